"""The API is split one router per domain (service/api/routers/): each module holds only the routes of its own
OpenAPI tag, and together they are exactly the API the app serves."""

from service.api.routers import agent, audit, keys, manifests, nodes, ops, plans, rollouts, tokens, tuning

MODULES = {
    "agent": agent,
    "audit": audit,
    "keys": keys,
    "manifests": manifests,
    "nodes": nodes,
    "ops": ops,
    "plans": plans,
    "rollouts": rollouts,
    "tokens": tokens,
    "tuning": tuning,
}


def test_each_router_holds_only_its_own_domain():
    for tag, module in MODULES.items():
        routes = module.router.routes
        assert routes, f"routers/{tag}.py has no route"
        for route in routes:
            assert route.tags == [tag], f"routers/{tag}.py holds {route.operation_id} tagged {route.tags}"


def test_the_routers_are_the_whole_api(client):
    served = {op["operationId"]: op["tags"] for ops in client.app.openapi()["paths"].values() for op in ops.values()}
    routed = {r.operation_id: r.tags for m in MODULES.values() for r in m.router.routes}
    assert routed == served
    assert len(routed) == 46  # 36 + seven rollout operations + three tuning ones
    assert served["fetchNodePlan"] == ["agent"] and served["nodeHistory"] == ["audit"]


def test_the_agent_router_is_matched_first(client):
    # the fleet's hot path is matched before any other route (create_app includes routers/agent.py first)
    paths = list(client.app.openapi()["paths"])
    assert paths[:2] == ["/v1/nodes/{name}/plan", "/v1/nodes/{name}/reports"]


def test_a_query_parameter_no_operation_declares_is_a_422_naming_it(client):
    """A misspelt filter would list everything and a misspelt switch act for real: every API operation refuses
    what it does not declare (probes, metrics and the key set excepted: load balancers append what they like)."""
    for url in (
        "/v1/plans?nod=gpu-01",
        "/v1/nodes?bogus=1",
        "/v1/audit?subjekt=rollout:x",
        "/v1/rollouts?state=completed&x=1",
        "/v1/nodes/gpu-01/plan?wiat=0",
    ):
        r = client.get(url)
        assert r.status_code == 422, (url, r.text)
        [err] = r.json()["errors"]
        assert err["rule"] == "unknown_query" and err["field"].startswith("query.")
    body = client.get("/v1/plans?nod=gpu-01").json()
    assert "node" in body["detail"] and body["errors"][0]["field"] == "query.nod"
    typo = client.post("/v1/plans?dryrun=true", json={"manifest": "x@1", "nodes": ["gpu-01"]})
    assert typo.status_code == 422 and typo.json()["errors"][0]["field"] == "query.dryrun"  # never signed for real
    for url in (
        "/v1/plans?node=gpu-01&limit=5",
        "/healthz?probe=1",
        "/.well-known/jwks.json?v=2",
        "/v1/audit?subject=rollout:x",
    ):
        assert client.get(url).status_code == 200, url
    long = client.get("/v1/plans", params={"x" * 3000 + "\u202e": "1"}).json()["errors"][0]
    assert len(long["field"]) <= 6 + 64 and "\u202e" not in long["field"]  # bounded, and as readable text
