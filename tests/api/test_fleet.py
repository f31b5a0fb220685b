"""The listings an operator expects: GET /v1/plans (filters, cursor), nodes with their current plan and state (bulk),
and POST /v1/plans?dry_run=true (judged by names, nothing stored)."""

from __future__ import annotations

import datetime as dt
import re

from sqlalchemy import event, func, select

from service.db.models import Assignment, AuditEvent, Plan, Report
from tests.support.api import PLAN_70B, fleet_of_two, register_manifest, register_node


def test_nodes_carry_current_plan_last_report_and_status(client):
    p1, p2 = fleet_of_two(client)
    items = {n["name"]: n for n in client.get("/v1/nodes").json()["items"]}
    g1, g2 = items["gpu-01"], items["gpu-02"]
    assert g1["plan"]["id"] == p1["id"] and g1["plan"]["model"] == "meta-llama/Llama-3.1-70B"
    assert g1["plan"]["seq"] == 1 and g1["plan"]["manifest"] == "meta-llama/Llama-3.1-70B@1"
    assert g1["plan"]["predicted_kv_tokens"] == p1["budget"]["kv_cache_tokens"]
    assert g1["plan"]["measured_kv_tokens"] == 500000
    assert g1["last_report"]["status"] == "running" and g1["last_report"]["message"] == "up"
    assert g1["status"] == "running" and g1["drift"] is False and g1["running_plan_id"] == p1["id"]
    assert g1["last_seen_at"] is not None
    assert g2["plan"]["id"] == p2["id"] and g2["status"] == "refused" and g2["running_plan_id"] is None
    assert g2["plan"]["measured_kv_tokens"] is None
    one = client.get("/v1/nodes/gpu-01")
    assert one.status_code == 200 and one.json()["plan"]["id"] == p1["id"] and one.json()["status"] == "running"
    assert one.headers["ETag"]


def test_drift_when_a_new_plan_is_not_yet_running(client):
    p1, _ = fleet_of_two(client)
    p3 = client.post(
        "/v1/plans", json={**PLAN_70B, "engine_args": {**PLAN_70B["engine_args"], "max_model_len": 4096}}
    ).json()
    g1 = client.get("/v1/nodes/gpu-01").json()
    assert g1["plan"]["id"] == p3["id"] and g1["plan"]["seq"] == 2
    assert g1["running_plan_id"] == p1["id"] and g1["drift"] is True


def test_unplanned_node_and_queries_do_not_grow_with_nodes(client, db):
    register_node(client, "gpu-09")
    g = client.get("/v1/nodes/gpu-09").json()
    assert g["plan"] is None and g["status"] == "unplanned" and g["last_report"] is None and g["drift"] is False
    fleet_of_two(client)
    for i in range(10):
        register_node(client, f"gpu-x{i}")

    def selects_for(limit: int) -> tuple[int, list[str]]:
        statements: list[str] = []

        def count(conn, cursor, statement, *a):
            # (the audit sealer and the cache-epoch watcher query in the background: only the listing's tables count)
            if statement.lstrip().upper().startswith("SELECT") and re.search(
                r"FROM (nodes|assignments|reports|calibration|tokens)\b", statement
            ):
                statements.append(statement)

        event.listen(db.engine, "before_cursor_execute", count)
        try:
            items = client.get("/v1/nodes", params={"limit": limit}).json()["items"]
        finally:
            event.remove(db.engine, "before_cursor_execute", count)
        return len(items), statements

    few, few_selects = selects_for(2)
    many, many_selects = selects_for(500)
    assert (few, many) == (2, 13)
    # node page, current assignments, heard-from times, reports, calibration (+ the token, unless cached)
    assert len(many_selects) == len(few_selects) <= 7, many_selects


