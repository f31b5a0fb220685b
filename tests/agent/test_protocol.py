"""The agent protocol on the service side (in process, SQLite and PostgreSQL): freshness statements served with
every fetch, the key-set chain, lifecycle reports (heartbeats cheap, planless refusals), and the runs answer."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from sqlalchemy import select

from service.agent.trust import Trust
from service.agent.verify import verify_freshness, verify_plan
from service.db.models import AuditEvent, Report
from service.signing import KeyStore, plan_digest
from tests.support.api import PLAN, fetch, setup_fleet

AUD = "preflight-agent"


def test_every_fetch_carries_a_freshness_statement_over_the_plan(client):
    fleet = setup_fleet(client, ["gpu-01"])
    token = fleet["gpu-01"]["token"]
    r = fetch(client, "gpu-01", token)
    jwks = client.get("/.well-known/jwks.json").json()
    plan = verify_plan(r.text, jwks, node="gpu-01", audience=AUD, issuer="preflight")
    claims = verify_freshness(
        r.headers["x-plan-freshness"],
        jwks,
        plan_token=r.text,
        plan=plan,
        node="gpu-01",
        audience=AUD,
        issuer="preflight",
    )
    assert claims["plan_digest"] == plan_digest(r.text) and claims["seq"] == 1
    assert 3500 <= claims["exp"] - time.time() <= 3600
    again = fetch(client, "gpu-01", token, **{"If-None-Match": r.headers["etag"]})
    assert again.status_code == 304 and again.headers["x-plan-freshness"] == r.headers["x-plan-freshness"]  # cached
    created = client.get("/v1/audit", params={"kind": "plan.created"}).json()["items"][0]
    assert created["payload"]["plan_digests"] == [plan_digest(r.text)]


def test_the_statement_signed_with_the_plan_is_served_while_young_then_a_new_one(client, db, keys, monkeypatch):
    """The freshness statement is signed with the plan (stored on the assignment), so a fleet booting right after a
    rollout costs no signature per fetch; once it is older than the re-signing window, or its key is no longer the
    active one, a fetch gets a newly signed statement — verified like any other."""
    from service.db.models import Assignment

    fleet = setup_fleet(client, ["gpu-01", "gpu-02"])
    with db.sessions() as s:
        stored = {a.node_name: a.freshness for a in s.scalars(select(Assignment))}
    jwks = client.get("/.well-known/jwks.json").json()
    r = fetch(client, "gpu-01", fleet["gpu-01"]["token"])
    assert r.headers["x-plan-freshness"] == stored["gpu-01"]
    plan = verify_plan(r.text, jwks, node="gpu-01", audience=AUD, issuer="preflight")
    verify_freshness(
        stored["gpu-01"], jwks, plan_token=r.text, plan=plan, node="gpu-01", audience=AUD, issuer="preflight"
    )
    keys.rotate()  # the stored statement's key is no longer the active one
    r2 = fetch(client, "gpu-02", fleet["gpu-02"]["token"])
    assert r2.headers["x-plan-freshness"] != stored["gpu-02"]
    jwks = client.get("/.well-known/jwks.json").json()
    plan2 = verify_plan(r2.text, jwks, node="gpu-02", audience=AUD, issuer="preflight")
    claims = verify_freshness(
        r2.headers["x-plan-freshness"],
        jwks,
        plan_token=r2.text,
        plan=plan2,
        node="gpu-02",
        audience=AUD,
        issuer="preflight",
    )
    assert claims["seq"] == 1
    later = time.time() + 3600  # past the re-signing window: a new statement, with a later iat
    monkeypatch.setattr(time, "time", lambda: later)
    r3 = fetch(client, "gpu-01", fleet["gpu-01"]["token"], **{"If-None-Match": r.headers["etag"]})
    assert r3.status_code == 304 and r3.headers["x-plan-freshness"] != stored["gpu-01"]
    assert (
        verify_freshness(
            r3.headers["x-plan-freshness"],
            jwks,
            plan_token=r.text,
            plan=plan,
            node="gpu-01",
            audience=AUD,
            issuer="preflight",
            now=later,
        )["iat"]
        >= int(later) - 1
    )


class _OverTestClient:
    """An httpx transport answering through the app's TestClient: Starlette's TestClient runs on httpx2 when it is
    installed (huggingface_hub brings it), whose transport an httpx client cannot use directly."""

    def __init__(self, client):
        self.client = client

    def handle_request(self, request):
        import httpx

        r = self.client.request(
            request.method, str(request.url), headers=list(request.headers.multi_items()), content=request.read()
        )
        return httpx.Response(r.status_code, headers=list(r.headers.multi_items()), stream=httpx.ByteStream(r.content))

    def close(self):
        pass


class RecordingAgentClient:
    """The agent's real HTTP client over the app (no sockets), keeping every plan-fetch answer it got; with
    ``replay`` it answers fetches with that response instead of asking (an answer captured earlier)."""

    def __init__(self, client, node, token, replay=None):
        from service.agent.client import AgentClient

        self.http = AgentClient("http://testserver", node, token, transport=_OverTestClient(client))
        self.answers: list = []
        self.replay = replay

    def fetch(self, etag=None, nonce=None):
        if self.replay is not None:
            return self.replay
        r = self.http.fetch(etag, nonce=nonce)
        self.answers.append(r)
        return r

    def __getattr__(self, name):
        return getattr(self.http, name)


def agent_boot(client, tmp_path, agent):
    import json

    from service.agent.boot import Boot, BootOptions
    from service.clock import ManualClock

    trust = tmp_path / "trust.json"
    if not trust.exists():
        trust.write_text(json.dumps(client.get("/.well-known/jwks.json").json()))
    said: list[str] = []
    options = BootOptions(
        node="gpu-01",
        state_path=tmp_path / "state.json",
        checkpoint_copy=tmp_path / "checkpoint.jws",
        metrics_seconds=0,
    )
    clock = ManualClock(start=time.time())
    out = Boot(options, client=agent, trust=Trust.load(trust), clock=clock, err=said.append, out=said.append).run()
    return out, "\n".join(said)


def test_a_state_file_rolled_back_cannot_replay_an_older_plan_through_the_api(client, tmp_path):
    """End to end through the API: the agent runs seq 1, then seq 2 (each reported ``fetched``). Every freshness
    statement echoes the fetch's nonce and carries the highest seq the node reported on. With its state file lowered
    back to seq 1, the answer captured for seq 1 (plan and statement, within the statement's lifetime) is refused."""
    import json

    fleet = setup_fleet(client, ["gpu-01"])
    token = fleet["gpu-01"]["token"]
    first = RecordingAgentClient(client, "gpu-01", token)
    out, said = agent_boot(client, tmp_path, first)
    assert (out.code, out.step) == (0, "printed"), said
    captured = first.answers[-1]
    assert captured.status_code == 200
    r = client.post("/v1/plans", json={**PLAN, "nodes": ["gpu-01"]})
    assert r.status_code == 201, r.text
    out, said = agent_boot(client, tmp_path, RecordingAgentClient(client, "gpu-01", token))
    assert (out.code, out.step) == (0, "printed"), said
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["last_seq"] == 2

    nonce = "n" * 22
    r = fetch(client, "gpu-01", token, **{"X-Plan-Nonce": nonce})
    jwks = client.get("/.well-known/jwks.json").json()
    plan = verify_plan(r.text, jwks, node="gpu-01", audience=AUD, issuer="preflight")
    claims = verify_freshness(
        r.headers["x-plan-freshness"], jwks, plan_token=r.text, plan=plan, node="gpu-01", audience=AUD, nonce=nonce
    )
    assert (claims["seq"], claims["acked_seq"], claims["nonce"]) == (2, 2, nonce)
    assert fetch(client, "gpu-01", token, **{"X-Plan-Nonce": "short"}).status_code == 422

    state.update(last_seq=1, plan_id=captured.headers["x-plan-id"], plan=captured.text, etag=None)
    (tmp_path / "state.json").write_text(json.dumps(state))
    out, said = agent_boot(client, tmp_path, RecordingAgentClient(client, "gpu-01", token, replay=captured))
    assert (out.code, out.step) == (3, "refused")
    assert "REFUSED freshness" in said and "freshness_replayed" in said
    assert json.loads((tmp_path / "state.json").read_text())["last_seq"] == 1  # nothing saved from the replay


def test_keyset_chain_endpoint_follows_rotation_and_retirement(client, keys, tmp_path):
    first = client.get("/.well-known/jwks.json").json()
    assert first["version"] == 1 and len(client.get("/v1/keysets").json()["keysets"]) == 1
    trust_file = tmp_path / "trust.json"
    trust_file.write_text(client.get("/.well-known/jwks.json").text)
    old = keys.active_kid
    new = keys.rotate()
    keys.retire(old)
    body = client.get("/v1/keysets", params={"after": 1}).json()
    assert body["version"] == 3 and len(body["keysets"]) == 2
    trust = Trust.load(trust_file)
    assert trust.apply_chain(body["keysets"]) == [2, 3]
    assert [k["kid"] for k in Trust.load(trust_file).keys] == [new]
    assert client.get("/v1/keysets", params={"after": -1}).status_code == 422
    KeyStore(keys.dir).rotate()  # by the CLI (another process): seen on the next request, version included
    body = client.get("/v1/keysets", params={"after": 3}).json()
    assert body["version"] == 4 and len(body["keysets"]) == 1


def test_heartbeats_store_nothing_but_the_time_and_say_when_the_plan_is_superseded(client, db):
    fleet = setup_fleet(client, ["gpu-01"])
    token, plan_id = fleet["gpu-01"]["token"], fleet["gpu-01"]["plan"]["id"]
    auth = {"Authorization": f"Bearer {token}"}

    def post(body):
        return client.post("/v1/nodes/gpu-01/reports", json=body, headers=auth)

    assert post({"plan_id": plan_id, "status": "started", "details": {"run_id": "r1"}}).status_code == 201
    with db.transaction() as s:
        events, reports = len(s.execute(select(AuditEvent.id)).all()), len(s.execute(select(Report.id)).all())
    beat = post({"plan_id": plan_id, "status": "heartbeat", "details": {"run_id": "r1"}})
    assert beat.status_code == 201 and beat.json() == {
        "id": None,
        "plan_id": plan_id,
        "node": "gpu-01",
        "status": "heartbeat",
        "current": True,
    }
    with db.transaction() as s:
        assert len(s.execute(select(AuditEvent.id)).all()) == events
        assert len(s.execute(select(Report.id)).all()) == reports
    runs = client.get("/v1/nodes/gpu-01/runs").json()["items"]
    assert runs[0]["run_id"] == "r1" and runs[0]["ended_at"] is None and runs[0]["last_heartbeat_at"]
    client.post("/v1/plans", json={**PLAN, "nodes": ["gpu-01"]})
    assert post({"plan_id": plan_id, "status": "heartbeat", "details": {"run_id": "r1"}}).json()["current"] is False


def test_report_bodies_are_checked(client):
    fleet = setup_fleet(client, ["gpu-01"])
    auth = {"Authorization": f"Bearer {fleet['gpu-01']['token']}"}
    r = client.post("/v1/nodes/gpu-01/reports", json={"status": "started"}, headers=auth)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "plan_id"
    r = client.post(
        "/v1/nodes/gpu-01/reports",
        json={"plan_id": fleet["gpu-01"]["plan"]["id"], "status": "running", "details": {"run_id": 7}},
        headers=auth,
    )
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "details.run_id"
    r = client.post(
        "/v1/nodes/gpu-01/reports",
        json={"status": "refused", "message": "key set refused", "details": {"reason": "keyset_untrusted"}},
        headers=auth,
    )
    assert r.status_code == 201 and r.json()["id"] is None
    event = client.get("/v1/audit", params={"node": "gpu-01", "kind": "agent.refused"}).json()["items"][0]
    assert event["plan_id"] is None and event["payload"]["details"]["reason"] == "keyset_untrusted"


def test_runs_answers_which_plan_ran_when(client):
    fleet = setup_fleet(client, ["gpu-01"])
    auth = {"Authorization": f"Bearer {fleet['gpu-01']['token']}"}
    a = fleet["gpu-01"]["plan"]["id"]

    def post(plan, kind, run, **details):
        r = client.post(
            "/v1/nodes/gpu-01/reports",
            json={"plan_id": plan, "status": kind, "details": {"run_id": run, **details}},
            headers=auth,
        )
        assert r.status_code == 201, r.text

    post(a, "started", "r1")
    post(a, "running", "r1")
    post(a, "started", "r2")  # no end report for r1: the node lost power
    b = client.post("/v1/plans", json={**PLAN, "nodes": ["gpu-01"]}).json()["id"]
    post(a, "exited", "r2", status=1, tail=["boom"])  # the end of a run is recorded after the plan was superseded
    r = client.post(
        "/v1/nodes/gpu-01/reports", json={"plan_id": a, "status": "running", "details": {"run_id": "r2"}}, headers=auth
    )
    assert r.status_code == 409  # ... but the superseded plan cannot start running again
    post(b, "started", "r3")
    post(b, "stopped", "r3", signal="SIGTERM", status=0)
    runs = client.get("/v1/nodes/gpu-01/runs").json()["items"]
    assert [(r["run_id"], r["plan_id"], r["seq"], r["end"], r["exit_status"]) for r in runs] == [
        ("r1", a, 1, "interrupted", None),
        ("r2", a, 1, "exited", 1),
        ("r3", b, 2, "stopped", 0),
    ]
    at = client.get("/v1/nodes/gpu-01/runs", params={"at": runs[2]["started_at"]}).json()["items"]
    assert [r["run_id"] for r in at] == ["r3"]
    assert client.get("/v1/nodes/nope/runs").status_code == 404
    bad = client.get("/v1/nodes/gpu-01/runs", params={"since": "2026-01-02T00:00:00Z", "until": "2026-01-01"})
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "until"


def test_reports_delivered_late_keep_the_agents_time(client):
    fleet = setup_fleet(client, ["gpu-01"])
    auth = {"Authorization": f"Bearer {fleet['gpu-01']['token']}"}
    plan = fleet["gpu-01"]["plan"]["id"]
    then = time.time() - 600  # an offline boot ten minutes ago, reported now
    for kind, at in (("started", then), ("exited", then + 5)):
        r = client.post(
            "/v1/nodes/gpu-01/reports",
            headers=auth,
            json={
                "plan_id": plan,
                "status": kind,
                "details": {"run_id": "r1", "at": at, "status": 0, "offline_boot": {"age_seconds": 3600}},
            },
        )
        assert r.status_code == 201
    client.post(
        "/v1/nodes/gpu-01/reports",
        headers=auth,
        json={  # a clock far off is not believed
            "plan_id": plan,
            "status": "started",
            "details": {"run_id": "r2", "at": time.time() - 90 * 86400},
        },
    )
    runs = client.get("/v1/nodes/gpu-01/runs").json()["items"]
    started = [dt.datetime.fromisoformat(r["started_at"]).timestamp() for r in runs]
    assert abs(started[0] - then) < 0.01 and abs(started[1] - time.time()) < 60
    assert dt.datetime.fromisoformat(runs[0]["ended_at"]).timestamp() - started[0] == pytest.approx(5, abs=0.01)
    assert runs[0]["offline_boot"] == {"age_seconds": 3600}


def test_late_reports_are_believed_only_within_the_window(client):
    fleet = setup_fleet(client, ["gpu-01"])
    auth = {"Authorization": f"Bearer {fleet['gpu-01']['token']}"}
    old = fleet["gpu-01"]["plan"]["id"]
    assert client.post("/v1/plans", json={**PLAN, "nodes": ["gpu-01"]}).status_code == 201
    for at in (0, -1e300, 99999999999, time.time() - 40 * 86400):
        r = client.post(
            "/v1/nodes/gpu-01/reports", headers=auth, json={"plan_id": old, "status": "running", "details": {"at": at}}
        )
        assert r.status_code == 409, (at, r.text)
    r = client.post(
        "/v1/nodes/gpu-01/reports",
        headers=auth,
        json={"plan_id": old, "status": "running", "details": {"at": time.time() - 600}},
    )
    assert r.status_code == 201


def test_runs_in_a_past_window_show_how_they_ended(client):
    """A run that ended after the window asked about is not 'still running'."""
    fleet = setup_fleet(client, ["gpu-01"])
    auth = {"Authorization": f"Bearer {fleet['gpu-01']['token']}"}
    plan = fleet["gpu-01"]["plan"]["id"]

    def post(kind, run, **details):
        r = client.post(
            "/v1/nodes/gpu-01/reports",
            headers=auth,
            json={"plan_id": plan, "status": kind, "details": {"run_id": run, **details}},
        )
        assert r.status_code == 201, r.text

    post("started", "r1")
    post("running", "r1")
    started = client.get("/v1/nodes/gpu-01/runs").json()["items"][0]["started_at"]
    time.sleep(0.01)
    post("stopped", "r1", signal="SIGTERM", status=0)
    at = client.get("/v1/nodes/gpu-01/runs", params={"at": started}).json()["items"]
    assert [(r["run_id"], r["end"]) for r in at] == [("r1", "stopped")] and at[0]["ended_at"]
    window = client.get("/v1/nodes/gpu-01/runs", params={"since": started, "until": started}).json()["items"]
    assert window == [] or window[0]["end"] == "stopped"
