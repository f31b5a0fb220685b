"""Multi-node plans over HTTP: groups, ranks, roles, each node's own signed argv, the group moving
together, and node addresses."""

from __future__ import annotations

import pytest

from service.agent.verify import verify_plan
from service.domain.render import parse_argv
from service.domain.versions import resolve_version
from tests.support.api import register_manifest
from tests.support.multi_node import H200, TP16, agent_headers, deepseek, node, plan

LINE = resolve_version("0.33.0")[1]


def claims_of(client, keys, name, plan_id):
    r = client.get(f"/v1/plans/{plan_id}")
    a = next(a for a in r.json()["assignments"] if a["node"] == name)
    return verify_plan(a["signed"], keys.jwks(), node=name, audience="preflight-agent").claims


def test_two_node_tp16_deepseek_v3_signs_two_different_commands(client, keys):
    node(client, "h200-a", "10.0.0.11")
    node(client, "h200-b", "10.0.0.12")
    deepseek(client)
    p = plan(client, ["h200-a", "h200-b"], TP16)
    assert p["topology"] == {"form": "nnodes", "nodes_per_instance": 2}
    [group] = p["groups"]
    assert group["nodes"] == ["h200-a", "h200-b"] and group["head"] == "h200-a"
    assert group["head_address"] == "10.0.0.11" and group["nnodes"] == 2 and len(group["digest"]) == 64
    a, b = claims_of(client, keys, "h200-a", p["id"]), claims_of(client, keys, "h200-b", p["id"])
    assert a["argv"] != b["argv"]
    assert (a["rank"], a["role"], b["rank"], b["role"]) == (0, "head", 1, "worker")
    assert a["group_digest"] == b["group_digest"] == group["digest"]
    assert a["head"] == b["head"] == "h200-a" and a["nnodes"] == b["nnodes"] == 2 and a["group"] == b["group"] == 0
    assert "--headless" not in a["argv"] and "--headless" in b["argv"]
    for claims, rank in ((a, 0), (b, 1)):
        _, parsed = parse_argv(claims["argv"], LINE)
        assert parsed["nnodes"] == 2 and parsed["node_rank"] == rank
        assert parsed["master_addr"] == "10.0.0.11" and parsed["master_port"] == 29501
        assert parsed["tensor_parallel_size"] == 16 and parsed["max_model_len"] == 32768
    # the plan response shows every node's own argv and the assignment's place
    # judged per rank at the group's TP: a sixteenth of the FP8 weights per GPU, MLA's latent KV not split by TP
    # (61 layers × (512 + 64) × 2 bytes per token on every GPU)
    assert p["budget"]["kv_bytes_per_token_per_gpu"] == 61 * 576 * 2 and p["budget"]["kv_layers_per_gpu"] == 61
    assert 40e9 < p["budget"]["weights_bytes_per_gpu"] < 45e9
    rows = {x["node"]: x for x in p["assignments"]}
    assert rows["h200-b"]["argv"] == b["argv"] and rows["h200-b"]["rank"] == 1 and rows["h200-b"]["role"] == "worker"


def test_four_nodes_at_tp16_form_two_groups_each_with_its_head(client, keys):
    for i in range(4):
        node(client, f"n{i}", f"10.0.1.{i + 1}")
    deepseek(client)
    p = plan(client, ["n0", "n1", "n2", "n3"], TP16)
    assert [g["nodes"] for g in p["groups"]] == [["n0", "n1"], ["n2", "n3"]]
    assert p["groups"][0]["digest"] != p["groups"][1]["digest"]
    c3 = claims_of(client, keys, "n3", p["id"])
    assert (c3["group"], c3["rank"], c3["role"], c3["head"]) == (1, 1, "worker", "n2")
    assert parse_argv(c3["argv"], LINE)[1]["master_addr"] == "10.0.1.3"


