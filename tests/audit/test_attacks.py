"""The attacks of a hostile pass on the audit log, each through the service's own paths on SQLite and PostgreSQL:

1. deleting the newest events (after the newest checkpoint) shows to every process and after a restart — the
   recorded head (``audit_head``) is in the database, signed with the audit keys; deleting or lowering it shows too;
2. a trigger that copies each new pending row does not get the copy sealed (the MAC binds a per-event nonce);
3. a trigger that drops the events creating tokens, plans, assignments or rollouts leaves orphan rows verify names.

A "process" here is an app over its own ``Database`` (engine, pool, sealer with its own memory): two of them over one
database are two workers, and a new one after the first is closed is a restart."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from service import audit
from service.api.app import create_app
from service.cli import app as cli
from service.db.session import Database
from tests.support import ADMIN
from tests.support.api import PLAN_70B, register_manifest, register_node
from tests.support.rollouts import Fleet

QUIET = {"audit_checkpoint_events": 1000, "audit_checkpoint_seconds": 3600}  # no checkpoint after the first


@pytest.fixture
def processes(settings, keys):
    """``start()``: a service process over the test database (its own Database); ``stop(p)`` ends one."""
    running: list[tuple[TestClient, Database]] = []

    def start(**overrides) -> TestClient:
        db = Database(settings.resolved_database_url)
        c = TestClient(create_app(settings.model_copy(update={**QUIET, **overrides}), db=db, keys=keys))
        c.__enter__()
        c.headers["Authorization"] = f"Bearer {ADMIN}"
        running.append((c, db))
        return c

    def stop(client: TestClient) -> None:
        for i, (c, db) in enumerate(running):
            if c is client:
                c.__exit__(None, None, None)
                db.engine.dispose()
                del running[i]
                return

    yield start, stop
    for c, db in running:
        c.__exit__(None, None, None)
        db.engine.dispose()


def sql(settings, statement, params=None):
    engine = create_engine(settings.resolved_database_url)
    with engine.begin() as conn:
        out = conn.execute(text(statement), params or {})
        rows = out.all() if out.returns_rows else None
    engine.dispose()
    return rows


def verify(client) -> dict:
    r = client.get("/v1/audit/verify")
    assert r.status_code == 200, r.text
    return r.json()


def new_token(client, label) -> int:
    r = client.post("/v1/tokens", json={"role": "admin", "label": label})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def token_event_seqs(settings) -> list[int]:
    return [
        r[0]
        for r in sql(settings, "SELECT chain_seq FROM audit_events WHERE kind = 'token.created' ORDER BY chain_seq")
    ]


# --- 1. the newest events deleted ---------------------------------------------------------------------------------


def test_deleted_newest_events_show_after_a_restart(processes, settings):
    """Three admin tokens made after the newest checkpoint, their events deleted, the service restarted: verify
    reports the cut tail (naming the first missing seq) and the three tokens without their event."""
    start, stop = processes
    first = start()
    register_node(first, "gpu-01")
    assert verify(first)["ok"] is True  # the first checkpoint: the node's registration only
    tokens = [new_token(first, f"t{i}") for i in range(3)]
    assert verify(first)["ok"] is True
    seqs = token_event_seqs(settings)
    assert len(seqs) == 3 and sql(settings, "SELECT max(last_seq) FROM audit_checkpoints")[0][0] < seqs[0]
    sql(settings, "DELETE FROM audit_events WHERE kind = 'token.created'")
    stop(first)
    out = verify(start())  # a new process: nothing in memory of what was sealed
    assert out["ok"] is False and out["checkpoint"]["ok"] is True, out  # the checkpoint is older than the cut
    assert out["cut"]["first_missing"] == seqs[0] and out["cut"]["head_seq"] == seqs[-1], out
    assert "deleted" in out["cut"]["reason"]
    assert [(o["table"], o["id"]) for o in out["orphans"]] == [("tokens", t) for t in tokens], out


def test_a_cut_tail_looks_the_same_to_two_workers(processes, settings):
    """Two processes over one database (two workers): the one that sealed the deleted events and the other answer
    alike, and so do both again after a restart."""
    start, stop = processes
    a, b = start(), start()
    register_node(a, "gpu-01")
    verify(a)  # the first checkpoint
    for i in range(4):
        r = a.patch("/v1/nodes/gpu-01", json={"labels": {"step": str(i)}})
        assert r.status_code == 200, r.text
    assert verify(a)["ok"] is True and verify(b)["ok"] is True
    last = sql(settings, "SELECT max(chain_seq) FROM audit_events")[0][0]
    sql(settings, "DELETE FROM audit_events WHERE chain_seq > :s", {"s": last - 2})  # two node.updated: no orphan
    answers = [verify(a), verify(b)]
    stop(a)
    answers.append(verify(start()))
    for out in answers:
        assert out["ok"] is False and "orphans" not in out, out
        assert out["cut"]["first_missing"] == last - 1 and out["cut"]["head_seq"] == last, out
    r = b.patch("/v1/nodes/gpu-01", json={"labels": {"step": "after"}})  # the service goes on writing...
    assert r.status_code == 200
    out = verify(b)  # ...but seals nothing onto a cut chain (that would hide it) and signs no checkpoint over it
    assert out["pending"] == 1 and out["cut"]["first_missing"] == last - 1, out
    assert b.post("/v1/audit/checkpoints").status_code == 409


def test_a_deleted_head_record_is_reported(processes, settings):
    start, _ = processes
    client = start()
    register_node(client, "gpu-01")
    assert verify(client)["ok"] is True
    sql(settings, "DELETE FROM audit_head")
    out = verify(client)
    assert out["ok"] is False and "missing" in out["head_record"]["reason"], out


@pytest.mark.parametrize("mac", ["kept", "null"])
def test_a_head_lowered_by_hand_to_match_a_cut_chain_is_reported(processes, settings, mac):
    """The attacker cuts the tail and moves the recorded head onto the new end: its MAC no longer matches (or, set to
    null, is missing although the chain was sealed by a sealer that signs the head)."""
    start, stop = processes
    client = start()
    register_node(client, "gpu-01")
    verify(client)
    for i in range(3):
        assert client.patch("/v1/nodes/gpu-01", json={"labels": {"step": str(i)}}).status_code == 200
    assert verify(client)["ok"] is True
    seq, h = sql(settings, "SELECT chain_seq, hash FROM audit_events ORDER BY chain_seq DESC LIMIT 1 OFFSET 2")[0]
    sql(settings, "DELETE FROM audit_events WHERE chain_seq > :s", {"s": seq})
    sql(
        settings,
        "UPDATE audit_head SET seq = :s, hash = :h" + (", mac = NULL" if mac == "null" else ""),
        {"s": seq, "h": h},
    )
    stop(client)
    out = verify(start())
    assert out["ok"] is False and "cut" not in out, out
    assert ("does not match" if mac == "kept" else "no MAC") in out["head_record"]["reason"], out


def test_the_cli_reads_the_recorded_head_too(processes, settings, monkeypatch):
    """``preflight audit verify``, a process of its own, sees the cut without any checkpoint covering it."""
    start, _ = processes
    client = start()
    register_node(client, "gpu-01")
    verify(client)
    new_token(client, "t")
    verify(client)
    seq = token_event_seqs(settings)[0]
    sql(settings, "DELETE FROM audit_events WHERE chain_seq = :s", {"s": seq})
    monkeypatch.setenv("PREFLIGHT_DATABASE_URL", settings.resolved_database_url)
    monkeypatch.setenv("PREFLIGHT_DATA_DIR", str(settings.data_dir))
    out = CliRunner().invoke(cli, ["audit", "verify"])
    assert out.exit_code == 1 and json.loads(out.stdout)["cut"]["first_missing"] == seq, out.stdout


# --- 2. a copied row ------------------------------------------------------------------------------------------------

_COPY_COLUMNS = "ts, actor, kind, subject, node, plan_id, model, payload, payload_digest, mac, nonce"


def install_copy_trigger(settings, dialect: str, nonce: str) -> None:
    """After each insert of a pending row, insert a copy of it (the MAC copied along; the nonce kept or dropped)."""
    values = ", ".join(f"NEW.{c}" if c != "nonce" or nonce == "kept" else "NULL" for c in _COPY_COLUMNS.split(", "))
    if dialect == "sqlite":
        sql(
            settings,
            "CREATE TRIGGER copy_rows AFTER INSERT ON audit_events WHEN NEW.chain_seq IS NULL BEGIN "
            f"INSERT INTO audit_events ({_COPY_COLUMNS}) VALUES ({values}); END",
        )
        return
    sql(
        settings,
        "CREATE FUNCTION copy_rows() RETURNS trigger AS $$ BEGIN IF pg_trigger_depth() = 1 THEN "
        f"INSERT INTO audit_events ({_COPY_COLUMNS}) VALUES ({values}); END IF; RETURN NEW; END $$ "
        "LANGUAGE plpgsql",
    )
    sql(
        settings,
        "CREATE TRIGGER copy_rows AFTER INSERT ON audit_events FOR EACH ROW WHEN (NEW.chain_seq IS NULL) "
        "EXECUTE FUNCTION copy_rows()",
    )


@pytest.mark.parametrize("nonce", ["kept", "dropped"])
def test_a_copied_pending_row_is_never_sealed(processes, settings, db, nonce):
    start, _ = processes
    client = start()
    register_node(client, "gpu-01")
    assert verify(client)["ok"] is True
    install_copy_trigger(settings, db.dialect, nonce)
    new_token(client, "t")
    out = verify(client)  # once the sealer has passed
    rows = sql(settings, "SELECT id, chain_seq FROM audit_events WHERE kind = 'token.created' ORDER BY id")
    assert len(rows) == 2  # the genuine event and its copy
    (genuine, seq), (copy, copy_seq) = rows
    assert seq is not None and copy_seq is None  # only the genuine one is in the chain
    assert out["ok"] is False and out["pending"] == 0, out
    assert out["copies" if nonce == "kept" else "forged"] == [copy], out
    assert "orphans" not in out


def test_rows_written_before_nonces_still_verify_and_seal(db, keys, settings):
    """Events written with the MAC forms before migration 0015 (no nonce): a sealed ``s1.`` row and a pending row
    with the old append form, which the sealer still accepts."""
    from service.audit.encoding import mac_fields

    db.audit_keys = audit.AuditKeys(keys)
    kid = keys.active_kid
    secret = keys.derived_secrets(audit.AuditKeys.LABEL)[kid]
    with db.transaction() as s:
        audit.append(s, actor="t", kind="node.registered", subject="node:new", payload={})
    digest = audit.sha256_hex(audit.canonical({}))
    ts = "2026-01-01 00:00:00"
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for i, name in enumerate(("old-a", "old-b")):  # as the service wrote them before: no nonce
        mac = hmac.new(
            secret, mac_fields(when, "t", "node.updated", f"node:{name}", None, None, None, digest), hashlib.sha256
        )
        sql(
            settings,
            "INSERT INTO audit_events (ts, actor, kind, subject, payload, payload_digest, mac) VALUES "
            "(:ts, 't', 'node.updated', :sub, '{}', :d, :m)",
            {"ts": ts, "sub": f"node:{name}", "d": digest, "m": f"{kid}.{mac.hexdigest()}"},
        )
        if i == 0:  # the first one also sealed in the old form, as an older sealer did
            db.sealer.seal_now()
    db.sealer.seal_now()
    macs = [r[0].split(".")[0] for r in sql(settings, "SELECT mac FROM audit_events ORDER BY chain_seq")]
    assert macs == ["s2", "s1", "s1"]
    with db.read() as s:
        out = audit.verify_chain(s)
    assert out["ok"] is True and out["events"] == 3 and out["pending"] == 0, out


# --- 3. state without its events --------------------------------------------------------------------------------


def install_drop_trigger(settings, dialect: str, kinds: list[str]) -> None:
    """Silently drop inserts of audit events of ``kinds`` (the state change itself commits)."""
    listed = ", ".join(f"'{k}'" for k in kinds)
    if dialect == "sqlite":
        sql(
            settings,
            f"CREATE TRIGGER drop_rows BEFORE INSERT ON audit_events WHEN NEW.kind IN ({listed}) "
            "BEGIN SELECT RAISE(IGNORE); END",
        )
        return
    sql(
        settings,
        f"CREATE FUNCTION drop_rows() RETURNS trigger AS $$ BEGIN IF NEW.kind IN ({listed}) THEN RETURN NULL; "
        "END IF; RETURN NEW; END $$ LANGUAGE plpgsql",
    )
    sql(settings, "CREATE TRIGGER drop_rows BEFORE INSERT ON audit_events FOR EACH ROW EXECUTE FUNCTION drop_rows()")


def test_a_token_whose_event_was_dropped_is_an_orphan(processes, settings, db):
    start, stop = processes
    client = start()
    register_node(client, "gpu-01")
    kept = new_token(client, "with its event")
    assert verify(client)["ok"] is True
    install_drop_trigger(settings, db.dialect, ["token.created"])
    dropped = new_token(client, "no trail")
    out = verify(client)
    assert out["ok"] is False and out["orphans"] == [
        {"table": "tokens", "id": dropped, "missing": "token.created, token.rotated or node.registered"}
    ], out
    assert kept != dropped and "cut" not in out and "first_broken" not in out
    stop(client)
    assert verify(start())["orphans"] == out["orphans"]  # the same after a restart


def test_plans_assignments_and_rollouts_without_their_events_are_orphans(client, db, settings, keys):
    fleet = Fleet(client, db, settings, keys)
    assert verify(client)["ok"] is True
    install_drop_trigger(settings, db.dialect, ["plan.created", "rollout.created"])
    r = client.post("/v1/plans", json={**PLAN_70B, "nodes": ["gpu-01", "gpu-02"]})
    assert r.status_code == 201, r.text
    plan = r.json()["id"]
    rollout = fleet.rollout()["id"]
    assignments = [
        r[0] for r in sql(settings, "SELECT id FROM assignments WHERE plan_id = :p ORDER BY id", {"p": plan})
    ]
    out = verify(client)
    found = {(o["table"], o["id"]) for o in out["orphans"]}
    assert out["ok"] is False
    assert found == {("plans", plan), ("rollouts", rollout)} | {("assignments", a) for a in assignments}, out


def test_an_assignment_added_by_hand_to_an_audited_plan_is_an_orphan(client, settings):
    """The plan's event names the nodes it was assigned to: a row for another node has no event."""
    register_manifest(client)
    for n in ("gpu-01", "gpu-02"):
        register_node(client, n)
    plan = client.post("/v1/plans", json=PLAN_70B).json()["id"]
    assert verify(client)["ok"] is True
    sql(
        settings,
        "INSERT INTO assignments (plan_id, node_name, seq, signed, etag, status, fetch_count, created_at) "
        "SELECT plan_id, 'gpu-02', 1, signed, etag, status, 0, created_at FROM assignments WHERE plan_id = :p",
        {"p": plan},
    )
    added = sql(settings, "SELECT id FROM assignments WHERE node_name = 'gpu-02'")[0][0]
    out = verify(client)
    assert out["ok"] is False and [(o["table"], o["id"]) for o in out["orphans"]] == [("assignments", added)], out


