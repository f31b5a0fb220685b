"""The tuning loop against the simulator, through the service's API: from the plan Preflight makes at
stage ``initial``, the windows the agent's sampler computes from the simulator's /metrics walk the node to
0.8 × the simulator's knee; every proposal validates; one outlier window moves nothing; a burst of preemptions
backs a settled node off. Plus the metrics endpoint's input rules and the plan-level tuning block."""

from __future__ import annotations

import math

import pytest

from service.agent.vllm_metrics import parse, window
from service.sim.vllm_sim import SimVllm, SimWorkload
from tests.support import model_config

# workloads: prompt / output tokens per request (avg_seq_len = prompt + output; P99 about 3 × for the plan)
WORKLOADS = {
    "short_chat": dict(prompt=400, output=200, shape="balanced", p99=2000),
    "long_in_short_out": dict(prompt=6000, output=300, shape="long_in_short_out", p99=12000),
    "long_generation": dict(prompt=500, output=3000, shape="short_in_long_out", p99=8000),
}
# two GPUs of the catalogue: an H100 80GB running Llama-3.1-8B on one GPU, an L4 24GB pair at TP 2
GPUS = {"h100": ("h100-sxm-80gb", 1, 1), "l4": ("l4-24gb", 2, 2)}
MODEL = "meta-llama__Llama-3.1-8B-Instruct"
MAX_PLANS = 16
WINDOW_S = 15.0


def setup_node(client, gpu_key: str, workload: str, *, name="gpu-01", tuning=None, environment="production"):
    gpu, count, tp = GPUS[gpu_key]
    r = client.post("/v1/nodes", json={"name": name, "gpu": gpu, "gpu_count": count, "interconnect": "nvlink"})
    assert r.status_code == 201, r.text
    agent = r.json()["agent_token"]
    if client.get("/v1/manifests/meta-llama/Llama-3.1-8B-Instruct@1").status_code == 404:
        r = client.post(
            "/v1/manifests",
            json={
                "name": "meta-llama/Llama-3.1-8B-Instruct",
                "version": "1",
                "uri": "s3://weights/llama-3.1-8b",
                "config": model_config(MODEL),
            },
        )
        assert r.status_code == 201, r.text
    w = WORKLOADS[workload]
    body = {
        "manifest": "meta-llama/Llama-3.1-8B-Instruct@1",
        "nodes": [name],
        "environment": environment,
        "engine_args": {"tensor_parallel_size": tp},
        "workload": {
            "avg_seq_len": w["prompt"] + w["output"],
            "p99_seq_len": w["p99"],
            "shape": w["shape"],
            "stage": "initial",
        },
    }
    if tuning is not None:
        body["tuning"] = tuning
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 201, r.text
    return agent, r.json()


def knobs(plan: dict) -> tuple[int, float]:
    argv = plan["argv"]
    return (int(argv[argv.index("--max-num-seqs") + 1]), float(argv[argv.index("--gpu-memory-utilization") + 1]))