def test_tp8_pp2_llama4_maverick_over_two_nodes(client, keys):
    node(client, "m-a", "m-a.gpu.internal")
    node(client, "m-b", "m-b.gpu.internal")
    register_manifest(
        client,
        fixture="meta-llama__Llama-4-Maverick-17B-128E-Instruct",
        name="meta-llama/Llama-4-Maverick-17B-128E-Instruct",
    )
    p = plan(
        client,
        ["m-a", "m-b"],
        {"tensor_parallel_size": 8, "pipeline_parallel_size": 2, "max_model_len": 32768},
        manifest="meta-llama/Llama-4-Maverick-17B-128E-Instruct@1",
    )
    assert p["budget"]["kv_layers_per_gpu"] == 24  # 48 layers over two pipeline stages
    b = claims_of(client, keys, "m-b", p["id"])
    _, parsed = parse_argv(b["argv"], LINE)
    assert parsed["pipeline_parallel_size"] == 2 and parsed["tensor_parallel_size"] == 8
    assert parsed["nnodes"] == 2 and parsed["node_rank"] == 1 and parsed["master_addr"] == "m-a.gpu.internal"
    assert parsed["headless"] is True


def test_dp4_tp4_over_two_nodes_in_both_forms(client, keys):
    node(client, "d-a", "10.0.2.1")
    node(client, "d-b", "10.0.2.2")
    deepseek(client)
    args = {"tensor_parallel_size": 4, "data_parallel_size": 4, "enable_expert_parallel": True, "max_model_len": 16384}
    p = plan(client, ["d-a", "d-b"], args)
    b = parse_argv(claims_of(client, keys, "d-b", p["id"])["argv"], LINE)[1]
    assert (b["nnodes"], b["node_rank"], b["data_parallel_size"], b["tensor_parallel_size"]) == (2, 1, 4, 4)
    p = plan(client, ["d-a", "d-b"], args, multi_node_form="data_parallel")
    assert p["topology"]["form"] == "data_parallel"
    a = parse_argv(claims_of(client, keys, "d-a", p["id"])["argv"], LINE)[1]
    b = parse_argv(claims_of(client, keys, "d-b", p["id"])["argv"], LINE)[1]
    assert a["data_parallel_size_local"] == b["data_parallel_size_local"] == 2
    assert a["data_parallel_address"] == b["data_parallel_address"] == "10.0.2.1"
    assert a["data_parallel_rpc_port"] == b["data_parallel_rpc_port"] == 29550
    assert "data_parallel_start_rank" not in a and b["data_parallel_start_rank"] == 2
    assert "headless" not in a and b["headless"] is True and "nnodes" not in a


def test_replicas_of_a_tp8_launch_get_the_same_argv_without_nnodes(client, keys):
    node(client, "r-a")
    node(client, "r-b")  # replicas need no address
    register_manifest(client)
    p = plan(
        client,
        ["r-a", "r-b"],
        {"tensor_parallel_size": 8, "max_model_len": 8192},
        manifest="meta-llama/Llama-3.1-70B@1",
    )
    assert p["topology"] == {"form": "replicas", "nodes_per_instance": 1}
    a, b = claims_of(client, keys, "r-a", p["id"]), claims_of(client, keys, "r-b", p["id"])
    assert a["argv"] == b["argv"] == p["argv"]
    assert not any(x in a["argv"] for x in ("--nnodes", "--node-rank", "--master-addr", "--headless"))
    assert (a["role"], b["role"], a["group"], b["group"], a["nnodes"]) == ("replica", "replica", 0, 1, 1)
    assert a["group_digest"] != b["group_digest"]


def test_three_nodes_for_a_two_node_instance_is_422_with_the_numbers(client):
    for i in range(3):
        node(client, f"t{i}", f"10.0.3.{i + 1}")
    deepseek(client)
    r = client.post(
        "/v1/plans", json={"manifest": "deepseek-ai/DeepSeek-V3@1", "nodes": ["t0", "t1", "t2"], "engine_args": TP16}
    )
    assert r.status_code == 422
    body = r.json()
    assert body["errors"][0]["field"] == "nodes" and body["errors"][0]["rule"] == "nnodes"
    assert "World size 16" in body["detail"] and "3 node(s) is not a multiple of 2" in body["detail"]
    assert "give 2 or 4 nodes" in body["detail"]
    assert client.get("/v1/nodes/t0/plan").status_code == 404  # nothing stored


