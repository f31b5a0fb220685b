"""Multi-node plans through the API: H200 nodes, the DeepSeek-V3 manifest, a TP16 plan."""

from __future__ import annotations

from tests.support.api import register_manifest

H200 = "h200-141gb"
TP16 = {"tensor_parallel_size": 16, "max_model_len": 32768}


def node(client, name, address=None, count=8, gpu=H200):
    body = {"name": name, "gpu": gpu, "gpu_count": count, "interconnect": "nvlink"}
    if address is not None:
        body["address"] = address
    r = client.post("/v1/nodes", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def deepseek(client):
    return register_manifest(client, fixture="deepseek-ai__DeepSeek-V3", name="deepseek-ai/DeepSeek-V3")


def plan(client, nodes, engine_args, manifest="deepseek-ai/DeepSeek-V3@1", status=201, **extra):
    r = client.post("/v1/plans", json={"manifest": manifest, "nodes": nodes, "engine_args": engine_args, **extra})
    assert r.status_code == status, r.text
    return r.json()


def agent_headers(token):
    return {"Authorization": f"Bearer {token}"}