def test_the_service_own_writes_leave_no_orphan(client, db, settings, keys):
    """Every way the service creates these rows has its event: nodes (their first agent token), a node's token
    rotation, tokens made and rotated, plans over several nodes, a rollout and its waves' plans."""
    fleet = Fleet(client, db, settings, keys)
    assert client.post("/v1/nodes/gpu-01/token").status_code in (200, 201)
    t = new_token(client, "rotated")
    assert client.post(f"/v1/tokens/{t}/rotate").status_code in (200, 201)
    rid = fleet.rollout()["id"]
    fleet.tick()
    out = verify(client)
    assert out["ok"] is True and "orphans" not in out, out
    assert sql(settings, "SELECT count(*) FROM plans")[0][0] >= 2 and rid


def test_a_database_upgraded_to_the_recorded_head_starts_it_at_the_chain_end(db_url, db, keys):
    """Migration 0015 on a chain sealed by an older service: the head starts at the chain's end, unsigned (a
    migration has no keys) and accepted as such until the first seal signs it."""
    from service.db.migrate import downgrade, upgrade

    downgrade(db_url, "0014")
    prev, digest, ts = audit.GENESIS, audit.sha256_hex(audit.canonical({})), dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    engine = create_engine(db_url)
    with engine.begin() as conn:
        for seq in (1, 2):
            h = audit.event_hash(seq, prev, ts, "t", "node.updated", "node:x", None, None, None, digest)
            conn.execute(
                text(
                    "INSERT INTO audit_events (ts, actor, kind, subject, payload, payload_digest, chain_seq, prev_hash,"
                    " hash) VALUES (:ts, 't', 'node.updated', 'node:x', '{}', :d, :s, :p, :h)"
                ),
                {"ts": ts, "d": digest, "s": seq, "p": prev, "h": h},
            )
            prev = h
    engine.dispose()
    upgrade(db_url)
    db.audit_keys = audit.AuditKeys(keys)
    with db.read() as s:
        out = audit.verify_chain(s)
    assert out["ok"] is True and out["last_seq"] == 2, out  # the unsigned head names the chain's end
    with db.transaction() as s:
        audit.append(s, actor="t", kind="node.updated", subject="node:x", payload={})
    head = sql_url(db_url, "SELECT seq, hash, mac FROM audit_head")[0]
    assert head[0] == 3 and head[2].startswith("h1.") and db.audit_keys.head_valid(*head)
    with db.read() as s:
        assert audit.verify_chain(s)["ok"] is True


