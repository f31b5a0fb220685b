"""The agents' hot path: the ASGI fast path answers exactly as the route does; caches stay coherent across service
processes (services/epochs.py); group-committed writes give each request its own outcome (services/agent_writes.py)."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.clock import SYSTEM
from service.db.session import Database
from service.errors import Forbidden, NotFound, Unauthorized
from service.services import agent_writes, epochs
from service.services import tokens as token_service
from tests.support import ADMIN
from tests.support.api import PLAN, fetch, setup_fleet


def comparable(r) -> tuple:
    headers = {k: v for k, v in r.headers.items() if k not in ("x-request-id", "date")}
    return r.status_code, headers, r.content


def count_route_calls(monkeypatch, app) -> list:
    """Record every request that reaches FastAPI's router (its path) and every fetch that goes to the database
    (``db:<node>``): the fast path answers before the router, from memory or through the group commit."""
    calls = []
    router_type = type(app.router)
    original = router_type.__call__

    async def counting(self, scope, receive, send):
        if self is app.router:
            calls.append(scope["path"])
        return await original(self, scope, receive, send)

    monkeypatch.setattr(router_type, "__call__", counting)
    writes = app.state.writes
    to_database = writes.fetch

    async def fetching(item):
        calls.append(f"db:{item.node}")
        return await to_database(item)

    monkeypatch.setattr(writes, "fetch", fetching)
    return calls


def warm(client, monkeypatch, node, token) -> list:
    """Fetch until the fast path answers from memory (an entry read just before the poll saw the plan's creation is
    dropped at that poll, so the first cached answer may take one more fetch). Returns the call log."""
    calls = count_route_calls(monkeypatch, client.app)
    assert eventually(lambda: (n := len(calls), fetch(client, node, token).status_code == 200 and len(calls) == n)[1])
    return calls


def test_fast_path_answers_byte_for_byte_as_the_route(client, monkeypatch):
    fleet = setup_fleet(client, ["gpu-01"])
    token = fleet["gpu-01"]["token"]
    first = fetch(client, "gpu-01", token)  # a miss: the route, which records the fetch and fills the caches
    assert first.status_code == 200
    etag = first.headers["etag"]
    calls = warm(client, monkeypatch, "gpu-01", token)

    def both_from_memory():
        # the fast path steps aside (correctly) whenever the epoch poll is late, as it can be on a loaded machine:
        # what is compared is a pair of answers it gave
        calls.clear()
        pair = fetch(client, "gpu-01", token), fetch(client, "gpu-01", token, **{"If-None-Match": etag})
        return pair if calls == [] else None

    pair = eventually(both_from_memory)
    assert pair is not None, "the fast path never answered two fetches in a row"
    again, cond = pair
    assert comparable(again) == comparable(first)
    assert cond.status_code == 304 and cond.content == b""
    # the same conditional request through the route (a query string skips the fast path) answers the same
    routed = client.get(
        "/v1/nodes/gpu-01/plan?wait=0", headers={"Authorization": f"Bearer {token}", "If-None-Match": etag}
    )
    assert calls == ["/v1/nodes/gpu-01/plan"]
    assert comparable(routed) == comparable(cond)
    assert cond.headers["x-request-id"]  # still logged and counted by Observability
    metrics = client.get("/metrics").text
    assert (
        'route="/v1/nodes/{name}/plan"' in metrics
        and 'preflight_agent_fetches_total{outcome="not_modified"}' in metrics
    )


def test_fast_path_leaves_errors_to_the_route(client, monkeypatch):
    fleet = setup_fleet(client)
    calls = warm(client, monkeypatch, "gpu-01", fleet["gpu-01"]["token"])
    calls.clear()
    other = fetch(client, "gpu-02", fleet["gpu-01"]["token"])  # cached principal, another node's plan
    assert other.status_code == 403 and other.headers["content-type"] == "application/problem+json"
    assert client.get("/v1/nodes/gpu-01/plan", headers={"Authorization": "Basic eDp5"}).status_code == 401
    assert fetch(client, "gpu-01", "pf_not-a-token").status_code == 401
    assert [c for c in calls if not c.startswith("db:")] == ["/v1/nodes/gpu-02/plan", *["/v1/nodes/gpu-01/plan"] * 2]


def test_report_fast_path_answers_as_the_route_and_leaves_errors_to_it(client, monkeypatch):
    import json

    fleet = setup_fleet(client)
    token, plan = fleet["gpu-01"]["token"], fleet["gpu-01"]["plan"]["id"]
    h = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    calls = warm(client, monkeypatch, "gpu-01", token)  # the token's principal is now cached
    calls.clear()
    body = json.dumps({"plan_id": plan, "status": "started", "details": {"run_id": "r1"}})
    fast = client.post("/v1/nodes/gpu-01/reports", headers=h, content=body)
    assert fast.status_code == 201 and calls == []
    # another media type goes to the route: the same answer, the next report id
    routed = client.post(
        "/v1/nodes/gpu-01/reports", headers={**h, "Content-Type": "application/json; charset=utf-8"}, content=body
    )
    assert calls == ["/v1/nodes/gpu-01/reports"]
    assert routed.status_code == 201 and fast.headers["content-type"] == routed.headers["content-type"]
    assert (
        {**fast.json(), "id": None}
        == {**routed.json(), "id": None}
        == {
            "id": None,
            "plan_id": plan,
            "node": "gpu-01",
            "status": "started",
        }
    )
    assert routed.json()["id"] == fast.json()["id"] + 1
    calls.clear()
    refused = [
        client.post("/v1/nodes/gpu-01/reports", headers=h, content=json.dumps({"plan_id": plan, "status": "odd"})),
        client.post("/v1/nodes/gpu-01/reports", headers=h, content=json.dumps({"status": "started"})),
        client.post("/v1/nodes/gpu-01/reports", headers=h, content=b"{not json"),
        client.post("/v1/nodes/gpu-02/reports", headers=h, content=body),  # another node's token
        client.post("/v1/nodes/gpu-01/reports", headers=h, content=body.replace(plan, "no-such-plan")),
    ]
    assert [r.status_code for r in refused] == [422, 422, 422, 403, 404]
    assert all(r.headers["content-type"] == "application/problem+json" for r in refused)
    assert refused[0].json()["errors"][0]["field"] == "status" and refused[1].json()["errors"][0]["field"] == "plan_id"
    assert len([c for c in calls if not c.startswith("db:")]) == 5  # every refusal answered by the route
    started = [
        e for e in client.get("/v1/audit", params={"node": "gpu-01"}).json()["items"] if e["kind"] == "agent.started"
    ]
    assert len(started) == 2  # the two accepted reports, nothing for the refused ones
    assert client.get("/v1/audit/verify").json()["ok"] is True


@pytest.fixture
def second_process(settings, keys):
    """A second service process over the same database (its own caches, watcher and writer)."""
    db2 = Database(settings.resolved_database_url)
    with TestClient(create_app(settings, db=db2, keys=keys)) as c:
        c.headers["Authorization"] = f"Bearer {ADMIN}"
        yield c
    db2.engine.dispose()


def eventually(check, timeout=5.0):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.05)


def test_revocation_in_another_process_reaches_the_cache_within_a_poll(client, second_process, monkeypatch):
    fleet = setup_fleet(client, ["gpu-01"])
    token, plan = fleet["gpu-01"]["token"], fleet["gpu-01"]["plan"]
    warm(client, monkeypatch, "gpu-01", token)  # answered from process 1's memory
    watcher = client.app.state.epochs
    assert second_process.post(f"/v1/plans/{plan['id']}/revoke").status_code == 200
    polls = watcher.polls
    assert eventually(lambda: fetch(client, "gpu-01", token).status_code == 404, timeout=30)
    assert watcher.polls - polls <= 3  # within a poll or two of the change, not the cache's 30 s TTL (120 polls)


def test_new_plan_from_another_process_is_served_at_once_after_a_poll(client, second_process, monkeypatch):
    fleet = setup_fleet(client, ["gpu-01"])
    token = fleet["gpu-01"]["token"]
    warm(client, monkeypatch, "gpu-01", token)
    old = fetch(client, "gpu-01", token)
    r = second_process.post("/v1/plans", json={**PLAN, "nodes": ["gpu-01"]})
    assert r.status_code == 201
    new_seq = str(r.json()["assignments"][0]["seq"])
    assert eventually(lambda: fetch(client, "gpu-01", token).headers.get("x-plan-seq") == new_seq)
    assert new_seq != old.headers["x-plan-seq"]


def test_token_revoked_in_another_process_is_refused_within_a_poll(client, second_process, monkeypatch):
    fleet = setup_fleet(client, ["gpu-01"])
    token = fleet["gpu-01"]["token"]
    warm(client, monkeypatch, "gpu-01", token)
    assert second_process.post("/v1/nodes/gpu-01/token").status_code == 200  # rotation revokes the old token
    assert eventually(lambda: fetch(client, "gpu-01", token).status_code == 401)


def test_caches_unused_while_the_epoch_poll_is_stale(client, monkeypatch):
    fleet = setup_fleet(client, ["gpu-01"])
    token = fleet["gpu-01"]["token"]
    calls = warm(client, monkeypatch, "gpu-01", token)
    client.app.state.epochs.stop()  # no poll: after STALE_AFTER nothing may be answered from memory
    calls.clear()
    assert fetch(client, "gpu-01", token).status_code == 200
    assert calls == ["db:gpu-01"]  # read from the database (by the fast path's group commit, not the router)


def test_epoch_cache_entry_read_under_an_older_epoch_is_not_used(db):
    watcher = epochs.EpochWatcher(db)
    watcher.poll()
    cache = epochs.EpochCache(watcher, "plans", ttl=60)
    tag = cache.tag()  # taken before a database read ...
    with db.transaction() as s:
        epochs.bump(s, "plans")  # ... that a concurrent change overtakes
    watcher.poll()
    cache.put("gpu-01", {"seq": 1}, tag)
    assert cache.get("gpu-01") is None
    cache.put("gpu-01", {"seq": 2}, cache.tag())
    assert cache.get("gpu-01") == {"seq": 2}


# -- group commit ------------------------------------------------------------------------------------------------


def test_batch_gives_each_request_its_own_outcome(client, db):
    fleet = setup_fleet(client)
    t1, t2 = fleet["gpu-01"]["token"], fleet["gpu-02"]["token"]
    p1 = fleet["gpu-01"]["plan"]["id"]
    agent1 = token_service.Principal(role="agent", name="agent:gpu-01", node="gpu-01")
    items = [
        agent_writes.Fetch(t1, None, "gpu-01", ()),  # fine: served and recorded
        agent_writes.Fetch("pf_unknown", None, "gpu-01", ()),  # unknown token
        agent_writes.Fetch(t2, None, "gpu-01", ()),  # another node's token
        agent_writes.Fetch(ADMIN, token_service.Principal(role="admin", name="admin"), "gpu-99", ()),
        agent_writes.Report(agent1, "gpu-01", p1, "running", None, {}),  # fine
        agent_writes.Report(agent1, "gpu-01", "no-such-plan", "running", None, {}),
        agent_writes.Fetch(t1, None, "gpu-01", ()),  # same node again: recorded once
    ]
    with db.transaction() as s:
        out = agent_writes.run_batch(s, items, clock=SYSTEM)
    principal, assignment, served = out[0]
    assert principal.node == "gpu-01" and served and assignment["plan_id"] == p1
    assert isinstance(out[1], Unauthorized) and isinstance(out[2], Forbidden)
    assert isinstance(out[3], NotFound) and out[3].extra["field"] == "name"
    assert out[4]["status"] == "running" and out[4]["id"] > 0
    assert isinstance(out[5], NotFound) and out[5].extra["field"] == "plan_id"
    assert out[6][2] is True
    events = client.get("/v1/audit", params={"node": "gpu-01"}).json()["items"]
    kinds = [e["kind"] for e in events]
    assert kinds.count("plan.fetched") == 1 and kinds.count("agent.running") == 1
    assert client.get("/v1/audit/verify").json()["ok"] is True


def test_a_batch_failing_in_the_database_is_retried_one_by_one(db, monkeypatch):
    real = agent_writes.run_batch

    def poisoned(session, items, *, clock):
        if any(getattr(it, "message", None) == "poison" for it in items):
            raise ValueError("one request's data broke the batch")
        return [f"ok:{it.node}" for it in items]

    monkeypatch.setattr(agent_writes, "run_batch", poisoned)
    writes = agent_writes.AgentWrites(db)
    p = token_service.Principal(role="admin", name="admin")
    items = [agent_writes.Report(p, f"n{i}", "x", "running", "poison" if i == 1 else None, {}) for i in range(3)]
    outcomes = writes._outcomes(items)
    assert [o if isinstance(o, str) else type(o) for o in outcomes] == ["ok:n0", ValueError, "ok:n2"]
    assert real is not poisoned


def test_a_cancelled_request_is_dropped_and_the_writer_keeps_running(client, db):
    import asyncio

    fleet = setup_fleet(client, ["gpu-01"])
    writes = agent_writes.AgentWrites(db, threads=1)
    item = agent_writes.Fetch(fleet["gpu-01"]["token"], None, "gpu-01", ())

    async def fetch():
        gone = asyncio.get_running_loop().create_future()
        gone.cancel()  # the client disconnected before its batch ran
        with writes._cv:
            writes._queue.append((item, gone))
        writes._start()
        return await asyncio.wait_for(writes.fetch(item), timeout=10)

    principal, assignment, served = asyncio.run(fetch())  # answered by the same, still running, thread
    assert served and principal.node == "gpu-01" and assignment["node_name"] == "gpu-01"
    assert all(w.is_alive() for w in writes._workers)
    writes.stop()
    assert writes._workers == []


# -- hostile timing and input on the hot path --------------------------------------------------------------


def test_a_long_poll_stops_when_its_token_is_revoked(client):
    import threading

    fleet = setup_fleet(client, ["gpu-01"])
    token = fleet["gpu-01"]["token"]
    etag = fetch(client, "gpu-01", token).headers["etag"]
    result = {}

    def long_poll():
        result["r"] = client.get(
            "/v1/nodes/gpu-01/plan?wait=10", headers={"Authorization": f"Bearer {token}", "If-None-Match": etag}
        )

    t = threading.Thread(target=long_poll)
    t.start()
    time.sleep(1.0)
    assert client.post("/v1/nodes/gpu-01/token").status_code == 200  # revokes the token the poll holds
    assert client.post("/v1/plans", json={**PLAN, "nodes": ["gpu-01"]}).status_code == 201
    t.join(15)
    assert result["r"].status_code == 401, result["r"].text  # not the new plan


def test_duplicate_headers_get_the_same_answer_on_both_paths(client, monkeypatch):
    fleet = setup_fleet(client)
    own, other = fleet["gpu-01"]["token"], fleet["gpu-02"]["token"]
    warm(client, monkeypatch, "gpu-01", own)
    etag = fetch(client, "gpu-01", own).headers["etag"]
    two_tokens = [("Authorization", f"Bearer {other}"), ("Authorization", f"Bearer {own}")]
    for url in ("/v1/nodes/gpu-01/plan", "/v1/nodes/gpu-01/plan?wait=0"):  # fast path, then the route
        r = client.get(url, headers=two_tokens)
        assert r.status_code == 401 and "exactly one" in r.json()["detail"]
        tags = [("Authorization", f"Bearer {own}"), ("If-None-Match", etag), ("If-None-Match", '"zzz"')]
        assert client.get(url, headers=tags).status_code == 304


def test_if_none_match_star_and_weak_tags_match(client, monkeypatch):
    fleet = setup_fleet(client, ["gpu-01"])
    token = fleet["gpu-01"]["token"]
    etag = fetch(client, "gpu-01", token).headers["etag"]
    for url in ("/v1/nodes/gpu-01/plan?wait=0", "/v1/nodes/gpu-01/plan"):
        for tag in ("*", f"W/{etag}", f'"other", W/{etag}'):
            assert (
                client.get(url, headers={"Authorization": f"Bearer {token}", "If-None-Match": tag}).status_code == 304
            ), (url, tag)
        assert (
            client.get(url, headers={"Authorization": f"Bearer {token}", "If-None-Match": 'W/"other"'}).status_code
            == 200
        )


def test_an_admin_reading_a_plan_is_not_the_agents_delivery(client):
    fleet = setup_fleet(client, ["gpu-01"])
    plan_id = fleet["gpu-01"]["plan"]["id"]
    assert client.get("/v1/nodes/gpu-01/plan").status_code == 200  # the admin token
    fetched = [
        e for e in client.get("/v1/audit", params={"plan": plan_id}).json()["items"] if e["kind"] == "plan.fetched"
    ]
    assert fetched == []
    assert fetch(client, "gpu-01", fleet["gpu-01"]["token"]).status_code == 200
    fetched = [
        e for e in client.get("/v1/audit", params={"plan": plan_id}).json()["items"] if e["kind"] == "plan.fetched"
    ]
    assert [e["actor"] for e in fetched] == ["agent:gpu-01"]
    placement = client.get(f"/v1/plans/{plan_id}/placements").json()["placements"][0]
    assert placement["fetches"] == 1


@pytest.mark.parametrize(
    "figures, field",
    [
        ({"kv_cache_tokens": 1000, "available_kv_cache_gib": 1e300}, "details.vllm.available_kv_cache_gib"),
        ({"kv_cache_tokens": 1000, "available_kv_cache_gib": 1e10}, "details.vllm.available_kv_cache_gib"),
        ({"kv_cache_tokens": 0}, "details.vllm.kv_cache_tokens"),
        ({"kv_cache_tokens": 2**41}, "details.vllm.kv_cache_tokens"),
        ({"kv_cache_tokens": "1000"}, "details.vllm.kv_cache_tokens"),
    ],
)
def test_out_of_range_vllm_figures_are_refused_naming_the_field(client, figures, field):
    fleet = setup_fleet(client, ["gpu-01"])
    r = client.post(
        "/v1/nodes/gpu-01/reports",
        headers={"Authorization": f"Bearer {fleet['gpu-01']['token']}"},
        json={"plan_id": fleet["gpu-01"]["plan"]["id"], "status": "running", "details": {"vllm": figures}},
    )
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == field, r.text
    assert client.get("/v1/calibration").json()["count"] == 0


def test_bad_values_deep_in_a_body_are_named_by_path(client):
    fleet = setup_fleet(client, ["gpu-01"])
    body = {"plan_id": fleet["gpu-01"]["plan"]["id"], "status": "running"}
    for details, field in (({"x": [1, "a\x00"]}, "details.x[1]"), ({"x": {"y": 2**60}}, "details.x.y")):
        r = client.post("/v1/nodes/gpu-01/reports", json={**body, "details": details})
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == field, r.text


def test_node_names_are_checked_alike_on_every_database(client):
    setup_fleet(client, ["gpu-01"])
    r = client.get("/v1/nodes/gpu%00/plan")
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "path.name"
    r = client.post("/v1/nodes/gpu-99/reports", json={"plan_id": "x", "status": "running"})
    assert r.status_code == 404 and r.json()["field"] == "name" and "not registered" in r.json()["detail"]


def test_the_epoch_poll_takes_no_write_lock_on_sqlite(db):
    """SQLite writers queue on one lock (BEGIN IMMEDIATE); the poller, four times a second per process, must not."""
    import threading

    if db.dialect != "sqlite":
        pytest.skip("SQLite's write lock")
    watcher = epochs.EpochWatcher(db)
    with db.transaction() as writer:  # holds the write lock until the block ends
        epochs.bump(writer, "plans")
        done = threading.Event()
        threading.Thread(target=lambda: (watcher.poll(), done.set()), daemon=True).start()
        assert done.wait(5), "the poll waited for the writer's lock"
    watcher.poll()
    assert watcher.current("plans") == 1


def test_changes_are_committed_before_the_response_starts(settings, db, keys):
    """An acknowledgement must be durable: when the response to a revoke, a token rotation or a node registration
    starts, another connection already sees the change (a worker killed right after answering loses nothing)."""
    from sqlalchemy import create_engine, text

    seen = []
    reader = create_engine(settings.resolved_database_url)

    def state() -> tuple:
        with reader.connect() as c:
            return (
                c.execute(text("SELECT status FROM plans ORDER BY created_at DESC LIMIT 1")).scalar(),
                c.execute(text("SELECT count(*) FROM tokens WHERE revoked_at IS NOT NULL")).scalar(),
                c.execute(text("SELECT count(*) FROM nodes")).scalar(),
            )

    class AtResponseStart:
        def __init__(self, app):
            self.app = app

        async def __call__(self, scope, receive, send):
            async def watch(message):
                if message["type"] == "http.response.start" and scope["method"] == "POST":
                    seen.append((scope["path"], state()))
                await send(message)

            return await self.app(scope, receive, watch if scope["type"] == "http" else send)

    app = create_app(settings, db=db, keys=keys)
    app.add_middleware(AtResponseStart)
    with TestClient(app) as c:
        c.headers["Authorization"] = f"Bearer {ADMIN}"
        plan = setup_fleet(c, ["gpu-01"])["gpu-01"]["plan"]
        assert seen[-1][1][2] == 1  # the node registration was visible when its 201 started
        assert c.post(f"/v1/plans/{plan['id']}/revoke").status_code == 200
        assert seen[-1] == (f"/v1/plans/{plan['id']}/revoke", ("revoked", 0, 1))
        assert c.post("/v1/nodes/gpu-01/token").status_code == 200
        assert seen[-1][1][1] == 1  # the old agent token is revoked
    reader.dispose()


def test_report_fast_path_takes_no_body_the_route_would_refuse_for_its_content_type(client, monkeypatch):
    """FastAPI reads the first Content-Type field; a request carrying another before ``application/json`` is the
    route's 422, and the fast path must not store it."""
    import json

    fleet = setup_fleet(client, ["gpu-01"])
    token, plan = fleet["gpu-01"]["token"], fleet["gpu-01"]["plan"]["id"]
    warm(client, monkeypatch, "gpu-01", token)  # the token's principal is now cached
    body = json.dumps({"plan_id": plan, "status": "started"})
    headers = [
        ("Authorization", f"Bearer {token}"),
        ("Content-Type", "text/plain"),
        ("Content-Type", "application/json"),
    ]
    r = client.post("/v1/nodes/gpu-01/reports", headers=headers, content=body)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "body"
    events = client.get("/v1/audit", params={"node": "gpu-01"}).json()["items"]
    assert [e for e in events if e["kind"] == "agent.started"] == []
