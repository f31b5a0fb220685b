"""What a signed plan may load, through POST /v1/plans: code needs the manifest's allow_remote_code in production,
switches that turn safety off, write paths and secrets in the argv are refused everywhere, read paths in production,
other weights are named — in engine arguments at any depth and in the env alike, and nothing is stored when refused."""

from __future__ import annotations

import pytest

from tests.support.api import register_manifest, register_node

MODEL = "meta-llama__Meta-Llama-3.1-8B"


@pytest.fixture
def fleet(client):
    register_node(client, name="n1", gpu="h100-sxm-80gb", count=1)
    register_manifest(client, MODEL, name="m")
    register_manifest(client, MODEL, name="trusted", allow_remote_code=True)
    return client


def plan(client, manifest="m", environment="production", **body):
    return client.post(
        "/v1/plans",
        json={"manifest": manifest, "nodes": ["n1"], "environment": environment, **body},
    )


def errors(r) -> set[tuple[str, str]]:
    """(field, rule) of every refusal: a request error (``errors``) or a launch finding of severity error."""
    body = r.json()
    found = body.get("errors") or [f for f in body.get("findings", ()) if f["severity"] == "error"]
    return {(e["field"], e["rule"]) for e in found}


MULTI = {
    "kv_connector": "MultiConnector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {
        "connectors": [
            {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
            {"kv_connector": "X", "kv_role": "kv_both", "kv_connector_module_path": "evil.mod"},
        ]
    },
}


@pytest.mark.parametrize(
    "args,field",
    [
        (
            {"kv_transfer_config": MULTI},
            "kv_transfer_config.kv_connector_extra_config.connectors[1].kv_connector_module_path",
        ),
        ({"compilation_config": {"mode": 1, "backend": "evil.mod.backend"}}, "compilation_config.backend"),
        ({"model_class_overrides": {"LlamaForCausalLM": "evil.mod:Model"}}, "model_class_overrides"),
        (
            {"speculative_config": {"model": "evil.proposer.Cls", "num_speculative_tokens": 2}},
            "speculative_config.model",
        ),
        # vLLM's test is str.isidentifier per part: a Unicode class name is a class path too
        ({"speculative_config": {"model": "evil.Ćls", "num_speculative_tokens": 2}}, "speculative_config.model"),
        ({"logging_config": {"pylogging_config_file": "/srv/log.json"}}, "logging_config.pylogging_config_file"),
        (
            {"compilation_config": {"inductor_compile_config": {"cpp.cxx": "/tmp/evil"}}},
            "compilation_config.inductor_compile_config",
        ),
    ],
)
def test_code_needs_the_manifests_consent_in_production(fleet, args, field):
    r = plan(fleet, engine_args=args)
    assert r.status_code == 422, r.text
    assert ("engine_args." + field, "code_not_allowed") in errors(r)
    assert fleet.get("/v1/plans").json()["items"] == []  # a refusal stores nothing
    trusted = plan(fleet, manifest="trusted", engine_args=args)  # may be refused for a path, never for code
    assert "code_not_allowed" not in {rule for _, rule in errors(trusted)}, trusted.text


@pytest.mark.parametrize(
    "env",
    [
        {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},
        {"VLLM_SERVER_DEV_MODE": "1"},
        {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"},
        {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"},
        {"TRITON_CACHE_MANAGER": "evil.mod:Manager"},
        {"TRITON_REMOTE_CACHE_BACKEND": "evil.mod:Backend"},
        {"VLLM_LOGGING_STREAM": "ext://evil.mod.stream"},  # dictConfig imports an ext:// stream
    ],
)
@pytest.mark.parametrize("environment", ["production", "benchmark"])
def test_env_that_loads_code_or_turns_safety_off_is_refused_everywhere(fleet, env, environment):
    r = plan(fleet, manifest="trusted", environment=environment, env=env)
    assert r.status_code == 422, r.text
    assert errors(r) == {(f"env.{next(iter(env))}", "env_not_allowed")}


@pytest.mark.parametrize(
    "args,field,rule",
    [
        ({"mm_encoder_fp8_scale_save_path": "/etc/cron.d/x"}, "mm_encoder_fp8_scale_save_path", "write_not_allowed"),
        (
            {"compilation_config": {"debug_dump_path": "/root/.ssh"}},
            "compilation_config.debug_dump_path",
            "write_not_allowed",
        ),
        ({"api_key": ["s3cret-key"]}, "api_key", "secret_in_engine_args"),
        ({"hf_token": "hf_s3cret"}, "hf_token", "secret_in_engine_args"),
        # passed on to the processor's from_pretrained (vllm/transformers_utils/processor.py)
        ({"mm_processor_kwargs": {"token": "hf_s3cret"}}, "mm_processor_kwargs.token", "secret_in_engine_args"),
        ({"uds": "/etc/cron.d/sock"}, "uds", "write_not_allowed"),
    ],
)
@pytest.mark.parametrize("environment", ["production", "benchmark"])
def test_writes_and_secrets_are_refused_everywhere(fleet, args, field, rule, environment):
    r = plan(fleet, manifest="trusted", environment=environment, engine_args=args)
    assert r.status_code == 422, r.text
    assert any(f.startswith("engine_args." + field) and ru == rule for f, ru in errors(r)), r.text
    assert "s3cret" not in r.text  # a refused secret is never echoed


@pytest.mark.parametrize(
    "name,value",
    [
        ("chat_template", "/etc/shadow"),
        ("chat_template", "/srv/{x}/t.jinja"),  # vLLM opens it before reading it as Jinja
        ("allowed_local_media_path", "/"),  # API clients read any file under it as media
        ("ssl_keyfile", "/etc/shadow"),
    ],
)
def test_a_path_to_read_is_refused_in_production_only(fleet, name, value):
    args = {name: value}
    r = plan(fleet, manifest="trusted", engine_args=args)
    assert r.status_code == 422 and (f"engine_args.{name}", "path_not_allowed") in errors(r), r.text
    assert plan(fleet, manifest="trusted", environment="benchmark", engine_args=args).status_code == 201


def test_other_weights_are_named_in_a_warning(fleet):
    r = plan(fleet, engine_args={"tokenizer": "org/another-tokenizer"})
    assert r.status_code == 201, r.text
    warned = [f for f in r.json()["findings"] if f["rule"] == "other_weights"]
    assert warned and "org/another-tokenizer" in warned[0]["message"]


def test_quantization_config_is_not_signed_unjudged(fleet):
    r = plan(fleet, engine_args={"quantization_config": {"ignore": ["lm_head"]}})
    assert r.status_code == 422 and "flag_unjudged" in r.text, r.text
