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
    ("listPlans", "GET", "/v1/plans?node=gpu-a", None, READERS, 200),
    ("getPlan", "GET", lambda c, w: f"/v1/plans/{w['plan']}", None, READERS, 200),
    ("upgradeImpact", "GET", "/v1/upgrade-impact?vllm_version=0.33", None, READERS, 200),
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
    ("latestAuditCheckpoint", "GET",  # (verify first: it waits for the sealer, which makes the first checkpoint)
     lambda c, w: c.get("/v1/audit/verify") and "/v1/audit/checkpoints/latest", None,
     {"admin", "deployer", "auditor", "agent_own", "agent_other"}, 200),
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


# Issue 14: lock-out and resurrection
def _settings_without_env_admin(settings):
    return settings.model_copy(update={"admin_token": None})


def test_last_active_admin_token_cannot_be_revoked_and_a_revoked_token_cannot_be_rotated(settings, db, keys):
    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from service.services import tokens as token_service

    with db.transaction() as s:
        first, row = token_service.create(s, role="admin", label="bootstrap")
    app = create_app(_settings_without_env_admin(settings), db=db, keys=keys)
    with TestClient(app) as c:
        c.headers["Authorization"] = f"Bearer {first}"
        r = c.post(f"/v1/tokens/{row.id}/revoke")
        assert r.status_code == 409 and "last active admin" in r.json()["detail"], r.text
        second = c.post("/v1/tokens", json={"role": "admin", "label": "second"}).json()
        assert c.post(f"/v1/tokens/{row.id}/revoke").status_code == 200  # another admin exists now
        c.headers["Authorization"] = f"Bearer {second['token']}"
        assert c.post(f"/v1/tokens/{second['id']}/revoke").status_code == 409  # now the last one
        r = c.post(f"/v1/tokens/{row.id}/rotate")
        assert r.status_code == 409, r.text  # no resurrection of a revoked token
        assert [t["id"] for t in c.get("/v1/tokens").json()["items"] if t["revoked_at"] is None] == [second["id"]]
        rotated = c.post(f"/v1/tokens/{second['id']}/rotate")  # rotating the last admin keeps one admin
        assert rotated.status_code == 200, rotated.text
        c.headers["Authorization"] = f"Bearer {rotated.json()['token']}"
        assert c.get("/v1/tokens").status_code == 200


def test_serve_never_prints_a_revoked_bootstrap_token(settings, db):
    from service.cli import bootstrap_admin_token
    from service.services import tokens as token_service

    s = _settings_without_env_admin(settings)
    s.data_dir.mkdir(parents=True, exist_ok=True)
    token, generated = bootstrap_admin_token(s, db)
    assert generated and token
    assert bootstrap_admin_token(s, db) == (token, False)
    with db.transaction() as session:
        token_service.create(session, role="admin", label="another")
        row = token_service.authenticate(session, token)
        token_service.revoke(session, row.token_id)
    assert bootstrap_admin_token(s, db) == (None, False)


def test_concurrent_conditional_patches_let_exactly_one_through(client, monkeypatch):
    """10 PATCHes with one If-Match at once: the row is read FOR UPDATE, so one matches and 9 get 412 (PostgreSQL
    let up to 9 through when it read the row without a lock). The read-to-write window is widened (a pause where
    the update copies the old state) so that, without the lock, the requests would all read the same row."""
    import concurrent.futures
    import time

    from service.services import nodes as node_service

    real = node_service.node_dict

    def slow_node_dict(n):
        time.sleep(0.05)
        return real(n)

    client.post("/v1/nodes", json={"name": "n1", "gpu": "h100-sxm-80gb", "gpu_count": 8})
    etag = client.get("/v1/nodes/n1").headers["ETag"]
    monkeypatch.setattr(node_service, "node_dict", slow_node_dict)
    barrier = __import__("threading").Barrier(10)

    def patch(i):
        barrier.wait()
        return client.patch("/v1/nodes/n1", json={"labels": {"writer": str(i)}}, headers={"If-Match": etag}).status_code

    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        codes = sorted(pool.map(patch, range(10)))
    assert codes == [200] + [412] * 9, codes
    updates = [e for e in client.get("/v1/audit", params={"kind": "node.updated"}).json()["items"]]
    assert len(updates) == 1
