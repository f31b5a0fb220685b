"""Staged rollouts over HTTP and the scheduler's tick: waves gated by the agents' reports, the automatic
rollback to each changed node's previous plan with a higher seq, operators' commands, a worker dying mid-rollout,
multi-node groups as one unit, and hostile input. The scheduler thread is off (PREFLIGHT_ROLLOUT_TICK_SECONDS 0):
the tests call ``tick`` with the time they mean."""

from __future__ import annotations

import re
import time

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from service.api.app import create_app
from service.db.models import Assignment, AuditEvent, Plan, Rollout
from service.db.session import Database
from service.services import rollouts as rollout_service
from service.services.context import Context
from service.services.rollouts import common as rollout_common
from service.services.rollouts import stepping
from tests.support import ADMIN
from tests.support.api import register_manifest, register_node

NODES = ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]
OLD = {"tensor_parallel_size": 8, "max_model_len": 8192, "gpu_memory_utilization": 0.9}
NEW = {"tensor_parallel_size": 8, "max_model_len": 16384, "gpu_memory_utilization": 0.9}


@pytest.fixture
def quiet(settings):
    return settings.model_copy(update={"rollout_tick_seconds": 0})


@pytest.fixture
def api(quiet, db, keys):
    app = create_app(quiet, db=db, keys=keys)
    with TestClient(app) as c:
        c.headers["Authorization"] = f"Bearer {ADMIN}"
        yield c


class Fleet:
    """Four 8 × H100 nodes running Llama-3.1-70B at max_model_len 8192 (one plan, seq 1 on each)."""

    def __init__(self, api, db, settings, keys, nodes=NODES):
        self.api, self.db, self.settings, self.keys = api, db, settings, keys
        self.tokens = {n: register_node(api, n)["agent_token"] for n in nodes}
        register_manifest(api)
        r = api.post("/v1/plans", json={"manifest": "meta-llama/Llama-3.1-70B@1", "nodes": nodes, "engine_args": OLD})
        assert r.status_code == 201, r.text
        self.old = r.json()

    def rollout(self, status=201, **extra):
        body = {"manifest": "meta-llama/Llama-3.1-70B@1", "engine_args": NEW, "nodes": NODES,
                "waves": [{"percent": 25, "bake_s": 60}, {"percent": 100}], "failure_limit": 0,
                "gates": {"ready_timeout_s": 300, "kv_tolerance": 0.2}, **extra}
        r = self.api.post("/v1/rollouts", json=body)
        assert r.status_code == status, r.text
        return r.json()

    def tick(self, at=None, db=None, **kw):
        return rollout_service.tick(db or self.db, Context(self.settings, self.keys),
                                    now=time.time() if at is None else at, **kw)

    def status(self, rid):
        r = self.api.get(f"/v1/rollouts/{rid}")
        assert r.status_code == 200, r.text
        return r.json()

    def report(self, node, plan_id, what, **details):
        r = self.api.post(f"/v1/nodes/{node}/reports", headers={"Authorization": f"Bearer {self.tokens[node]}"},
                          json={"plan_id": plan_id, "status": what, "details": details})
        assert r.status_code == 201, r.text

    def current(self, node):
        """(plan id, seq, argv) of the node's current plan, from the API."""
        n = self.api.get(f"/v1/nodes/{node}").json()["plan"]
        plan = self.api.get(f"/v1/plans/{n['id']}").json()
        return n["id"], n["seq"], plan["argv"]

    def assignments(self, node):
        with self.db.sessions() as s:
            return s.scalar(select(func.count()).select_from(Assignment).where(Assignment.node_name == node))

    def predicted(self, plan_id):
        return self.api.get(f"/v1/plans/{plan_id}").json()["budget"]["kv_cache_tokens"]

    def events(self, rid):
        with self.db.sessions() as s:
            return [(e.kind, e.node, e.payload) for e in s.execute(
                select(AuditEvent).where(AuditEvent.subject == f"rollout:{rid}").order_by(AuditEvent.id)).scalars()]


@pytest.fixture
def fleet(api, db, quiet, keys):
    return Fleet(api, db, quiet, keys)


def test_failed_report_in_wave_1_halts_and_restores_only_the_first_node(fleet):
    before = {n: fleet.current(n) for n in NODES}
    r = fleet.rollout()
    assert r["state"] == "pending" and [w["nodes"] for w in r["waves"]] == [["gpu-01"], NODES[1:]]
    assert fleet.tick() == {r["id"]: "sign"}
    s = fleet.status(r["id"])
    first = s["nodes"][0]
    assert s["state"] == "waiting" and first["outcome"] == "pending" and first["new_seq"] == 2
    assert first["previous_plan_id"] == fleet.old["id"]
    new_id, seq, argv = fleet.current("gpu-01")
    assert new_id == first["new_plan_id"] and seq == 2 and argv[argv.index("--max-model-len") + 1] == "16384"
    fleet.report("gpu-01", new_id, "failed", tail="torch.OutOfMemoryError: CUDA out of memory")
    assert fleet.tick() == {r["id"]: "halt"}
    s = fleet.status(r["id"])
    assert s["state"] == "rolled_back" and "failure_limit 0" in s["reason"] and s["failures"] == 1
    assert [w["state"] for w in s["waves"]] == ["halted", "cancelled"]  # the waves end with the rollout
    first = s["nodes"][0]
    assert first["outcome"] == "restored" and first["failed"] is True and first["restored_seq"] == 3
    assert first["evidence"]["reason"] == "report_failed" and first["evidence"]["status"] == "failed"
    assert first["evidence"]["message"] == "torch.OutOfMemoryError: CUDA out of memory"
    # gpu-01 runs its previous command again, as a new plan with a higher seq
    restored_id, seq, argv = fleet.current("gpu-01")
    assert restored_id == first["restored_plan_id"] not in (fleet.old["id"], new_id) and seq == 3
    assert argv == before["gpu-01"][2] and argv[argv.index("--max-model-len") + 1] == "8192"
    # the other three never changed: the same plan, seq 1, nothing else ever assigned
    for n in NODES[1:]:
        assert fleet.current(n) == before[n] and fleet.assignments(n) == 1
        assert s["nodes"][NODES.index(n)]["outcome"] == "unchanged"
    kinds = [k for k, _, _ in fleet.events(r["id"])]
    assert kinds == ["rollout.created", "rollout.wave_signed", "rollout.node_failed", "rollout.halted",
                     "rollout.node_restored", "rollout.rolled_back"]
    restored = next(p for k, _, p in fleet.events(r["id"]) if k == "rollout.node_restored")
    assert restored["previous_plan_id"] == fleet.old["id"] and restored["seq"] == 3
    assert restored["evidence"]["reason"] == "report_failed" and "failure_limit" in restored["reason"]
    assert fleet.tick() == {}  # over: the scheduler leaves it alone


