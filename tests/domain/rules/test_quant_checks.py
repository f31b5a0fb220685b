"""The quantization checks (service/domain/rules/quant_checks.py): quantization vs GPU / dtype, deprecated methods,
GPTQ/AWQ parameters and FP8 weight-only, on real configs (synthetic AWQ/GPTQ variants are real configs plus a
quantization_config); the accept-side sweep covers the alignment rules too."""

from __future__ import annotations

import pytest

from tests.support import hf_quant_config, model_config, request
from tests.support.rules import AWQ, FIXTURES, GPTQ, TP_SIZES, errors, found, head_valid, quantized

FAMILY = (
    "quant_gpu_capability",
    "quant_dtype",
    "quant_deprecated",
    "quant_bits",
    "fp8_weight_only",
    "quant_group_alignment",
    "fp8_block_alignment",
)


@pytest.mark.parametrize("model", FIXTURES)
@pytest.mark.parametrize("tp", TP_SIZES)
def test_accept_side_fixture_models_h100(model, tp):
    """Real checkpoints (FP8 block, ModelOpt FP8, compressed-tensors int4 experts, MXFP4) at head-valid TPs."""
    if not head_valid(model_config(model), tp):
        pytest.skip("TP not allowed by the head rules")
    req = request(model, count=8, nodes=2, tensor_parallel_size=tp, distributed_executor_backend="ray")
    assert errors(req, *FAMILY) == []


def test_gptq_desc_act_and_bits():
    (f,) = errors(quantized("Qwen__Qwen2.5-72B-Instruct", dict(GPTQ, desc_act=True), count=1), "quant_bits")
    assert "desc_act" in f.message
    assert (
        errors(quantized("Qwen__Qwen2.5-72B-Instruct", dict(GPTQ, desc_act=True, group_size=-1), count=1), "quant_bits")
        == []
    )
    assert errors(quantized("Qwen__Qwen2.5-72B-Instruct", dict(GPTQ, bits=3), count=1), "quant_bits")
    assert errors(quantized("Qwen__Qwen2.5-72B-Instruct", dict(GPTQ, sym=False), count=1), "quant_bits")
    assert errors(quantized("Qwen__Qwen2.5-72B-Instruct", dict(AWQ, bits=8), count=1), "quant_bits")
    awq_odd = found(quantized("Qwen__Qwen2.5-72B-Instruct", dict(AWQ, group_size=256), count=1), "quant_bits")
    assert [f.severity.value for f in awq_odd] == ["warning"]


def test_capability_awq_on_v100_and_t4():
    (f,) = errors(quantized("Qwen__Qwen2.5-72B-Instruct", AWQ, gpu="v100-32gb", count=1), "quant_gpu_capability")
    assert "Minimum capability: 75. Current capability: 70." in f.message
    assert errors(quantized("Qwen__Qwen2.5-72B-Instruct", AWQ, gpu="t4-16gb", count=1), "quant_gpu_capability") == []


def test_gpt_oss_needs_sm80_and_bf16():
    assert (
        errors(request("openai__gpt-oss-120b", gpu="a100-sxm4-80gb", count=1), "quant_gpu_capability", "quant_dtype")
        == []
    )
    (f,) = errors(request("openai__gpt-oss-120b", gpu="t4-16gb", count=8), "quant_gpu_capability")
    assert "gpt_oss_mxfp4" in f.message and "Minimum capability: 80" in f.message
    (f,) = errors(request("openai__gpt-oss-120b", gpu="h100-sxm-80gb", count=2, dtype="float16"), "quant_dtype")
    assert f.message.startswith("torch.float16 is not supported for quantization method gpt_oss_mxfp4")


def test_fp32_refused_for_fp8():
    (f,) = errors(request("Qwen__Qwen3-235B-A22B-FP8", dtype="float32"), "quant_dtype")
    assert f.remedy == {"dtype": "bfloat16"}


def test_fbgemm_fp8_deprecated_until_flag():
    req = request("meta-llama__Meta-Llama-3.1-405B", tensor_parallel_size=8)
    req["model"]["config"]["quantization_config"] = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}
    (f,) = errors(req, "quant_deprecated")
    assert f.remedy == {"allow_deprecated_quantization": True}
    req["engine_args"]["allow_deprecated_quantization"] = True
    assert errors(req, "quant_deprecated") == []


def test_fp8_weight_only_on_ampere_not_on_hopper():
    model = "nvidia__Llama-3.1-70B-Instruct-FP8"
    assert hf_quant_config(model) is not None
    on_a100 = found(request(model, gpu="a100-sxm4-80gb", count=4, tensor_parallel_size=4), "fp8_weight_only")
    assert [f.severity.value for f in on_a100] == ["warning"]
    assert found(request(model, gpu="h100-sxm-80gb", count=4, tensor_parallel_size=4), "fp8_weight_only") == []
    # ModelOpt FP8 needs SM80: a T4 is refused
    assert errors(request(model, gpu="t4-16gb", count=8, tensor_parallel_size=8), "quant_gpu_capability")


def test_online_fp8_per_channel_needs_sm89():
    assert errors(
        request("meta-llama__Llama-3.1-8B-Instruct", gpu="a100-sxm4-80gb", count=1, quantization="fp8_per_channel"),
        "fp8_weight_only",
    )
    assert not errors(
        request("meta-llama__Llama-3.1-8B-Instruct", gpu="l40s-48gb", count=1, quantization="fp8_per_channel"),
        "fp8_weight_only",
    )
    per_tensor = found(
        request("meta-llama__Llama-3.1-8B-Instruct", gpu="a100-sxm4-80gb", count=1, quantization="fp8_per_tensor"),
        "fp8_weight_only",
    )
    assert [f.severity.value for f in per_tensor] == ["warning"]
