"""Registering nodes, manifests and plans through the API (a TestClient), as most service tests start."""

from __future__ import annotations

from tests.support import model_config

H100 = "NVIDIA H100 80GB HBM3"  # the name nvidia-smi prints


def register_node(client, name="gpu-01", gpu=H100, count=8, interconnect="nvlink"):
    r = client.post("/v1/nodes", json={"name": name, "gpu": gpu, "gpu_count": count, "interconnect": interconnect})
    assert r.status_code == 201, r.text
    return r.json()


def register_manifest(
    client, fixture="meta-llama__Meta-Llama-3.1-70B", name="meta-llama/Llama-3.1-70B", version="1", **extra
):
    body = {"name": name, "version": version, "uri": f"s3://weights/{name}", "config": model_config(fixture), **extra}
    r = client.post("/v1/manifests", json=body)
    assert r.status_code == 201, r.text
    return r.json()


PLAN_70B = {
    "manifest": "meta-llama/Llama-3.1-70B@1",
    "nodes": ["gpu-01"],
    "engine_args": {"tensor_parallel_size": 8, "max_model_len": 8192, "gpu_memory_utilization": 0.9},
}
PLAN = {"manifest": "meta-llama/Llama-3.1-70B@1", "engine_args": {"tensor_parallel_size": 8, "max_model_len": 8192}}


def setup_fleet(client, names=("gpu-01", "gpu-02")) -> dict[str, dict]:
    """Nodes with a plan each; returns name -> {"token", "plan"}."""
    register_manifest(client)
    out = {}
    for n in names:
        token = register_node(client, name=n)["agent_token"]
        r = client.post("/v1/plans", json={**PLAN, "nodes": [n]})
        assert r.status_code == 201, r.text
        out[n] = {"token": token, "plan": r.json()}
    return out


def fetch(client, node, token, **headers):
    return client.get(f"/v1/nodes/{node}/plan", headers={"Authorization": f"Bearer {token}", **headers})


def fleet_of_two(client):
    """Two H100 nodes: gpu-01 runs Llama-3.1-70B (reported running with vLLM's figures), gpu-02 has a Llama-3.1-8B
    plan its agent refused."""
    a1 = register_node(client, "gpu-01")["agent_token"]
    a2 = register_node(client, "gpu-02")["agent_token"]
    register_manifest(client)
    register_manifest(client, fixture="meta-llama__Meta-Llama-3.1-8B", name="meta-llama/Llama-3.1-8B")
    p1 = client.post("/v1/plans", json=PLAN_70B).json()
    p2 = client.post(
        "/v1/plans",
        json={
            "manifest": "meta-llama/Llama-3.1-8B@1",
            "nodes": ["gpu-02"],
            "engine_args": {"max_model_len": 4096, "gpu_memory_utilization": 0.9},
        },
    ).json()
    r = client.post(
        "/v1/nodes/gpu-01/reports",
        headers={"Authorization": f"Bearer {a1}"},
        json={
            "plan_id": p1["id"],
            "status": "running",
            "message": "up",
            "details": {"vllm": {"kv_cache_tokens": 500000}},
        },
    )
    assert r.status_code == 201, r.text
    r = client.post(
        "/v1/nodes/gpu-02/reports",
        headers={"Authorization": f"Bearer {a2}"},
        json={"plan_id": p2["id"], "status": "refused", "details": {"reason": "signature"}},
    )
    assert r.status_code == 201, r.text
    return p1, p2
