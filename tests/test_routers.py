"""The API is split one router per domain (service/api/routers/): each module holds only the routes of its own
OpenAPI tag, and together they are exactly the API the app serves."""

from service.api.routers import agent, audit, keys, manifests, nodes, ops, plans, rollouts, tokens, tuning

MODULES = {"agent": agent, "audit": audit, "keys": keys, "manifests": manifests, "nodes": nodes, "ops": ops,
           "plans": plans, "rollouts": rollouts, "tokens": tokens, "tuning": tuning}


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
    assert len(routed) == 46  # 36 + issue 19's seven rollout operations + issue 16's three tuning ones
    assert served["fetchNodePlan"] == ["agent"] and served["nodeHistory"] == ["audit"]


def test_the_agent_router_is_matched_first(client):
    # the fleet's hot path is matched before any other route (create_app includes routers/agent.py first)
    paths = list(client.app.openapi()["paths"])
    assert paths[:2] == ["/v1/nodes/{name}/plan", "/v1/nodes/{name}/reports"]
