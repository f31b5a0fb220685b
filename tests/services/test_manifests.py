"""Registration applies the plan's rules: a manifest whose quantization sources disagree, or whose uri vLLM would
read as an option, is refused with 422 and nothing is stored."""

from __future__ import annotations

import pytest

from tests.support import audit_events, hf_quant_config, model_config

FP8 = "nvidia__Llama-3.1-70B-Instruct-FP8"


def body(fixture, **extra):
    return {
        "name": "m",
        "version": "1",
        "uri": "s3://weights/m",
        "config": model_config(fixture),
        "hf_quant_config": hf_quant_config(fixture),
        **extra,
    }


@pytest.mark.parametrize(
    "fixture,tag,rule",
    [
        ("moonshotai__Kimi-K2.5", "awq", "quant_mismatch"),  # compressed-tensors weights tagged AWQ
        ("Qwen__Qwen3-235B-A22B-FP8", "gptq", "quant_mismatch"),  # fp8 config.json, tag gptq
        ("meta-llama__Meta-Llama-3.1-70B", "awq", "quant_no_config"),  # unquantized weights tagged awq
    ],
)
def test_tag_that_disagrees_with_the_checkpoint_is_refused(client, fixture, tag, rule):
    before = audit_events(client)
    r = client.post("/v1/manifests", json=body(fixture, quantization_txt=tag))
    assert r.status_code == 422, r.text
    assert rule in r.text
    assert client.get("/v1/manifests").json()["items"] == [] and audit_events(client) == before


def test_config_and_hf_quant_config_that_disagree_are_refused(client):
    b = body("Qwen__Qwen3-235B-A22B-FP8", hf_quant_config=hf_quant_config(FP8))  # fp8 config.json + ModelOpt file
    r = client.post("/v1/manifests", json=b)
    assert r.status_code == 422 and "hf_quant_config.json says modelopt" in r.text


def test_matching_tags_register(client):
    assert client.post("/v1/manifests", json=body(FP8, quantization_txt="modelopt")).status_code == 201
    # vLLM 0.33's ModelOpt override claims FP8 ModelOpt weights whatever --quantization names (modelopt.py:453-459)
    b = body(FP8, name="tagged-awq", quantization_txt="awq")
    assert client.post("/v1/manifests", json=b).status_code == 201
    b = body("meta-llama__Meta-Llama-3.1-70B", name="plain", quantization_txt="none")
    b["name"] = "plain"
    assert client.post("/v1/manifests", json=b).status_code == 201


@pytest.mark.parametrize("uri", ["--model=/tmp/other", "-x", "weights dir/with space", "../../etc"])
def test_uri_vllm_would_misread_is_refused(client, uri):
    r = client.post("/v1/manifests", json=body("meta-llama__Meta-Llama-3.1-8B", uri=uri))
    assert r.status_code == 422 and "model_reference" in r.text, r.text


@pytest.mark.parametrize("fixture", ["Qwen__Qwen3-235B-A22B-FP8", "openai__gpt-oss-120b", FP8])
def test_tag_none_on_quantized_weights_is_refused(client, fixture):
    r = client.post("/v1/manifests", json=body(fixture, quantization_txt="none"))
    assert r.status_code == 422 and "quant_mismatch" in r.text, r.text


@pytest.mark.parametrize("tag", ["bitsandbytes", "gguf"])
def test_tags_of_older_lines_register(client, tag):
    r = client.post("/v1/manifests", json=body("meta-llama__Meta-Llama-3.1-8B", quantization_txt=tag))
    assert r.status_code == 201, r.text


@pytest.mark.parametrize("key", ["trust_remote_code", "--trust-remote-code", "trust-remote-code"])
def test_remote_code_in_production_needs_the_manifests_consent_in_every_spelling(client, key):
    from tests.support.api import register_node

    register_node(client, name="n1", gpu="h100-sxm-80gb", count=1)
    assert client.post("/v1/manifests", json=body("meta-llama__Meta-Llama-3.1-8B")).status_code == 201
    r = client.post("/v1/plans", json={"manifest": "m", "nodes": ["n1"], "engine_args": {key: True}})
    assert r.status_code == 422 and "trust_remote_code_not_allowed" in r.text, r.text


@pytest.mark.parametrize(
    "args",
    [
        {"tool_parser_plugin": "/tmp/evil.py"},
        {"worker_cls": "evil.Worker"},
        {"middleware": ["evil.mw"]},
        {"logits_processors": ["evil:LP"]},
        {"kv_transfer_config": {"kv_connector": "X", "kv_role": "kv_both", "kv_connector_module_path": "evil.mod"}},
        {"scheduler_cls": "evil.Sched"},
        {"distributed_executor_backend": "evil.Exec"},
        {"compilation_config": {"inductor_passes": {"p": "evil.fn"}}},
        {"structured_outputs_config": {"reasoning_parser_plugin": "/tmp/evil.py"}},
        {"ec_transfer_config": {"ec_connector_module_path": "evil.mod"}},
        {
            "kv_transfer_config": {
                "kv_connector": "MultiConnector",
                "kv_role": "kv_both",
                "kv_connector_extra_config": {
                    "connectors": [{"kv_connector": "X", "kv_role": "kv_both", "kv_connector_module_path": "evil.mod"}]
                },
            }
        },
        {
            "kv_transfer_config": {
                "kv_connector_extra_config": {"a": {"b": {"c": {"d": {"e": {"f": {"g": [{"worker_cls": "evil.W"}]}}}}}}}
            }
        },
    ],
)
def test_options_that_load_code_need_the_manifests_consent_in_production(client, args):
    from tests.support.api import register_node

    register_node(client, name="n1", gpu="h100-sxm-80gb", count=1)
    assert client.post("/v1/manifests", json=body("meta-llama__Meta-Llama-3.1-8B")).status_code == 201
    r = client.post("/v1/plans", json={"manifest": "m", "nodes": ["n1"], "engine_args": args})
    assert r.status_code == 422 and "code_not_allowed" in r.text, r.text
    ok = client.post(
        "/v1/plans", json={"manifest": "m", "nodes": ["n1"], "engine_args": args, "environment": "benchmark"}
    )
    assert ok.status_code == 201, ok.text
