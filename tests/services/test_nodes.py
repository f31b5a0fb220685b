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