class Harness:
    """The simulator behind one node, sampled as the agent's sampler does (same parse and window code)."""

    def __init__(
        self, client, agent_token: str, plan: dict, workload: str, *, name="gpu-01", seed=7, environment="production"
    ):
        self.environment = environment
        w = WORKLOADS[workload]
        mns, _ = knobs(plan)
        self.client, self.name = client, name
        self.agent = {"Authorization": f"Bearer {agent_token}"}
        # offered load: 1.5 × what the pool's knee can serve, so the queue grows at every level below it
        probe = SimVllm(
            kv_cache_tokens=plan["budget"]["kv_cache_tokens"],
            max_num_seqs=mns,
            workload=SimWorkload(w["prompt"], w["output"], 1.0),
        )
        rate = 1.5 * probe.capacity(max(1, probe.true_knee()) * 1.2)
        self.sim = SimVllm(
            kv_cache_tokens=plan["budget"]["kv_cache_tokens"],
            max_num_seqs=mns,
            workload=SimWorkload(w["prompt"], w["output"], rate),
            seed=seed,
        )
        self.plan = plan
        self.t = 0.0
        self.posted: list[int] = []

    def run_plan(self, plan: dict) -> None:
        self.plan = plan
        mns, _ = knobs(plan)
        self.sim.configure(max_num_seqs=mns, kv_cache_tokens=plan["budget"]["kv_cache_tokens"])

    def windows(self, n: int, *, preempt_extra: dict[int, float] | None = None) -> list[dict]:
        out = []
        prev = parse(self.sim.exposition(), self.t)
        for i in range(n):
            self.sim.advance(WINDOW_S)
            if preempt_extra and i in preempt_extra:
                self.sim.c_pre.inc(preempt_extra[i])  # an outlier: a burst in this window only
            self.t += WINDOW_S
            cur = parse(self.sim.exposition(), self.t)
            w = window(self.plan["id"], prev, cur)
            prev = cur
            r = self.client.post(f"/v1/nodes/{self.name}/metrics", json=w, headers=self.agent)
            assert r.status_code == 201, r.text
            self.posted.append(r.json()["id"])
            out.append(w)
        return out

    def status(self) -> dict:
        r = self.client.get(f"/v1/nodes/{self.name}/tuning")
        assert r.status_code == 200, r.text
        return r.json()

    def apply(self) -> dict:
        r = self.client.post(f"/v1/nodes/{self.name}/tuning/apply")
        assert r.status_code == 201, r.text
        plan = r.json()
        assert plan["verdict"] != "reject"
        self.run_plan(plan)
        return plan


def walk(h: Harness, max_plans=MAX_PLANS) -> tuple[dict, list[dict]]:
    """Run the loop until it holds at a settled level: returns the last status and the plans it made."""
    plans = []
    for _ in range(max_plans * 3):
        h.windows(4)
        st = h.status()
        if st["next"] is None:
            if st["state"] == "settled":
                return st, plans
            continue  # keep measuring
        # every proposal validates (the dry run a deploy script would make says so)
        r = h.client.post(
            "/v1/plans?dry_run=true",
            json={
                "manifest": "meta-llama/Llama-3.1-8B-Instruct@1",
                "nodes": [h.name],
                "engine_args": st["next"]["engine_args"],
                "environment": h.environment,
            },
        )
        assert r.status_code == 200 and r.json()["verdict"] != "reject", r.text
        plans.append(h.apply())
        assert len(plans) <= max_plans, [knobs(p) for p in plans]
    raise AssertionError(f"did not settle: {[knobs(p) for p in plans]}")


@pytest.mark.parametrize("gpu", sorted(GPUS))
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_loop_settles_at_0_8_of_the_simulators_knee(client, gpu, workload):
    agent, plan = setup_node(client, gpu, workload)
    start_mns, start_util = knobs(plan)
    assert start_util == 0.85  # the guide's conservative start
    h = Harness(client, agent, plan, workload)
    st, plans = walk(h)
    final = plans[-1]
    mns, util = knobs(final)
    knee = h.sim.true_knee()  # at the settled plan's pool
    assert util <= 0.90
    assert abs(mns - 0.8 * knee) <= 0.1 * 0.8 * knee, (mns, knee, [knobs(p) for p in plans])
    assert st["state"] == "settled" and st["memo"]["knee"] is not None
    assert final["tuning"]["state"] == "knee_found" and final["tuning"]["action"] == "settle"
    assert start_mns < knee  # it walked up from the conservative start
    # every step is audited with its reasons and window ids
    events = client.get("/v1/audit", params={"kind": "tuning.applied", "limit": 100}).json()["items"]
    assert len(events) == len(plans)
    assert all(e["payload"]["reasons"] and e["payload"]["windows"] for e in events)
    # the windows' figures themselves, kept by the audit when the windows are pruned
    assert all(
        {"id", "num_requests_running", "num_preemptions", "kv_cache_usage_perc"} <= set(w)
        for e in events
        for w in e["payload"]["windows"]
    )
    # the plans superseded each other: one active plan on the node
    active = client.get("/v1/plans", params={"node": "gpu-01", "status": "active"}).json()["items"]
    assert [p["id"] for p in active] == [final["id"]]