def test_superseding_one_member_supersedes_the_whole_group(client, keys):
    for n, addr in (("s-a", "10.0.4.1"), ("s-b", "10.0.4.2"), ("s-c", "10.0.4.3")):
        node(client, n, addr)
    deepseek(client)
    first = plan(client, ["s-a", "s-b"], TP16)
    # a new two-node plan over the worker and another node: the old head must not keep running alone
    second = plan(client, ["s-c", "s-b"], TP16)
    old = client.get(f"/v1/plans/{first['id']}").json()
    assert old["status"] == "superseded"
    assert {a["node"]: a["status"] for a in old["assignments"]} == {"s-a": "superseded", "s-b": "superseded"}
    assert old["groups"][0]["status"] == "superseded"
    assert client.get("/v1/nodes/s-a/plan").status_code == 404
    b = claims_of(client, keys, "s-b", second["id"])
    assert b["head"] == "s-c" and parse_argv(b["argv"], LINE)[1]["master_addr"] == "10.0.4.3"
    events = client.get("/v1/audit", params={"kind": "plan.superseded", "node": "s-a"}).json()["items"]
    assert events and events[-1]["payload"]["group_member_of"] == "s-b"


def test_revoke_and_reissue_move_the_whole_group(client, keys):
    node(client, "v-a", "10.0.5.1")
    node(client, "v-b", "10.0.5.2")
    deepseek(client)
    p = plan(client, ["v-a", "v-b"], TP16, group_env=[{"NCCL_SOCKET_IFNAME": "eth1", "GLOO_SOCKET_IFNAME": "eth1"}])
    assert claims_of(client, keys, "v-b", p["id"])["env"] == {
        "NCCL_SOCKET_IFNAME": "eth1",
        "GLOO_SOCKET_IFNAME": "eth1",
    }
    r = client.post(f"/v1/plans/{p['id']}/revoke")
    assert r.status_code == 200
    assert client.get("/v1/nodes/v-a/plan").status_code == 404 and client.get("/v1/nodes/v-b/plan").status_code == 404
    again = client.post(f"/v1/plans/{p['id']}/reissue").json()
    assert [g["nodes"] for g in again["groups"]] == [["v-a", "v-b"]]
    b = claims_of(client, keys, "v-b", again["id"])
    assert b["rank"] == 1 and b["env"]["NCCL_SOCKET_IFNAME"] == "eth1" and b["group_digest"] != p["groups"][0]["digest"]


def test_a_head_without_an_address_is_422_naming_the_node(client):
    node(client, "x-a")
    node(client, "x-b", "10.0.6.2")
    deepseek(client)
    r = client.post(
        "/v1/plans", json={"manifest": "deepseek-ai/DeepSeek-V3@1", "nodes": ["x-a", "x-b"], "engine_args": TP16}
    )
    assert r.status_code == 422 and "'x-a'" in r.json()["detail"]
    assert r.json()["errors"][0] == {"field": "nodes.0", "rule": "head_address", "message": "node 'x-a' has no address"}
    r = client.patch("/v1/nodes/x-a", json={"address": "10.0.6.1"})
    assert r.status_code == 200 and r.json()["address"] == "10.0.6.1"
    plan(client, ["x-a", "x-b"], TP16)


LOOPBACK = ["localhost", "LOCALHOST", "localhost.", "gpu-1.localhost", "127.0.0.1", "127.8.9.10", "::1"]
LOOPBACK += ["::ffff:127.0.0.1", "0.0.0.0", "::", "0x7f000001", "169.254.10.1", "fe80::1"]


@pytest.mark.parametrize("address", LOOPBACK)
def test_an_address_every_other_node_would_read_as_itself_is_422_at_registration_and_update(client, address):
    """A node's address becomes the other members' --master-addr: a loopback, unspecified or link-local one would
    have each of them connect to itself."""
    r = client.post("/v1/nodes", json={"name": "lo", "gpu": H200, "gpu_count": 8, "address": address})
    assert r.status_code == 422, address
    assert r.json()["errors"][0]["field"] == "address" and address in r.json()["errors"][0]["message"]
    assert client.get("/v1/nodes/lo").status_code == 404
    node(client, "lo", "10.0.7.1")
    r = client.patch("/v1/nodes/lo", json={"address": address})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "address"
    assert client.get("/v1/nodes/lo").json()["address"] == "10.0.7.1"


