"""The assembled memory budget (service/domain/memory/budget.py) on real configs: vLLM's KV-cache formulas (vllm
0.33.0 vllm/v1/kv_cache_interface.py:586-601; vllm/v1/core/kv_cache_planning.py:642-683), worked examples
(Llama-3.1-70B at TP 4 on H100, DeepSeek-V3 at TP 8 on H200), the parts adding up and vLLM's log line."""

from __future__ import annotations

import dataclasses
import re

import pytest

from service.domain.gpus import GIB, MIB
from service.domain.memory import format_gib
from service.domain.request import LaunchRequest
from service.domain.validate import validate
from tests.support import request
from tests.support.memory import budget


def test_llama31_70b_tp4_h100_worked_example():
    """Worked example: 2 KV heads/rank × 128 × 2 B × 2 × 80 layers = 81,920 B/token; a block is 1.25 MiB; one 131072-token
    request needs 8192 blocks = 10.0 GiB; weights ≈ 32.9 GiB/rank; KV ≈ 35-37 GiB → 459k-485k tokens, 3.5-3.7×."""
    _, b = budget("meta-llama__Meta-Llama-3.1-70B", tensor_parallel_size=4)
    assert b.kv_bytes_per_token_per_gpu == 81_920
    assert b.bytes_per_block == int(1.25 * MIB)
    assert b.block_size == 16
    assert b.needed_bytes_max_model_len == 8192 * b.bytes_per_block == 10 * GIB
    assert format_gib(b.weights_bytes_per_gpu) == pytest.approx(32.9, abs=0.1)
    assert 35 * GIB <= b.kv_cache_bytes_per_gpu <= 37 * GIB
    assert 459_000 <= b.kv_cache_tokens <= 485_200
    assert 3.5 <= b.max_concurrency <= 3.7
    assert b.max_model_len == 131_072


def test_deepseek_v3_mla_tp8_h200():
    """Worked example: MLA latent (512 + 64) × 2 B = 1152 B per layer, not divided by TP; 61 layers = 70,272 B/token;
    block 16 on Hopper → 1,124,352 B; one 163840-token request = 10.72 GiB; weights 78-80 GiB/rank."""
    _, b = budget("deepseek-ai__DeepSeek-V3", "h200-141gb", tensor_parallel_size=8)
    assert b.kv_bytes_per_token_per_gpu == 70_272
    assert b.bytes_per_block == 1_124_352
    assert format_gib(b.needed_bytes_max_model_len) == 10.72
    assert 78 * GIB <= b.weights_bytes_per_gpu <= 80 * GIB
    assert 3.7 <= b.max_concurrency <= 4.15


def test_mla_block_size_32_on_blackwell():
    _, b = budget("deepseek-ai__DeepSeek-V3", "b200-180gb", tensor_parallel_size=8)
    assert b.block_size == 32


def test_budget_parts_add_up_and_vllm_formulas():
    _, b = budget("meta-llama__Meta-Llama-3.1-70B", tensor_parallel_size=8, max_model_len=10240)
    assert b.usable_bytes == b.weights_bytes_per_gpu + b.overhead_bytes + b.kv_cache_bytes_per_gpu
    assert b.overhead_bytes == b.activation_peak_bytes + b.non_torch_bytes + b.cuda_graph_bytes
    assert b.num_gpu_blocks == b.kv_cache_bytes_per_gpu // b.bytes_per_block
    assert b.max_concurrency == b.num_gpu_blocks / (10240 // 16)
    assert b.kv_cache_tokens == int(b.max_concurrency * 10240)


def test_log_line_is_vllms():
    _, b = budget("meta-llama__Meta-Llama-3.1-70B", tensor_parallel_size=4)
    fixed = dataclasses.replace(b, kv_cache_tokens=485_104, max_concurrency=485_104 / 131_072)
    assert fixed.log_line == (
        "GPU KV cache size: 485,104 tokens, Maximum concurrency for 131,072 tokens per request: 3.70x"
    )
    d = b.as_dict()
    for key in (
        "gpu_memory_bytes",
        "usable_bytes",
        "weights_bytes_per_gpu",
        "overhead_bytes",
        "overhead",
        "kv_cache_bytes_per_gpu",
        "kv_bytes_per_token_per_gpu",
        "block_size",
        "num_gpu_blocks",
        "kv_cache_tokens",
        "max_concurrency",
        "max_num_seqs_bound",
        "estimated_max_model_len",
        "log_line",
    ):
        assert key in d
    assert re.fullmatch(
        r"GPU KV cache size: [\d,]+ tokens, Maximum concurrency for [\d,]+ tokens per request: "
        r"\d+\.\d\dx",
        d["log_line"],
    )


def test_kv_cache_memory_bytes_skips_profiling():
    _, b = budget("meta-llama__Meta-Llama-3.1-8B", count=1, kv_cache_memory_bytes="20G")
    assert b.kv_cache_bytes_per_gpu == 20 * GIB
    assert b.num_gpu_blocks == 20 * GIB // b.bytes_per_block


def test_num_gpu_blocks_override_and_cpu_offload():
    _, b = budget("meta-llama__Meta-Llama-3.1-8B", count=1, num_gpu_blocks_override=1000)
    assert b.num_gpu_blocks == 1000 and b.kv_cache_tokens == int(1000 / (131072 // 16) * 131072)
    _, base = budget("meta-llama__Meta-Llama-3.1-8B", count=1)
    _, off = budget("meta-llama__Meta-Llama-3.1-8B", count=1, cpu_offload_gb=4)
    assert base.weights_bytes_per_gpu - off.weights_bytes_per_gpu == 4 * GIB


def test_validate_puts_the_budget_in_the_result():
    r = validate(LaunchRequest.model_validate(request("meta-llama__Meta-Llama-3.1-70B", tensor_parallel_size=4)))
    assert r.budget is not None and r.budget["kv_bytes_per_token_per_gpu"] == 81_920


def test_capacity_doc_is_current():
    from scripts.gen_capacity import OUT, render

    assert OUT.read_text() == render(), "run: python -m scripts.gen_capacity"