def test_one_outlier_window_does_not_move_it(client):
    agent, plan = setup_node(client, "h100", "short_chat")
    h = Harness(client, agent, plan, "short_chat")
    h.windows(4, preempt_extra={2: 500})  # window 3 of 4: a burst of 500 preemptions
    st = h.status()
    assert st["action"] == "raise_max_num_seqs", st["reasons"]
    assert any("outlier" in r for r in st["reasons"])
    assert st["next"]["max_num_seqs"] == math.floor(knobs(plan)[0] * 1.25)


def test_settled_node_backs_off_after_a_preemption_burst(client):
    agent, plan = setup_node(client, "h100", "long_generation")
    h = Harness(client, agent, plan, "long_generation")
    st, plans = walk(h)
    settled_mns, util = knobs(plans[-1])
    h.sim.burst_factor = 1.6  # the traffic's sequences grow: the settled level now overruns the pool
    h.windows(4)
    st = h.status()
    assert (st["state"], st["action"]) == ("backing_off", "back_off"), st["reasons"]
    assert st["next"]["max_num_seqs"] == math.floor(settled_mns * 0.8)
    assert any("preemption" in r for r in st["reasons"])
    backed = h.apply()
    assert knobs(backed) == (math.floor(settled_mns * 0.8), util)
    assert backed["tuning"]["memo"]["state"] == "backing_off"


def test_a_proposal_that_fails_validation_steps_back(client, monkeypatch):
    from service.domain import tuning as dt

    agent, plan = setup_node(client, "h100", "short_chat")
    h = Harness(client, agent, plan, "short_chat")
    h.windows(4)
    real = dt.decide
    mnbt = int(plan["argv"][plan["argv"].index("--max-num-batched-tokens") + 1])

    def too_far(level, windows, s=dt.DEFAULTS):  # a proposal above max_num_batched_tokens: vLLM refuses it
        d = real(level, windows, s)
        return dt.Decision(
            d.state, d.action, dt.Point(mnbt + 1000, level.gpu_memory_utilization), d.memo, d.reasons, d.evidence
        )

    monkeypatch.setattr(dt, "decide", too_far)
    st = h.status()
    assert any(f"max_num_seqs {mnbt + 1000}" in r and "fails validation" in r for r in st["reasons"]), st["reasons"]
    assert st["next"]["max_num_seqs"] == (knobs(plan)[0] + mnbt + 1000) // 2  # halfway back, and it validates
    if st["next"] is not None:
        r = client.post(
            "/v1/plans?dry_run=true",
            json={
                "manifest": "meta-llama/Llama-3.1-8B-Instruct@1",
                "nodes": ["gpu-01"],
                "engine_args": st["next"]["engine_args"],
            },
        )
        assert r.json()["verdict"] != "reject"


def test_apply_with_nothing_to_apply_is_409(client):
    agent, plan = setup_node(client, "h100", "short_chat")
    r = client.post("/v1/nodes/gpu-01/tuning/apply")
    assert r.status_code == 409, r.text
    st = client.get("/v1/nodes/gpu-01/tuning").json()
    assert (st["state"], st["action"], st["next"]) == ("exploring", "measure", None)
    assert st["current"]["engine_args"]["max_num_seqs"] == knobs(plan)[0]


