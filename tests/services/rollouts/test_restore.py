"""Restoring what a rollout changed (service/services/rollouts/restore.py): each changed node gets its previous
plan's content again with a higher seq (its group env and tuning kept, a revoked plan never signed again), a chunk per
transaction, and a refused restore leaves the rollout halted."""

from __future__ import annotations

from service.services.rollouts import common as rollout_common
from tests.support.rollouts import NODES, OLD, TP16, Fleet


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
    assert kinds == [
        "rollout.created",
        "rollout.wave_signed",
        "rollout.node_failed",
        "rollout.halted",
        "rollout.node_restored",
        "rollout.rolled_back",
    ]
    restored = next(p for k, _, p in fleet.events(r["id"]) if k == "rollout.node_restored")
    assert restored["previous_plan_id"] == fleet.old["id"] and restored["seq"] == 3
    assert restored["evidence"]["reason"] == "report_failed" and "failure_limit" in restored["reason"]
    assert fleet.tick() == {}  # over: the scheduler leaves it alone


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


def test_restoring_the_second_group_of_a_plan_gives_it_its_own_group_env(groups):
    body = {
        "manifest": "deepseek-ai/DeepSeek-V3@1",
        "engine_args": {**TP16, "max_model_len": 16384},
        "nodes": ["h200-c", "h200-d", "h200-a", "h200-b"],
        "waves": [{"percent": 50}, {"percent": 100}],
    }
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
    fix = fleet.api.post(
        "/v1/plans", json={"manifest": "meta-llama/Llama-3.1-70B@1", "nodes": ["gpu-01"], "engine_args": OLD}
    )
    assert fix.status_code == 201
    ab = fleet.api.post(f"/v1/rollouts/{r['id']}/abort").json()
    assert ab["state"] == "aborted" and ab["nodes"][0]["outcome"] == "superseded_by_hand"
    assert fleet.current("gpu-01")[0] == fix.json()["id"]


def test_a_restore_keeps_the_previous_plans_tuning(fleet):
    tuned = fleet.api.post(
        "/v1/plans",
        json={
            "manifest": "meta-llama/Llama-3.1-70B@1",
            "nodes": ["gpu-01"],
            "engine_args": OLD,
            "workload": {"avg_seq_len": 2000, "p99_seq_len": 6000, "shape": "balanced", "stage": "initial"},
            "tuning": {"slo_ttft_p99_s": 0.5, "slo_e2e_p99_s": 9},
        },
    )
    assert tuned.status_code == 201, tuned.text
    slo = fleet.api.get(f"/v1/plans/{tuned.json()['id']}").json()["tuning"]["slo"]
    r = fleet.rollout(waves=[{"percent": 25}, {"percent": 100}])
    fleet.tick()
    fleet.report("gpu-01", fleet.status(r["id"])["nodes"][0]["new_plan_id"], "failed")
    assert fleet.tick() == {r["id"]: "halt"}
    restored = fleet.status(r["id"])["nodes"][0]["restored_plan_id"]
    assert fleet.api.get(f"/v1/plans/{restored}").json()["tuning"]["slo"] == slo


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
