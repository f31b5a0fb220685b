"""The authorization matrix: every route × every role (and own vs other node), each asserting the exact status."""

from __future__ import annotations

import itertools

import pytest

from tests.support import model_config

ROLES = ["admin", "deployer", "auditor", "agent_own", "agent_other", "enroller", "anonymous", "revoked"]
READERS = {"admin", "deployer", "auditor"}
counter = itertools.count()


@pytest.fixture
def world(client):
    """Nodes gpu-a (with a plan), gpu-b, gpu-c (scratch); a manifest; one token per role."""
    tokens = {}
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        r = client.post(
            "/v1/nodes", json={"name": name, "gpu": "h100-sxm-80gb", "gpu_count": 8, "interconnect": "nvlink"}
        )
        tokens[name] = r.json()["agent_token"]
    client.post(
        "/v1/manifests",
        json={
            "name": "llama",
            "version": "1",
            "uri": "s3://llama",
            "config": model_config("meta-llama__Meta-Llama-3.1-8B"),
        },
    )
    plan = client.post(
        "/v1/plans", json={"manifest": "llama", "nodes": ["gpu-a"], "engine_args": {"max_model_len": 8192}}
    ).json()
    for role in ("deployer", "auditor", "enroller"):
        tokens[role] = client.post("/v1/tokens", json={"role": role}).json()["token"]
    revoked = client.post("/v1/tokens", json={"role": "deployer"}).json()
    client.post(f"/v1/tokens/{revoked['id']}/revoke")
    auth = {
        "admin": client.headers["Authorization"],
        "deployer": f"Bearer {tokens['deployer']}",
        "auditor": f"Bearer {tokens['auditor']}",
        "agent_own": f"Bearer {tokens['gpu-a']}",
        "agent_other": f"Bearer {tokens['gpu-b']}",
        "enroller": f"Bearer {tokens['enroller']}",
        "anonymous": "",
        "revoked": f"Bearer {revoked['token']}",
    }
    return {"plan": plan["id"], "auth": auth}


def scratch_plan(client) -> str:
    r = client.post("/v1/plans", json={"manifest": "llama", "nodes": ["gpu-c"], "engine_args": {"max_model_len": 4096}})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def rollout_body(client) -> dict:
    """A rollout over a fresh node that has a plan (a node is in one rollout at a time)."""
    name = f"r{next(counter)}"
    client.post("/v1/nodes", json={"name": name, "gpu": "h100-sxm-80gb", "gpu_count": 8})
    r = client.post("/v1/plans", json={"manifest": "llama", "nodes": [name], "engine_args": {"max_model_len": 4096}})
    assert r.status_code == 201, r.text
    return {"manifest": "llama", "nodes": [name], "engine_args": {"max_model_len": 2048}, "waves": [{"percent": 100}]}


def scratch_rollout(client, pause: bool = False) -> str:
    r = client.post("/v1/rollouts", json=rollout_body(client))
    assert r.status_code == 201, r.text
    if pause:
        assert client.post(f"/v1/rollouts/{r.json()['id']}/pause").status_code == 200
    return r.json()["id"]


def scratch_token(client) -> int:
    return client.post("/v1/tokens", json={"role": "auditor"}).json()["id"]