def test_metrics_input_rules(client):
    agent, plan = setup_node(client, "h100", "short_chat")
    other = client.post("/v1/nodes", json={"name": "gpu-02", "gpu": "h100-sxm-80gb", "gpu_count": 1}).json()
    ok = {
        "plan": plan["id"],
        "window_s": 15,
        "num_requests_running": 10,
        "num_requests_waiting": 2,
        "kv_cache_usage_perc": 0.4,
        "num_preemptions": 0,
        "ttft_p99_s": 0.2,
        "e2e_p99_s": 3.0,
        "generation_tokens_per_s": 800.5,
    }
    mine = {"Authorization": f"Bearer {agent}"}
    assert client.post("/v1/nodes/gpu-01/metrics", json=ok, headers=mine).status_code == 201
    # another node's agent may not post for gpu-01
    r = client.post("/v1/nodes/gpu-01/metrics", json=ok, headers={"Authorization": f"Bearer {other['agent_token']}"})
    assert r.status_code == 403
    for field, value in [
        ("kv_cache_usage_perc", 1.5),
        ("num_preemptions", -1),
        ("window_s", 0.5),
        ("window_s", 7200),
        ("num_requests_running", True),
        ("e2e_p99_s", "3"),
        ("generation_tokens_per_s", 1e300),
        ("surprise", 1),
    ]:
        r = client.post("/v1/nodes/gpu-01/metrics", json={**ok, field: value}, headers=mine)
        assert r.status_code == 422, (field, value, r.text)
        assert r.json()["errors"][0]["field"] == field
    r = client.post(
        "/v1/nodes/gpu-01/metrics",
        content=b'{"plan": "x", "window_s": NaN}',
        headers={**mine, "content-type": "application/json"},
    )
    assert r.status_code == 422
    r = client.post("/v1/nodes/gpu-01/metrics", json={**ok, "plan": "not-a-plan-of-this-node"}, headers=mine)
    assert r.status_code == 404 and r.json()["field"] == "plan"


def test_windows_are_pruned_per_node(client, monkeypatch):
    from service.services import tuning as ts

    monkeypatch.setattr(ts, "RETENTION", 5)
    monkeypatch.setattr(ts, "PRUNE_EVERY", 1)
    agent, plan = setup_node(client, "h100", "short_chat")
    body = {
        "plan": plan["id"],
        "window_s": 15,
        "num_requests_running": 10,
        "num_requests_waiting": 2,
        "kv_cache_usage_perc": 0.4,
        "num_preemptions": 0,
        "generation_tokens_per_s": 8,
    }
    ids = [
        client.post("/v1/nodes/gpu-01/metrics", json=body, headers={"Authorization": f"Bearer {agent}"}).json()["id"]
        for _ in range(12)
    ]
    from sqlalchemy import select

    from service.db.models import MetricWindow

    with client.app.state.db.transaction() as s:
        kept = list(
            s.scalars(select(MetricWindow.id).where(MetricWindow.node_name == "gpu-01").order_by(MetricWindow.id))
        )
    assert kept == ids[-5:]


def test_retention_holds_per_node_whatever_ids_other_nodes_take(client, monkeypatch):
    """Ids are global: with other nodes posting in between, a node's windows are still bounded by its own count
    (RETENTION + PRUNE_EVERY at most), not by which ids it happens to get."""
    from sqlalchemy import func, insert, select

    from service.db.models import MetricWindow, utcnow
    from service.services import tuning as ts

    monkeypatch.setattr(ts, "RETENTION", 5)
    monkeypatch.setattr(ts, "PRUNE_EVERY", 4)
    agent, plan = setup_node(client, "h100", "short_chat")
    body = {
        "plan": plan["id"],
        "window_s": 15,
        "num_requests_running": 10,
        "num_requests_waiting": 2,
        "kv_cache_usage_perc": 0.4,
        "num_preemptions": 0,
        "generation_tokens_per_s": 8,
    }
    other = {
        "node_name": "gpu-elsewhere",
        "plan_id": plan["id"],
        "window_s": 15,
        "running": 1,
        "waiting": 0,
        "kv_usage": 0.1,
        "preemptions": 0,
        "gen_tokens_per_s": 1,
    }
    counts = []
    for i in range(40):
        with client.app.state.db.transaction() as s:  # another node's window takes the next id(s)
            s.execute(insert(MetricWindow.__table__), [{**other, "created_at": utcnow()}] * (1 + i % 3))
        r = client.post("/v1/nodes/gpu-01/metrics", json=body, headers={"Authorization": f"Bearer {agent}"})
        assert r.status_code == 201, r.text
        with client.app.state.db.transaction() as s:
            counts.append(
                s.scalar(select(func.count()).select_from(MetricWindow).where(MetricWindow.node_name == "gpu-01"))
            )
    assert max(counts) <= 5 + 4 and counts[-1] >= 5


