"""Quantization vs GPU / dtype, deprecated methods, GPTQ/AWQ parameters, FP8 weight-only, and per-rank alignment
of quant groups and FP8 blocks, on real configs (synthetic AWQ/GPTQ variants are real configs plus a
quantization_config)."""

from __future__ import annotations

import pytest

from tests.support.rules import FIXTURES, TP_SIZES, errors, found, head_valid
from tests.support import hf_quant_config, model_config, request

FAMILY = ("quant_gpu_capability", "quant_dtype", "quant_deprecated", "quant_bits", "fp8_weight_only",
          "quant_group_alignment", "fp8_block_alignment")
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}


def quantized(model: str, qcfg: dict, gpu: str = "a100-sxm4-80gb", **args) -> dict:
    req = request(model, gpu=gpu, **args)
    req["model"]["config"]["quantization_config"] = dict(qcfg)
    req["model"]["config"]["torch_dtype"] = "float16"
    return req


@pytest.mark.parametrize("model", FIXTURES)
@pytest.mark.parametrize("tp", TP_SIZES)
def test_accept_side_fixture_models_h100(model, tp):
    """Real checkpoints (FP8 block, ModelOpt FP8, compressed-tensors int4 experts, MXFP4) at head-valid TPs."""
    if not head_valid(model_config(model), tp):
        pytest.skip("TP not allowed by the head rules")
    req = request(model, count=8, nodes=2, tensor_parallel_size=tp, distributed_executor_backend="ray")
    assert errors(req, *FAMILY) == []


@pytest.mark.parametrize("tp", (1, 2, 4, 8))
def test_fp8_block_moe_experts_exempt_qwen3_235b(tp):
    # 1536 / 8 = 192 is not a multiple of 128 but the Triton MoE path refines the blocks (vllm 0.33.0
    # vllm/model_executor/layers/fused_moe/oracle/fp8.py refine_fp8_moe_block_shape)
    assert errors(request("Qwen__Qwen3-235B-A22B-FP8", tensor_parallel_size=tp), "fp8_block_alignment") == []


def test_fp8_block_dense_deepseek_tp32():
    req = request("deepseek-ai__DeepSeek-V3", count=8, nodes=4, tensor_parallel_size=32,
                  distributed_executor_backend="ray")
    (f,) = errors(req, "fp8_block_alignment")
    assert "576" in f.message and 16 in f.remedy["tensor_parallel_size"] and 32 not in f.remedy["tensor_parallel_size"]


def test_fp8_block_ep_does_not_help_dense_layers():
    req = request("deepseek-ai__DeepSeek-V3", count=8, nodes=4, tensor_parallel_size=32, enable_expert_parallel=True,
                  distributed_executor_backend="ray")
    assert errors(req, "fp8_block_alignment")


@pytest.mark.parametrize("tp,bad", [(1, False), (2, True), (4, True), (8, True)])
def test_awq_group_straddle_qwen25_72b(tp, bad):
    # intermediate 29568 = 231 groups of 128: any TP > 1 straddles a group in down_proj (vllm 0.33.0
    # quantization/auto_awq.py:819-832)
    got = errors(quantized("Qwen__Qwen2.5-72B-Instruct", AWQ, count=8, tensor_parallel_size=tp),
                 "quant_group_alignment")
    assert bool(got) is bad
    if bad:
        assert "The input size is not aligned" in got[0].message and got[0].remedy["tensor_parallel_size"] == [1]


@pytest.mark.parametrize("tp", (1, 2, 4, 8))
def test_awq_padded_intermediate_passes(tp):
    # the published Qwen2.5-72B-Instruct-AWQ pads the MLP to 29696 = 29 × 1024
    req = quantized("Qwen__Qwen2.5-72B-Instruct", AWQ, count=8, tensor_parallel_size=tp)
    req["model"]["config"]["intermediate_size"] = 29696
    assert errors(req, "quant_group_alignment") == []


def test_gptq_group_straddle_is_rejected_too():
    # GPTQ does not raise in vLLM 0.33 (the Exllama kernel floors the scale rows: wrong output); Preflight rejects
    (f,) = errors(quantized("Qwen__Qwen2.5-72B-Instruct", GPTQ, count=8, tensor_parallel_size=8),
                  "quant_group_alignment")
    assert "input_size_per_partition=3696" in f.message


def test_awq_ignored_modules_are_not_checked():
    qcfg = dict(AWQ, modules_to_not_convert=["mlp.down_proj"])
    assert errors(quantized("Qwen__Qwen2.5-72B-Instruct", qcfg, count=8, tensor_parallel_size=8),
                  "quant_group_alignment") == []


@pytest.mark.parametrize("tp", (2, 4, 8))
def test_awq_moe_experts_fall_back_not_refused_qwen3_30b(tp):
    # Qwen3 MoE AWQ/GPTQ at TP=4/8 load (MoE-WNA16 fallback, vllm 0.33.0 quantization/utils/marlin_utils.py:335-397);
    # the attention o_proj 4096 splits fine
    req = quantized("Qwen__Qwen3-30B-A3B", AWQ, count=8, tensor_parallel_size=tp)
    assert errors(req, "quant_group_alignment") == []


def test_kimi_k25_int4_experts_only():
    # compressed-tensors int4 g32 with attention / shared experts / dense MLP ignored
    for tp in (8, 16):
        req = request("moonshotai__Kimi-K2.5", count=8, nodes=2, tensor_parallel_size=tp,
                      distributed_executor_backend="ray")
        assert errors(req, "quant_group_alignment", "quant_gpu_capability") == []


def test_gptq_desc_act_and_bits():
    (f,) = errors(quantized("Qwen__Qwen2.5-72B-Instruct", dict(GPTQ, desc_act=True), count=1), "quant_bits")
    assert "desc_act" in f.message
    assert errors(quantized("Qwen__Qwen2.5-72B-Instruct", dict(GPTQ, desc_act=True, group_size=-1), count=1),
                  "quant_bits") == []
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
    assert errors(request("openai__gpt-oss-120b", gpu="a100-sxm4-80gb", count=1), "quant_gpu_capability",
                  "quant_dtype") == []
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
    assert errors(request("meta-llama__Llama-3.1-8B-Instruct", gpu="a100-sxm4-80gb", count=1,
                          quantization="fp8_per_channel"), "fp8_weight_only")
    assert not errors(request("meta-llama__Llama-3.1-8B-Instruct", gpu="l40s-48gb", count=1,
                              quantization="fp8_per_channel"), "fp8_weight_only")
    per_tensor = found(request("meta-llama__Llama-3.1-8B-Instruct", gpu="a100-sxm4-80gb", count=1,
                               quantization="fp8_per_tensor"), "fp8_weight_only")
    assert [f.severity.value for f in per_tensor] == ["warning"]
