"""The authorization matrix: every route × every role (and own vs other node), each asserting the exact status."""

from __future__ import annotations

import itertools

import pytest

from tests.support import model_config

ROLES = ["admin", "deployer", "auditor", "agent_own", "agent_other", "anonymous", "revoked"]
READERS = {"admin", "deployer", "auditor"}
counter = itertools.count()


@pytest.fixture
def world(client):
    """Nodes gpu-a (with a plan), gpu-b, gpu-c (scratch); a manifest; one token per role."""
    tokens = {}
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        r = client.post("/v1/nodes", json={"name": name, "gpu": "h100-sxm-80gb", "gpu_count": 8,
                                           "interconnect": "nvlink"})
        tokens[name] = r.json()["agent_token"]
    client.post("/v1/manifests", json={"name": "llama", "version": "1", "uri": "s3://llama",
                                       "config": model_config("meta-llama__Meta-Llama-3.1-8B")})
    plan = client.post("/v1/plans", json={"manifest": "llama", "nodes": ["gpu-a"],
                                          "engine_args": {"max_model_len": 8192}}).json()
    for role in ("deployer", "auditor"):
        tokens[role] = client.post("/v1/tokens", json={"role": role}).json()["token"]
    revoked = client.post("/v1/tokens", json={"role": "deployer"}).json()
    client.post(f"/v1/tokens/{revoked['id']}/revoke")
    auth = {"admin": client.headers["Authorization"], "deployer": f"Bearer {tokens['deployer']}",
            "auditor": f"Bearer {tokens['auditor']}", "agent_own": f"Bearer {tokens['gpu-a']}",
            "agent_other": f"Bearer {tokens['gpu-b']}", "anonymous": "", "revoked": f"Bearer {revoked['token']}"}
    return {"plan": plan["id"], "auth": auth}


def scratch_plan(client) -> str:
    r = client.post("/v1/plans", json={"manifest": "llama", "nodes": ["gpu-c"], "engine_args": {"max_model_len": 4096}})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def scratch_token(client) -> int:
    return client.post("/v1/tokens", json={"role": "auditor"}).json()["id"]


# (name, method, path-or-builder, body-or-builder, allowed roles, success status)
ROUTES = [
    ("healthz", "GET", "/healthz", None, "public", 200),
    ("jwks", "GET", "/.well-known/jwks.json", None, "public", 200),
    ("keysets", "GET", "/v1/keysets", None, "public", 200),
    ("registerNode", "POST", "/v1/nodes",
     lambda c, w: {"name": f"n{next(counter)}", "gpu": "h100-sxm-80gb", "gpu_count": 8}, {"admin"}, 201),
    ("listNodes", "GET", "/v1/nodes", None, READERS, 200),
    ("getNode", "GET", "/v1/nodes/gpu-a", None, READERS, 200),
    ("rotateNodeToken", "POST", "/v1/nodes/gpu-c/token", None, {"admin"}, 200),
    ("registerManifest", "POST", "/v1/manifests",
     lambda c, w: {"name": "m", "version": f"v{next(counter)}", "uri": "s3://m",
                   "config": model_config("meta-llama__Meta-Llama-3.1-8B")}, {"admin", "deployer"}, 201),
    ("listManifests", "GET", "/v1/manifests", None, READERS, 200),
    ("getManifest", "GET", "/v1/manifests/llama@1", None, READERS, 200),
    ("validateLaunch", "POST", "/v1/validate",
     lambda c, w: {"model": {"config": model_config("meta-llama__Meta-Llama-3.1-8B")},
                   "hardware": {"gpu": "h100-sxm-80gb"}}, READERS, 200),
    ("createPlan", "POST", "/v1/plans",
     lambda c, w: {"manifest": "llama", "nodes": ["gpu-c"], "engine_args": {"max_model_len": 2048}},
     {"admin", "deployer"}, 201),
    ("getPlan", "GET", lambda c, w: f"/v1/plans/{w['plan']}", None, READERS, 200),
    ("revokePlan", "POST", lambda c, w: f"/v1/plans/{scratch_plan(c)}/revoke", None, {"admin", "deployer"}, 200),
    ("reissuePlan", "POST", lambda c, w: f"/v1/plans/{scratch_plan(c)}/reissue", None, {"admin", "deployer"}, 201),
    ("fetchNodePlan", "GET", "/v1/nodes/gpu-a/plan", None, {"admin", "agent_own"}, 200),
    ("reportNodeStatus", "POST", "/v1/nodes/gpu-a/reports",
     lambda c, w: {"plan_id": w["plan"], "status": "running"}, {"admin", "agent_own"}, 201),
    ("updateNode", "PATCH", "/v1/nodes/gpu-b", lambda c, w: {"labels": {"n": str(next(counter))}}, {"admin"}, 200),
    ("nodeHistory", "GET", "/v1/nodes/gpu-a/history", None, READERS, 200),
    ("nodeRuns", "GET", "/v1/nodes/gpu-a/runs", None, READERS, 200),
    ("planPlacements", "GET", lambda c, w: f"/v1/plans/{w['plan']}/placements", None, READERS, 200),
    ("calibration", "GET", "/v1/calibration", None, READERS, 200),
    ("listAudit", "GET", "/v1/audit", None, {"admin", "auditor"}, 200),
    ("exportAudit", "GET", "/v1/audit/export", None, {"admin", "auditor"}, 200),
    ("createAuditCheckpoint", "POST", "/v1/audit/checkpoints", None, {"admin", "auditor"}, 201),
    ("verifyAudit", "GET", "/v1/audit/verify", None, {"admin", "auditor"}, 200),
    ("createToken", "POST", "/v1/tokens", lambda c, w: {"role": "auditor"}, {"admin"}, 201),
    ("listTokens", "GET", "/v1/tokens", None, {"admin"}, 200),
    ("revokeToken", "POST", lambda c, w: f"/v1/tokens/{scratch_token(c)}/revoke", None, {"admin"}, 200),
    ("rotateToken", "POST", lambda c, w: f"/v1/tokens/{scratch_token(c)}/rotate", None, {"admin"}, 200),
]


def expected(allowed, role, success):
    if allowed == "public":
        return success
    if role in ("anonymous", "revoked"):
        return 401
    return success if role in allowed else 403


@pytest.mark.parametrize("route", ROUTES, ids=[r[0] for r in ROUTES])
def test_matrix(client, world, route):
    name, method, path, body, allowed, success = route
    admin_auth = client.headers["Authorization"]
    for role in ROLES:
        client.headers["Authorization"] = admin_auth
        p = path(client, world) if callable(path) else path
        b = body(client, world) if callable(body) else body
        r = client.request(method, p, json=b, headers={"Authorization": world["auth"][role]})
        assert r.status_code == expected(allowed, role, success), f"{name} as {role}: {r.status_code} {r.text[:200]}"
    client.headers["Authorization"] = admin_auth


def test_every_route_is_in_the_matrix(client):
    ops = {op["operationId"] for path in client.app.openapi()["paths"].values() for op in path.values()}
    assert ops == {r[0] for r in ROUTES} | {"readyz", "metrics"}