def sql_url(url, statement):
    engine = create_engine(url)
    with engine.begin() as conn:
        rows = conn.execute(text(statement)).all()
    engine.dispose()
    return rows


def test_an_agent_token_put_in_by_hand_is_an_orphan(client, settings):
    """``node.registered`` names the agent token it issued: a token swapped in for it (the genuine one deleted, so
    the forged one is the node's oldest) has no event."""
    register_node(client, "gpu-01")
    assert verify(client)["ok"] is True
    genuine = sql(settings, "SELECT id FROM tokens WHERE node_name = 'gpu-01'")[0][0]
    sql(settings, "DELETE FROM tokens WHERE id = :i", {"i": genuine})
    forged = genuine + 100  # a new id (a row put back under the very same id is an edit this check cannot see)
    sql(
        settings,
        "INSERT INTO tokens (id, token_hash, role, node_name, label, created_at) "
        "VALUES (:i, :h, 'agent', 'gpu-01', 'agent token of gpu-01', :t)",
        {"i": forged, "h": hashlib.sha256(b"forged").hexdigest(), "t": "2026-01-01 00:00:00"},
    )
    out = verify(client)
    assert out["ok"] is False and [(o["table"], o["id"]) for o in out["orphans"]] == [("tokens", forged)], out


def test_an_older_genuine_head_put_back_with_the_tail_cut_to_it(processes, settings, monkeypatch, tmp_path):
    """The head is in the database: a writer there can save its row, cut the tail back to it later and put it back
    (its MAC is genuine). The process that sealed further still knows; after a restart only a checkpoint kept outside
    the database does — the anchor the recorded head does not replace."""
    start, stop = processes
    client = start()
    register_node(client, "gpu-01")
    verify(client)
    saved = sql(settings, "SELECT seq, hash, mac FROM audit_head")[0]
    for i in range(2):
        assert client.patch("/v1/nodes/gpu-01", json={"labels": {"step": str(i)}}).status_code == 200
    assert verify(client)["ok"] is True
    kept = tmp_path / "kept.jws"
    kept.write_text(client.post("/v1/audit/checkpoints").json()["checkpoint"])  # an auditor keeps a copy
    sql(settings, "DELETE FROM audit_events WHERE chain_seq > :s", {"s": saved[0]})
    sql(settings, "UPDATE audit_head SET seq = :s, hash = :h, mac = :m", {"s": saved[0], "h": saved[1], "m": saved[2]})
    sql(settings, "DELETE FROM audit_checkpoints WHERE last_seq > :s", {"s": saved[0]})
    settings.checkpoint_file.unlink()
    out = verify(client)
    assert out["ok"] is False and out["cut"]["seen_seq"] == saved[0] + 2, out  # this process sealed further
    stop(client)
    assert verify(start())["ok"] is True  # what the database and data dir hold agrees again: the documented limit
    monkeypatch.setenv("PREFLIGHT_DATABASE_URL", settings.resolved_database_url)
    monkeypatch.setenv("PREFLIGHT_DATA_DIR", str(settings.data_dir))
    out = CliRunner().invoke(cli, ["audit", "verify", "--checkpoint", str(kept)])
    assert out.exit_code == 1 and "deleted" in json.loads(out.stdout)["checkpoint"]["reason"], out.stdout