def test_list_plans_filters_and_cursor(client):
    p1, p2 = fleet_of_two(client)
    p3 = client.post("/v1/plans", json=PLAN_70B).json()  # supersedes p1
    r = client.get("/v1/plans").json()
    assert [p["id"] for p in r["items"]] == [p3["id"], p2["id"], p1["id"]] and r["next"] is None
    assert r["items"][0]["model"] == "meta-llama/Llama-3.1-70B" and r["items"][0]["assignments"][0]["node"] == "gpu-01"
    assert [p["id"] for p in client.get("/v1/plans", params={"node": "gpu-01"}).json()["items"]] == [p3["id"], p1["id"]]
    assert [p["id"] for p in client.get("/v1/plans", params={"model": "meta-llama/Llama-3.1-8B"}).json()["items"]] == [
        p2["id"]
    ]
    assert [p["id"] for p in client.get("/v1/plans", params={"status": "superseded"}).json()["items"]] == [p1["id"]]
    assert [
        p["id"] for p in client.get("/v1/plans", params={"status": "active", "node": "gpu-01"}).json()["items"]
    ] == [p3["id"]]
    page1 = client.get("/v1/plans", params={"limit": 2}).json()
    assert [p["id"] for p in page1["items"]] == [p3["id"], p2["id"]] and page1["next"] == p2["id"]
    page2 = client.get("/v1/plans", params={"limit": 2, "after": page1["next"]}).json()
    assert [p["id"] for p in page2["items"]] == [p1["id"]] and page2["next"] is None
    future = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    past = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert client.get("/v1/plans", params={"since": future}).json()["items"] == []
    assert len(client.get("/v1/plans", params={"since": past, "until": future}).json()["items"]) == 3
    assert client.get("/v1/plans", params={"until": past}).json()["items"] == []


def test_list_plans_bad_input_names_the_field(client):
    fleet_of_two(client)
    for params, field in (
        ({"status": "running"}, "status"),
        ({"since": "yesterday"}, "since"),
        ({"limit": 0}, "limit"),
        ({"after": "x" * 37}, "after"),
        ({"since": "2026-12-02T00:00:00Z", "until": "2026-12-01T00:00:00Z"}, "until"),
    ):
        r = client.get("/v1/plans", params=params)
        assert r.status_code == 422, (params, r.text)
        assert r.json()["errors"][0]["field"] in (field, f"query.{field}")
    r = client.get("/v1/plans", params={"mdoel": "x"})  # a misspelt filter does not list everything
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "query.mdoel"
    assert client.get("/v1/plans?=false").status_code == 422
    r = client.get("/v1/plans", params={"after": "no-such-plan"})
    assert r.status_code == 404 and r.json()["field"] == "after"


def test_list_plans_redacts_env_for_auditors(client):
    register_node(client)
    register_manifest(client)
    client.post("/v1/plans", json={**PLAN_70B, "env": {"VLLM_API_KEY": "s3cret"}})
    auditor = client.post("/v1/tokens", json={"role": "auditor"}).json()["token"]
    item = client.get("/v1/plans", headers={"Authorization": f"Bearer {auditor}"}).json()["items"][0]
    assert item["env"] == {"VLLM_API_KEY": "<redacted>"} and item.get("signed") is None
    assert "s3cret" not in str(item)
    assert client.get("/v1/plans").json()["items"][0]["env"] == {"VLLM_API_KEY": "s3cret"}


def _counts(db):
    with db.transaction() as s:
        return tuple(
            s.execute(select(func.count()).select_from(t)).scalar() for t in (Plan, Assignment, AuditEvent, Report)
        )


def test_dry_run_stores_nothing_and_consumes_no_seq(client, db):
    register_node(client)
    register_manifest(client)
    before = _counts(db)
    r = client.post("/v1/plans", params={"dry_run": "true"}, json=PLAN_70B)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["dry_run"] is True and out["verdict"] in ("accept", "warn")
    assert out["argv"][:3] == ["vllm", "serve", "s3://weights/meta-llama/Llama-3.1-70B"]
    assert out["argv"][out["argv"].index("--tensor-parallel-size") + 1] == "8"
    assert out["budget"]["max_model_len"] == 8192 and out["budget"]["kv_cache_tokens"] > 0
    assert out["nodes"] == ["gpu-01"] and out["manifest"] == "meta-llama/Llama-3.1-70B@1"
    assert _counts(db) == before
    real = client.post("/v1/plans", json=PLAN_70B).json()
    assert real["assignments"][0]["seq"] == 1  # the dry run took no seq
    assert real["argv"] == out["argv"]


def test_dry_run_rejected_is_422_with_findings_and_nothing_stored(client, db):
    register_node(client)
    register_manifest(client)
    before = _counts(db)
    r = client.post("/v1/plans?dry_run=true", json={**PLAN_70B, "engine_args": {"tensor_parallel_size": 3}})
    assert r.status_code == 422
    body = r.json()
    assert body["dry_run"] is True and any(f["rule"] == "tp_heads_divisible" for f in body["findings"]), body[
        "findings"
    ]
    assert _counts(db) == before
    assert client.post("/v1/plans?dry_run=true", json={**PLAN_70B, "nodes": ["nope"]}).status_code == 404
    assert client.post("/v1/plans?dry_run=maybe", json=PLAN_70B).json()["errors"][0]["field"] == "query.dry_run"


