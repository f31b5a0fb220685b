"""Signing a wave (service/services/rollouts/signing.py): whole units in chunks of the plan cap, the values pinned at
creation (the pool, the canary's command) on every wave, nodes planned by hand left alone or superseded, and a
multi-node instance never split."""

from __future__ import annotations

import time

from service.services.rollouts import common as rollout_common
from tests.support.rollouts import H200, NODES, OLD, TP16, Died, Fleet

GIB = 1 << 30


WORKLOAD = {"avg_seq_len": 3000, "p99_seq_len": 12000, "shape": "long_in_short_out", "stage": "initial"}


def _argv(fleet, plan_id):
    return fleet.api.get(f"/v1/plans/{plan_id}").json()["argv"]


def test_a_multi_node_group_moves_as_one_unit_in_one_wave(groups):
    body = {
        "manifest": "deepseek-ai/DeepSeek-V3@1",
        "engine_args": {**TP16, "max_model_len": 16384},
        "nodes": H200,
        "waves": [{"percent": 25}, {"percent": 100}],
        "gates": {"kv_tolerance": None},
    }
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
    assert s["failures"] == 1 and [n["outcome"] for n in s["nodes"]] == [
        "restored",
        "restored",
        "unchanged",
        "unchanged",
    ]
    restored = {n["restored_plan_id"] for n in s["nodes"][:2]}
    assert len(restored) == 1  # the group restored together, in one plan
    again = groups.api.get(f"/v1/plans/{restored.pop()}").json()
    assert [g["nodes"] for g in again["groups"]] == [["h200-a", "h200-b"]]
    assert [a["seq"] for a in again["assignments"]] == [3, 3]
    assert again["argv"] == groups.old["argv"]
    assert [groups.current(n)[:2] for n in H200[2:]] == [(groups.old["id"], 1)] * 2


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


def test_a_pinned_pool_is_decided_once_and_every_wave_gets_it(fleet):
    # only gpu-03 ran this launch and reported its pool; the canary gpu-01 never did
    fleet.report("gpu-03", fleet.old["id"], "running", vllm={"available_kv_cache_gib": 21.5})
    r = fleet.rollout(
        engine_args=OLD,
        kv_cache_pool="pinned",
        nodes=["gpu-01", "gpu-03"],
        waves=[{"percent": 50, "bake_s": 1}, {"percent": 100}],
        gates={"kv_tolerance": None},
    )
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
    r = fleet.rollout(
        workload=WORKLOAD,
        environment="benchmark",
        gates={"kv_tolerance": None},
        waves=[{"percent": 25, "bake_s": 1}, {"percent": 100}],
    )
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
    hand = fleet.api.post(
        "/v1/plans",
        json={
            "manifest": "meta-llama/Llama-3.1-70B@1",
            "nodes": ["gpu-02", "gpu-04"],
            "engine_args": {**OLD, "pipeline_parallel_size": 2},
        },
    )
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
    manual = fleet.api.post(
        "/v1/plans",
        json={
            "manifest": "meta-llama/Llama-3.1-70B@1",
            "nodes": ["gpu-01"],
            "engine_args": {**OLD, "max_model_len": 4096},
        },
    )
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
    again = fleet.api.post(
        "/v1/plans", json={"manifest": "meta-llama/Llama-3.1-70B@1", "nodes": ["gpu-02"], "engine_args": OLD}
    )
    assert "warnings" not in again.json()


def test_a_node_planned_by_hand_before_its_wave_is_left_alone(fleet):
    r = fleet.rollout(waves=[{"percent": 25}, {"percent": 100}])
    assert [n["previous_plan_id"] for n in r["nodes"]] == [fleet.old["id"]] * 4  # recorded at creation
    t0 = time.time()
    fleet.tick(t0)
    fleet.report("gpu-01", fleet.status(r["id"])["nodes"][0]["new_plan_id"], "running")
    hotfix = fleet.api.post(
        "/v1/plans",
        json={
            "manifest": "meta-llama/Llama-3.1-70B@1",
            "nodes": ["gpu-03"],
            "engine_args": {**OLD, "max_model_len": 4096},
        },
    )
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
