"""Every cut of the audit shows: verify is read-only and never seals; rows the service did not write are
never sealed and are reported; signed checkpoints (automatic, stored and in the data dir) expose a deleted tail, an
emptied table and swapped ids; `preflight audit verify --checkpoint FILE` checks against a copy an auditor kept."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from service import audit
from service.api.app import create_app
from service.cli import app as cli
from tests.support import ADMIN

runner = CliRunner()


@pytest.fixture
def make_client(settings, db, keys):
    clients = []

    def make(**overrides):
        app = create_app(settings.model_copy(update=overrides), db=db, keys=keys)
        c = TestClient(app)
        c.__enter__()
        c.headers["Authorization"] = f"Bearer {ADMIN}"
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.__exit__(None, None, None)


def register(client, n, start=0):
    for i in range(start, start + n):
        assert (
            client.post("/v1/nodes", json={"name": f"n{i}", "gpu": "h100-sxm-80gb", "gpu_count": 8}).status_code == 201
        )


def sql(settings, statement, params=None):
    engine = create_engine(settings.resolved_database_url)
    with engine.begin() as conn:
        out = conn.execute(text(statement), params or {})
        rows = out.all() if out.returns_rows else None
    engine.dispose()
    return rows


def verify(client):
    r = client.get("/v1/audit/verify")
    assert r.status_code == 200
    return r.json()


def sealed(client, wait: float = 30.0):
    """verify once the background sealer has sealed what was written (it seals a burst moments after the commit:
    on a loaded machine the answer may come first)."""
    deadline = time.monotonic() + wait
    out = verify(client)
    while out["pending"] and time.monotonic() < deadline:
        time.sleep(0.05)
        out = verify(client)
    return out


def checkpoint(client):
    r = client.post("/v1/audit/checkpoints")
    assert r.status_code == 201, r.text
    return r.json()


def test_checkpoints_are_made_every_n_events_stored_served_and_written_to_the_data_dir(make_client, settings, keys):
    client = make_client(audit_checkpoint_events=4, audit_checkpoint_seconds=3600)
    for i in range(10):  # one event sealed per pass
        register(client, 1, start=i)
        out = sealed(client)
        assert out["ok"] is True and out["pending"] == 0, out
    seqs = [r[0] for r in sql(settings, "SELECT last_seq FROM audit_checkpoints ORDER BY last_seq")]
    assert seqs == [1, 5, 9]  # the first at once, then one every 4 events
    latest = client.get("/v1/audit/checkpoints/latest").json()
    assert latest["claims"]["last_seq"] == 9 and latest["claims"]["events"] == 9
    saved = audit.read_checkpoint_file(settings.checkpoint_file, keys.jwks())
    assert saved == latest["claims"]
    assert out["checkpoint"]["ok"] is True
    agent = client.post("/v1/nodes/n0/token").json()["agent_token"]  # agents keep copies too
    assert client.get("/v1/audit/checkpoints/latest", headers={"Authorization": f"Bearer {agent}"}).status_code == 200


def test_a_checkpoint_follows_within_t_seconds_of_growth(make_client):
    client = make_client(audit_checkpoint_events=1000, audit_checkpoint_seconds=0.2)
    register(client, 1)
    verify(client)
    first = client.get("/v1/audit/checkpoints/latest").json()["claims"]["last_seq"]  # the first comes at once
    register(client, 1, start=1)
    deadline = time.monotonic() + 15
    while client.get("/v1/audit/checkpoints/latest").json()["claims"]["last_seq"] == first:
        assert time.monotonic() < deadline, "no time-based checkpoint"
        time.sleep(0.2)


def test_deleted_tail_is_detected(make_client, settings):
    client = make_client()
    register(client, 4)
    cp = checkpoint(client)["claims"]
    sql(settings, "DELETE FROM audit_events WHERE chain_seq > :s", {"s": cp["last_seq"] - 2})
    out = verify(client)
    assert out["ok"] is False and "deleted" in out["checkpoint"]["reason"], out


@pytest.mark.parametrize("also", ["", "audit_checkpoints"])
def test_emptied_table_is_detected(make_client, settings, also):
    """Emptying the events (and the stored checkpoints with them): the data-dir copy still knows the length."""
    client = make_client()
    register(client, 3)
    checkpoint(client)
    sql(settings, "DELETE FROM audit_events")
    if also:
        sql(settings, f"DELETE FROM {also}")
    out = verify(client)
    assert out["ok"] is False and out["events"] == 0 and "deleted" in out["checkpoint"]["reason"], out


def test_forged_unsealed_row_is_never_sealed_and_is_reported(make_client, settings):
    client = make_client()
    register(client, 2)
    verify(client)
    sql(
        settings,
        "INSERT INTO audit_events (ts, actor, kind, subject, payload, payload_digest) VALUES "
        "(:ts, 'admin', 'plan.revoked', 'plan:x', '{}', :d)",
        {"ts": "2026-01-01 00:00:00", "d": audit.sha256_hex(audit.canonical({}))},
    )
    forged_id = sql(settings, "SELECT max(id) FROM audit_events")[0][0]
    out = verify(client)  # waits for the sealer: it refuses the row; verify itself never seals
    assert out["ok"] is False and out["forged"] == [forged_id], out
    assert sql(settings, "SELECT chain_seq FROM audit_events WHERE id = :i", {"i": forged_id})[0][0] is None
    register(client, 1, start=5)  # the service goes on: later events are chained past the forged row
    out = verify(client)
    assert out["forged"] == [forged_id] and out["pending"] == 0


def test_forged_row_chained_by_hand_is_detected(make_client, settings):
    """An attacker who also computes the chain fields (no secret in the hash chain) lacks the MAC key."""
    client = make_client()
    register(client, 2)
    verify(client)
    seq, head = sql(settings, "SELECT chain_seq, hash FROM audit_events ORDER BY chain_seq DESC LIMIT 1")[0]
    import datetime as dt

    ts = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    digest = audit.sha256_hex(audit.canonical({}))
    h = audit.event_hash(seq + 1, head, ts, "admin", "plan.revoked", "plan:x", None, None, None, digest)
    sql(
        settings,
        "INSERT INTO audit_events (ts, actor, kind, subject, payload, payload_digest, chain_seq, "
        "prev_hash, hash) VALUES (:ts, 'admin', 'plan.revoked', 'plan:x', '{}', :d, :s, :p, :h)",
        {"ts": ts, "d": digest, "s": seq + 1, "p": head, "h": h},
    )
    out = verify(client)
    assert out["ok"] is False and "MAC" in out["first_broken"]["reason"], out


def test_swapped_ids_are_detected(make_client, settings, keys):
    client = make_client()
    register(client, 3)
    checkpoint(client)
    a, b = [r[0] for r in sql(settings, "SELECT id FROM audit_events ORDER BY chain_seq LIMIT 2 OFFSET 1")]
    sql(settings, "UPDATE audit_events SET id = -1 WHERE id = :a", {"a": a})
    sql(settings, "UPDATE audit_events SET id = :a WHERE id = :b", {"a": a, "b": b})
    sql(settings, "UPDATE audit_events SET id = :b WHERE id = -1", {"b": b})
    out = verify(client)  # the sealed MACs bind the ids
    assert out["ok"] is False and out["first_broken"]["id"] == b and "MAC" in out["first_broken"]["reason"], out
    # a verifier without the MAC keys (only the public JWKS) still sees it: the checkpoint's id digest differs
    from service.db.session import Database

    public = Database(settings.resolved_database_url)
    try:
        with public.sessions() as s:
            found, _ = audit.known_checkpoints(s, keys.jwks(), [settings.checkpoint_file])
            out = audit.verify_chain(s, checkpoints=found)
    finally:
        public.engine.dispose()
    assert out["ok"] is False and out["macs"] == "unchecked" and "ids" in out["checkpoint"]["reason"], out


def test_verify_never_seals(db):
    """The library verify is read-only too: pending rows stay pending."""
    with db.sessions() as s:
        with s.begin():
            audit.append(s, actor="t", kind="node.registered", subject="node:x", payload={})
    with db.sessions() as s:
        assert audit.verify_chain(s)["pending"] == 1
    with db.sessions() as s:
        assert audit.verify_chain(s)["pending"] == 1


def test_cli_verify_against_a_checkpoint_an_auditor_kept(make_client, settings, monkeypatch, tmp_path):
    client = make_client()
    register(client, 3)
    kept = tmp_path / "kept.jws"
    kept.write_text(checkpoint(client)["checkpoint"])  # an auditor asks for one and keeps it
    for k, v in {
        "PREFLIGHT_DATABASE_URL": settings.resolved_database_url,
        "PREFLIGHT_DATA_DIR": str(settings.data_dir),
    }.items():
        monkeypatch.setenv(k, v)
    verify(client)
    ok = runner.invoke(cli, ["audit", "verify", "--checkpoint", str(kept)])
    assert ok.exit_code == 0, ok.stdout
    assert str(kept) in [c["source"] for c in json.loads(ok.stdout)["compared"]]  # says which copies it checked
    # the attacker cuts the tail and removes every copy it can reach: the stored checkpoints and the data-dir file
    last = json.loads(ok.stdout)["last_seq"]
    sql(settings, "DELETE FROM audit_events WHERE chain_seq >= :s", {"s": last - 1})
    sql(settings, "DELETE FROM audit_checkpoints")
    settings.checkpoint_file.unlink()
    cut = runner.invoke(cli, ["audit", "verify"])  # the recorded head (audit_head) still knows the length...
    assert cut.exit_code == 1 and json.loads(cut.stdout)["cut"]["first_missing"] == last - 1, cut.stdout
    bad = runner.invoke(cli, ["audit", "verify", "--checkpoint", str(kept)])  # ...and so does the auditor's copy
    assert bad.exit_code == 1 and "deleted" in json.loads(bad.stdout)["checkpoint"]["reason"], bad.stdout
    forged = tmp_path / "forged.jws"
    h, p, s = kept.read_text().strip().split(".")
    forged.write_text(f"{h}.{p}.{s[:-4]}AAAA")
    assert runner.invoke(cli, ["audit", "verify", "--checkpoint", str(forged)]).exit_code == 1


def test_without_the_keys_a_long_unsealed_row_is_reported(db, settings):
    """A verifier away from the key directory cannot check MACs: a row unsealed for minutes is reported."""
    sql(
        settings,
        "INSERT INTO audit_events (ts, actor, kind, subject, payload, payload_digest) VALUES "
        "(:ts, 'admin', 'plan.revoked', 'plan:x', '{}', :d)",
        {"ts": "2026-01-01 00:00:00", "d": audit.sha256_hex(audit.canonical({}))},
    )
    with db.sessions() as s:
        out = audit.verify_chain(s)
    assert out["ok"] is False and out["forged"] == [1] and out["macs"] == "unchecked"


def test_a_data_dir_checkpoint_that_does_not_verify_is_reported_then_replaced(make_client, settings):
    client = make_client(audit_checkpoint_events=1)
    register(client, 1)
    verify(client)
    settings.checkpoint_file.write_text("not.a.jws\n")
    out = verify(client)
    assert out["ok"] is True and any("does not verify" in w for w in out["warnings"]), out
    register(client, 1, start=1)  # the next checkpoint replaces the bad file
    out = verify(client)
    assert "warnings" not in out and out["checkpoint"]["ok"] is True, out


def test_swapped_ids_after_the_newest_checkpoint_break_the_sealed_macs(make_client, settings):
    """The sealer's MAC binds each row's id and chain position: a swap shows without any checkpoint covering it."""
    client = make_client(audit_checkpoint_events=1000, audit_checkpoint_seconds=3600)
    register(client, 5)
    verify(client)
    a, b = [r[0] for r in sql(settings, "SELECT id FROM audit_events ORDER BY chain_seq DESC LIMIT 2")]
    sql(settings, "UPDATE audit_events SET id = -1 WHERE id = :a", {"a": a})
    sql(settings, "UPDATE audit_events SET id = :a WHERE id = :b", {"a": a, "b": b})
    sql(settings, "UPDATE audit_events SET id = :b WHERE id = -1", {"b": b})
    out = verify(client)
    assert out["ok"] is False and "MAC" in out["first_broken"]["reason"], out


def test_a_tail_cut_after_the_newest_checkpoint_shows_to_the_running_service(make_client, settings):
    client = make_client(audit_checkpoint_events=1000, audit_checkpoint_seconds=3600)
    register(client, 1)
    verify(client)  # the first checkpoint covers the first event only
    register(client, 4, start=1)
    assert verify(client)["ok"] is True
    sql(settings, "DELETE FROM audit_events WHERE chain_seq > 3")
    out = verify(client)
    assert out["ok"] is False and out["checkpoint"]["ok"] is True and "deleted" in out["cut"]["reason"], out


def test_stripped_macs_and_a_rechained_forgery_are_caught_and_never_checkpointed(make_client, settings):
    """A database writer without the keys nulls every MAC and appends a correctly hashed row:
    verify reports it (checkpoints carry macs_from) and the service refuses to sign a checkpoint over it."""
    client = make_client(audit_checkpoint_events=1000, audit_checkpoint_seconds=3600)
    register(client, 3)
    first = checkpoint(client)
    assert verify(client)["ok"]
    sql(settings, "UPDATE audit_events SET mac = NULL")
    head = sql(
        settings, "SELECT chain_seq, hash FROM audit_events WHERE chain_seq IS NOT NULL ORDER BY chain_seq DESC LIMIT 1"
    )[0]
    import datetime as dt

    ts = dt.datetime.now(dt.UTC)
    payload = {"forged": True}
    digest = audit.sha256_hex(audit.canonical(payload))
    h = audit.event_hash(head[0] + 1, head[1], ts, "admin", "node.registered", "node:evil", "evil", None, None, digest)
    sql(
        settings,
        "INSERT INTO audit_events (ts, actor, kind, subject, node, payload, payload_digest, chain_seq, "
        "prev_hash, hash) VALUES (:ts, 'admin', 'node.registered', 'node:evil', 'evil', :p, :d, :s, :ph, :h)",
        {"ts": ts, "p": json.dumps(payload), "d": digest, "s": head[0] + 1, "ph": head[1], "h": h},
    )
    out = verify(client)
    assert not out["ok"] and "MAC" in out["first_broken"]["reason"]
    r = client.post("/v1/audit/checkpoints")
    assert r.status_code == 409, r.text  # the service does not vouch for what it did not write
    assert first  # the genuine checkpoint made before the forgery is what exposes it


def test_verify_reads_a_snapshot_and_holds_no_write_lock(db):
    """A whole-chain verify must not hold up writers (agents, deploys): its read transaction takes no write lock, and
    what is written meanwhile is not in its snapshot."""
    import threading

    with db.transaction() as s:
        audit.append(s, actor="t", kind="node.registered", subject="node:a", payload={})
    db.sealer.seal_now()
    done = threading.Event()

    def write():
        with db.transaction() as s:
            audit.append(s, actor="t", kind="node.registered", subject="node:b", payload={})
        done.set()

    with db.read() as s:
        before = audit.verify_chain(s)
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        assert done.wait(20), "a write waited for the read-only verify"  # hang guard, not a timing assertion
        during = audit.verify_chain(s)
        assert during["events"] + during["pending"] == before["events"] + before["pending"]  # its snapshot
    with db.read() as s:
        after = audit.verify_chain(s)
    assert after["events"] + after["pending"] == before["events"] + before["pending"] + 1


def test_a_second_verify_at_the_same_time_is_told_to_retry(make_client):
    client = make_client()
    lock = client.app.state.audit_verifying
    assert lock.acquire(blocking=False)  # a verification is running
    try:
        r = client.get("/v1/audit/verify")
    finally:
        lock.release()
    assert r.status_code == 429 and r.headers["retry-after"] == "5", r.text
    assert "already running" in r.json()["detail"]
    assert verify(client)["ok"] is True
