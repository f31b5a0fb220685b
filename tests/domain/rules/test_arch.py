"""Removed architectures, architectures a release resolves through its Transformers backend or a suffix adapter or
refuses, custom config code and pipeline-parallel executor rules."""

from __future__ import annotations

import pytest

from service.domain import arch_resolution
from service.domain.transformers_models import release_transformers
from service.domain.versions import resolve_version, version_lines
from tests.support import model_config, request
from tests.support.rules import FIXTURES, errors, found

FAMILY = ("arch_unsupported", "pp_supported")


@pytest.mark.parametrize("model", FIXTURES)
@pytest.mark.parametrize("pp", (1, 2, 4))
def test_accept_side_fixture_models(model, pp):
    req = request(
        model,
        count=8,
        nodes=4,
        tensor_parallel_size=8,
        pipeline_parallel_size=pp,
        distributed_executor_backend="ray",
        trust_remote_code=True,
    )
    assert errors(req, *FAMILY) == []


@pytest.mark.parametrize(
    "arch,until",
    [
        ("BaichuanForCausalLM", "0.23.0"),
        ("QWenLMHeadModel", "0.23.0"),
        ("MPTForCausalLM", "0.28.0"),
    ],
)
def test_removed_architectures(arch, until):
    req = request("meta-llama__Llama-2-13b-hf", count=1)
    req["model"]["config"]["architectures"] = [arch]
    (f,) = errors(req, "arch_unsupported")
    assert f"supported in vLLM until v{until}" in f.message


def test_trust_remote_code_for_unknown_custom_type():
    req = request("meta-llama__Llama-2-13b-hf", count=1)
    req["model"]["config"].update(
        model_type="baichuan", auto_map={"AutoConfig": "configuration_baichuan.BaichuanConfig"}
    )
    (f,) = found(req, "trust_remote_code")
    assert f.remedy == {"trust_remote_code": True}
    req["engine_args"]["trust_remote_code"] = True
    assert not found(req, "trust_remote_code")


def test_auto_map_on_builtin_type_needs_nothing():
    # Falcon-40B and Phi-3 ship auto_map but their model types are in Transformers
    for model in ("tiiuae__falcon-40b", "microsoft__Phi-3-medium-4k-instruct"):
        assert model_config(model).get("auto_map")
        assert not found(request(model, count=2, tensor_parallel_size=2), "trust_remote_code")


def test_pp_with_uni_backend_and_async_scheduling():
    assert errors(
        request(
            "meta-llama__Meta-Llama-3.1-70B",
            count=8,
            tensor_parallel_size=4,
            pipeline_parallel_size=2,
            distributed_executor_backend="uni",
        ),
        "pp_supported",
    )
    async_pp = request(
        "meta-llama__Meta-Llama-3.1-70B",
        count=8,
        tensor_parallel_size=4,
        pipeline_parallel_size=2,
        async_scheduling=True,
    )
    # 0.32: the V1 model runner refuses the pair; 0.33 runs it on Model Runner V2 (vLLM 0.33's create_engine_config
    # accepts it, found by scripts/vllm_differential.py)
    assert errors({**async_pp, "vllm_version": "0.32.0"}, "pp_supported")
    assert not errors(async_pp, "pp_supported")
    assert not errors(
        request("meta-llama__Meta-Llama-3.1-70B", count=8, tensor_parallel_size=4, pipeline_parallel_size=2),
        "pp_supported",
    )


def _arch(model: str, version: str, archs: list[str] | None = None, **engine_args) -> list:
    req = request(model, count=8, **engine_args)
    req["vllm_version"] = version
    if archs is not None:
        req["model"]["config"]["architectures"] = archs
    return found(req, "arch_unsupported")


def test_kimi_k25_on_0_10_2_depends_on_the_repository_class():
    # 0.10.2 registers no KimiK25ForConditionalGeneration, no Transformers it allows has the class, and it loads
    # auto_map's AutoModel class from the repository without asking for --trust-remote-code (registry.py:568-600)
    assert "KimiK25ForConditionalGeneration" not in resolve_version("0.10.2")[1].architectures
    (f,) = _arch("moonshotai__Kimi-K2.5", "0.10.2", tensor_parallel_size=8)
    assert f.severity.value == "warning"
    assert "transformers 4.55.2 and 5.24.0 have no class KimiK25ForConditionalGeneration" in f.message
    assert "auto_map's modeling_kimi_k25.KimiK25ForConditionalGeneration from the repository" in f.message
    assert "_supports_attention_backend = True" in f.message
    assert "'Model architectures ['KimiK25ForConditionalGeneration'] are not supported for now'" in f.message


def test_kimi_k25_on_0_10_2_without_the_transformers_backend_is_refused():
    (f,) = _arch("moonshotai__Kimi-K2.5", "0.10.2", tensor_parallel_size=8, model_impl="vllm")
    assert f.severity.value == "error"
    assert f.message.startswith(
        "Model architectures ['KimiK25ForConditionalGeneration'] are not supported for now. Supported architectures: "
    )
    assert "the 210 architectures of vLLM 0.10.2's model registry; nearest: KimiVLForConditionalGeneration" in f.message
    assert f.remedy == {"vllm_version": "0.15.1"}


def test_kimi_k25_registered_from_0_15():
    assert "KimiK25ForConditionalGeneration" in resolve_version("0.33.0")[1].architectures
    for version in ("0.15.1", "0.33.0"):
        assert _arch("moonshotai__Kimi-K2.5", version, tensor_parallel_size=8) == []