def test_events_keeping_a_node_name_spelling_from_before_0014_are_no_orphans(client, db, settings):
    """Migration 0014 rewrote node names to lower case without a final dot in every table but the audit log (it is
    hash-chained): a node registered as ``GPU-B`` by an older service has its rows as ``gpu-b`` and its events as
    ``GPU-B`` — the legacy node.registered without token_id, and the plan.created naming ``GPU-B``. Those rows have
    their events."""
    register_manifest(client)
    register_node(client, "gpu-a")
    plan = client.post("/v1/plans", json={**PLAN_70B, "nodes": ["gpu-a"]}).json()["id"]
    legacy_plan = "00000000-0000-4000-8000-000000000014"
    with db.transaction() as s:  # the events as the older service wrote them (no token_id, names as registered)
        audit.append(s, actor="admin", kind="node.registered", subject="node:GPU-B", node="GPU-B", payload={})
        audit.append(
            s,
            actor="admin",
            kind="plan.created",
            subject=f"plan:{legacy_plan}",
            plan_id=legacy_plan,
            payload={"nodes": ["GPU-B."]},
        )
    # the rows as migration 0014 left them: in lower case
    sql(
        settings,
        "INSERT INTO nodes (name, gpu_id, gpu, gpu_count, interconnect, labels, address, created_at, updated_at) "
        "SELECT 'gpu-b', gpu_id, gpu, gpu_count, interconnect, labels, address, created_at, updated_at FROM nodes "
        "WHERE name = 'gpu-a'",
    )
    sql(
        settings,
        "INSERT INTO tokens (token_hash, role, node_name, label, created_at) "
        "VALUES (:h, 'agent', 'gpu-b', 'agent token of GPU-B', :t)",
        {"h": hashlib.sha256(b"legacy").hexdigest(), "t": "2026-01-01 00:00:00"},
    )
    cols = "manifest_id, request, verdict, findings, argv, command, env, budget, recommendations, vllm_version, "
    cols += "status, topology, tuning, created_by, created_at"
    sql(
        settings,
        f"INSERT INTO plans (id, {cols}) SELECT :q, {cols} FROM plans WHERE id = :p",
        {"p": plan, "q": legacy_plan},
    )
    sql(
        settings,
        "INSERT INTO assignments (plan_id, node_name, seq, signed, etag, status, fetch_count, created_at) "
        "SELECT :q, 'gpu-b', 1, signed, etag, status, 0, created_at FROM assignments WHERE plan_id = :p",
        {"p": plan, "q": legacy_plan},
    )
    out = verify(client)
    assert out["ok"] is True and "orphans" not in out, json.dumps(out)
