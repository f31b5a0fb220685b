"""The scheduler (service/services/rollouts/scheduler.py): a worker dying before or after its commit signs nothing
twice, and the service's own thread steps rollouts with no tick from the test."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from service.api.app import create_app
from service.db.models import Plan
from service.db.session import Database
from service.services import rollouts as rollout_service
from tests.support import ADMIN
from tests.support.rollouts import NODES, Died, Fleet


def test_a_worker_dying_before_its_commit_signed_nothing_and_another_signs_once(fleet, db_url):
    r = fleet.rollout()
    other = Database(db_url)  # a second service process on the same database
    try:

        def die(rid, action):
            raise Died(action)

        assert fleet.tick(after_step=die) == {}  # signed, then died before the commit: nothing of it is kept
        with fleet.db.sessions() as s:
            assert s.scalar(select(func.count()).select_from(Plan)) == 1
        assert fleet.status(r["id"])["state"] == "pending" and fleet.assignments("gpu-01") == 1
        assert fleet.tick(db=other) == {r["id"]: "sign"}
        assert fleet.assignments("gpu-01") == 2
        # the first process is back: it finds the wave signed and does not sign it again
        assert fleet.tick() == {r["id"]: "none"}
        assert fleet.assignments("gpu-01") == 2
        assert [k for k, _, _ in fleet.events(r["id"])].count("rollout.wave_signed") == 1
    finally:
        other.engine.dispose()


def test_a_worker_killed_after_signing_the_next_resumes_without_signing_twice(fleet, quiet, db_url):
    """Two service instances (each its own app, database pool and key store) on one database: A signs wave 1 and
    is stopped before it advances; B goes on from the state A committed and signs each node exactly once."""
    from service.signing import KeyStore

    r = fleet.rollout(waves=[{"percent": 25, "bake_s": 60}, {"percent": 100}])
    instances = []
    for _ in range(2):
        app = create_app(quiet, db=Database(db_url), keys=KeyStore(quiet.key_dir))
        client = TestClient(app)
        client.__enter__()  # lifespan: sealer, epoch watcher (the rollout thread is off: ticks come from the test)
        instances.append((app, client))

    def tick(i, at):
        app = instances[i][0]
        return rollout_service.tick(app.state.db, app.state.context, now=at)

    try:
        t0 = time.time()
        assert tick(0, t0) == {r["id"]: "sign"}
        instances[0][1].__exit__(None, None, None)  # instance A stops between signing and advancing
        instances[0][0].state.db.engine.dispose()
        new_id = fleet.status(r["id"])["nodes"][0]["new_plan_id"]
        fleet.report("gpu-01", new_id, "running")
        assert tick(1, t0 + 1) == {r["id"]: "bake"}
        assert tick(1, t0 + 62) == {r["id"]: "sign"}
        assert [fleet.assignments(n) for n in NODES] == [2, 2, 2, 2]  # each node signed exactly once
        assert [k for k, _, _ in fleet.events(r["id"])].count("rollout.wave_signed") == 2
        for n in NODES[1:]:  # B's wave reaches the agents through B
            got = instances[1][1].get(f"/v1/nodes/{n}/plan", headers={"Authorization": f"Bearer {fleet.tokens[n]}"})
            assert got.status_code == 200 and got.headers["X-Plan-Seq"] == "2"
    finally:
        instances[1][1].__exit__(None, None, None)
        for app, _ in instances:
            app.state.db.engine.dispose()


def test_the_service_steps_rollouts_by_itself(settings, db, keys):
    """The scheduler thread of a service process (PREFLIGHT_ROLLOUT_TICK_SECONDS) signs the first wave with no tick
    from the test: waited for as a condition (up to 30 s), not timed."""
    app = create_app(settings.model_copy(update={"rollout_tick_seconds": 0.05}), db=db, keys=keys)
    with TestClient(app) as c:
        c.headers["Authorization"] = f"Bearer {ADMIN}"
        f = Fleet(c, db, settings, keys)
        agent = {"Authorization": f"Bearer {f.tokens['gpu-01']}"}
        assert c.get("/v1/nodes/gpu-01/plan", headers=agent).headers["X-Plan-Id"] == f.old["id"]  # now cached
        rid = f.rollout()["id"]
        deadline = time.monotonic() + 30
        while f.status(rid)["state"] == "pending" and time.monotonic() < deadline:
            time.sleep(0.05)
        s = f.status(rid)
        assert s["state"] == "waiting" and s["nodes"][0]["new_seq"] == 2
        # the agent's next fetch is the new plan, not the one this process cached
        r = c.get("/v1/nodes/gpu-01/plan", headers=agent)
        assert r.status_code == 200 and r.headers["X-Plan-Id"] == s["nodes"][0]["new_plan_id"]
