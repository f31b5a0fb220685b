"""A plan that names who must have signed the weights (``weights_signer``): signed into
``node_checks.weights_expected.signature`` for the node to verify model.sig with (service/agent/provenance.py),
stored with the plan and kept by a reissue; a signer nobody can verify with is a 422 naming the field; what the node
found comes back in the ``started`` report and stays in the audit."""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from service.agent.verify import verify_plan
from tests.support.api import register_manifest, register_node

ARGS = {"tensor_parallel_size": 8, "max_model_len": 8192, "gpu_memory_utilization": 0.9}


def pem(key) -> str:
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return public.decode("ascii")


def plan(client, **extra):
    return client.post(
        "/v1/plans",
        json={"manifest": "meta-llama/Llama-3.1-70B@1", "nodes": ["gpu-01"], "engine_args": ARGS, **extra},
    )


def test_a_named_signer_is_signed_for_the_node_kept_by_a_reissue_and_the_result_audited(client, settings):
    node = register_node(client)
    register_manifest(client)
    signer = {"public_key": pem(ec.generate_private_key(ec.SECP256R1()))}
    r = plan(client, weights_signer=signer)
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["weights_check"] == {"mode": "verify", "signer": signer}
    agent = client.headers.copy()
    agent["Authorization"] = f"Bearer {node['agent_token']}"
    fetched = client.get("/v1/nodes/gpu-01/plan", headers=agent)
    jwks = client.get("/.well-known/jwks.json").json()
    claims = verify_plan(fetched.text, jwks, node="gpu-01", audience=settings.audience).claims
    assert claims["node_checks"]["weights_expected"]["signature"] == signer

    provenance = {"status": "verified", "message": "/w/model.sig verified: signed by key sha256:0123456789abcdef"}
    rep = client.post(
        "/v1/nodes/gpu-01/reports",
        headers=agent,
        json={
            "plan_id": created["id"],
            "status": "started",
            "message": "pid 7",
            "details": {"pid": 7, "provenance": provenance},
        },
    )
    assert rep.status_code == 201, rep.text
    events = client.get("/v1/audit", params={"node": "gpu-01"}).json()["items"]
    started = next(e for e in events if e["kind"] == "agent.started")
    assert started["payload"]["details"]["provenance"] == provenance

    again = client.post(f"/v1/plans/{created['id']}/reissue")
    assert again.status_code == 201, again.text
    assert again.json()["weights_check"] == {"mode": "verify", "signer": signer}


def test_a_signer_nobody_can_verify_with_is_a_422_naming_the_field(client):
    register_node(client)
    register_manifest(client)
    for bad, said in [
        ({"public_key": pem(ed25519.Ed25519PrivateKey.generate())}, "elliptic-curve key on secp256r1"),
        ({"identity": "release@example.com", "oidc_issuer": "http://issuer"}, "https://"),
        ({"public_key": "x", "identity": "y"}, "must be {public_key}"),
    ]:
        r = plan(client, weights_signer=bad)
        assert r.status_code == 422 and "weights_signer" in r.text and said in r.text, r.text
    r = plan(
        client,
        weights_check="skip",
        weights_check_reason="vendor loader",
        weights_signer={"identity": "release@example.com", "oidc_issuer": "https://issuer"},
    )
    assert r.status_code == 422 and "checks no signature" in r.text