# (name, method, path-or-builder, body-or-builder, allowed roles, success status)
ROUTES = [
    ("healthz", "GET", "/healthz", None, "public", 200),
    ("jwks", "GET", "/.well-known/jwks.json", None, "public", 200),
    ("keysets", "GET", "/v1/keysets", None, "public", 200),
    (
        "registerNode",
        "POST",
        "/v1/nodes",
        lambda c, w: {"name": f"n{next(counter)}", "gpu": "h100-sxm-80gb", "gpu_count": 8},
        {"admin"},
        201,
    ),
    ("listNodes", "GET", "/v1/nodes", None, READERS, 200),
    ("getNode", "GET", "/v1/nodes/gpu-a", None, READERS, 200),
    ("rotateNodeToken", "POST", "/v1/nodes/gpu-c/token", None, {"admin"}, 200),
    (
        "registerManifest",
        "POST",
        "/v1/manifests",
        lambda c, w: {
            "name": "m",
            "version": f"v{next(counter)}",
            "uri": "s3://m",
            "config": model_config("meta-llama__Meta-Llama-3.1-8B"),
        },
        {"admin", "deployer"},
        201,
    ),
    ("listManifests", "GET", "/v1/manifests", None, READERS, 200),
    ("getManifest", "GET", "/v1/manifests/llama@1", None, READERS, 200),
    (
        "validateLaunch",
        "POST",
        "/v1/validate",
        lambda c, w: {
            "model": {"config": model_config("meta-llama__Meta-Llama-3.1-8B")},
            "hardware": {"gpu": "h100-sxm-80gb"},
        },
        READERS,
        200,
    ),
    (
        "createPlan",
        "POST",
        "/v1/plans",
        lambda c, w: {"manifest": "llama", "nodes": ["gpu-c"], "engine_args": {"max_model_len": 2048}},
        {"admin", "deployer"},
        201,
    ),
    ("listPlans", "GET", "/v1/plans?node=gpu-a", None, READERS, 200),
    ("getPlan", "GET", lambda c, w: f"/v1/plans/{w['plan']}", None, READERS, 200),
    ("upgradeImpact", "GET", "/v1/upgrade-impact?vllm_version=0.33", None, READERS, 200),
    ("revokePlan", "POST", lambda c, w: f"/v1/plans/{scratch_plan(c)}/revoke", None, {"admin", "deployer"}, 200),
    ("reissuePlan", "POST", lambda c, w: f"/v1/plans/{scratch_plan(c)}/reissue", None, {"admin", "deployer"}, 201),
    ("fetchNodePlan", "GET", "/v1/nodes/gpu-a/plan", None, {"admin", "agent_own"}, 200),
    (
        "reportNodeStatus",
        "POST",
        "/v1/nodes/gpu-a/reports",
        lambda c, w: {"plan_id": w["plan"], "status": "running"},
        {"admin", "agent_own"},
        201,
    ),
    (
        "postNodeMetrics",
        "POST",
        "/v1/nodes/gpu-a/metrics",  # the node's own agent (or an admin)
        lambda c, w: {
            "plan": w["plan"],
            "window_s": 15,
            "num_requests_running": 4,
            "num_requests_waiting": 0,
            "kv_cache_usage_perc": 0.2,
            "num_preemptions": 0,
            "generation_tokens_per_s": 100,
        },
        {"admin", "agent_own"},
        201,
    ),
    ("getNodeTuning", "GET", "/v1/nodes/gpu-a/tuning", None, READERS, 200),
    # gpu-a's plan sets no max_num_seqs: the loop proposes nothing, so an allowed caller gets 409 (not 403)
    ("applyNodeTuning", "POST", "/v1/nodes/gpu-a/tuning/apply", None, {"admin", "deployer"}, 409),
    (
        "putNodeFacts",
        "PUT",
        "/v1/nodes/gpu-a/facts",  # an agent: its own node only; an enroller: any node
        lambda c, w: {"gpu": "h100-sxm-80gb", "gpu_count": 8, "interconnect": "nvlink"},
        {"admin", "enroller", "agent_own"},
        200,
    ),
    ("updateNode", "PATCH", "/v1/nodes/gpu-b", lambda c, w: {"labels": {"n": str(next(counter))}}, {"admin"}, 200),
    ("nodeHistory", "GET", "/v1/nodes/gpu-a/history", None, READERS, 200),
    ("nodeRuns", "GET", "/v1/nodes/gpu-a/runs", None, READERS, 200),
    ("planPlacements", "GET", lambda c, w: f"/v1/plans/{w['plan']}/placements", None, READERS, 200),
    ("calibration", "GET", "/v1/calibration", None, READERS, 200),
    ("listAudit", "GET", "/v1/audit", None, {"admin", "auditor"}, 200),
    ("exportAudit", "GET", "/v1/audit/export", None, {"admin", "auditor"}, 200),
    ("createAuditCheckpoint", "POST", "/v1/audit/checkpoints", None, {"admin", "auditor"}, 201),
    ("verifyAudit", "GET", "/v1/audit/verify", None, {"admin", "auditor"}, 200),
    (
        "latestAuditCheckpoint",
        "GET",  # (verify first: it waits for the sealer, which makes the first checkpoint)
        lambda c, w: c.get("/v1/audit/verify") and "/v1/audit/checkpoints/latest",
        None,
        {"admin", "deployer", "auditor", "agent_own", "agent_other"},
        200,
    ),
    ("createRollout", "POST", "/v1/rollouts", lambda c, w: rollout_body(c), {"admin", "deployer"}, 201),
    ("listRollouts", "GET", "/v1/rollouts", None, READERS, 200),
    ("getRollout", "GET", lambda c, w: f"/v1/rollouts/{scratch_rollout(c)}", None, READERS, 200),
    ("pauseRollout", "POST", lambda c, w: f"/v1/rollouts/{scratch_rollout(c)}/pause", None, {"admin", "deployer"}, 200),
    (
        "resumeRollout",
        "POST",
        lambda c, w: f"/v1/rollouts/{scratch_rollout(c, pause=True)}/resume",
        None,
        {"admin", "deployer"},
        200,
    ),
    (
        "promoteRollout",
        "POST",
        lambda c, w: f"/v1/rollouts/{scratch_rollout(c)}/promote",
        None,
        {"admin", "deployer"},
        200,
    ),
    ("abortRollout", "POST", lambda c, w: f"/v1/rollouts/{scratch_rollout(c)}/abort", None, {"admin", "deployer"}, 200),
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


# Lock-out and resurrection
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
    from service.cli.server import bootstrap_admin_token
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


# The enroller role, against the app's own route table (not a hand list)


def test_an_enroller_token_gets_403_on_every_route_but_node_facts(client, world):
    enroller = world["auth"]["enroller"]
    anonymous_ok = set()
    checked = []
    # the API's operations as the app documents them (its routers, not a hand list; FastAPI may keep included
    # routers nested in app.routes, so the OpenAPI document is the flat table)
    operations = [
        (path, method.upper(), op["operationId"])
        for path, ops in client.app.openapi()["paths"].items()
        for method, op in ops.items()
    ]
    assert len(operations) == 46  # 36 + seven rollout operations + three tuning ones
    for template, method, operation_id in operations:
        path = (
            template.replace("{name}", "gpu-a")
            .replace("{plan_id}", world["plan"])
            .replace("{token_id}", "1")
            .replace("{ref}", "llama@1")
            .replace("{rollout_id}", "r-1")
        )
        if client.request(method, path, headers={"Authorization": ""}).status_code != 401:
            anonymous_ok.add(operation_id)  # public: healthz, readyz, metrics, jwks, keysets
            continue
        r = client.request(
            method,
            path,
            headers={"Authorization": enroller},
            json={"gpu": "h100-sxm-80gb", "gpu_count": 8, "interconnect": "nvlink"}
            if operation_id == "putNodeFacts"
            else {},
        )
        checked.append(operation_id)
        if operation_id == "putNodeFacts":
            assert r.status_code == 200, r.text
        else:
            assert r.status_code == 403, f"{operation_id}: {r.status_code} {r.text[:200]}"
    assert anonymous_ok == {"healthz", "readyz", "metrics", "jwks", "keysets"}
    assert len(checked) == len({op for _, _, op in operations}) - 5
    # the operators' pages refuse an enroller token too (agent and enroller tokens do not sign in there)
    assert client.get("/ui/", headers={"Authorization": enroller}).status_code == 403


def test_node_facts_create_update_and_least_privilege(client, world):
    enroller, own, other = world["auth"]["enroller"], world["auth"]["agent_own"], world["auth"]["agent_other"]
    facts = {
        "gpu": "NVIDIA L4",
        "gpu_count": 1,
        "gpus": [
            {
                "index": 0,
                "name": "NVIDIA L4",
                "memory_total_bytes": 23034 << 20,
                "memory_used_bytes": 0,
                "compute_capability": "8.9",
                "bus_id": "00000000:00:03.0",
            }
        ],
    }
    r = client.put("/v1/nodes/l4-new/facts", json=facts, headers={"Authorization": enroller})
    assert r.status_code == 201 and r.json()["agent_token"].startswith("pf_") and r.json()["gpu"]["id"] == "l4-24gb"
    first = r.json()["agent_token"]
    again = client.put("/v1/nodes/l4-new/facts", json=facts, headers={"Authorization": enroller})
    assert again.status_code == 200 and "agent_token" not in again.json()
    rotated = client.put(
        "/v1/nodes/l4-new/facts", json={**facts, "rotate_token": True}, headers={"Authorization": enroller}
    ).json()["agent_token"]
    assert (
        rotated != first
        and client.get("/v1/nodes/l4-new/plan", headers={"Authorization": f"Bearer {first}"}).status_code == 401
    )
    # an agent: its own node only, never a new node, never a token
    assert (
        client.put(
            "/v1/nodes/gpu-a/facts", json={**facts, "rotate_token": True}, headers={"Authorization": own}
        ).status_code
        == 403
    )
    assert client.put("/v1/nodes/gpu-a/facts", json=facts, headers={"Authorization": other}).status_code == 403
    assert client.put("/v1/nodes/gpu-a/facts", json=facts, headers={"Authorization": own}).json()["gpu_count"] == 1
    kinds = [e["kind"] for e in client.get("/v1/audit", params={"node": "l4-new"}).json()["items"]]
    assert kinds.count("node.registered") == 1 and kinds.count("token.rotated") == 1
    assert "node.facts_updated" not in kinds  # the same facts again change nothing


@pytest.mark.parametrize(
    "body,field",
    [
        ({"gpu": "NVIDIA L4", "gpu_count": 65}, "gpu_count"),
        ({"gpu": "NVIDIA L4", "gpu_count": "1"}, "gpu_count"),
        ({"gpu": "NVIDIA Nonexistent 9000", "gpu_count": 1}, "gpu"),
        ({"gpu": "NVIDIA L4", "gpu_count": 1, "gpus": [{"index": 0}] * 65}, "gpus"),
        (
            {
                "gpu": "NVIDIA L4",
                "gpu_count": 1,
                "gpus": [
                    {
                        "index": 0,
                        "name": "x",
                        "memory_total_bytes": -1,
                        "memory_used_bytes": 0,
                        "compute_capability": "8.9",
                        "bus_id": "b",
                    }
                ],
            },
            "gpus.0.memory_total_bytes",
        ),
        ({"gpu": "NVIDIA L4", "gpu_count": 1, "interconnect": "infiniband"}, "interconnect"),
    ],
)
def test_hostile_node_facts_are_4xx_naming_the_field(client, body, field):
    r = client.put("/v1/nodes/hostile/facts", json=body)
    assert r.status_code == 422, r.text
    assert any(e["field"].startswith(field) for e in r.json()["errors"]), r.text


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/shadow", "a/b.safetensors", "..", "x\u0000y", "x\ny"])
def test_a_manifest_with_a_path_in_a_shard_name_is_refused(client, name):
    r = client.post(
        "/v1/manifests",
        json={
            "name": "m",
            "version": "1",
            "uri": "s3://m",
            "config": model_config("meta-llama__Meta-Llama-3.1-8B"),
            "files": {"config_sha256": "0" * 64, "shards": [{"name": name, "size": 1}]},
        },
    )
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"].replace("[", ".").replace("]", "").startswith("files.shards.0.name")


def test_a_manifests_files_are_signed_into_its_plans(client, world):
    files = {"config_sha256": "a" * 64, "shards": [{"name": "model.safetensors", "size": 16_060_522_240}]}
    r = client.post(
        "/v1/manifests",
        json={
            "name": "m8",
            "version": "1",
            "uri": "/models/llama",
            "quantization_txt": "fp8\n",
            "files": {**files, "quantization": "awq"},
            "config": model_config("meta-llama__Meta-Llama-3.1-8B"),
        },
    )
    assert r.status_code == 201, r.text
    plan = client.post("/v1/plans", json={"manifest": "m8", "nodes": ["gpu-b"], "engine_args": {"max_model_len": 4096}})
    assert plan.status_code == 201, plan.text
    import base64
    import json as _json

    payload = plan.json()["signed"].split(".")[1]
    claims = _json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    nc = claims["node_checks"]
    assert nc["weights"] == {**files, "quantization": "fp8"}  # the tag the service judged, not the one sent
    assert nc["hardware"] == {
        "gpu_id": "h100-sxm-80gb",
        "gpu_name": "NVIDIA H100 SXM5 80GB",
        "memory_bytes": 85520809984,
        "memory_checked": True,
        "compute_capability": "9.0",
        "count": 8,
        "interconnect": "nvlink",
    }
    assert nc["memory"]["gpus"] == 1 and nc["memory"]["gpu_memory_utilization"] == 0.92


def test_a_hostile_address_in_node_facts_is_a_422_naming_it(client):
    r = client.put("/v1/nodes/hostile/facts", json={"gpu": "NVIDIA L4", "gpu_count": 1, "address": "-oProxyCommand=x"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "address", r.text
