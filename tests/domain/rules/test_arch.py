"""Removed architectures, custom config code and pipeline-parallel executor rules."""

from __future__ import annotations

import pytest

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
        ("MllamaForConditionalGeneration", "0.10.2"),
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
        "meta-llama__Meta-Llama-3.1-70B", count=8, tensor_parallel_size=4, pipeline_parallel_size=2, async_scheduling=True
    )
    # 0.32: the V1 model runner refuses the pair; 0.33 runs it on Model Runner V2 (vLLM 0.33's create_engine_config
    # accepts it, found by scripts/vllm_differential.py)
    assert errors({**async_pp, "vllm_version": "0.32.0"}, "pp_supported")
    assert not errors(async_pp, "pp_supported")
    assert not errors(
        request("meta-llama__Meta-Llama-3.1-70B", count=8, tensor_parallel_size=4, pipeline_parallel_size=2),
        "pp_supported",
    )