def test_a_loopback_address_stored_before_it_was_refused_cannot_head_a_group(client, db):
    from sqlalchemy import update

    from service.db.models import Node

    node(client, "y-a", "10.0.9.1")
    node(client, "y-b", "10.0.9.2")
    deepseek(client)
    with db.sessions() as s:
        s.execute(update(Node).where(Node.name == "y-a").values(address="localhost"))
        s.commit()
    r = client.post(
        "/v1/plans", json={"manifest": "deepseek-ai/DeepSeek-V3@1", "nodes": ["y-a", "y-b"], "engine_args": TP16}
    )
    assert r.status_code == 422, r.text
    [error] = r.json()["errors"]
    assert (error["field"], error["rule"]) == ("nodes.0", "head_address")
    assert (
        error["message"]
        == "localhost names the loopback interface: every other node would reach itself there, not this node"
    )


def test_per_node_arguments_ray_and_mixed_hardware_are_refused(client):
    node(client, "y-a", "10.0.7.1")
    node(client, "y-b", "10.0.7.2")
    node(client, "y-c", "10.0.7.3", count=4)
    deepseek(client)
    for args, field in (
        ({**TP16, "node_rank": 1}, "engine_args.node_rank"),
        ({**TP16, "--master-addr": "10.9.9.9"}, "engine_args.master_addr"),
        ({**TP16, "nnodes": 4}, "engine_args.nnodes"),
        ({**TP16, "distributed_executor_backend": "ray"}, "engine_args.distributed_executor_backend"),
    ):
        r = client.post(
            "/v1/plans", json={"manifest": "deepseek-ai/DeepSeek-V3@1", "nodes": ["y-a", "y-b"], "engine_args": args}
        )
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == field, (args, r.text)
    r = client.post(
        "/v1/plans", json={"manifest": "deepseek-ai/DeepSeek-V3@1", "nodes": ["y-a", "y-c"], "engine_args": TP16}
    )
    assert r.status_code == 422 and "y-c: 4" in r.json()["detail"]
    r = client.post(
        "/v1/plans",
        json={
            "manifest": "deepseek-ai/DeepSeek-V3@1",
            "nodes": ["y-a", "y-b"],
            "engine_args": TP16,
            "group_env": [{"LD_PRELOAD": "/x.so"}],
        },
    )
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "group_env.0.LD_PRELOAD"
    r = client.post(
        "/v1/plans",
        json={
            "manifest": "deepseek-ai/DeepSeek-V3@1",
            "nodes": ["y-a", "y-b"],
            "engine_args": TP16,
            "group_env": [{}, {}],
        },
    )
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "group_env"


@pytest.mark.parametrize(
    "address",
    [
        "--evil",
        "a b",
        "x" * 254,
        "10.0.0.1;rm",
        "",
        "0.0.0.0",
        "-a.example",
        "a..b",
        "ä.example",
        "1.2.3",
        "gpu\n",
        "10.0.0.1\n",
        "a\n.b",
        "::ffff:0.0.0.0",
        "fe80::1%--evil",
        "fe80::1% x",
        "255.255.255.255",
        "a\tb",
    ],
)
def test_hostile_addresses_are_422_naming_the_field(client, address):
    r = client.post("/v1/nodes", json={"name": "z", "gpu": H200, "gpu_count": 8, "address": address})
    assert r.status_code == 422, address
    assert r.json()["errors"][0]["field"] == "address"
    assert client.get("/v1/nodes/z").status_code == 404