def test_a_clean_wave_advances_after_the_bake_and_completes(fleet):
    r = fleet.rollout()
    # the create answer says how the target was judged, and names the manifest as the caller did
    [judged] = r["judged"]
    assert judged["nodes"] == 4 and judged["gpu"] == "h100-sxm-80gb" and judged["verdict"] in ("accept", "warn")
    assert all({"rule", "severity", "message"} <= set(f) for f in judged["findings"])
    assert r["target"]["manifest"] == "meta-llama/Llama-3.1-70B@1" and isinstance(r["target"]["manifest_id"], int)
    assert fleet.status(r["id"])["judged"] == r["judged"]  # kept: readable until (and after) wave 0 is signed
    t0 = time.time()
    fleet.tick(t0)
    new_id = fleet.status(r["id"])["nodes"][0]["new_plan_id"]
    assert fleet.tick(t0 + 1) == {r["id"]: "none"}  # nothing reported yet: waiting
    predicted = fleet.predicted(new_id)
    fleet.report("gpu-01", new_id, "running", vllm={"kv_cache_tokens": int(predicted * 0.95)})
    assert fleet.tick(t0 + 2) == {r["id"]: "bake"}
    s = fleet.status(r["id"])
    assert s["state"] == "baking" and s["nodes"][0]["outcome"] == "ready"
    assert s["nodes"][0]["evidence"]["kv_relative_error"] == pytest.approx(-0.05, abs=1e-4)
    assert fleet.tick(t0 + 30) == {r["id"]: "none"}  # still baking: wave 2 not signed
    assert all(fleet.assignments(n) == 1 for n in NODES[1:])
    assert fleet.tick(t0 + 63) == {r["id"]: "sign"}
    s = fleet.status(r["id"])
    assert s["state"] == "waiting" and s["wave"] == 1 and [w["state"] for w in s["waves"]] == ["done", "waiting"]
    wave2 = s["waves"][1]["plan_ids"]
    assert len(wave2) == 1 and all(fleet.current(n)[:2] == (wave2[0], 2) for n in NODES[1:])
    for n in NODES[1:3]:
        fleet.report(n, wave2[0], "running", vllm={"kv_cache_tokens": predicted})
    fleet.report("gpu-04", wave2[0], "running")  # no KV figure: the gate passes it and says it judged nothing
    assert fleet.tick(t0 + 64) == {r["id"]: "complete"}
    s = fleet.status(r["id"])
    assert s["state"] == "completed" and {n["outcome"] for n in s["nodes"]} == {"ready"}
    assert s["nodes"][3]["evidence"]["kv_gate"] == "not judged: the running report carried no KV cache figure"
    assert "kv_gate" not in s["nodes"][1]["evidence"]
    assert [w["state"] for w in s["waves"]] == ["done", "done"]
    kinds = [k for k, _, _ in fleet.events(r["id"])]
    assert kinds == ["rollout.created", "rollout.wave_signed", "rollout.wave_settled", "rollout.wave_done",
                     "rollout.wave_signed", "rollout.wave_done", "rollout.completed"]