def test_dry_run_needs_a_deployer(client):
    register_node(client)
    register_manifest(client)
    auditor = client.post("/v1/tokens", json={"role": "auditor"}).json()["token"]
    r = client.post("/v1/plans?dry_run=true", json=PLAN_70B, headers={"Authorization": f"Bearer {auditor}"})
    assert r.status_code == 403


def test_no_workload_production_warns_when_max_num_seqs_exceeds_the_bound_at_max_model_len(client):
    """An L4 at 8192 tokens holds 3 sequences of Llama-3.1-8B; vLLM's default max_num_seqs 256 warned of
    nothing."""
    register_node(client, "l4-01", gpu="NVIDIA L4", count=1, interconnect=None)
    register_manifest(client, fixture="meta-llama__Meta-Llama-3.1-8B", name="meta-llama/Llama-3.1-8B")
    body = {
        "manifest": "meta-llama/Llama-3.1-8B@1",
        "nodes": ["l4-01"],
        "engine_args": {"max_model_len": 8192, "gpu_memory_utilization": 0.9},
    }
    out = client.post("/v1/plans?dry_run=true", json=body).json()
    f = next(f for f in out["findings"] if f["rule"] == "max_num_seqs_above_bound_at_max_len")
    assert out["verdict"] == "warn" and f["severity"] == "warning"
    assert f["remedy"] == {"max_num_seqs": 3} and f["data"]["bound"] == 3 == out["budget"]["max_num_seqs_bound"]
    assert "max_num_seqs 256" in f["message"] and "at most 3" in f["message"]
    fixed = client.post(
        "/v1/plans?dry_run=true", json={**body, "engine_args": {**body["engine_args"], "max_num_seqs": 3}}
    ).json()
    assert not any(f["rule"].startswith("max_num_seqs_above") for f in fixed["findings"])
    bench = client.post("/v1/plans?dry_run=true", json={**body, "environment": "benchmark"}).json()
    assert not any(f["rule"] == "max_num_seqs_above_bound_at_max_len" for f in bench["findings"])
    # with a workload the bound at the average length is judged instead (and the value filled from it)
    wl = client.post("/v1/plans?dry_run=true", json={**body, "workload": {"avg_seq_len": 1000}}).json()
    assert not any(f["rule"] == "max_num_seqs_above_bound_at_max_len" for f in wl["findings"])


def test_too_big_names_the_gpu_count_and_the_quantized_variants_that_fit(client):
    from tests.support import hf_quant_config

    register_node(client, "h100x2", count=2)
    register_manifest(client)  # Llama-3.1-70B, bf16
    fp8 = "nvidia__Llama-3.1-70B-Instruct-FP8"
    register_manifest(
        client,
        fixture=fp8,
        name="nvidia/Llama-3.1-70B-Instruct-FP8",
        quantization_txt="modelopt\n",
        hf_quant_config=hf_quant_config(fp8),
    )
    register_manifest(client, fixture="meta-llama__Meta-Llama-3.1-8B", name="meta-llama/Llama-3.1-8B")
    body = {
        "manifest": "meta-llama/Llama-3.1-70B@1",
        "nodes": ["h100x2"],
        "engine_args": {"tensor_parallel_size": 2, "max_model_len": 8192, "gpu_memory_utilization": 0.9},
    }
    for path in ("/v1/plans?dry_run=true", "/v1/plans"):
        r = client.post(path, json=body)
        assert r.status_code == 422, r.text
        out = r.json()
        f = next(f for f in out["findings"] if f["rule"] == "kv_cache_fits_max_len")  # weights fit, KV does not
        assert f["data"]["min_gpus"] == 4 and "needs at least 4 × NVIDIA H100" in f["message"]
        assert None not in f["remedy"].values()  # (was {"tensor_parallel_size": null, ...})
        assert [v["manifest"] for v in out["variants"]] == ["nvidia/Llama-3.1-70B-Instruct-FP8@1"]
        assert out["variants"][0]["quantization"] == "modelopt" and out["variants"][0]["verdict"] in ("accept", "warn")
    assert client.get("/v1/plans").json()["items"] == []