def test_auto_apply_only_in_benchmark(client):
    r = client.post("/v1/nodes", json={"name": "gpu-01", "gpu": "h100-sxm-80gb", "gpu_count": 1})
    client.post("/v1/manifests", json={"name": "m", "version": "1", "uri": "s3://m", "config": model_config(MODEL)})
    body = {
        "manifest": "m@1",
        "nodes": ["gpu-01"],
        "workload": {"avg_seq_len": 600, "p99_seq_len": 2000},
        "tuning": {"auto_apply": True},
    }
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "tuning.auto_apply"
    dry = client.post("/v1/plans", params={"dry_run": "true"}, json=body)  # the dry run refuses it too
    assert dry.status_code == 422 and dry.json()["errors"][0]["field"] == "tuning.auto_apply"
    r = client.post(
        "/v1/plans", json={**body, "environment": "benchmark", "tuning": {"auto_apply": True, "slo_e2e_p99_s": 60}}
    )
    assert r.status_code == 201, r.text
    assert r.json()["tuning"]["auto_apply"] is True and r.json()["tuning"]["slo"]["e2e_p99_s"] == 60


def test_auto_apply_walks_a_benchmark_node_without_apply_calls(client):
    agent, plan = setup_node(client, "h100", "short_chat", environment="benchmark", tuning={"auto_apply": True})
    h = Harness(client, agent, plan, "short_chat")
    first = plan["id"]
    h.windows(4)  # the fourth window decides: the service applies the next plan itself
    cur = client.get("/v1/plans", params={"node": "gpu-01", "status": "active"}).json()["items"][0]
    assert cur["id"] != first and cur["created_by"] == "tuning:auto"
    assert cur["tuning"]["auto_apply"] is True
    assert knobs(cur)[0] == math.floor(knobs(plan)[0] * 1.25)


def test_windows_of_a_recent_plan_are_kept_but_not_judged_and_older_ones_are_refused(client):
    agent, first = setup_node(client, "h100", "short_chat")
    mine = {"Authorization": f"Bearer {agent}"}
    body = {
        "window_s": 15,
        "num_requests_running": 10,
        "num_requests_waiting": 2,
        "kv_cache_usage_perc": 0.4,
        "num_preemptions": 0,
        "generation_tokens_per_s": 8,
    }
    plans = [first["id"]]
    for mml in (4096, 3072, 2048):  # three newer plans for the node
        r = client.post(
            "/v1/plans",
            json={
                "manifest": "meta-llama/Llama-3.1-8B-Instruct@1",
                "nodes": ["gpu-01"],
                "engine_args": {"max_model_len": mml, "max_num_seqs": 64, "gpu_memory_utilization": 0.85},
            },
        )
        plans.append(r.json()["id"])
    r = client.post("/v1/nodes/gpu-01/metrics", json={**body, "plan": plans[-2]}, headers=mine)
    assert r.status_code == 201 and r.json()["current"] is False  # in flight at the switch: kept
    r = client.post("/v1/nodes/gpu-01/metrics", json={**body, "plan": plans[0]}, headers=mine)
    assert r.status_code == 404  # four plans ago: refused
    st = client.get("/v1/nodes/gpu-01/tuning").json()
    assert st["plan"] == plans[-1] and st["evidence"] == [] and st["action"] == "measure"