def test_kv_far_below_the_prediction_halts(fleet):
    r = fleet.rollout()
    fleet.tick()
    new_id = fleet.status(r["id"])["nodes"][0]["new_plan_id"]
    fleet.report("gpu-01", new_id, "running", vllm={"kv_cache_tokens": fleet.predicted(new_id) // 2})
    assert fleet.tick() == {r["id"]: "halt"}
    first = fleet.status(r["id"])["nodes"][0]
    assert first["evidence"]["reason"] == "kv_out_of_range" and first["outcome"] == "restored"
    assert first["evidence"]["kv_relative_error"] == pytest.approx(-0.5, abs=1e-3)


def test_the_kv_gate_judges_the_newest_running_report(fleet):
    r = fleet.rollout(waves=[{"percent": 25, "bake_s": 600}, {"percent": 100}])
    t0 = time.time()
    fleet.tick(t0)
    new_id = fleet.status(r["id"])["nodes"][0]["new_plan_id"]
    fleet.report("gpu-01", new_id, "running")  # no figure yet: ready, "not judged"
    assert fleet.tick(t0 + 1) == {r["id"]: "bake"}
    # vLLM restarted and printed a pool half the prediction: judged now, during the bake
    fleet.report("gpu-01", new_id, "running", vllm={"kv_cache_tokens": fleet.predicted(new_id) // 2})
    assert fleet.tick(t0 + 2) == {r["id"]: "halt"}
    assert fleet.status(r["id"])["nodes"][0]["evidence"]["reason"] == "kv_out_of_range"


def test_a_later_running_report_without_a_figure_hides_no_bad_pool(fleet):
    r = fleet.rollout(waves=[{"percent": 25, "bake_s": 600}, {"percent": 100}])
    fleet.tick()
    new_id = fleet.status(r["id"])["nodes"][0]["new_plan_id"]
    fleet.report("gpu-01", new_id, "running", vllm={"kv_cache_tokens": 10})
    fleet.report("gpu-01", new_id, "running")
    assert fleet.tick() == {r["id"]: "halt"}
    assert fleet.status(r["id"])["nodes"][0]["evidence"]["measured_kv_tokens"] == 10


def test_a_rollout_created_paused_signs_nothing_until_resumed(fleet):
    r = fleet.rollout(paused=True)
    assert r["state"] == "paused" and r["paused_from"] == "pending" and r["judged"][0]["verdict"] in ("accept", "warn")
    assert fleet.tick() == {r["id"]: "none"} and all(fleet.assignments(n) == 1 for n in NODES)
    assert fleet.api.post(f"/v1/rollouts/{r['id']}/resume").json()["state"] == "pending"
    assert fleet.tick() == {r["id"]: "sign"}


def test_an_exited_report_keeps_vllms_exit_status_in_the_evidence(fleet):
    r = fleet.rollout()
    fleet.tick()
    fleet.report("gpu-01", fleet.status(r["id"])["nodes"][0]["new_plan_id"], "exited", status=137)
    assert fleet.tick() == {r["id"]: "halt"}
    ev = fleet.status(r["id"])["nodes"][0]["evidence"]
    assert ev["reason"] == "report_exited" and ev["exit_status"] == 137


def test_kv_gate_off_lets_a_small_pool_pass_and_idempotency_key_replays(fleet):
    body = {"manifest": "meta-llama/Llama-3.1-70B@1", "engine_args": NEW, "nodes": NODES,
            "waves": [{"percent": 25}, {"percent": 100}], "gates": {"kv_tolerance": None}}
    first = fleet.api.post("/v1/rollouts", json=body, headers={"Idempotency-Key": "k1"})
    again = fleet.api.post("/v1/rollouts", json=body, headers={"Idempotency-Key": "k1"})
    assert first.status_code == again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    r = first.json()
    assert again.json()["id"] == r["id"] and r["gates"] == {"ready_timeout_s": 600, "kv_tolerance": None}
    fleet.tick()
    new_id = fleet.status(r["id"])["nodes"][0]["new_plan_id"]
    fleet.report("gpu-01", new_id, "running", vllm={"kv_cache_tokens": fleet.predicted(new_id) // 2})
    assert fleet.tick() == {r["id"]: "sign"}  # not judged: wave 1 settled, bake 0, wave 2 signed


def test_the_metrics_gate_hook_can_halt_a_running_wave(fleet, monkeypatch):
    from service.domain.rollout import Outcome

    seen = []

    def p99_gate(o):
        seen.append(o.node)
        return Outcome("failed", "p99_above_slo", {"p99_s": 4.2, "slo_s": 2.0})

    monkeypatch.setattr(stepping, "METRICS_GATE", p99_gate)
    r = fleet.rollout()
    fleet.tick()
    fleet.report("gpu-01", fleet.status(r["id"])["nodes"][0]["new_plan_id"], "running")
    assert fleet.tick() == {r["id"]: "halt"} and seen == ["gpu-01"]
    first = fleet.status(r["id"])["nodes"][0]
    assert first["evidence"]["reason"] == "p99_above_slo" and first["evidence"]["p99_s"] == 4.2


def test_a_node_not_ready_in_time_halts(fleet):
    r = fleet.rollout()
    t0 = time.time()
    fleet.tick(t0)
    assert fleet.tick(t0 + 299) == {r["id"]: "none"}
    assert fleet.tick(t0 + 301) == {r["id"]: "halt"}
    first = fleet.status(r["id"])["nodes"][0]
    assert first["evidence"]["reason"] == "not_ready" and first["evidence"]["ready_timeout_s"] == 300


def test_failures_within_the_limit_do_not_halt(fleet):
    r = fleet.rollout(failure_limit=1, waves=[{"percent": 50}, {"percent": 100}])
    fleet.tick()
    s = fleet.status(r["id"])
    plan_id = s["waves"][0]["plan_ids"][0]
    fleet.report("gpu-01", plan_id, "refused", reason="signature")
    fleet.report("gpu-02", plan_id, "running")
    assert fleet.tick() == {r["id"]: "sign"}  # one failed unit, limit 1: the wave is settled, bake 0
    s = fleet.status(r["id"])
    assert s["failures"] == 1 and s["nodes"][0]["outcome"] == "failed" and s["wave"] == 1


def test_pause_resume_promote_abort(fleet):
    r = fleet.rollout()
    rid = r["id"]
    t0 = time.time()
    fleet.tick(t0)
    new_id = fleet.status(rid)["nodes"][0]["new_plan_id"]
    fleet.report("gpu-01", new_id, "running")
    fleet.tick(t0 + 1)
    assert fleet.status(rid)["state"] == "baking"
    p = fleet.api.post(f"/v1/rollouts/{rid}/pause", json={"reason": "watching the dashboards"})
    assert p.status_code == 200 and p.json()["state"] == "paused" and p.json()["paused_from"] == "baking"
    assert fleet.tick(t0 + 10_000) == {rid: "none"}  # the bake is long over, but paused: nothing signed
    assert all(fleet.assignments(n) == 1 for n in NODES[1:])
    assert fleet.api.post(f"/v1/rollouts/{rid}/promote").status_code == 409  # resume first
    assert fleet.api.post(f"/v1/rollouts/{rid}/pause").status_code == 409
    res = fleet.api.post(f"/v1/rollouts/{rid}/resume")
    assert res.status_code == 200 and res.json()["state"] == "baking"
    assert fleet.tick(time.time() + 1) == {rid: "none"}  # the bake starts over on resume
    pr = fleet.api.post(f"/v1/rollouts/{rid}/promote")
    assert pr.status_code == 200 and pr.json()["promote"] is True
    assert fleet.tick(time.time() + 2) == {rid: "sign"}  # promoted: wave 2 without waiting for the bake
    s = fleet.status(rid)
    assert s["wave"] == 1 and s["promote"] is False
    wave2 = s["waves"][1]["plan_ids"][0]
    ab = fleet.api.post(f"/v1/rollouts/{rid}/abort", json={"reason": "wrong model"})
    assert ab.status_code == 200, ab.text
    s = ab.json()
    assert s["state"] == "aborted" and s["reason"] == "aborted by admin: wrong model"
    assert {n["outcome"] for n in s["nodes"]} == {"restored"}
    assert [w["state"] for w in s["waves"]] == ["done", "aborted"]
    for n in NODES:  # every node back on max_model_len 8192, each at seq 3
        plan_id, seq, argv = fleet.current(n)
        assert seq == 3 and plan_id not in (new_id, wave2) and argv[argv.index("--max-model-len") + 1] == "8192"
    assert fleet.api.post(f"/v1/rollouts/{rid}/abort").status_code == 409
    assert fleet.tick() == {}
    kinds = [k for k, _, _ in fleet.events(rid)]
    for kind in ("rollout.paused", "rollout.resumed", "rollout.promoted", "rollout.aborted", "rollout.rolled_back"):
        assert kind in kinds
    assert kinds.count("rollout.node_restored") == 4
    paused = next(p for k, _, p in fleet.events(rid) if k == "rollout.paused")
    assert paused["reason"] == "watching the dashboards" and paused["from"] == "baking"


def test_abort_leaves_a_node_someone_planned_since(fleet):
    r = fleet.rollout()
    fleet.tick()
    manual = fleet.api.post("/v1/plans", json={"manifest": "meta-llama/Llama-3.1-70B@1", "nodes": ["gpu-01"],
                                               "engine_args": {**OLD, "max_model_len": 4096}}).json()
    s = fleet.api.post(f"/v1/rollouts/{r['id']}/abort").json()
    assert s["state"] == "aborted" and s["nodes"][0]["outcome"] == "superseded_by_hand"
    assert "no longer the rollout's" in s["nodes"][0]["evidence"]["restore"]
    assert fleet.current("gpu-01")[0] == manual["id"]


def test_a_refused_restore_leaves_it_halted_until_an_operator_aborts(fleet):
    r = fleet.rollout()
    fleet.tick()
    new_id = fleet.status(r["id"])["nodes"][0]["new_plan_id"]
    # gpu-01 lost half its GPUs: its previous plan (TP 8) no longer validates there, so the restore is refused
    assert fleet.api.patch("/v1/nodes/gpu-01", json={"gpu_count": 4}).status_code == 200
    fleet.report("gpu-01", new_id, "failed")
    assert fleet.tick() == {r["id"]: "halt"}
    s = fleet.status(r["id"])
    first = s["nodes"][0]
    assert s["state"] == "halted" and first["outcome"] == "not_restored" and first["failed"] is True
    assert "4 GPUs" in first["evidence"]["restore"] and "LaunchRejected" not in first["evidence"]["restore"]
    assert fleet.current("gpu-01")[:2] == (new_id, 2)  # nothing half-done: the rollout's plan is still current
    assert "rollout.rollback_incomplete" in [k for k, _, _ in fleet.events(r["id"])]
    assert fleet.tick() == {}  # a halted rollout waits for an operator
    assert fleet.api.post(f"/v1/rollouts/{r['id']}/pause").status_code == 409
    # an abort while the restore is still refused keeps it halted (never a final state with a node left behind)
    s = fleet.api.post(f"/v1/rollouts/{r['id']}/abort", json={"reason": "try again"}).json()
    assert s["state"] == "halted" and s["nodes"][0]["outcome"] == "not_restored"
    assert s["reason"].startswith("1 node(s) could not be restored")
    assert fleet.api.patch("/v1/nodes/gpu-01", json={"gpu_count": 8}).status_code == 200  # repaired
    s = fleet.api.post(f"/v1/rollouts/{r['id']}/abort", json={"reason": "GPUs back"}).json()
    assert s["state"] == "aborted" and s["nodes"][0]["outcome"] == "restored" and s["nodes"][0]["restored_seq"] == 3
    assert fleet.current("gpu-01")[2] == fleet.old["argv"]


def test_paused_rollout_still_halts_on_failure(fleet):
    r = fleet.rollout()
    fleet.tick()
    new_id = fleet.status(r["id"])["nodes"][0]["new_plan_id"]
    fleet.api.post(f"/v1/rollouts/{r['id']}/pause")
    fleet.report("gpu-01", new_id, "exited", status=1)
    assert fleet.tick() == {r["id"]: "halt"}
    assert fleet.status(r["id"])["state"] == "rolled_back"


def test_listing_and_auditor_sees_no_env_values(fleet):
    r = fleet.rollout(env={"VLLM_LOGGING_LEVEL": "DEBUG"})
    items = fleet.api.get("/v1/rollouts").json()["items"]
    assert [i["id"] for i in items] == [r["id"]] and items[0]["state"] == "pending"
    assert items[0]["nodes_total"] == 4 and items[0]["failures"] == 0 and "nodes" not in items[0]
    assert fleet.api.get("/v1/rollouts", params={"state": "completed"}).json()["items"] == []
    tok = fleet.api.post("/v1/tokens", json={"role": "auditor"}).json()["token"]
    seen = fleet.api.get(f"/v1/rollouts/{r['id']}", headers={"Authorization": f"Bearer {tok}"}).json()
    assert seen["target"]["env"] == {"VLLM_LOGGING_LEVEL": "<redacted>"}
    assert fleet.api.post(f"/v1/rollouts/{r['id']}/pause",
                          headers={"Authorization": f"Bearer {tok}"}).status_code == 403
    assert fleet.api.get("/v1/rollouts/nope").status_code == 404


# -- a worker dying mid-rollout ----------------------------------------------------------------------------------------

class Died(Exception):
    pass


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


def test_two_workers_on_postgresql_never_step_one_rollout_at_once(fleet, db_url):
    if not db_url.startswith("postgresql"):
        pytest.skip("SKIP LOCKED is PostgreSQL's; SQLite's single write lock serializes the workers")
    r = fleet.rollout()
    other = Database(db_url)
    try:
        with other.transaction() as s:  # worker B holds the rollout's row mid-step
            assert stepping.lock_for_step(s, r["id"]) is not None
            assert fleet.tick() == {}  # worker A skips it instead of waiting or signing too
        assert fleet.tick() == {r["id"]: "sign"}
        assert fleet.assignments("gpu-01") == 2
    finally:
        other.engine.dispose()


# -- a multi-node group moves as one unit ------------------------------------------------------------------------------

H200 = ["h200-a", "h200-b", "h200-c", "h200-d"]
TP16 = {"tensor_parallel_size": 16, "max_model_len": 32768}


@pytest.fixture
def groups(api, db, quiet, keys):
    f = Fleet.__new__(Fleet)
    f.api, f.db, f.settings, f.keys = api, db, quiet, keys
    f.tokens = {}
    for i, n in enumerate(H200):
        r = api.post("/v1/nodes", json={"name": n, "gpu": "h200-141gb", "gpu_count": 8, "interconnect": "nvlink",
                                        "address": f"10.0.0.{i + 1}"})
        assert r.status_code == 201, r.text
        f.tokens[n] = r.json()["agent_token"]
    register_manifest(api, fixture="deepseek-ai__DeepSeek-V3", name="deepseek-ai/DeepSeek-V3")
    r = api.post("/v1/plans", json={"manifest": "deepseek-ai/DeepSeek-V3@1", "nodes": H200, "engine_args": TP16,
                                    "group_env": [{"NCCL_SOCKET_IFNAME": "eth0"}, {"NCCL_SOCKET_IFNAME": "eth1"}]})
    assert r.status_code == 201, r.text
    f.old = r.json()
    return f


def test_a_multi_node_group_moves_as_one_unit_in_one_wave(groups):
    body = {"manifest": "deepseek-ai/DeepSeek-V3@1", "engine_args": {**TP16, "max_model_len": 16384},
            "nodes": H200, "waves": [{"percent": 25}, {"percent": 100}], "gates": {"kv_tolerance": None}}
    r = groups.api.post("/v1/rollouts", json=body)
    assert r.status_code == 201, r.text
    r = r.json()
    # 25 % of four nodes is one node, but h200-a heads a two-node instance: the wave takes the group
    assert [w["nodes"] for w in r["waves"]] == [["h200-a", "h200-b"], ["h200-c", "h200-d"]]
    assert [n["head"] for n in r["nodes"]] == [True, False, True, False]
    assert groups.tick() == {r["id"]: "sign"}
    s = groups.status(r["id"])
    [plan_id] = s["waves"][0]["plan_ids"]
    plan = groups.api.get(f"/v1/plans/{plan_id}").json()
    assert [g["nodes"] for g in plan["groups"]] == [["h200-a", "h200-b"]]
    assert [groups.current(n)[1] for n in H200] == [2, 2, 1, 1]
    groups.report("h200-b", plan_id, "exited", status=1)  # the worker's vLLM ended: the instance failed
    assert groups.tick() == {r["id"]: "halt"}
    s = groups.status(r["id"])
    assert s["failures"] == 1 and [n["outcome"] for n in s["nodes"]] == ["restored", "restored", "unchanged",
                                                                         "unchanged"]
    restored = {n["restored_plan_id"] for n in s["nodes"][:2]}
    assert len(restored) == 1  # the group restored together, in one plan
    again = groups.api.get(f"/v1/plans/{restored.pop()}").json()
    assert [g["nodes"] for g in again["groups"]] == [["h200-a", "h200-b"]]
    assert [a["seq"] for a in again["assignments"]] == [3, 3]
    assert again["argv"] == groups.old["argv"]
    assert [groups.current(n)[:2] for n in H200[2:]] == [(groups.old["id"], 1)] * 2


def test_restoring_the_second_group_of_a_plan_gives_it_its_own_group_env(groups):
    body = {"manifest": "deepseek-ai/DeepSeek-V3@1", "engine_args": {**TP16, "max_model_len": 16384},
            "nodes": ["h200-c", "h200-d", "h200-a", "h200-b"], "waves": [{"percent": 50}, {"percent": 100}]}
    rid = groups.api.post("/v1/rollouts", json=body).json()["id"]
    groups.tick()
    s = groups.status(rid)
    assert s["waves"][0]["nodes"] == ["h200-c", "h200-d"]
    groups.report("h200-c", s["waves"][0]["plan_ids"][0], "failed")
    assert groups.tick() == {rid: "halt"}
    restored = groups.status(rid)["nodes"][0]["restored_plan_id"]
    again = groups.api.get(f"/v1/plans/{restored}").json()
    [group] = again["groups"]
    assert group["nodes"] == ["h200-c", "h200-d"] and group["head_address"] == "10.0.0.3"
    assert group["env"] == {"NCCL_SOCKET_IFNAME": "eth1"}  # group 1 of the old plan, not group 0's eth0
    assert [groups.current(n)[:2] for n in ("h200-a", "h200-b")] == [(groups.old["id"], 1)] * 2


def test_a_group_head_running_settles_its_unit(groups):
    body = {"manifest": "deepseek-ai/DeepSeek-V3@1", "engine_args": {**TP16, "max_model_len": 16384},
            "nodes": H200, "waves": [{"percent": 50}, {"percent": 100}], "gates": {"kv_tolerance": None}}
    rid = groups.api.post("/v1/rollouts", json=body).json()["id"]
    groups.tick()
    plan_id = groups.status(rid)["waves"][0]["plan_ids"][0]
    t0 = time.time()
    groups.report("h200-a", plan_id, "running")  # the head is ready; its headless worker reports nothing
    assert groups.tick(t0 + 1) == {rid: "sign"}
    s = groups.status(rid)
    assert [(n["node"], n["outcome"]) for n in s["nodes"][:2]] == [("h200-a", "ready"), ("h200-b", "ready")]
    assert s["nodes"][1]["evidence"] == {"ready_with_head": True}
    # long after ready_timeout_s (600 s), the worker that never reports running is still not a failure
    plan2 = s["waves"][1]["plan_ids"][0]
    assert groups.tick(t0 + 700) == {rid: "halt"}  # wave 2's head never reported: that unit fails, not wave 1's
    s = groups.status(rid)
    assert s["failures"] == 1 and [n["failed"] for n in s["nodes"]] == [False, False, True, False]
    assert s["nodes"][2]["evidence"]["reason"] == "not_ready" and plan2
    assert [w["state"] for w in s["waves"]] == ["done", "halted"]


def test_a_completed_group_rollout_shows_every_member_ready(groups):
    body = {"manifest": "deepseek-ai/DeepSeek-V3@1", "engine_args": {**TP16, "max_model_len": 16384},
            "nodes": H200, "waves": [{"percent": 100}], "gates": {"kv_tolerance": None}}
    rid = groups.api.post("/v1/rollouts", json=body).json()["id"]
    t0 = time.time()
    groups.tick(t0)
    plan_id = groups.status(rid)["waves"][0]["plan_ids"][0]
    for head in ("h200-a", "h200-c"):
        groups.report(head, plan_id, "running")
    assert groups.tick(t0 + 1) == {rid: "complete"}
    s = groups.status(rid)
    assert s["state"] == "completed" and [n["outcome"] for n in s["nodes"]] == ["ready"] * 4


def test_a_rollout_may_not_split_a_running_group(groups):
    r = groups.api.post("/v1/rollouts", json={"manifest": "deepseek-ai/DeepSeek-V3@1", "engine_args": TP16,
                                              "nodes": ["h200-a", "h200-c", "h200-d"], "waves": [{"percent": 100}]})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "nodes.0"
    assert r.json()["errors"][0]["rule"] == "partial_group"


# -- hostile input -----------------------------------------------------------------------------------------------------

def test_a_node_listed_twice_is_422_naming_the_repeat_for_rollouts_plans_and_dry_runs(fleet):
    twice = ["gpu-01", "gpu-02", "gpu-01"]
    r = fleet.api.post("/v1/rollouts", json={"manifest": "meta-llama/Llama-3.1-70B@1", "engine_args": NEW,
                                              "nodes": twice, "waves": [{"percent": 100}]})
    p = fleet.api.post("/v1/plans", json={"manifest": "meta-llama/Llama-3.1-70B@1", "nodes": twice,
                                          "engine_args": NEW})
    d = fleet.api.post("/v1/plans?dry_run=true", json={"manifest": "meta-llama/Llama-3.1-70B@1", "nodes": twice,
                                                       "engine_args": NEW})
    for resp in (r, p, d):
        assert resp.status_code == 422, resp.text
        [err] = resp.json()["errors"]
        assert err["field"] == "nodes.2" and err["rule"] == "duplicate_node" and "nodes.0" in err["message"]
    assert _stored(fleet)[0] == 0 and all(fleet.assignments(n) == 1 for n in NODES)


def _stored(fleet):
    with fleet.db.sessions() as s:
        return (s.scalar(select(func.count()).select_from(Rollout)),
                s.scalar(select(func.count()).select_from(AuditEvent).where(AuditEvent.kind.like("rollout.%"))))


@pytest.mark.parametrize("extra, field", [
    ({"waves": [{"percent": 50}, {"percent": 50}, {"percent": 100}]}, "waves.1.percent"),
    ({"waves": [{"percent": 50}, {"percent": 101}]}, "waves.1.percent"),
    ({"waves": [{"percent": 10}, {"percent": 60}]}, "waves.1.percent"),
    ({"waves": [{"percent": 0}, {"percent": 100}]}, "waves.0.percent"),
    ({"waves": [{"percent": "50"}, {"percent": 100}]}, "waves.0.percent"),
    ({"waves": []}, "waves"),
    ({"waves": [{"percent": 100, "bake_s": -5}]}, "waves.0.bake_s"),
    ({"nodes": ["gpu-01", "gpu-02", "gpu-99"]}, "nodes.2"),
    ({"nodes": [f"n{i}" for i in range(5000)]}, "nodes"),
    ({"nodes": ["bad name"]}, "nodes.0"),
    ({"nodes": []}, "nodes"),
    ({"selector": {"gpu": "h100-sxm-80gb"}}, "nodes"),  # nodes and selector both
    ({"failure_limit": -1}, "failure_limit"),
    ({"gates": {"ready_timeout_s": 0}}, "gates.ready_timeout_s"),
    ({"group_env": [{}]}, "group_env"),
])
def test_bad_rollouts_are_422_naming_the_field_and_store_nothing(fleet, extra, field):
    body = fleet.rollout(status=422, **extra)
    assert field in [e["field"] for e in body["errors"]], body
    assert _stored(fleet) == (0, 0)


def test_a_rejected_target_is_the_plans_422_with_findings_and_stores_nothing(fleet):
    body = fleet.rollout(status=422, engine_args={"tensor_parallel_size": 3})
    assert body["status"] == 422 and "tp_heads_divisible" in {f["rule"] for f in body["findings"]}
    heads = next(f for f in body["findings"] if f["rule"] == "tp_heads_divisible")
    assert heads["remedy"] == {"tensor_parallel_size": [1, 2, 4, 8]}  # Llama-3.1-70B: 64 heads, 8 KV heads
    assert _stored(fleet) == (0, 0)
    assert all(fleet.assignments(n) == 1 for n in NODES)


def test_selector_over_inventory_fields(fleet):
    fleet.api.patch("/v1/nodes/gpu-03", json={"labels": {"pool": "canary"}})
    r = fleet.rollout(nodes=None, selector={"gpu": "NVIDIA H100 80GB HBM3", "labels": {"pool": "canary"}},
                      waves=[{"percent": 100}])
    assert [n["node"] for n in r["nodes"]] == ["gpu-03"] and r["selector"]["labels"] == {"pool": "canary"}
    none = fleet.rollout(status=422, nodes=None, selector={"gpu": "a100-sxm4-80gb"})
    assert none["errors"][0]["field"] == "selector"


def test_a_node_without_a_plan_or_in_another_rollout_is_refused(fleet):
    register_node(fleet.api, "gpu-05")
    body = fleet.rollout(status=422, nodes=NODES + ["gpu-05"])
    assert body["errors"][0]["field"] == "nodes.4" and body["errors"][0]["rule"] == "no_current_plan"
    by_selector = fleet.rollout(status=422, nodes=None, selector={"gpu": "h100-sxm-80gb"})
    assert by_selector["errors"][0]["field"] == "selector" and "gpu-05" in by_selector["detail"]
    fleet.rollout(nodes=["gpu-02"], waves=[{"percent": 100}])
    busy = fleet.rollout(status=409)
    assert busy["field"] == "nodes.1"


# -- the CLI -------------------------------------------------------------------------------------------------------------

def test_cli_rollout_create_status_pause_resume_promote_abort(fleet, tmp_path, monkeypatch):
    import json

    from typer.testing import CliRunner

    from service import cli

    # the CLI's HTTP calls go to the test app
    monkeypatch.setattr(cli.common, "client", lambda server, token: fleet.api)
    run = lambda *args: CliRunner().invoke(cli.app, [*args, "--server", "http://x", "--token", ADMIN])  # noqa: E731
    spec = tmp_path / "rollout.json"
    spec.write_text(json.dumps({"manifest": "meta-llama/Llama-3.1-70B@1", "engine_args": NEW, "nodes": NODES,
                                "waves": [{"percent": 25, "bake_s": 600}, {"percent": 100}]}))
    out = run("rollout", "create", str(spec))
    assert out.exit_code == 0, out.output
    rid = out.output.split()[1].rstrip(":")
    assert "meta-llama/Llama-3.1-70B@1" in out.output.splitlines()[0]
    assert re.search(r"^  judged 4 node\(s\) of 8 x h100-sxm-80gb: (accept|warn)", out.output, re.M), out.output
    fleet.tick()
    out = run("rollout", "status", rid)
    assert out.exit_code == 5  # still going
    assert f"rollout {rid}: waiting (wave 0), meta-llama/Llama-3.1-70B@1, failures 0 (limit 0)" in out.output
    assert "gpu-01: wave 0, pending, seq 2" in out.output and "gpu-02: wave 1, unchanged" in out.output
    assert run("rollout", "pause", rid, "--reason", "lunch").exit_code == 0
    assert "paused" in run("rollout", "status").output
    bad = run("rollout", "promote", rid)
    assert bad.exit_code == 1 and "HTTP 409" in bad.output
    assert "waiting" in run("rollout", "resume", rid).output
    assert run("rollout", "promote", rid).exit_code == 0
    out = run("rollout", "abort", rid)
    assert out.exit_code == 0 and "aborted" in out.output and "gpu-01: wave 0, restored" in out.output
    assert run("rollout", "status", rid).exit_code == 4  # scripts can tell an aborted rollout
    waited = run("rollout", "wait", rid, "--interval", "0.5")
    assert waited.exit_code == 4 and waited.output.startswith(f"rollout {rid}: aborted")
    bad_file = tmp_path / "bad.json"
    bad_file.write_text("{not json")
    assert run("rollout", "create", str(bad_file)).exit_code == 2
    refused = tmp_path / "refused.json"
    refused.write_text(json.dumps({"manifest": "meta-llama/Llama-3.1-70B@1", "nodes": NODES,
                                   "engine_args": {"tensor_parallel_size": 3}, "waves": [{"percent": 100}]}))
    out = run("rollout", "create", str(refused))
    assert out.exit_code == 1 and "tp_heads_divisible" in out.output


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


def test_the_fleet_page_lists_rollouts(fleet):
    r = fleet.rollout()
    fleet.tick()
    fleet.report("gpu-01", fleet.status(r["id"])["nodes"][0]["new_plan_id"], "failed")
    fleet.tick()
    page = fleet.api.get("/ui/")
    assert page.status_code == 200
    row = page.text[page.text.index(f'data-rollout="{r["id"]}"'):]
    row = row[:row.index("</tr>")]
    assert "rolled_back" in row and "0 of 0–1" in row and "25 %, 100 %" in row and "1 / 0" in row
    assert "failure_limit 0" in row


def test_a_rollouts_page_shows_its_waves_nodes_evidence_and_steps(fleet):
    r = fleet.rollout()
    fleet.tick()
    new_id = fleet.status(r["id"])["nodes"][0]["new_plan_id"]
    fleet.report("gpu-01", new_id, "failed", tail="torch.OutOfMemoryError: <b>CUDA</b> \u202eevil\u3164")
    fleet.tick()
    fleet_page = fleet.api.get("/ui/").text
    assert f'<a href="/ui/rollouts/{r["id"]}">' in fleet_page and "meta-llama/Llama-3.1-70B@1" in fleet_page
    page = fleet.api.get(f"/ui/rollouts/{r['id']}")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    html = page.text
    row = html[html.index('data-node="gpu-01"'):]
    row = row[:row.index("</tr>")]
    assert "restored" in row and f'/ui/plans/{new_id}' in row and "report_failed" in row
    assert "&lt;b&gt;CUDA&lt;/b&gt;" in row and "<b>CUDA</b>" not in html  # what an agent sent is escaped
    assert "\\u202eevil\\u3164" in row and "\u202e" not in html and "\u3164" not in html  # and shown as it is
    waves = html[html.index('id="waves"'):html.index('id="rollout-nodes"')]
    assert waves.count("status-halted") == 1 and waves.count("status-cancelled") == 1
    assert 'data-kind="rollout.halted"' in html and 'data-kind="rollout.node_restored"' in html
    assert fleet.api.get("/ui/rollouts/no-such-rollout").status_code == 404
    assert fleet.api.get("/ui/rollouts/" + "x" * 300).status_code == 404


def test_a_wave_refused_at_signing_halts_and_restores_what_changed(fleet):
    r = fleet.rollout(waves=[{"percent": 25}, {"percent": 100}])
    fleet.tick()
    fleet.report("gpu-01", fleet.status(r["id"])["nodes"][0]["new_plan_id"], "running")
    # the inventory changed since the rollout was validated: gpu-03 now has 4 GPUs, TP 8 does not fit it
    assert fleet.api.patch("/v1/nodes/gpu-03", json={"gpu_count": 4}).status_code == 200
    assert fleet.tick() == {r["id"]: "halt"}
    s = fleet.status(r["id"])
    assert s["state"] == "rolled_back" and s["reason"].startswith("signing wave 1 was refused")
    assert [n["outcome"] for n in s["nodes"]] == ["restored", "unchanged", "unchanged", "unchanged"]
    assert [fleet.assignments(n) for n in NODES] == [3, 1, 1, 1]  # nothing of wave 1 was kept
    assert s["waves"][1]["plan_ids"] == [] and s["waves"][1]["signed_at"] is None
    assert [w["state"] for w in s["waves"]] == ["done", "halted"]  # the wave refused at signing, not "cancelled"


# -- what the canary proved is what the fleet gets -----------------------------

GIB = 1 << 30
WORKLOAD = {"avg_seq_len": 3000, "p99_seq_len": 12000, "shape": "long_in_short_out", "stage": "initial"}


def _argv(fleet, plan_id):
    return fleet.api.get(f"/v1/plans/{plan_id}").json()["argv"]


def test_a_pinned_pool_is_decided_once_and_every_wave_gets_it(fleet):
    # only gpu-03 ran this launch and reported its pool; the canary gpu-01 never did
    fleet.report("gpu-03", fleet.old["id"], "running", vllm={"available_kv_cache_gib": 21.5})
    r = fleet.rollout(engine_args=OLD, kv_cache_pool="pinned", nodes=["gpu-01", "gpu-03"],
                      waves=[{"percent": 50, "bake_s": 1}, {"percent": 100}], gates={"kv_tolerance": None})
    [pin] = r["pinned"].values()
    assert pin["kv_cache_memory_bytes"] == int(21.5 * GIB) and pin["vllm_version"] == fleet.old["vllm_version"]
    t0 = time.time()
    assert fleet.tick(t0) == {r["id"]: "sign"}  # before: a refusal (gpu-01 alone has no report) and a rollback
    s = fleet.status(r["id"])
    first = s["waves"][0]["plan_ids"][0]
    argv0 = _argv(fleet, first)
    assert s["state"] == "waiting" and argv0[argv0.index("--kv-cache-memory-bytes") + 1] == str(int(21.5 * GIB))
    fleet.report("gpu-01", first, "running")
    fleet.tick(t0 + 1)
    assert fleet.tick(t0 + 3) == {r["id"]: "sign"}
    second = fleet.status(r["id"])["waves"][1]["plan_ids"][0]
    assert _argv(fleet, second) == argv0


def test_every_wave_signs_the_command_the_canary_ran(fleet):
    r = fleet.rollout(workload=WORKLOAD, environment="benchmark", gates={"kv_tolerance": None},
                      waves=[{"percent": 25, "bake_s": 1}, {"percent": 100}])
    [pin] = r["pinned"].values()
    assert pin["vllm_version"] and "max_num_seqs" in pin["engine_args"]  # recommendations filled in and pinned
    t0 = time.time()
    fleet.tick(t0)
    canary = fleet.status(r["id"])["waves"][0]["plan_ids"][0]
    fleet.report("gpu-01", canary, "running")
    fleet.tick(t0 + 1)
    assert fleet.tick(t0 + 3) == {r["id"]: "sign"}
    rest = fleet.status(r["id"])["waves"][1]["plan_ids"][0]
    a, b = _argv(fleet, canary), _argv(fleet, rest)
    assert a == b and a[a.index("--max-num-seqs") + 1] == str(pin["engine_args"]["max_num_seqs"])
    versions = {fleet.api.get(f"/v1/plans/{p}").json()["vllm_version"] for p in (canary, rest)}
    assert versions == {pin["vllm_version"]}


def test_a_wave_never_splits_a_multi_node_instance_planned_since_creation(fleet):
    r = fleet.rollout(nodes=NODES[:3], waves=[{"percent": 33}, {"percent": 100}], gates={"kv_tolerance": None})
    t0 = time.time()
    fleet.tick(t0)
    fleet.report("gpu-01", fleet.status(r["id"])["waves"][0]["plan_ids"][0], "running")
    # by hand: gpu-02 (wave 1 of the rollout) and gpu-04 (outside it) become one two-node instance
    assert fleet.api.patch("/v1/nodes/gpu-02", json={"address": "10.0.0.2"}).status_code == 200
    hand = fleet.api.post("/v1/plans", json={"manifest": "meta-llama/Llama-3.1-70B@1", "nodes": ["gpu-02", "gpu-04"],
                                             "engine_args": {**OLD, "pipeline_parallel_size": 2}})
    assert hand.status_code == 201, hand.text
    [warning] = hand.json()["warnings"]
    assert warning["rule"] == "rollout_in_progress" and warning["rollout"] == r["id"] and warning["nodes"] == ["gpu-02"]
    assert fleet.tick(t0 + 1) == {r["id"]: "sign"}  # gpu-02 was planned since creation: left alone, not split
    s = fleet.status(r["id"])
    assert [n["outcome"] for n in s["nodes"]] == ["ready", "superseded_by_hand", "pending"]
    assert s["nodes"][1]["new_plan_id"] is None and s["nodes"][1]["evidence"]["current_plan_id"] == hand.json()["id"]
    # the instance is whole: both members still on the hand-made plan
    assert fleet.current("gpu-02")[0] == fleet.current("gpu-04")[0] == hand.json()["id"]
    assert fleet.current("gpu-03")[0] == s["nodes"][2]["new_plan_id"]


def test_a_node_planned_by_hand_during_its_wave_is_superseded_not_failed(fleet):
    r = fleet.rollout()
    t0 = time.time()
    fleet.tick(t0)
    manual = fleet.api.post("/v1/plans", json={"manifest": "meta-llama/Llama-3.1-70B@1", "nodes": ["gpu-01"],
                                               "engine_args": {**OLD, "max_model_len": 4096}})
    assert manual.status_code == 201 and manual.json()["warnings"][0]["rollout"] == r["id"]
    assert fleet.tick(t0 + 400) == {r["id"]: "bake"}  # past ready_timeout_s: not "not_ready", no rollback
    s = fleet.status(r["id"])
    first = s["nodes"][0]
    assert s["failures"] == 0 and first["outcome"] == "superseded_by_hand" and first["failed"] is False
    assert first["evidence"]["current_plan_id"] == manual.json()["id"]
    ab = fleet.api.post(f"/v1/rollouts/{r['id']}/abort").json()
    assert ab["nodes"][0]["outcome"] == "superseded_by_hand" and fleet.current("gpu-01")[0] == manual.json()["id"]
    done = [p for k, _, p in fleet.events(r["id"]) if k == "rollout.rolled_back"]
    assert done[-1]["not_restored"] == 0
    # no rollout in progress now: no warning
    again = fleet.api.post("/v1/plans", json={"manifest": "meta-llama/Llama-3.1-70B@1", "nodes": ["gpu-02"],
                                              "engine_args": OLD})
    assert "warnings" not in again.json()


def test_a_node_planned_by_hand_before_its_wave_is_left_alone(fleet):
    r = fleet.rollout(waves=[{"percent": 25}, {"percent": 100}])
    assert [n["previous_plan_id"] for n in r["nodes"]] == [fleet.old["id"]] * 4  # recorded at creation
    t0 = time.time()
    fleet.tick(t0)
    fleet.report("gpu-01", fleet.status(r["id"])["nodes"][0]["new_plan_id"], "running")
    hotfix = fleet.api.post("/v1/plans", json={"manifest": "meta-llama/Llama-3.1-70B@1", "nodes": ["gpu-03"],
                                               "engine_args": {**OLD, "max_model_len": 4096}})
    assert hotfix.status_code == 201 and hotfix.json()["warnings"][0]["rule"] == "rollout_in_progress"
    assert fleet.tick(t0 + 1) == {r["id"]: "sign"}
    s = fleet.status(r["id"])
    third = s["nodes"][2]
    assert third["outcome"] == "superseded_by_hand" and third["new_plan_id"] is None
    assert third["evidence"]["current_plan_id"] == hotfix.json()["id"] and third["evidence"]["before_wave"] is True
    assert fleet.current("gpu-03")[0] == hotfix.json()["id"]  # the operator's plan was not overwritten
    assert s["waves"][1]["nodes"] == ["gpu-02", "gpu-03", "gpu-04"]
    signed = {n["node"] for n in s["nodes"] if n["new_plan_id"] and n["wave"] == 1}
    assert signed == {"gpu-02", "gpu-04"}
    for n in ("gpu-02", "gpu-04"):
        fleet.report(n, s["nodes"][NODES.index(n)]["new_plan_id"], "running")
    assert fleet.tick(t0 + 2) == {r["id"]: "complete"}
    s = fleet.status(r["id"])
    assert s["outcomes"] == {"ready": 3, "superseded_by_hand": 1}


def test_a_rollback_never_signs_a_revoked_plan_again(fleet):
    r = fleet.rollout(waves=[{"percent": 25}, {"percent": 100}])
    fleet.tick()
    new_id = fleet.status(r["id"])["nodes"][0]["new_plan_id"]
    # the plan gpu-01 ran before is withdrawn (gpu-02..04 still run it, so the revoke is allowed)
    assert fleet.api.post(f"/v1/plans/{fleet.old['id']}/revoke").status_code == 200
    fleet.report("gpu-01", new_id, "failed")
    assert fleet.tick() == {r["id"]: "halt"}
    s = fleet.status(r["id"])
    first = s["nodes"][0]
    assert s["state"] == "halted" and first["outcome"] == "not_restored"
    assert "revoked" in first["evidence"]["restore"] and fleet.current("gpu-01")[0] == new_id
    # the operator gives gpu-01 a plan, then aborts: it is left with theirs
    fix = fleet.api.post("/v1/plans", json={"manifest": "meta-llama/Llama-3.1-70B@1", "nodes": ["gpu-01"],
                                            "engine_args": OLD})
    assert fix.status_code == 201
    ab = fleet.api.post(f"/v1/rollouts/{r['id']}/abort").json()
    assert ab["state"] == "aborted" and ab["nodes"][0]["outcome"] == "superseded_by_hand"
    assert fleet.current("gpu-01")[0] == fix.json()["id"]


def test_a_restore_keeps_the_previous_plans_tuning(fleet):
    tuned = fleet.api.post("/v1/plans", json={
        "manifest": "meta-llama/Llama-3.1-70B@1", "nodes": ["gpu-01"], "engine_args": OLD,
        "workload": {"avg_seq_len": 2000, "p99_seq_len": 6000, "shape": "balanced", "stage": "initial"},
        "tuning": {"slo_ttft_p99_s": 0.5, "slo_e2e_p99_s": 9}})
    assert tuned.status_code == 201, tuned.text
    slo = fleet.api.get(f"/v1/plans/{tuned.json()['id']}").json()["tuning"]["slo"]
    r = fleet.rollout(waves=[{"percent": 25}, {"percent": 100}])
    fleet.tick()
    fleet.report("gpu-01", fleet.status(r["id"])["nodes"][0]["new_plan_id"], "failed")
    assert fleet.tick() == {r["id"]: "halt"}
    restored = fleet.status(r["id"])["nodes"][0]["restored_plan_id"]
    assert fleet.api.get(f"/v1/plans/{restored}").json()["tuning"]["slo"] == slo


def test_a_large_wave_is_signed_and_restored_in_chunks_of_the_plan_cap(api, db, quiet, keys, monkeypatch):
    monkeypatch.setattr(rollout_common, "SIGN_CHUNK", 16)  # 256 in service: 16 keeps the test small
    names = [f"n-{i:03d}" for i in range(40)]
    fleet = Fleet(api, db, quiet, keys, nodes=names)
    r = fleet.rollout(nodes=names, waves=[{"percent": 100}], gates={"kv_tolerance": None})

    chunks = []

    def die_on_the_second_chunk(rid, action):
        chunks.append(action)
        if len(chunks) == 2:
            raise Died(action)

    # the first chunk commits, the second dies before its commit: 16 nodes signed, nothing more
    assert fleet.tick(after_step=die_on_the_second_chunk) == {} and chunks == ["signing", "signing"]
    assert sum(fleet.assignments(n) == 2 for n in names) == 16
    assert fleet.tick() == {r["id"]: "sign"}  # resumes: the other 24, each once
    assert [fleet.assignments(n) for n in names] == [2] * 40
    s = fleet.status(r["id"])
    assert len(s["waves"][0]["plan_ids"]) == 3
    sizes = [len(fleet.api.get(f"/v1/plans/{p}").json()["assignments"]) for p in s["waves"][0]["plan_ids"]]
    assert sizes == [16, 16, 8]
    # abort restores one chunk in the request and answers "aborting"; the scheduler restores the rest, a chunk per
    # transaction
    ab = fleet.api.post(f"/v1/rollouts/{r['id']}/abort")
    assert ab.status_code == 200 and ab.json()["state"] == "aborting"
    assert [n["outcome"] for n in ab.json()["nodes"]].count("restored") == 16
    assert fleet.api.post(f"/v1/rollouts/{r['id']}/abort").status_code == 409  # already aborting
    steps = []
    assert fleet.tick(after_step=lambda rid, action: steps.append(action)) == {r["id"]: "restore"}
    assert steps == ["restoring", "restore"]
    s = fleet.status(r["id"])
    assert s["state"] == "aborted" and {n["outcome"] for n in s["nodes"]} == {"restored"}
    restored = {n["restored_plan_id"] for n in s["nodes"]}
    assert sorted(len(fleet.api.get(f"/v1/plans/{p}").json()["assignments"]) for p in restored) == [8, 16, 16]
    assert all(fleet.current(n)[2] == fleet.old["argv"] for n in names[::13])
    assert [k for k, _, _ in fleet.events(r["id"])].count("rollout.rolled_back") == 1


def test_a_large_halt_restores_a_chunk_per_transaction(api, db, quiet, keys, monkeypatch):
    monkeypatch.setattr(rollout_common, "SIGN_CHUNK", 10)
    names = [f"m-{i:03d}" for i in range(25)]
    fleet = Fleet(api, db, quiet, keys, nodes=names)
    r = fleet.rollout(nodes=names, waves=[{"percent": 100}], gates={"kv_tolerance": None})
    assert fleet.tick() == {r["id"]: "sign"}
    plan_id = fleet.status(r["id"])["waves"][0]["plan_ids"][0]
    fleet.report(names[3], plan_id, "failed")
    steps = []
    assert fleet.tick(after_step=lambda rid, action: steps.append(action)) == {r["id"]: "restore"}
    assert steps == ["halting", "restoring", "restore"]  # 10 + 10 + 5 nodes, three transactions
    s = fleet.status(r["id"])
    assert s["state"] == "rolled_back" and {n["outcome"] for n in s["nodes"]} == {"restored"}
    restored = {n["restored_plan_id"] for n in s["nodes"]}
    assert sorted(len(fleet.api.get(f"/v1/plans/{p}").json()["assignments"]) for p in restored) == [5, 10, 10]


def test_reasons_with_control_characters_are_refused_and_printed_escaped(fleet):
    from service import cli

    r = fleet.rollout()
    for bad in ("\x1b]0;pwned\x07", "ok\x9b31m", "abc\u202egnp.exe", "line\nbreak"):
        got = fleet.api.post(f"/v1/rollouts/{r['id']}/pause", json={"reason": bad})
        assert got.status_code == 422 and "reason" in got.text, bad
    assert fleet.status(r["id"])["state"] == "pending"
    text = cli.rollout.summary({**fleet.status(r["id"]), "reason": "\x1b[2Jgone\u202e",
                                "nodes": [{"node": "gpu-01", "wave": 0, "outcome": "failed",
                                           "evidence": {"reason": "x\x07"}}]})
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    assert "\\x1b[2Jgone\\u202e" in text and "x\\x07" in text


def test_promote_in_pending_skips_wave_0s_bake_once(fleet):
    r = fleet.rollout()  # wave 0 bakes 60 s
    assert fleet.api.post(f"/v1/rollouts/{r['id']}/promote").status_code == 200
    again = fleet.api.post(f"/v1/rollouts/{r['id']}/promote")
    assert again.status_code == 409 and "already promoted" in again.text
    t0 = time.time()
    fleet.tick(t0)
    assert fleet.status(r["id"])["promote"] is True  # kept past wave 0's signing
    fleet.report("gpu-01", fleet.status(r["id"])["nodes"][0]["new_plan_id"], "running")
    assert fleet.tick(t0 + 1) == {r["id"]: "sign"}  # no bake
    assert [k for k, _, _ in fleet.events(r["id"])].count("rollout.promoted") == 1


def test_an_empty_wave_is_skipped_without_a_bake(groups):
    body = {"manifest": "deepseek-ai/DeepSeek-V3@1", "engine_args": {**TP16, "max_model_len": 16384},
            "nodes": H200, "waves": [{"percent": 25}, {"percent": 50, "bake_s": 3600}, {"percent": 100}],
            "gates": {"kv_tolerance": None}}
    r = groups.api.post("/v1/rollouts", json=body).json()
    assert [w["nodes"] for w in r["waves"]] == [["h200-a", "h200-b"], [], ["h200-c", "h200-d"]]
    t0 = time.time()
    groups.tick(t0)
    groups.report("h200-a", groups.status(r["id"])["waves"][0]["plan_ids"][0], "running")
    assert groups.tick(t0 + 1) == {r["id"]: "sign"}  # wave 1 is empty: straight to wave 2, no hour of baking
    s = groups.status(r["id"])
    assert s["wave"] == 2 and [w["state"] for w in s["waves"]] == ["done", "skipped", "waiting"]


def test_waves_left_empty_at_the_end_are_skipped_when_the_rollout_completes(groups):
    body = {"manifest": "deepseek-ai/DeepSeek-V3@1", "engine_args": {**TP16, "max_model_len": 16384},
            "nodes": H200[:2], "waves": [{"percent": 1}, {"percent": 50, "bake_s": 5}, {"percent": 100}],
            "gates": {"kv_tolerance": None}}
    r = groups.api.post("/v1/rollouts", json=body).json()
    t0 = time.time()
    groups.tick(t0)
    groups.report("h200-a", groups.status(r["id"])["waves"][0]["plan_ids"][0], "running")
    assert groups.tick(t0 + 1) == {r["id"]: "complete"}
    s = groups.status(r["id"])
    assert [w["state"] for w in s["waves"]] == ["done", "skipped", "skipped"]
    assert [k for k, _, _ in groups.events(r["id"])].count("rollout.wave_skipped") == 2


def test_failure_limit_at_the_units_warns_and_kv_tolerance_is_a_number(fleet):
    r = fleet.rollout(failure_limit=4)
    [w] = r["warnings"]
    assert w["rule"] == "failure_limit_not_limiting" and w["field"] == "failure_limit"
    bad = fleet.api.post("/v1/rollouts", json={"manifest": "meta-llama/Llama-3.1-70B@1", "engine_args": NEW,
                                               "nodes": NODES, "waves": [{"percent": 100}],
                                               "gates": {"kv_tolerance": "0.2"}})
    assert bad.status_code == 422 and "kv_tolerance" in bad.text


@pytest.mark.parametrize("body, code", [
    (b"{not json", 1), (b"[1, 2]", 1), (b'{"state": "completed"}', 1), (b'{"id": "x", "state": "waiting", "wave": "2"}', 5),
    (b'{"id": "x", "state": "completed", "nodes": [{"node": "a"}]}', 0), (b"[" * 100_000 + b"]" * 100_000, 1),
    (b'{"id": "x", "state": "\\u001b]0;pwned\\u0007", "failure_limit": "\\u001b[31mRED", "failures": 0,'
     b' "waves": [{"index": 0, "percent": 100, "bake_s": 0, "state": "\\u001b[2J", "nodes": []}],'
     b' "outcomes": {"ready": "\\u001b[1m"}}', 5),
])
def test_rollout_cli_survives_a_hostile_answer(monkeypatch, body, code):
    """What a server (or something in the middle) answers is never a traceback and never reaches the terminal raw."""
    import httpx
    from typer.testing import CliRunner

    from service import cli

    transport = httpx.MockTransport(lambda req: httpx.Response(200, content=iter([body])))  # streamed, as sent
    monkeypatch.setattr(cli.common, "client",
                        lambda server, token: httpx.Client(base_url="http://x", transport=transport))
    for args in (["status", "x"], ["wait", "x", "--timeout", "1", "--interval", "0.5"]):
        out = CliRunner().invoke(cli.app, ["rollout", *args, "--server", "http://x", "--token", "t"])
        assert out.exit_code == code and (out.exception is None or isinstance(out.exception, SystemExit)), (
            args, out.output, out.exception)
        assert "\x1b" not in out.output and "\x07" not in out.output


def test_rollout_wait_gives_up_on_a_server_that_drips(monkeypatch):
    import httpx
    from typer.testing import CliRunner

    from service import cli

    def drip():
        for _ in range(120):  # a byte every half second: a minute for the whole answer
            time.sleep(0.5)
            yield b" "

    transport = httpx.MockTransport(lambda req: httpx.Response(200, content=drip()))
    monkeypatch.setattr(cli.common, "client",
                        lambda server, token: httpx.Client(base_url="http://x", transport=transport))
    out = CliRunner().invoke(cli.app, ["rollout", "wait", "x", "--timeout", "1", "--server", "http://x",
                                       "--token", "t"])
    assert isinstance(out.exception, httpx.ReadTimeout)  # given up within --timeout, not after the minute
