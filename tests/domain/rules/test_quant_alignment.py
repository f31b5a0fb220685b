"""Per-rank alignment of quantization groups and FP8 blocks (service/domain/rules/quant_alignment.py), on real
configs (synthetic AWQ/GPTQ variants are real configs plus a quantization_config)."""

from __future__ import annotations

import pytest

from tests.support import request
from tests.support.rules import AWQ, GPTQ, errors, quantized


@pytest.mark.parametrize("tp", (1, 2, 4, 8))
def test_fp8_block_moe_experts_exempt_qwen3_235b(tp):
    # 1536 / 8 = 192 is not a multiple of 128 but the Triton MoE path refines the blocks (vllm 0.33.0
    # vllm/model_executor/layers/fused_moe/oracle/fp8.py refine_fp8_moe_block_shape)
    assert errors(request("Qwen__Qwen3-235B-A22B-FP8", tensor_parallel_size=tp), "fp8_block_alignment") == []


def test_fp8_block_dense_deepseek_tp32():
    req = request(
        "deepseek-ai__DeepSeek-V3", count=8, nodes=4, tensor_parallel_size=32, distributed_executor_backend="ray"
    )
    (f,) = errors(req, "fp8_block_alignment")
    assert "576" in f.message and 16 in f.remedy["tensor_parallel_size"] and 32 not in f.remedy["tensor_parallel_size"]


def test_fp8_block_ep_does_not_help_dense_layers():
    req = request(
        "deepseek-ai__DeepSeek-V3",
        count=8,
        nodes=4,
        tensor_parallel_size=32,
        enable_expert_parallel=True,
        distributed_executor_backend="ray",
    )
    assert errors(req, "fp8_block_alignment")


@pytest.mark.parametrize("tp,bad", [(1, False), (2, True), (4, True), (8, True)])
def test_awq_group_straddle_qwen25_72b(tp, bad):
    # intermediate 29568 = 231 groups of 128: any TP > 1 straddles a group in down_proj (vllm 0.33.0
    # quantization/auto_awq.py:819-832)
    got = errors(
        quantized("Qwen__Qwen2.5-72B-Instruct", AWQ, count=8, tensor_parallel_size=tp), "quant_group_alignment"
    )
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
    (f,) = errors(
        quantized("Qwen__Qwen2.5-72B-Instruct", GPTQ, count=8, tensor_parallel_size=8), "quant_group_alignment"
    )
    assert "input_size_per_partition=3696" in f.message


def test_awq_ignored_modules_are_not_checked():
    qcfg = dict(AWQ, modules_to_not_convert=["mlp.down_proj"])
    assert (
        errors(quantized("Qwen__Qwen2.5-72B-Instruct", qcfg, count=8, tensor_parallel_size=8), "quant_group_alignment")
        == []
    )


@pytest.mark.parametrize("tp", (2, 4, 8))
def test_awq_moe_experts_fall_back_not_refused_qwen3_30b(tp):
    # Qwen3 MoE AWQ/GPTQ at TP=4/8 load (MoE-WNA16 fallback, vllm 0.33.0 quantization/utils/marlin_utils.py:335-397);
    # the attention o_proj 4096 splits fine
    req = quantized("Qwen__Qwen3-30B-A3B", AWQ, count=8, tensor_parallel_size=tp)
    assert errors(req, "quant_group_alignment") == []


def test_kimi_k25_int4_experts_only():
    # compressed-tensors int4 g32 with attention / shared experts / dense MLP ignored
    for tp in (8, 16):
        req = request(
            "moonshotai__Kimi-K2.5", count=8, nodes=2, tensor_parallel_size=tp, distributed_executor_backend="ray"
        )
        assert errors(req, "quant_group_alignment", "quant_gpu_capability") == []