def test_addresses_are_listed(client):
    node(client, "l-a", "fd00::1")
    node(client, "l-b", "gpu-7.rack-2.example.com")
    items = {n["name"]: n["address"] for n in client.get("/v1/nodes").json()["items"]}
    assert items == {"l-a": "fd00::1", "l-b": "gpu-7.rack-2.example.com"}
    r = client.patch("/v1/nodes/l-a", json={"address": "not an address"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "address"


def test_group_is_running_when_the_head_is_ready_and_failed_when_a_worker_fails(client):
    ta = node(client, "g-a", "10.0.8.1")["agent_token"]
    tb = node(client, "g-b", "10.0.8.2")["agent_token"]
    deepseek(client)
    p = plan(client, ["g-a", "g-b"], TP16)

    def state():
        return client.get(f"/v1/plans/{p['id']}").json()["groups"][0]["status"]

    assert state() == "pending"
    for name, token in (("g-a", ta), ("g-b", tb)):
        r = client.post(
            f"/v1/nodes/{name}/reports",
            headers=agent_headers(token),
            json={"plan_id": p["id"], "status": "started", "details": {"rank": 0 if name == "g-a" else 1}},
        )
        assert r.status_code == 201, r.text
    assert state() == "starting"
    client.post("/v1/nodes/g-a/reports", headers=agent_headers(ta), json={"plan_id": p["id"], "status": "running"})
    assert state() == "running"
    client.post(
        "/v1/nodes/g-b/reports",
        headers=agent_headers(tb),
        json={"plan_id": p["id"], "status": "exited", "details": {"status": 1, "rank": 1}},
    )
    assert state() == "failed"
    runs = client.get("/v1/nodes/g-a/history").json()["items"]
    assert runs[0]["group_status"] == "failed" and runs[0]["role"] == "head" and runs[0]["rank"] == 0
    placements = client.get(f"/v1/plans/{p['id']}/placements").json()
    assert placements["groups"][0]["status"] == "failed"
    assert {x["node"]: x["rank"] for x in placements["placements"]} == {"g-a": 0, "g-b": 1}


def eventually(call, done, polls=40):
    """Call until ``done(answer)``: a head's report reaches the agents' caches through the epoch poll
    (services/epochs.py), a poll or two after it commits."""
    import time

    for _ in range(polls):
        answer = call()
        if done(answer):
            return answer
        time.sleep(0.1)
    return answer


def held(client, name, token):
    r = client.get(f"/v1/nodes/{name}/plan", headers=agent_headers(token))
    return r


def test_a_worker_is_held_until_its_head_reports_the_same_plan_started(client):
    """The defect: after a plan change a worker fetched and started the new plan while its head still ran the old
    one (until the head's next heartbeat). Now the worker's fetch answers 409 group-hold until the head reports the
    new plan started; the head's reports on the old plan never open it; a head refusal holds it for good."""
    ta = node(client, "w-a", "10.0.7.1")["agent_token"]
    tb = node(client, "w-b", "10.0.7.2")["agent_token"]
    deepseek(client)
    p1 = plan(client, ["w-a", "w-b"], TP16)
    r = held(client, "w-b", tb)
    assert r.status_code == 409 and r.headers["Retry-After"] == "5", r.text
    body = r.json()
    assert body["type"].endswith("/group-hold") and body["hold"]["reason"] == "head_pending"
    assert (body["hold"]["plan_id"], body["hold"]["head"], body["hold"]["final"]) == (p1["id"], "w-a", False)
    assert body["detail"] == body["hold"]["message"] and "w-a has not started plan" in body["detail"]
    assert client.get("/v1/nodes/w-b/plan").status_code == 200  # an admin reading the node's plan is not held
    assert client.get("/v1/nodes/w-a/plan", headers=agent_headers(ta)).status_code == 200  # the head never is

    def report(status, plan_id, token=ta, name="w-a"):
        return client.post(
            f"/v1/nodes/{name}/reports", headers=agent_headers(token), json={"plan_id": plan_id, "status": status}
        )

    assert report("fetched", p1["id"]).status_code == 201
    r = eventually(lambda: held(client, "w-b", tb), lambda r: r.json().get("hold", {}).get("reason") != "head_pending")
    assert r.status_code == 409 and r.json()["hold"]["reason"] == "head_fetched"
    assert report("started", p1["id"]).status_code == 201
    r = eventually(lambda: held(client, "w-b", tb), lambda r: r.status_code != 409)
    assert r.status_code == 200 and r.headers["X-Plan-Id"] == p1["id"]
    assert report("running", p1["id"]).status_code == 201

    # the plan changes: the worker waits for the head to run the new one
    p2 = plan(client, ["w-a", "w-b"], {**TP16, "max_model_len": 16384})
    r = eventually(lambda: held(client, "w-b", tb), lambda r: r.status_code == 409)
    assert r.json()["hold"]["plan_id"] == p2["id"] and r.json()["hold"]["reason"] == "head_pending"
    # the head, not yet told, still says it runs the old plan: that opens nothing
    report("running", p1["id"])
    report("heartbeat", p1["id"])
    r = held(client, "w-b", tb)
    assert r.status_code == 409 and r.json()["hold"]["reason"] == "head_pending"
    # an etag the worker holds does not turn the hold into a 304 (the agent would boot its saved plan)
    r = client.get("/v1/nodes/w-b/plan", headers={**agent_headers(tb), "If-None-Match": "*"})
    assert r.status_code == 409
    # the head refuses the new plan: the worker never starts it, and the group says failed
    assert report("refused", p2["id"]).status_code == 201
    r = eventually(lambda: held(client, "w-b", tb), lambda r: r.json().get("hold", {}).get("final") is True)
    assert r.status_code == 409 and r.json()["hold"]["reason"] == "head_refused"
    assert r.json()["hold"]["head_report"] == "refused" and "does not start it" in r.json()["detail"]
    assert client.get(f"/v1/plans/{p2['id']}").json()["groups"][0]["status"] == "failed"
    audit = client.get("/v1/audit", params={"node": "w-b", "kind": "plan.fetched"}).json()["items"]
    assert [e["plan_id"] for e in audit] == [p1["id"]]  # a held fetch is no delivery


def test_freshness_carries_the_heads_group_digest_and_the_agent_checks_it(client, keys):
    from service.agent.verify import VerificationError, verify_freshness

    ta = node(client, "f-a", "10.0.9.1")["agent_token"]
    tb = node(client, "f-b", "10.0.9.2")["agent_token"]
    deepseek(client)
    p = plan(client, ["f-a", "f-b"], TP16)
    assert (
        client.post(
            "/v1/nodes/f-a/reports", headers=agent_headers(ta), json={"plan_id": p["id"], "status": "started"}
        ).status_code
        == 201
    )  # the worker's gate
    r = eventually(lambda: client.get("/v1/nodes/f-b/plan", headers=agent_headers(tb)), lambda r: r.status_code != 409)
    assert r.status_code == 200
    mine = verify_plan(r.text, keys.jwks(), node="f-b", audience="preflight-agent")
    fresh = verify_freshness(
        r.headers["X-Plan-Freshness"], keys.jwks(), plan_token=r.text, plan=mine, node="f-b", audience="preflight-agent"
    )
    assert fresh["head_group_digest"] == p["groups"][0]["digest"] == mine.claims["group_digest"]
    # a statement naming another head digest (the head moved to another group plan) is refused
    from service.signing import FRESHNESS_MEDIA_TYPE, freshness_claims, plan_digest

    other = keys.sign(
        freshness_claims(
            issuer="preflight",
            audience="preflight-agent",
            node="f-b",
            plan_id=p["id"],
            seq=mine.seq,
            digest=plan_digest(r.text),
            ttl=600,
            acked_seq=0,
            grouped=True,
            head_group_digest="0" * 64,
        ),
        typ=FRESHNESS_MEDIA_TYPE,
    )
    with pytest.raises(VerificationError) as e:
        verify_freshness(other, keys.jwks(), plan_token=r.text, plan=mine, node="f-b", audience="preflight-agent")
    assert e.value.reason == "group_digest_mismatch"
    none = keys.sign(
        freshness_claims(
            issuer="preflight",
            audience="preflight-agent",
            node="f-b",
            plan_id=p["id"],
            seq=mine.seq,
            digest=plan_digest(r.text),
            ttl=600,
            acked_seq=0,
        ),
        typ=FRESHNESS_MEDIA_TYPE,
    )
    with pytest.raises(VerificationError) as e:  # a statement without the head's digest confirms nothing
        verify_freshness(none, keys.jwks(), plan_token=r.text, plan=mine, node="f-b", audience="preflight-agent")
    assert e.value.reason == "group_digest_mismatch"


def test_the_agent_refuses_placement_claims_that_disagree_with_the_argv(keys):
    from service.agent.verify import VerificationError
    from service.signing import plan_claims

    base = dict(
        issuer="preflight",
        audience="preflight-agent",
        node="w",
        plan_id="p1",
        seq=1,
        manifest_digest="d",
        vllm_version="0.33.0",
        env={},
        model_uri="s3://m",
    )
    argv = ["vllm", "serve", "s3://m", "--nnodes", "2", "--node-rank", "1"]
    good = {"group": 0, "rank": 1, "role": "worker", "nnodes": 2, "head": "h", "group_digest": "a" * 64}
    ok = keys.sign(plan_claims(**base, argv=[*argv, "--headless"], placement=good))
    assert verify_plan(ok, keys.jwks(), node="w", audience="preflight-agent").role == "worker"
    for argv_, placement in (
        (argv, good),  # a worker without --headless would start a second API server
        ([*argv, "--headless"], {**good, "role": "head"}),
        ([*argv, "--headless"], {**good, "rank": 2}),
        ([*argv, "--headless"], {k: v for k, v in good.items() if k != "group_digest"}),
    ):
        token = keys.sign(plan_claims(**base, argv=argv_, placement=placement))
        with pytest.raises(VerificationError):
            verify_plan(token, keys.jwks(), node="w", audience="preflight-agent")


@pytest.mark.parametrize(
    "flag", [{"headless": True}, {"node_rank": 1}, {"data_parallel_start_rank": 1}, {"master_addr": "10.0.0.9"}]
)
def test_per_node_flags_are_refused_on_a_one_node_plan_too(client, flag):
    """A signed --headless or --node-rank on a one-node plan would make the node a worker of an instance that does
    not exist (and the agent refuses such a replica): 422 before anything is stored or superseded."""
    deepseek(client)
    node(client, "solo", "10.0.0.1")
    r = client.post(
        "/v1/plans",
        json={
            "manifest": "deepseek-ai/DeepSeek-V3@1",
            "nodes": ["solo"],
            "engine_args": {"tensor_parallel_size": 8, "max_model_len": 8192, **flag},
        },
    )
    assert r.status_code == 422, r.text
    err = r.json()["errors"][0]
    assert err["rule"] == "flag_per_node" and err["field"] == f"engine_args.{next(iter(flag))}"
    assert client.get("/v1/nodes/solo/plan").status_code == 404  # nothing stored


def test_env_is_bounded_because_every_node_signs_a_copy(client):
    """A plan's env is copied into every node's signed plan: 120 variables × 4,000 characters over 256 nodes once
    made a 0.5 MB request into 166 MB of response and 332 MB of database. Env (and each group's) is capped at 16 KiB;
    line breaks are refused."""
    deepseek(client)
    node(client, "e-a", "10.0.0.1")
    big = {f"VLLM_X{i}": "v" * 4000 for i in range(5)}
    r = client.post(
        "/v1/plans",
        json={
            "manifest": "deepseek-ai/DeepSeek-V3@1",
            "nodes": ["e-a"],
            "engine_args": {"tensor_parallel_size": 8},
            "env": big,
        },
    )
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "env", r.text
    r = client.post(
        "/v1/plans",
        json={
            "manifest": "deepseek-ai/DeepSeek-V3@1",
            "nodes": ["e-a"],
            "engine_args": {"tensor_parallel_size": 8},
            "group_env": [{"NCCL_SOCKET_IFNAME": "eth0\nLD_PRELOAD=/x.so"}],
        },
    )
    assert r.status_code == 422 and r.json()["errors"][0]["field"].startswith("group_env"), r.text
    assert client.get("/v1/nodes/e-a/plan").status_code == 404