def test_tuning_of_unknown_or_unplanned_nodes_is_404(client):
    assert client.get("/v1/nodes/nope/tuning").status_code == 404
    client.post("/v1/nodes", json={"name": "idle", "gpu": "h100-sxm-80gb", "gpu_count": 1})
    r = client.get("/v1/nodes/idle/tuning")
    assert r.status_code == 404 and "no current plan" in r.json()["detail"]
    assert client.post("/v1/nodes/idle/tuning/apply").status_code == 404


def test_plan_page_draws_the_nodes_trajectory(client):
    from tests.support.pages import login

    agent, plan = setup_node(client, "h100", "short_chat")
    h = Harness(client, agent, plan, "short_chat")
    h.windows(4)
    h.status()
    new = h.apply()
    h.windows(2)
    assert login(client).status_code == 303
    page = client.get(f"/ui/plans/{new['id']}")
    assert page.status_code == 200
    html = page.text
    assert 'id="h-tuning"' in html and html.count("<polyline") == 4
    mns0, mns1 = knobs(plan)[0], knobs(new)[0]
    assert f"max_num_seqs: from {float(mns0)} to {float(mns1)}, at most {float(mns1)}" in html


def test_thresholds_and_steps_come_from_the_settings(settings, db, keys):
    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from tests.support import ADMIN

    tuned = settings.model_copy(update={"tuning": {"step_fraction": 0.5, "windows": 2, "fail_windows": 2}})
    with TestClient(create_app(tuned, db=db, keys=keys)) as c:
        c.headers["Authorization"] = f"Bearer {ADMIN}"
        agent, plan = setup_node(c, "h100", "short_chat")
        h = Harness(c, agent, plan, "short_chat")
        h.windows(3)  # warm-up + the 2 windows these settings judge on
        st = h.status()
        assert st["action"] == "raise_max_num_seqs" and len(st["evidence"]) == 2
        assert st["next"]["max_num_seqs"] == math.floor(knobs(plan)[0] * 1.5)


def test_a_reissue_keeps_the_tuning_memo_and_its_slo(client):
    agent, plan = setup_node(client, "h100", "short_chat", tuning={"slo_e2e_p99_s": 30})
    assert plan["tuning"]["slo"]["e2e_p99_s"] == 30
    r = client.post(f"/v1/plans/{plan['id']}/reissue")
    assert r.status_code == 201, r.text
    again = client.get(f"/v1/plans/{r.json()['id']}").json()
    assert again["tuning"]["slo"]["e2e_p99_s"] == 30 and again["tuning"]["auto_apply"] is False


def test_a_multi_node_instance_is_measured_by_its_head_not_its_workers(client):
    from tests.support.multi_node import TP16, deepseek, node
    from tests.support.multi_node import plan as make_plan

    head = node(client, "tn-a", "10.0.7.1")["agent_token"]
    worker = node(client, "tn-b", "10.0.7.2")["agent_token"]
    deepseek(client)
    p = make_plan(client, ["tn-a", "tn-b"], TP16)
    body = {
        "plan": p["id"],
        "window_s": 15,
        "num_requests_running": 10,
        "num_requests_waiting": 2,
        "kv_cache_usage_perc": 0.4,
        "num_preemptions": 0,
        "generation_tokens_per_s": 8,
    }
    r = client.post("/v1/nodes/tn-b/metrics", json=body, headers={"Authorization": f"Bearer {worker}"})
    assert r.status_code == 422 and r.json()["errors"][0]["rule"] == "metrics_from_head", r.text
    r = client.post("/v1/nodes/tn-a/metrics", json=body, headers={"Authorization": f"Bearer {head}"})
    assert r.status_code == 201, r.text
