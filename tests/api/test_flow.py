"""The v0 path end to end over HTTP: register → plan → agent fetch → verify → report → audit."""

from __future__ import annotations

import base64
import json

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from service.agent.verify import verify_plan
from tests.support import audit_events, hf_quant_config, model_config
from tests.support.api import H100, register_manifest, register_node


def b64d(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def independent_verify(token: str, jwks: dict) -> dict:
    """RFC 7515 compact JWS + RFC 8037 Ed25519, checked with `cryptography` alone (raises on a bad signature)."""
    h, p, sig = token.split(".")
    header = json.loads(b64d(h))
    assert header["alg"] == "Ed25519" and header["typ"] == "application/vnd.preflight.plan+jwt"
    jwk = next(k for k in jwks["keys"] if k["kid"] == header["kid"])
    assert jwk["kty"] == "OKP" and jwk["crv"] == "Ed25519"
    Ed25519PublicKey.from_public_bytes(b64d(jwk["x"])).verify(b64d(sig), f"{h}.{p}".encode())
    return json.loads(b64d(p))


def test_register_plan_fetch_verify_report_audit(client, settings):
    node = register_node(client)
    assert node["gpu"]["id"] == "h100-sxm-80gb" and node["gpu"]["memory_bytes"] == 85520809984
    manifest = register_manifest(client)
    r = client.post(
        "/v1/plans",
        json={
            "manifest": "meta-llama/Llama-3.1-70B@1",
            "nodes": ["gpu-01"],
            "engine_args": {"tensor_parallel_size": 8, "max_model_len": 8192, "gpu_memory_utilization": 0.9},
        },
    )
    assert r.status_code == 201, r.text
    plan = r.json()
    assert plan["verdict"] in ("accept", "warn")
    assert plan["argv"][:3] == ["vllm", "serve", "s3://weights/meta-llama/Llama-3.1-70B"]
    assert plan["argv"][plan["argv"].index("--tensor-parallel-size") + 1] == "8"
    assert plan["argv"][plan["argv"].index("--max-model-len") + 1] == "8192"

    agent = client.headers.copy()
    agent["Authorization"] = f"Bearer {node['agent_token']}"
    fetched = client.get("/v1/nodes/gpu-01/plan", headers=agent)
    assert fetched.status_code == 200 and fetched.headers["content-type"].startswith("application/jose")
    jwks = client.get("/.well-known/jwks.json").json()
    verified = verify_plan(fetched.text, jwks, node="gpu-01", audience=settings.audience)
    assert verified.argv == plan["argv"] and verified.seq == 1
    assert verified.claims["manifest_digest"] == manifest["digest"]

    # an independent implementation (raw `cryptography` Ed25519 over the JWS signing input) verifies it too
    claims = independent_verify(fetched.text, jwks)
    assert claims["sub"] == "gpu-01" and claims["argv"] == plan["argv"]

    unchanged = client.get("/v1/nodes/gpu-01/plan", headers={**agent, "If-None-Match": fetched.headers["ETag"]})
    assert unchanged.status_code == 304

    rep = client.post(
        "/v1/nodes/gpu-01/reports",
        headers=agent,
        json={"plan_id": plan["id"], "status": "running", "message": "vLLM up"},
    )
    assert rep.status_code == 201, rep.text

    events = client.get("/v1/audit", params={"node": "gpu-01"}).json()["items"]
    assert [e["kind"] for e in events] == ["node.registered", "plan.created", "plan.fetched", "agent.running"]
    verdict = client.get("/v1/audit/verify").json()
    assert verdict["ok"] is True and verdict["events"] >= 5


def test_tp3_refused_with_valid_sizes_and_nothing_stored(client):
    register_node(client)
    register_manifest(client)
    before = audit_events(client)
    r = client.post(
        "/v1/plans",
        json={"manifest": "meta-llama/Llama-3.1-70B", "nodes": ["gpu-01"], "engine_args": {"tensor_parallel_size": 3}},
    )
    assert r.status_code == 422
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    heads = next(f for f in body["findings"] if f["rule"] == "tp_heads_divisible")
    assert heads["remedy"] == {"tensor_parallel_size": [1, 2, 4, 8]}
    assert "Total number of attention heads (64) must be divisible by tensor parallel size (3)" in heads["message"]
    assert audit_events(client) == before  # nothing stored (seq/hash may be sealed meanwhile)


def test_phi3_medium_tp4_refused_by_kv_heads(client):
    register_node(client, name="a100-node", gpu="a100-sxm4-80gb", count=4)
    register_manifest(client, fixture="microsoft__Phi-3-medium-4k-instruct", name="microsoft/Phi-3-medium-4k-instruct")
    r = client.post(
        "/v1/plans",
        json={
            "manifest": "microsoft/Phi-3-medium-4k-instruct",
            "nodes": ["a100-node"],
            "engine_args": {"tensor_parallel_size": 4},
        },
    )
    assert r.status_code == 422
    kv = [f for f in r.json()["findings"] if f["rule"] == "tp_kv_heads"]
    assert kv and kv[0]["remedy"]["tensor_parallel_size"] == [1, 2]


def test_new_plan_supersedes_and_seq_increases(client, settings):
    node = register_node(client)
    register_manifest(client)
    ids = []
    for mml in (8192, 16384):
        r = client.post(
            "/v1/plans",
            json={
                "manifest": "meta-llama/Llama-3.1-70B",
                "nodes": ["gpu-01"],
                "engine_args": {"tensor_parallel_size": 8, "max_model_len": mml},
            },
        )
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    agent = {"Authorization": f"Bearer {node['agent_token']}"}
    token = client.get("/v1/nodes/gpu-01/plan", headers=agent).text
    jwks = client.get("/.well-known/jwks.json").json()
    v = verify_plan(token, jwks, node="gpu-01", audience=settings.audience, last_seq=1)
    assert v.seq == 2 and v.claims["jti"] == ids[1]
    first = client.get(f"/v1/plans/{ids[0]}").json()
    assert first["status"] == "superseded" and first["assignments"][0]["status"] == "superseded"
    revoked = client.post(f"/v1/plans/{ids[1]}/revoke")
    assert revoked.status_code == 200
    assert client.get("/v1/nodes/gpu-01/plan", headers=agent).status_code == 404


def test_modelopt_manifest_quantization_from_tag(client):
    register_node(client, name="h100", count=4)
    fixture = "nvidia__Llama-3.1-70B-Instruct-FP8"
    register_manifest(
        client,
        fixture=fixture,
        name="nvidia/Llama-3.1-70B-Instruct-FP8",
        quantization_txt="modelopt\n",
        hf_quant_config=hf_quant_config(fixture),
    )
    r = client.post(
        "/v1/plans",
        json={
            "manifest": "nvidia/Llama-3.1-70B-Instruct-FP8",
            "nodes": ["h100"],
            "engine_args": {"tensor_parallel_size": 4, "max_model_len": 8192},
        },
    )
    assert r.status_code == 201, r.text
    argv = r.json()["argv"]
    assert argv[argv.index("--quantization") + 1] == "modelopt"


def test_agent_cannot_fetch_another_nodes_plan(client):
    a = register_node(client, name="gpu-a")
    register_node(client, name="gpu-b")
    r = client.get("/v1/nodes/gpu-b/plan", headers={"Authorization": f"Bearer {a['agent_token']}"})
    assert r.status_code == 403
    assert client.get("/v1/nodes/gpu-b/plan", headers={"Authorization": ""}).status_code == 401
    assert (
        client.post(
            "/v1/nodes",
            headers={"Authorization": f"Bearer {a['agent_token']}"},
            json={"name": "x", "gpu": H100, "gpu_count": 1},
        ).status_code
        == 403
    )


def test_validate_endpoint_matches_cli_schema(client):
    body = {
        "model": {"name": "phi3", "config": model_config("microsoft__Phi-3-medium-4k-instruct")},
        "hardware": {"gpu": "a100-sxm4-80gb", "count": 4},
        "engine_args": {"tensor_parallel_size": 4},
    }
    r = client.post("/v1/validate", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["verdict"] == "reject" and "tp_kv_heads" in {f["rule"] for f in out["findings"]}
    assert json.dumps(out)  # serialisable


def test_long_poll_returns_304_after_wait_and_200_when_a_new_plan_lands(client):
    node = register_node(client)
    register_manifest(client)
    client.post(
        "/v1/plans",
        json={
            "manifest": "meta-llama/Llama-3.1-70B",
            "nodes": ["gpu-01"],
            "engine_args": {"tensor_parallel_size": 8, "max_model_len": 8192},
        },
    )
    agent = {"Authorization": f"Bearer {node['agent_token']}"}
    first = client.get("/v1/nodes/gpu-01/plan", headers=agent)
    r = client.get(
        "/v1/nodes/gpu-01/plan", params={"wait": 1}, headers={**agent, "If-None-Match": first.headers["ETag"]}
    )
    assert r.status_code == 304
    client.post(
        "/v1/plans",
        json={
            "manifest": "meta-llama/Llama-3.1-70B",
            "nodes": ["gpu-01"],
            "engine_args": {"tensor_parallel_size": 8, "max_model_len": 4096},
        },
    )
    r = client.get(
        "/v1/nodes/gpu-01/plan", params={"wait": 5}, headers={**agent, "If-None-Match": first.headers["ETag"]}
    )
    assert r.status_code == 200 and r.headers["X-Plan-Seq"] == "2"


def test_reissue_is_a_new_plan_with_a_new_seq(client, settings):
    node = register_node(client)
    register_manifest(client)
    old = client.post(
        "/v1/plans",
        json={
            "manifest": "meta-llama/Llama-3.1-70B",
            "nodes": ["gpu-01"],
            "engine_args": {"tensor_parallel_size": 8, "max_model_len": 8192},
        },
    ).json()
    client.post(
        "/v1/plans",
        json={
            "manifest": "meta-llama/Llama-3.1-70B",
            "nodes": ["gpu-01"],
            "engine_args": {"tensor_parallel_size": 8, "max_model_len": 4096},
        },
    )
    back = client.post(f"/v1/plans/{old['id']}/reissue")
    assert back.status_code == 201, back.text
    new = back.json()
    assert new["id"] != old["id"] and new["argv"] == old["argv"]
    assert new["assignments"][0]["seq"] == 3 and new["signed"] != old["signed"]
    token = client.get("/v1/nodes/gpu-01/plan", headers={"Authorization": f"Bearer {node['agent_token']}"}).text
    assert (
        verify_plan(
            token, client.get("/.well-known/jwks.json").json(), node="gpu-01", audience=settings.audience, last_seq=2
        ).claims["jti"]
        == new["id"]
    )


def test_workload_fills_recommended_values_into_the_signed_plan(client):
    """Llama-3.1-70B on 8 × H100, average 2000 tokens, P99 8000: every filled value explained, budget adds up."""
    register_node(client)
    register_manifest(client)
    r = client.post(
        "/v1/plans",
        json={
            "manifest": "meta-llama/Llama-3.1-70B",
            "nodes": ["gpu-01"],
            "workload": {"avg_seq_len": 2000, "p99_seq_len": 8000},
        },
    )
    assert r.status_code == 201, r.text
    plan = r.json()
    recs = {x["field"]: x for x in plan["recommendations"]}
    assert recs["tensor_parallel_size"]["value"] == 8
    assert recs["max_model_len"]["value"] == 10240  # 8000 × 1.2 = 9600 → next multiple of 1024
    assert recs["gpu_memory_utilization"]["value"] == 0.85
    assert all(x["why"] for x in plan["recommendations"])
    argv = plan["argv"]
    assert argv[argv.index("--max-model-len") + 1] == "10240"
    assert argv[argv.index("--max-num-seqs") + 1] == str(recs["max_num_seqs"]["value"])
    b = plan["budget"]
    assert b["weights_bytes_per_gpu"] + b["overhead_bytes"] + b["kv_cache_bytes_per_gpu"] == b["usable_bytes"]


def test_rejection_lists_the_nearest_launches_that_pass(client):
    register_node(client, name="a100-node", gpu="a100-sxm4-80gb", count=4)
    register_manifest(client, fixture="microsoft__Phi-3-medium-4k-instruct", name="phi3")
    r = client.post(
        "/v1/plans", json={"manifest": "phi3", "nodes": ["a100-node"], "engine_args": {"tensor_parallel_size": 4}}
    )
    assert r.status_code == 422
    alts = r.json()["alternatives"]
    assert alts and alts[0] == {"tensor_parallel_size": 2}
    ok = client.post("/v1/plans", json={"manifest": "phi3", "nodes": ["a100-node"], "engine_args": alts[0]})
    assert ok.status_code == 201


def test_revoke_is_idempotent_and_a_superseded_plan_cannot_be_revoked(client):
    """Revoking twice answers the same and records one event; a plan no node runs any more (superseded) is a 409,
    and its status stays what it was."""
    from tests.support.api import PLAN, setup_fleet

    fleet = setup_fleet(client, ["gpu-01"])
    first = fleet["gpu-01"]["plan"]["id"]
    second = client.post("/v1/plans", json={**PLAN, "nodes": ["gpu-01"]}).json()["id"]  # supersedes the first
    r = client.post(f"/v1/plans/{first}/revoke")
    assert r.status_code == 409 and r.json()["field"] == "plan_id", r.text
    assert client.get(f"/v1/plans/{first}").json()["status"] == "superseded"
    assert client.post(f"/v1/plans/{second}/revoke").status_code == 200
    again = client.post(f"/v1/plans/{second}/revoke")
    assert again.status_code == 200 and again.json()["status"] == "revoked"
    events = client.get("/v1/audit", params={"kind": "plan.revoked"}).json()["items"]
    assert [e["plan_id"] for e in events] == [second]
