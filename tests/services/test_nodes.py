"""Node facts (service/services/nodes.py): hardware facts that agree with themselves, and a PUT that merges the
optional facts."""

from __future__ import annotations

from tests.support.gpus import facts_of


def put(client, name, body):
    return client.put(f"/v1/nodes/{name}/facts", json=body)


def field_of(r) -> str:
    return r.json()["errors"][0]["field"]


def test_a_gpu_list_that_disagrees_with_the_facts_is_a_422_naming_the_field(client):
    h100 = facts_of("h100-sxm-8")
    r = put(client, "n1", {**h100, "gpu_count": 7})
    assert r.status_code == 422 and field_of(r) == "gpus" and "lists 8 GPU(s) but gpu_count is 7" in r.text
    mixed = {
        **h100,
        "gpus": h100["gpus"][:4] + [dict(x, index=4 + i) for i, x in enumerate(facts_of("a100-pcie-4")["gpus"])],
    }
    r = put(client, "n1", mixed)
    assert r.status_code == 422 and field_of(r) == "gpus.4.name" and "mixes GPU models" in r.text
    r = put(client, "n1", {**h100, "gpu": "a100-sxm4-80gb"})  # the list says H100
    assert r.status_code == 422 and field_of(r) == "gpus.0.name" and "h100-sxm-80gb" in r.text
    r = put(client, "n1", {**h100, "gpus": [h100["gpus"][0]] * 8})
    assert r.status_code == 422 and field_of(r) == "gpus.1.index"
    assert client.get("/v1/nodes/n1").status_code == 404  # nothing written
    assert put(client, "n1", h100).status_code == 201


def test_omitted_optional_facts_stay_and_null_clears_them(client):
    h100 = facts_of("h100-sxm-8")
    assert put(client, "n2", {**h100, "address": "10.0.0.2"}).status_code == 201
    bare = {"gpu": h100["gpu"], "gpu_count": 8}  # interconnect, gpus and address left out
    r = put(client, "n2", bare)
    assert r.status_code == 200, r.text
    node = client.get("/v1/nodes/n2").json()
    assert (node["interconnect"], node["address"], len(node["gpus"])) == ("nvlink", "10.0.0.2", 8)
    kinds = [e["kind"] for e in client.get("/v1/audit", params={"node": "n2"}).json()["items"]]
    assert "node.facts_updated" not in kinds  # nothing changed
    r = put(client, "n2", {**bare, "interconnect": None, "address": None})
    assert r.status_code == 200
    node = client.get("/v1/nodes/n2").json()
    assert (node["interconnect"], node["address"], len(node["gpus"])) == (None, None, 8)
    # a new count with the stored per-GPU list left out: the kept list no longer agrees
    r = put(client, "n2", {**bare, "gpu_count": 7})
    assert r.status_code == 422 and field_of(r) == "gpus" and '"gpus": null' in r.json()["errors"][0]["message"]
    r = put(client, "n2", {**bare, "gpu_count": 7, "gpus": None})
    assert r.status_code == 200 and "gpus" not in client.get("/v1/nodes/n2").json()


def test_a_patched_gpu_count_clears_the_per_gpu_list_it_contradicts(client):
    assert put(client, "n3", facts_of("a100-pcie-4")).status_code == 201
    r = client.patch("/v1/nodes/n3", json={"gpu_count": 3})
    assert r.status_code == 200, r.text
    node = client.get("/v1/nodes/n3").json()
    assert node["gpu_count"] == 3 and "gpus" not in node


def test_a_patch_with_null_labels_is_a_422_naming_the_field_and_changes_nothing(client):
    from tests.support.api import register_node

    register_node(client, name="n1", gpu="h100-sxm-80gb", count=1)
    assert client.patch("/v1/nodes/n1", json={"labels": {"pool": "a"}}).status_code == 200
    r = client.patch("/v1/nodes/n1", json={"labels": None})
    assert r.status_code == 422 and field_of(r) == "labels", r.text
    assert client.get("/v1/nodes/n1").json()["labels"] == {"pool": "a"}


def test_node_names_are_one_node_whatever_the_case_and_never_end_with_a_dot(client):
    """``NODE-A``, ``node-a`` and ``node-a.`` were three nodes: now the name is stored in lower case, another case
    is the same node everywhere a name is given (paths, the agent's fetch, plan and rollout node lists), and a
    final dot is a 422 naming the field."""
    from tests.support.api import PLAN, fetch, register_manifest, register_node

    token = register_node(client, "NODE-A")["agent_token"]
    assert client.get("/v1/nodes/node-a").json()["name"] == "node-a"
    r = client.post("/v1/nodes", json={"name": "node-a", "gpu": "NVIDIA H100 80GB HBM3", "gpu_count": 8})
    assert r.status_code == 409 and "'node-a' already exists" in r.text
    r = client.post("/v1/nodes", json={"name": "node-a.", "gpu": "NVIDIA H100 80GB HBM3", "gpu_count": 8})
    assert r.status_code == 422 and field_of(r) == "name" and "does not end with a dot" in r.text
    assert client.get("/v1/nodes/node-a.").status_code == 422
    assert client.get("/v1/nodes/Node-A").json()["name"] == "node-a"
    register_manifest(client)
    r = client.post("/v1/plans", json={**PLAN, "nodes": ["NODE-A", "node-a"]})
    assert r.status_code == 422 and field_of(r) == "nodes.1" and "listed twice" in r.text
    r = client.post("/v1/plans", json={**PLAN, "nodes": ["Node-A"]})
    assert r.status_code == 201, r.text
    assert [a["node"] for a in r.json()["assignments"]] == ["node-a"]
    for spelling in ("NODE-A", "node-a"):
        got = fetch(client, spelling, token)
        assert got.status_code == 200 and got.headers["x-plan-id"] == r.json()["id"]
    assert fetch(client, "node-a.", token).status_code == 422
    r = client.patch("/v1/nodes/NODE-A", json={"labels": {"rack": "2"}})
    assert r.status_code == 200 and r.json()["labels"] == {"rack": "2"}
    assert [n["name"] for n in client.get("/v1/nodes").json()["items"]] == ["node-a"]
