"""Creating a rollout (service/services/rollouts/creation.py) over HTTP: the nodes it may take (named once, planned,
in no other rollout, whole multi-node groups, a selector over inventory fields), the target judged like a plan,
the warnings it answers with, and nothing stored on a refusal."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from service.db.models import AuditEvent, Rollout
from tests.support.api import register_node
from tests.support.rollouts import NEW, NODES, TP16


def _stored(fleet):
    with fleet.db.sessions() as s:
        return (
            s.scalar(select(func.count()).select_from(Rollout)),
            s.scalar(select(func.count()).select_from(AuditEvent).where(AuditEvent.kind.like("rollout.%"))),
        )


def test_a_rollout_may_not_split_a_running_group(groups):
    r = groups.api.post(
        "/v1/rollouts",
        json={
            "manifest": "deepseek-ai/DeepSeek-V3@1",
            "engine_args": TP16,
            "nodes": ["h200-a", "h200-c", "h200-d"],
            "waves": [{"percent": 100}],
        },
    )
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "nodes.0"
    assert r.json()["errors"][0]["rule"] == "partial_group"


def test_a_node_listed_twice_is_422_naming_the_repeat_for_rollouts_plans_and_dry_runs(fleet):
    twice = ["gpu-01", "gpu-02", "gpu-01"]
    r = fleet.api.post(
        "/v1/rollouts",
        json={
            "manifest": "meta-llama/Llama-3.1-70B@1",
            "engine_args": NEW,
            "nodes": twice,
            "waves": [{"percent": 100}],
        },
    )
    p = fleet.api.post("/v1/plans", json={"manifest": "meta-llama/Llama-3.1-70B@1", "nodes": twice, "engine_args": NEW})
    d = fleet.api.post(
        "/v1/plans?dry_run=true", json={"manifest": "meta-llama/Llama-3.1-70B@1", "nodes": twice, "engine_args": NEW}
    )
    for resp in (r, p, d):
        assert resp.status_code == 422, resp.text
        [err] = resp.json()["errors"]
        assert err["field"] == "nodes.2" and err["rule"] == "duplicate_node" and "nodes.0" in err["message"]
    assert _stored(fleet)[0] == 0 and all(fleet.assignments(n) == 1 for n in NODES)


@pytest.mark.parametrize(
    "extra, field",
    [
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
    ],
)
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
    r = fleet.rollout(
        nodes=None, selector={"gpu": "NVIDIA H100 80GB HBM3", "labels": {"pool": "canary"}}, waves=[{"percent": 100}]
    )
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


def test_failure_limit_at_the_units_warns_and_kv_tolerance_is_a_number(fleet):
    r = fleet.rollout(failure_limit=4)
    [w] = r["warnings"]
    assert w["rule"] == "failure_limit_not_limiting" and w["field"] == "failure_limit"
    bad = fleet.api.post(
        "/v1/rollouts",
        json={
            "manifest": "meta-llama/Llama-3.1-70B@1",
            "engine_args": NEW,
            "nodes": NODES,
            "waves": [{"percent": 100}],
            "gates": {"kv_tolerance": "0.2"},
        },
    )
    assert bad.status_code == 422 and "kv_tolerance" in bad.text
