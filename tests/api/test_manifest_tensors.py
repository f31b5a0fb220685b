"""POST /v1/manifests with the tensor inventory ``preflight manifest push`` reads: stored and shown; a tag or
config the tensors contradict refused with 422 quant_mismatch naming both sides and the tensor."""

from __future__ import annotations

from service.tensor_readers import inventory_record, read_directory
from tests.api.test_bad_input import assert_problem
from tests.domain.test_tensor_format import AWQ_CONFIG, GPTQ_CONFIG, _layout, awq
from tests.support import audit_events, model_config
from tests.support.safetensors_files import write_checkpoint

LLAMA = "meta-llama__Meta-Llama-3.1-8B"


def _body(tmp_path, layout, **extra):
    record = inventory_record(read_directory(write_checkpoint(tmp_path / "m", {"model.safetensors": layout})))
    return {"name": "m", "version": "1", "uri": "s3://w", "config": model_config(LLAMA), "tensors": record, **extra}


def test_inventory_stored_and_shown(client, tmp_path):
    body = _body(tmp_path, _layout(lambda i, o: {"weight": ("BF16", [o, i])}))
    r = client.post("/v1/manifests", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["layout_digest"] == body["tensors"]["layout_digest"]
    assert r.json()["tensor_format"] == "none"
    full = client.get("/v1/manifests/m@1").json()
    assert full["tensors"]["tensor_count"] == 8 and full["tensors"]["by_dtype"]["BF16"]["tensors"] == 8
    assert full["tensors"]["format"]["weight_dtype"] == "BF16"


def test_mislabeled_checkpoint_refused(client, tmp_path):
    config = {**model_config(LLAMA), **GPTQ_CONFIG}
    body = _body(tmp_path, awq(), quantization_txt="gptq\n", config=config)
    before = audit_events(client)
    err = assert_problem(client.post("/v1/manifests", json=body), 422, "quantization_txt")["errors"][0]
    assert err["rule"] == "quant_mismatch"
    assert "quantization.txt says gptq" in err["message"] and "the tensors are awq 4-bit group 32" in err["message"]
    assert "model.layers.0.mlp.down_proj.qweight" in err["message"]
    assert audit_events(client) == before and client.get("/v1/manifests").json()["items"] == []


def test_config_wrong_tag_right_names_the_config(client, tmp_path):
    body = _body(tmp_path, awq(), quantization_txt="awq\n", config={**model_config(LLAMA), **GPTQ_CONFIG})
    err = assert_problem(client.post("/v1/manifests", json=body), 422, "quantization_config")["errors"][0]
    assert "config.json is wrong" in err["message"]
    body = _body(tmp_path, awq(), quantization_txt="awq\n", config={**model_config(LLAMA), **AWQ_CONFIG})
    assert client.post("/v1/manifests", json=body).status_code == 201


def test_hostile_inventory_refused(client, tmp_path):
    body = _body(tmp_path, _layout(lambda i, o: {"weight": ("BF16", [o, i])}))
    body["tensors"]["total_bytes"] += 1
    assert_problem(client.post("/v1/manifests", json=body), 422, "tensors")
    body = _body(tmp_path, _layout(lambda i, o: {"weight": ("BF16", [o, i])}))
    body["tensors"]["format"]["scheme"] = "q3_k_m"
    assert_problem(client.post("/v1/manifests", json=body), 422, "scheme")
    body["tensors"] = {"layout_digest": "sha256:" + "0" * 64}
    assert_problem(client.post("/v1/manifests", json=body), 422, "tensors")


def test_plan_budget_uses_the_manifests_tensors(client):
    """A manifest registered with its tensors' per-layer record: the plan's budget is the tensors' bytes per GPU
    (Llama-3.1-8B bf16 reconstructed to its published 16,060,522,496 bytes), and says so."""
    from service.domain.rank_weights import rank_weights
    from service.domain.tensors import FileHeader, build_inventory
    from tests.support.api import register_node
    from tests.support.checkpoints import llama_like

    tensors = llama_like(model_config(LLAMA))
    total = sum(t.nbytes for t in tensors.values())
    inv = build_inventory([FileHeader("model.safetensors", 0, total, tuple(tensors.values()))])
    record = inventory_record(inv)
    assert record["total_bytes"] == 16_060_522_496 and len(record["ranks"]["layers"]) == 32
    body = {"name": "m", "version": "1", "uri": "s3://w", "config": model_config(LLAMA), "tensors": record}
    assert client.post("/v1/manifests", json=body).status_code == 201
    register_node(client)
    r = client.post(
        "/v1/plans",
        json={
            "manifest": "m@1",
            "nodes": ["gpu-01"],
            "engine_args": {"tensor_parallel_size": 2, "max_model_len": 8192},
        },
    )
    assert r.status_code == 201, r.text
    budget = r.json()["budget"]
    assert budget["weights_source"] == "checkpoint tensors, split as vLLM shards them"
    rw = rank_weights(tensors)
    assert rw is not None and budget["weights_bytes_per_gpu"] == rw.max_stage_bytes(32, 2, 1, 8, 1)


def test_ranks_that_do_not_add_up_refused(client, tmp_path):
    body = _body(tmp_path, _layout(lambda i, o: {"weight": ("BF16", [o, i])}))
    assert body["tensors"]["ranks"]["layers"]
    body["tensors"]["ranks"]["final"] += 2
    assert_problem(client.post("/v1/manifests", json=body), 422, "tensors")
    body["tensors"]["ranks"]["final"] -= 2
    body["tensors"]["ranks"]["layers"] = [[1, 2]]
    assert_problem(client.post("/v1/manifests", json=body), 422, "layers")


def test_linear_shapes_stored_and_the_format_read_from_them(client, tmp_path):
    """The record carries each linear layout with its tensors' shapes; a format the shapes contradict is refused
    (the server reads it again from the shapes, it does not take the client's)."""
    body = _body(tmp_path, awq(), quantization_txt="awq\n", config={**model_config(LLAMA), **AWQ_CONFIG})
    linears = {m["module"]: m for m in body["tensors"]["linears"]}
    assert linears["model.layers.*.mlp.down_proj"]["params"]["qweight"]["dtype"] == "I32"
    lying = {**body, "version": "2", "tensors": {**body["tensors"], "format": {"scheme": "none", "schemes": {}}}}
    err = assert_problem(client.post("/v1/manifests", json=lying), 422, "tensors.format")["errors"][0]
    assert err["rule"] == "tensors_format" and "awq 4-bit group 32" in err["message"]
    assert client.post("/v1/manifests", json=body).status_code == 201
    assert client.get("/v1/manifests/m@1").json()["tensors"]["linears"] == body["tensors"]["linears"]


def test_tensors_holding_none_of_the_configs_layers_refused(client, tmp_path):
    layout = {"model.embed_tokens.weight": ("BF16", [64, 16]), "lm_head.weight": ("BF16", [64, 16])}
    body = _body(tmp_path, layout)
    err = assert_problem(client.post("/v1/manifests", json=body), 422, "tensors")["errors"][0]
    assert err["rule"] == "tensors_layers_missing"
    assert "config.json has 32 decoder layers" in err["message"] and "model.layers.0." in err["message"]