def test_model_impl_transformers_needs_the_class_or_trusted_repository_code():
    # 0.33 resolves the first architecture through Transformers first; the repository's class loads only with
    # --trust-remote-code (0.33.0 dynamic_module.py:36-41), so without it _try_resolve_transformers raises
    (f,) = _arch("moonshotai__Kimi-K2.5", "0.33.0", tensor_parallel_size=8, model_impl="transformers")
    assert f.severity.value == "error"
    assert f.message.startswith("Cannot find model module. 'KimiK25ForConditionalGeneration' is not a registered model")
    assert "transformers 5.16.1 and 5.20.2 have no class KimiK25ForConditionalGeneration" in f.message
    assert f.remedy == {"model_impl": "auto"}
    assert f.field == "engine_args.model_impl"
    (f,) = _arch(
        "moonshotai__Kimi-K2.5", "0.33.0", tensor_parallel_size=8, model_impl="transformers", trust_remote_code=True
    )
    assert f.severity.value == "warning"
    # LlamaForCausalLM: both Transformers 0.33 allows have it, backend-compatible
    assert _arch("meta-llama__Meta-Llama-3.1-8B", "0.33.0", model_impl="transformers") == []


@pytest.mark.parametrize(
    "version,span",
    [("0.33.0", "5.16.1 and 5.20.2"), ("0.10.2", "4.55.2 and 5.24.0"), ("0.9.2", "4.51.1 and 4.53.3")],
)
def test_transformers_only_architecture_is_served_by_the_backend(version, span):
    # Helium (kyutai/helium-1-preview-2b): a Llama-shaped model that Transformers has and vLLM never registered
    (f,) = _arch("meta-llama__Llama-2-13b-hf", version, ["HeliumForCausalLM"])
    assert f.severity.value == "info"
    assert f"vLLM serves it with its Transformers modeling backend (transformers {span} have HeliumForCausalLM" in (
        f.message
    )


def test_transformers_only_architecture_before_the_fallback_and_where_transformers_lacks_it():
    (f,) = _arch("meta-llama__Llama-2-13b-hf", "0.6.6", ["HeliumForCausalLM"])
    assert f.severity.value == "error"
    assert "vLLM 0.6.6 has no Transformers fallback" in f.message
    # 0.7.3 allows transformers 4.48.2 (no Helium yet) through 5.24.0 (Helium): depends on what is installed
    (f,) = _arch("meta-llama__Llama-2-13b-hf", "0.7.3", ["HeliumForCausalLM"])
    assert f.severity.value == "warning"
    assert "transformers 4.48.2 has no class HeliumForCausalLM" in f.message


def test_removed_architecture_taken_by_the_transformers_backend():
    # vLLM 0.33 tries the Transformers backend before it says "was supported until" (registry.py:1387-1418), but an
    # architecture vLLM removed stays refused (the public case pp-unsupported-llama32-90b-vision)
    (f,) = _arch("meta-llama__Llama-2-13b-hf", "0.33.0", ["MllamaForConditionalGeneration"])
    assert f.severity.value == "error"
    assert "was supported in vLLM until v0.10.2" in f.message
    assert "transformers 5.16.1 and 5.20.2 have MllamaForConditionalGeneration, backend-compatible" in f.message
    assert f.remedy == {"vllm_version": "0.10.2"}
    assert _arch("meta-llama__Llama-2-13b-hf", "0.10.2", ["MllamaForConditionalGeneration"]) == []


def test_pooling_suffix_resolves_to_the_registered_base_with_an_adapter():
    (f,) = _arch("Qwen__Qwen3-30B-A3B", "0.33.0", ["Qwen3MoeForSequenceClassification"])
    assert f.severity.value == "info"
    assert "resolves it to the registered Qwen3MoeForCausalLM" in f.message
    assert "convert classify" in f.message
    # 0.6 has neither the rewrite nor a Transformers fallback
    (f,) = _arch("Qwen__Qwen3-30B-A3B", "0.6.6", ["Qwen3MoeForSequenceClassification"])
    assert f.severity.value == "error"


@pytest.mark.parametrize(
    "model,version,said,registers",
    [
        ("openai__gpt-oss-120b", "0.9.2", "Cannot find model module. 'GptOssForCausalLM'", "0.10.2"),
        ("Qwen__Qwen3.5-35B-A3B", "0.13.0", "Model architectures ['Qwen3_5MoeForConditionalGeneration']", "0.18.1"),
    ],
)
def test_newer_architectures_on_older_releases_are_refused(model, version, said, registers):
    (f,) = _arch(model, version, tensor_parallel_size=8)
    assert f.severity.value == "error"
    assert f.message.startswith(said)
    assert f.remedy == {"vllm_version": registers}


def test_without_transformers_data_the_fallback_stays_a_warning(monkeypatch):
    monkeypatch.setattr(arch_resolution, "release_transformers", lambda version: None)
    out = arch_resolution.judge(("HeliumForCausalLM",), resolve_version("0.33.0")[1], "auto", False, None)
    assert out is not None and out.severity == "warning"
    assert "Preflight has no Transformers data for vLLM 0.33.0" in out.message


def test_every_release_has_transformers_data():
    for line in version_lines():
        rt = release_transformers(line.newest)
        assert rt is not None, line.newest
        assert len(rt.versions) in (1, 2)
        assert (rt.fallback is None) == (line.release < (0, 7, 0))
        assert bool(rt.suffixes) == (line.release >= (0, 10, 0))
    rt = release_transformers("0.33.0")
    assert rt is not None and rt.versions == ("5.16.1", "5.20.2") and rt.requirement == "<5.21.0,>=5.16.1"
    assert rt.suffixes[0] == ("ForCausalLM", "generate", "none")
    assert rt.classes[0]["LlamaForCausalLM"] == "bsf"
