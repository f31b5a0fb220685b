"""What a launch would make a node load (service/domain/loading.py), judged from each release's generated loading
facts: every option and nested field the facts mark as loading code is found at any depth, in every supported line."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from service.domain import env_policy, versions
from service.domain.engine_args import parse_engine_args
from service.domain.errors import DomainError
from service.domain.loading import CODE, NOT_LOADING, judge, option_loads

LINES = {line.newest: line for line in versions.version_lines()}


def loads(raw: dict[str, Any], version: str = "0.33.0"):
    line = versions.resolve_version(version)[1]
    return option_loads(parse_engine_args(raw, line).values, line.loading)


def kinds_at(raw: dict[str, Any], version: str = "0.33.0") -> set[tuple[str, str]]:
    return {(x.field, x.kind) for x in loads(raw, version)}


def nest(path: str, value: Any) -> dict[str, Any]:
    """``a.b[].c`` and a value -> ``{"a": {"b": [{"c": value}]}}``."""
    parts = re.findall(r"[^.\[\]]+|\[\]", path)
    out: Any = value
    for part in reversed(parts[1:]):
        out = [out] if part == "[]" else {part: out}
    return {parts[0]: out}


def shown(path: str) -> str:
    return "engine_args." + path.replace("[]", "[0]")


CANDIDATES: tuple[Any, ...] = ("evil.mod.Cls", True, {"cpp.cxx": "/tmp/evil"}, ["evil.mod.Cls"])


def code_cases():
    for version, line in LINES.items():
        for path, kinds in sorted(line.loading.options.items()):
            if kinds & CODE and path.split(".", 1)[0].removesuffix("[]") in line.options:
                yield pytest.param(version, path, id=f"{version}:{path}")


def test_every_supported_line_has_loading_facts():
    for version, line in LINES.items():
        assert line.loading.options, version
        assert {"trust_remote_code", "worker_cls"} <= set(line.loading.options), version


@pytest.mark.parametrize("version,path", list(code_cases()))
def test_every_option_the_release_imports_from_is_found(version, path):
    found = []
    for value in CANDIDATES:
        raw = nest(path, value)
        head = next(iter(raw))
        # a JSON option of an older line takes its JSON as text (vLLM parses it itself)
        for given in (raw, {head: json.dumps(raw[head])}):
            try:
                found = [x for x in loads(given, version) if x.kind in CODE]
            except DomainError:
                continue
            if found:
                break
        if found:
            break
    assert found, f"{path}: no value of {CANDIDATES} is accepted and found as loading code"
    assert found[0].field.startswith(shown(path).split("[", 1)[0].rsplit(".", 1)[0])
    assert found[0].site  # the release's file and line (or the name rule) is named


def test_multiconnector_connectors_at_any_depth():
    inner = {"kv_connector": "X", "kv_role": "kv_both", "kv_connector_module_path": "evil.mod"}
    for depth in range(1, 6):
        cfg: dict[str, Any] = inner
        for _ in range(depth):
            cfg = {
                "kv_connector": "MultiConnector",
                "kv_role": "kv_both",
                "kv_connector_extra_config": {"connectors": [{"kv_connector": "NixlConnector"}, cfg]},
            }
        found = kinds_at({"kv_transfer_config": cfg})
        field = "engine_args.kv_transfer_config" + ".kv_connector_extra_config.connectors[1]" * depth
        assert (field + ".kv_connector_module_path", "import") in found, depth


@pytest.mark.parametrize(
    "raw,field",
    [
        ({"compilation_config": {"mode": 1, "backend": "evil.mod.fn"}}, "compilation_config.backend"),
        ({"model_class_overrides": {"LlamaForCausalLM": "evil.mod:Model"}}, "model_class_overrides"),
        ({"logging_config": {"pylogging_config_file": "/tmp/log.json"}}, "logging_config.pylogging_config_file"),
        ({"speculative_config": {"model": "evil.proposer.Cls"}}, "speculative_config.model"),
        ({"distributed_executor_backend": "evil.mod.Executor"}, "distributed_executor_backend"),
        ({"kv_transfer_config": {"kv_connector_extra_config": {"spec_module_path": "evil"}}}, None),
    ],
)
def test_code_the_issue_found_accepted_is_found(raw, field):
    found = {f for f, k in kinds_at(raw) if k == "import"}
    assert found, raw
    if field is not None:
        assert "engine_args." + field in found


@pytest.mark.parametrize(
    "raw",
    [
        {"compilation_config": {"mode": 1, "backend": "inductor"}},
        {"distributed_executor_backend": "ray"},
        {"speculative_config": {"model": "meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 3}},
        {"kv_transfer_config": {"kv_connector": "NixlConnector", "kv_role": "kv_both", "engine_id": "abc"}},
        {"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"},
        {"trust_remote_code": False},
    ],
)
def test_names_vllm_reads_as_names_load_nothing(raw):
    assert [x for x in loads(raw) if x.kind != "other_weights"] == []


def test_values_vllm_reads_as_names_are_cited():
    for (path, _), (_, cite) in NOT_LOADING.items():
        assert cite, path


@pytest.mark.parametrize(
    "raw,rule,field",
    [
        ({"mm_encoder_fp8_scale_save_path": "/etc/x.json"}, "write_not_allowed", "mm_encoder_fp8_scale_save_path"),
        (
            {"compilation_config": {"debug_dump_path": "/tmp/d"}},
            "write_not_allowed",
            "compilation_config.debug_dump_path",
        ),
        ({"compilation_config": {"cache_dir": "/tmp/c"}}, "write_not_allowed", "compilation_config.cache_dir"),
        ({"download_dir": "/data"}, "write_not_allowed", "download_dir"),
        (
            {"kv_transfer_config": {"kv_connector": "NixlConnector", "kv_role": "kv_both", "engine_id": "../../etc"}},
            "write_not_allowed",
            "kv_transfer_config.engine_id",
        ),
        ({"chat_template": "/etc/passwd"}, "path_not_allowed", "chat_template"),
        ({"api_key": ["s3cret"]}, "secret_in_engine_args", "api_key"),
        ({"hf_token": "hf_abc"}, "secret_in_engine_args", "hf_token"),
        ({"tokenizer": "org/other-tokenizer"}, "other_weights", "tokenizer"),
        ({"lora_modules": ["a=/adapters/a"]}, "other_weights", "lora_modules"),
    ],
)
def test_the_policy_over_the_loads(raw, rule, field):
    verdicts = judge(loads(raw), environment="production", allow_remote_code=None)
    assert any(v.rule == rule and v.field.startswith("engine_args." + field) for v in verdicts), verdicts


def test_a_secret_is_never_echoed():
    verdicts = judge(loads({"hf_token": "hf_SECRETVALUE"}), environment="production", allow_remote_code=None)
    assert verdicts and all("SECRETVALUE" not in v.message for v in verdicts)


def test_paths_are_judged_only_in_production():
    raw = {"chat_template": "/opt/templates/x.jinja"}
    assert judge(loads(raw), environment="benchmark", allow_remote_code=None) == []
    assert judge(loads(raw), environment="production", allow_remote_code=None)


def test_code_needs_allow_remote_code_in_production():
    found = loads({"worker_cls": "evil.Worker"})
    assert [v.rule for v in judge(found, environment="production", allow_remote_code=False)] == ["code_not_allowed"]
    assert judge(found, environment="production", allow_remote_code=True) == []
    assert judge(found, environment="benchmark", allow_remote_code=False) == []


@pytest.mark.parametrize("version", ["0.6.6", "0.7.3"])
def test_json_given_as_the_text_of_a_string_option_is_searched(version):
    # before 0.9 --compilation-config is a plain string vLLM parses as JSON itself (CompilationConfig.from_cli)
    raw = {"compilation_config": '{"level": 3, "inductor_passes": {"p": "evil.mod.fn"}}'}
    assert any(k == "import" for _, k in kinds_at(raw, version))
    assert kinds_at({"compilation_config": '{"level": 3}'}, version) == set()


def env_cases():
    facts = versions.env_loading()
    for name, kinds in sorted(facts.env.items()):
        if kinds & (CODE | {"safety_off"}):
            yield name


@pytest.mark.parametrize("name", list(env_cases()))
def test_every_variable_the_releases_import_or_unpickle_from_is_refused(name):
    for value in ("1", "evil.mod:Cls"):
        refused = dict(env_policy.refused({name: value}))
        assert name in refused


@pytest.mark.parametrize(
    "name",
    [
        "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD",
        "VLLM_SERVER_DEV_MODE",
        "VLLM_ALLOW_INSECURE_SERIALIZATION",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
        "TRITON_CACHE_MANAGER",
        "TRITON_REMOTE_CACHE_BACKEND",
        "VLLM_LOGGING_CONFIG_PATH",
    ],
)
def test_the_switches_and_class_variables_the_issue_found(name):
    assert name in dict(env_policy.refused({name: "1"}))


@pytest.mark.parametrize(
    "env",
    [
        {"CUDA_VISIBLE_DEVICES": "0,1"},
        {"VLLM_SERVER_DEV_MODE": "0"},
        {"VLLM_API_KEY": "k"},
        {"NCCL_DEBUG": "INFO"},
        {"VLLM_ATTENTION_BACKEND": "FLASHINFER"},
    ],
)
def test_ordinary_variables_pass(env):
    assert env_policy.refused(env) == []


@pytest.mark.parametrize(
    "raw",
    [
        {"structured_outputs_config": {"backend": "xgrammar"}},
        {"speculative_config": {"method": "eagle", "model": "org/eagle-head", "num_speculative_tokens": 3}},
        {"compilation_config": {"mode": 3, "backend": "inductor"}},
    ],
)
def test_keys_other_configs_use_for_names_are_not_code_by_name(raw):
    assert [x for x in loads(raw) if x.kind in CODE] == []


@pytest.mark.parametrize(
    "model",
    [
        "evil.Ćls",  # vLLM tests each part with str.isidentifier (vllm/config/speculative.py:1224): Unicode counts
        "évil.Cls",
        "_evil._Cls",
    ],
)
def test_a_draft_model_vllm_reads_as_a_class_path_is_code(model):
    raw = {"speculative_config": {"model": model, "num_speculative_tokens": 2}}
    assert ("engine_args.speculative_config.model", "import") in kinds_at(raw)


@pytest.mark.parametrize(
    "model", ["org/draft", "https://host/evil.Cls", "evil", "evil..Cls", "1evil.Cls", "ngram", "evil.Cls "]
)
def test_a_draft_model_vllm_reads_as_a_model_is_not_code(model):
    raw = {"speculative_config": {"model": model, "num_speculative_tokens": 2}}
    assert not {k for _, k in kinds_at(raw) if k in CODE}


@pytest.mark.parametrize("template", ["/srv/{x}/t.jinja", "/proc/self/cwd/{{x}}", "{x}/../../etc/shadow"])
def test_a_chat_template_vllm_opens_as_a_file_is_a_path_even_with_jinja_characters(template):
    # vLLM opens the value first and falls back to reading it as a template only when that fails
    # (vllm/renderers/chat_utils/chat_template.py:72-105)
    verdicts = judge(loads({"chat_template": template}), environment="production", allow_remote_code=None)
    assert [v.rule for v in verdicts] == ["path_not_allowed"]


def test_the_bare_hf_token_flag_names_no_secret():
    # --hf-token alone uses the token the node logged in with (vllm/config/model.py:344-347)
    assert judge(loads({"hf_token": True}), environment="production", allow_remote_code=None) == []


@pytest.mark.parametrize(
    "raw,rule,field",
    [
        ({"allowed_local_media_path": "/"}, "path_not_allowed", "allowed_local_media_path"),
        ({"ssl_keyfile": "/etc/shadow"}, "path_not_allowed", "ssl_keyfile"),
        ({"ssl_ca_certs": "/etc/shadow"}, "path_not_allowed", "ssl_ca_certs"),
        ({"uds": "/etc/cron.d/sock"}, "write_not_allowed", "uds"),
        ({"mm_processor_kwargs": {"token": "hf_abc"}}, "secret_in_engine_args", "mm_processor_kwargs.token"),
        ({"mm_processor_kwargs": {"cache_dir": "/etc/x"}}, "write_not_allowed", "mm_processor_kwargs.cache_dir"),
    ],
)
def test_the_flows_the_analysis_missed(raw, rule, field):
    verdicts = judge(loads(raw), environment="production", allow_remote_code=None)
    assert any(v.rule == rule and v.field == "engine_args." + field for v in verdicts), verdicts


def test_the_logging_stream_imports_what_an_ext_url_names():
    # dictConfig resolves ext://module.attr by importing it (vllm/logger.py:237 hands the variable to it)
    assert "VLLM_LOGGING_STREAM" in dict(env_policy.refused({"VLLM_LOGGING_STREAM": "ext://evil.mod.stream"}))
    for value in ("ext://sys.stdout", "ext://sys.stderr"):
        assert env_policy.refused({"VLLM_LOGGING_STREAM": value}) == []


@pytest.mark.parametrize(
    "tier,key",
    [
        ({"type": "Evil", "module_path": "evil"}, "module_path"),  # vllm/v1/kv_offload/tiering/factory.py:123-140
        ({"type": "KVCR", "policy": "evil.mod.Policy"}, "policy"),  # vllm/v1/kv_offload/tiering/kvcr/manager.py:112
    ],
)
def test_an_offloading_tier_out_of_tree_is_code(tier, key):
    extra = {"secondary_tiers": [tier]}
    raw = {
        "kv_transfer_config": {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": extra,
        }
    }
    field = f"engine_args.kv_transfer_config.kv_connector_extra_config.secondary_tiers[0].{key}"
    assert (field, "import") in kinds_at(raw)


def test_a_built_in_offloading_policy_is_a_name():
    extra = {"eviction_policy": "lru", "secondary_tiers": [{"type": "KVCR", "policy": "lru"}]}
    raw = {
        "kv_transfer_config": {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": extra,
        }
    }
    assert not {k for _, k in kinds_at(raw) if k in CODE}
