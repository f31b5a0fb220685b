"""Stepping a rollout (service/services/rollouts/stepping.py): waves gated by the agents' reports (ready in time,
the KV pool against the prediction, the metrics hook), the bake, failures within the limit, multi-node units
settled by their head, empty waves skipped, and one worker stepping a rollout at a time."""

from __future__ import annotations

import time

import pytest

from service.db.session import Database
from service.services.rollouts import stepping
from tests.support.rollouts import H200, NEW, NODES, TP16


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
    assert kinds == [
        "rollout.created",
        "rollout.wave_signed",
        "rollout.wave_settled",
        "rollout.wave_done",
        "rollout.wave_signed",
        "rollout.wave_done",
        "rollout.completed",
    ]


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


def test_an_exited_report_keeps_vllms_exit_status_in_the_evidence(fleet):
    r = fleet.rollout()
    fleet.tick()
    fleet.report("gpu-01", fleet.status(r["id"])["nodes"][0]["new_plan_id"], "exited", status=137)
    assert fleet.tick() == {r["id"]: "halt"}
    ev = fleet.status(r["id"])["nodes"][0]["evidence"]
    assert ev["reason"] == "report_exited" and ev["exit_status"] == 137


def test_kv_gate_off_lets_a_small_pool_pass_and_idempotency_key_replays(fleet):
    body = {
        "manifest": "meta-llama/Llama-3.1-70B@1",
        "engine_args": NEW,
        "nodes": NODES,
        "waves": [{"percent": 25}, {"percent": 100}],
        "gates": {"kv_tolerance": None},
    }
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


def test_paused_rollout_still_halts_on_failure(fleet):
    r = fleet.rollout()
    fleet.tick()
    new_id = fleet.status(r["id"])["nodes"][0]["new_plan_id"]
    fleet.api.post(f"/v1/rollouts/{r['id']}/pause")
    fleet.report("gpu-01", new_id, "exited", status=1)
    assert fleet.tick() == {r["id"]: "halt"}
    assert fleet.status(r["id"])["state"] == "rolled_back"


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


def test_a_group_head_running_settles_its_unit(groups):
    body = {
        "manifest": "deepseek-ai/DeepSeek-V3@1",
        "engine_args": {**TP16, "max_model_len": 16384},
        "nodes": H200,
        "waves": [{"percent": 50}, {"percent": 100}],
        "gates": {"kv_tolerance": None},
    }
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
    body = {
        "manifest": "deepseek-ai/DeepSeek-V3@1",
        "engine_args": {**TP16, "max_model_len": 16384},
        "nodes": H200,
        "waves": [{"percent": 100}],
        "gates": {"kv_tolerance": None},
    }
    rid = groups.api.post("/v1/rollouts", json=body).json()["id"]
    t0 = time.time()
    groups.tick(t0)
    plan_id = groups.status(rid)["waves"][0]["plan_ids"][0]
    for head in ("h200-a", "h200-c"):
        groups.report(head, plan_id, "running")
    assert groups.tick(t0 + 1) == {rid: "complete"}
    s = groups.status(rid)
    assert s["state"] == "completed" and [n["outcome"] for n in s["nodes"]] == ["ready"] * 4


def test_an_empty_wave_is_skipped_without_a_bake(groups):
    body = {
        "manifest": "deepseek-ai/DeepSeek-V3@1",
        "engine_args": {**TP16, "max_model_len": 16384},
        "nodes": H200,
        "waves": [{"percent": 25}, {"percent": 50, "bake_s": 3600}, {"percent": 100}],
        "gates": {"kv_tolerance": None},
    }
    r = groups.api.post("/v1/rollouts", json=body).json()
    assert [w["nodes"] for w in r["waves"]] == [["h200-a", "h200-b"], [], ["h200-c", "h200-d"]]
    t0 = time.time()
    groups.tick(t0)
    groups.report("h200-a", groups.status(r["id"])["waves"][0]["plan_ids"][0], "running")
    assert groups.tick(t0 + 1) == {r["id"]: "sign"}  # wave 1 is empty: straight to wave 2, no hour of baking
    s = groups.status(r["id"])
    assert s["wave"] == 2 and [w["state"] for w in s["waves"]] == ["done", "skipped", "waiting"]


def test_waves_left_empty_at_the_end_are_skipped_when_the_rollout_completes(groups):
    body = {
        "manifest": "deepseek-ai/DeepSeek-V3@1",
        "engine_args": {**TP16, "max_model_len": 16384},
        "nodes": H200[:2],
        "waves": [{"percent": 1}, {"percent": 50, "bake_s": 5}, {"percent": 100}],
        "gates": {"kv_tolerance": None},
    }
    r = groups.api.post("/v1/rollouts", json=body).json()
    t0 = time.time()
    groups.tick(t0)
    groups.report("h200-a", groups.status(r["id"])["waves"][0]["plan_ids"][0], "running")
    assert groups.tick(t0 + 1) == {r["id"]: "complete"}
    s = groups.status(r["id"])
    assert [w["state"] for w in s["waves"]] == ["done", "skipped", "skipped"]
    assert [k for k, _, _ in groups.events(r["id"])].count("rollout.wave_skipped") == 2
