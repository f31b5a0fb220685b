"""A pinned KV pool. A node reports what vLLM printed; a plan with ``kv_cache_pool: pinned`` for the
same manifest, version and engine arguments renders ``--kv-cache-memory-bytes`` with that pool, and the argv
round-trips through the catalogue's parser (service/domain/render.py ``parse_argv``)."""

from __future__ import annotations

from service.agent.runner import parse_line
from service.domain.render import parse_argv
from service.domain.versions import resolve_version
from tests.support.api import register_manifest, register_node

ARGS = {"tensor_parallel_size": 8, "max_model_len": 8192, "gpu_memory_utilization": 0.9}
# vLLM 0.33's line (vllm/v1/worker/gpu_worker.py:1012-1066), as the agent reads it
LINE_033 = (
    "INFO gpu_worker.py:1066] Free memory on device (79.1/79.19 GiB) on startup. Desired GPU memory "
    "utilization is (0.9, 71.27 GiB). Actual usage is 17.9 GiB for consumed memory (weights + non-torch), "
    "1.6 GiB for peak activation, and 0.6 GiB for CUDAGraph memory. Replace gpu_memory_utilization config "
    "with `--kv-cache-memory=54599544012` (50.85 GiB) to fit into requested memory, or "
    "`--kv-cache-memory=62112221184` (57.85 GiB) to fully utilize gpu memory. Current kv cache memory in use "
    "is 51.0 GiB."
)


def plan(client, **extra):
    return client.post(
        "/v1/plans",
        json={"manifest": "meta-llama/Llama-3.1-70B@1", "nodes": ["gpu-01"], "engine_args": dict(ARGS), **extra},
    )


def test_agent_reads_the_033_suggestion_to_fit_requested_memory():
    figures: dict = {}
    parse_line(LINE_033, figures)
    assert figures["kv_cache_memory_bytes_suggested"] == 54599544012  # the first: "to fit into requested memory"


def test_pinned_pool_needs_a_report_then_renders_kv_cache_memory_bytes(client):
    node = register_node(client)
    register_manifest(client)
    r = plan(client, kv_cache_pool="pinned")
    assert r.status_code == 422, r.text
    assert "kv_pool_not_measured" in r.text

    first = plan(client)
    assert first.status_code == 201, first.text
    assert "--kv-cache-memory-bytes" not in first.json()["argv"]
    agent = client.headers.copy()
    agent["Authorization"] = f"Bearer {node['agent_token']}"
    figures: dict = {"kv_cache_tokens": 1_290_000, "available_kv_cache_gib": 51.0}
    parse_line(LINE_033, figures)
    rep = client.post(
        "/v1/nodes/gpu-01/reports",
        headers=agent,
        json={"plan_id": first.json()["id"], "status": "running", "details": {"vllm": figures}},
    )
    assert rep.status_code == 201, rep.text

    other = plan(client, kv_cache_pool="pinned", workload={"avg_seq_len": 2000})  # workload is not a launch arg
    assert other.status_code == 201, other.text
    argv = other.json()["argv"]
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == "54599544012"
    _, args = parse_argv(argv, resolve_version("0.33.0")[1])
    assert args["kv_cache_memory_bytes"] == 54599544012 and args["tensor_parallel_size"] == 8
    assert other.json()["budget"]["kv_cache_bytes_per_gpu"] == 54599544012

    # another launch (different max_model_len) has no measurement yet
    changed = client.post(
        "/v1/plans",
        json={
            "manifest": "meta-llama/Llama-3.1-70B@1",
            "nodes": ["gpu-01"],
            "engine_args": {**ARGS, "max_model_len": 4096},
            "kv_cache_pool": "pinned",
        },
    )
    assert changed.status_code == 422 and "kv_pool_not_measured" in changed.text


def test_an_impossible_pool_is_refused_given_or_reported(client):
    """A pool larger than the GPU is refused when given (rule kv_cache_memory_fits: vLLM reserves it as given), and a
    node that reports one cannot pin it; a pinned plan does not take a kv_cache_memory_bytes of its own."""
    node = register_node(client)
    register_manifest(client)
    huge = client.post(
        "/v1/plans",
        json={
            "manifest": "meta-llama/Llama-3.1-70B@1",
            "nodes": ["gpu-01"],
            "engine_args": {**ARGS, "kv_cache_memory_bytes": 1 << 50},
        },
    )
    assert huge.status_code == 422, huge.text
    err = next(e for e in huge.json()["findings"] if e["rule"] == "kv_cache_memory_fits")
    assert err["field"] == "engine_args.kv_cache_memory_bytes" and "exceed the GPU's 79.15 GiB" in err["message"]
    first = plan(client)
    agent = client.headers.copy()
    agent["Authorization"] = f"Bearer {node['agent_token']}"
    rep = client.post(
        "/v1/nodes/gpu-01/reports",
        headers=agent,
        json={
            "plan_id": first.json()["id"],
            "status": "running",
            "details": {"vllm": {"available_kv_cache_gib": 1048576}},
        },
    )
    assert rep.status_code == 201
    pinned = plan(client, kv_cache_pool="pinned")
    assert pinned.status_code == 422 and "kv_pool_not_measured" in pinned.text  # the report is not believed
    both = client.post(
        "/v1/plans",
        json={
            "manifest": "meta-llama/Llama-3.1-70B@1",
            "nodes": ["gpu-01"],
            "engine_args": {**ARGS, "kv_cache_memory_bytes": 40 << 30},
            "kv_cache_pool": "pinned",
        },
    )
    assert both.status_code == 422 and both.json()["errors"][0]["rule"] == "kv_pool_conflict"
    abbreviated = client.post(  # the same option as a prefix vLLM's parser accepts
        "/v1/plans",
        json={
            "manifest": "meta-llama/Llama-3.1-70B@1",
            "nodes": ["gpu-01"],
            "engine_args": {**ARGS, "--kv-cache-memory": 40 << 30},
            "kv_cache_pool": "pinned",
        },
    )
    assert abbreviated.status_code == 422 and abbreviated.json()["errors"][0]["rule"] == "kv_pool_conflict"
