"""The node check never fails open, end to end: a manifest registered through ``POST /v1/manifests`` (no file records,
as a deploy script registers one), a live service, the real agent CLI with a stand-in vllm and a replayed
nvidia-smi. The plan's signed ``weights_expected`` (config digest, tag) is compared with the node's weights directory;
a production plan whose weights the node cannot compare is refused unless it was signed with an audited
``weights_check: "skip"``."""

from __future__ import annotations

import json

import pytest

from tests.support import model_config
from tests.support.agent_node import Node
from tests.support.gpus import weights_dir
from tests.support.live import admin

LLAMA = "meta-llama__Meta-Llama-3.1-8B"


@pytest.fixture
def world(servers, tmp_path):
    """A node registered by an admin, its weights in a local directory, and two manifests registered by the API
    without file records: one at that directory (unquantized: no quantization_txt), one at a remote uri."""
    (url,) = servers(1)
    c = admin(url)
    r = c.post("/v1/nodes", json={"name": "gpu-01", "gpu": "h100-sxm-80gb", "gpu_count": 8, "interconnect": "nvlink"})
    assert r.status_code == 201, r.text
    node = Node(tmp_path, url, r.json()["agent_token"])
    node.weights = None  # no --weights-root: a remote uri has no local mapping
    weights = weights_dir(tmp_path / "data" / "llama-3.1-8b", LLAMA, shards=2)
    for version, uri in (("local", str(weights)), ("remote", "s3://unmapped/llama-3.1-8b")):
        m = c.post(
            "/v1/manifests",
            json={"name": "meta-llama/Llama-3.1-8B", "version": version, "uri": uri, "config": model_config(LLAMA)},
        )
        assert m.status_code == 201 and "files" not in m.json(), m.text
    return c, node, weights


def plan(c, version, **extra):
    body = {
        "manifest": f"meta-llama/Llama-3.1-8B@{version}",
        "nodes": ["gpu-01"],
        "engine_args": {"tensor_parallel_size": 1, "max_model_len": 8192},
        **extra,
    }
    r = c.post("/v1/plans", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def refusals(c):
    items = c.get("/v1/audit", params={"node": "gpu-01", "kind": "agent.refused"}).json()["items"]
    return [e["payload"]["details"] for e in items]


def claims_of(p) -> dict:
    import base64

    part = p["signed"].split(".")[1]
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def test_an_awq_tag_on_the_node_for_a_manifest_registered_unquantized_is_refused(world):
    c, node, weights = world
    p = plan(c, "local")
    expected = claims_of(p)["node_checks"]["weights_expected"]
    assert (expected["quantization"], expected["unchecked"], expected["weights_check"]) == ("none", "refuse", "verify")
    (weights / "quantization.txt").write_text("awq\n")
    run = node.run()
    assert run.returncode == 3 and node.launches() == [], run.stderr
    assert (
        f"REFUSED weights {p['id']}: the weights in {weights} are not the ones the plan was judged for: "
        "quantization.txt: the manifest records no tag, the node has tag awq. vLLM was not started."
    ) in run.stderr
    [d] = refusals(c)
    assert (d["reason"], d["mismatches"]) == (
        "weights_mismatch",
        [{"file": "quantization.txt", "expected": "no tag", "found": "tag awq"}],
    )
    # the tag removed (the checkpoint is what was registered): the same plan starts at the next boot
    (weights / "quantization.txt").unlink()
    again = node.run()
    assert again.returncode == 0 and len(node.launches()) == 1, again.stderr
    assert f"weights: {weights} matches the manifest (config and tag)" in again.stderr


def test_a_config_json_of_another_model_is_refused_naming_it(world):
    c, node, weights = world
    plan(c, "local")
    config = json.loads((weights / "config.json").read_text())
    (weights / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 80}, indent=1))
    run = node.run()
    assert run.returncode == 3 and node.launches() == []
    [d] = refusals(c)
    [m] = d["mismatches"]
    assert m["file"] == "config.json" and m["expected"].startswith("config digest sha256:")
    (weights / "config.json").write_text(json.dumps(config, indent=8, sort_keys=True))  # reformatted: the same JSON
    assert node.run().returncode == 0 and len(node.launches()) == 1


def test_a_remote_uri_without_a_mapping_is_refused_in_production_and_starts_in_benchmark(world):
    c, node, _ = world
    p = plan(c, "remote")
    run = node.run()
    assert run.returncode == 3 and node.launches() == []
    assert (
        f"REFUSED weights {p['id']}: s3://unmapped/llama-3.1-8b is remote and no --weights-root maps it to a local "
        "directory: a production plan does not start on weights nobody compared"
    ) in run.stderr
    [d] = refusals(c)
    assert (d["reason"], d["model_uri"]) == ("weights_unverifiable", "s3://unmapped/llama-3.1-8b")
    # benchmark plans keep the old behaviour (docs/agent.md says why): said, not refused
    plan(c, "remote", environment="benchmark")
    bench = node.run()
    assert bench.returncode == 0 and len(node.launches()) == 1, bench.stderr
    assert "not checked (a benchmark plan)" in bench.stderr


def test_a_skip_plan_starts_and_the_audit_names_who_asked_and_why(world):
    c, node, weights = world
    (weights / "quantization.txt").write_text("awq\n")  # would be refused; skipped on purpose
    reason = "weights streamed by the vendor loader; checked by its own signature"
    r = c.post(
        "/v1/plans",
        json={"manifest": "meta-llama/Llama-3.1-8B@remote", "nodes": ["gpu-01"], "weights_check": "skip"},
    )
    assert r.status_code == 422 and r.json()["errors"][0]["field"].endswith("weights_check_reason"), r.text
    p = plan(c, "remote", weights_check="skip", weights_check_reason=reason)
    assert p["weights_check"] == {"mode": "skip", "reason": reason, "requested_by": "admin"}
    run = node.run()
    assert run.returncode == 0 and len(node.launches()) == 1, run.stderr
    assert "weights: NOT CHECKED: the plan was signed with weights_check skip" in run.stderr and reason in run.stderr
    [ev] = c.get("/v1/audit", params={"kind": "plan.weights_check_skipped"}).json()["items"]
    assert (ev["actor"], ev["plan_id"], ev["node"]) == ("admin", p["id"], "gpu-01")
    assert ev["payload"]["reason"] == reason and ev["payload"]["requested_by"] == "admin"
    assert ev["payload"]["environment"] == "production" and ev["payload"]["model_uri"] == "s3://unmapped/llama-3.1-8b"
    [created] = [
        e for e in c.get("/v1/audit", params={"kind": "plan.created"}).json()["items"] if e["plan_id"] == p["id"]
    ]
    assert created["payload"]["weights_check"] == "skip"
    # a reissue signs the same choice again, audited again under whoever reissued it
    again = c.post(f"/v1/plans/{p['id']}/reissue")
    assert again.status_code == 201 and again.json()["weights_check"]["mode"] == "skip", again.text
    assert len(c.get("/v1/audit", params={"kind": "plan.weights_check_skipped"}).json()["items"]) == 2
