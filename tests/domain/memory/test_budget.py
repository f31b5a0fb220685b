"""The memory model on real configs: vLLM's KV-cache formulas (vllm 0.33.0 vllm/v1/kv_cache_interface.py:586-601;
vllm/v1/core/kv_cache_planning.py:642-683) and worked examples (Llama-3.1-70B at TP 4 on H100, DeepSeek-V3 at TP 8
on H200)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from service.domain.context import build_context
from service.domain.gpus import GIB, MIB
from service.domain.memory import Accounting, compute_budget, estimate_weights, format_gib, pp_partition
from service.domain.request import LaunchRequest
from service.domain.validate import validate
from tests.support import request


def budget(model: str, gpu: str = "h100-sxm-80gb", count: int = 8, **engine_args):
    ctx = build_context(LaunchRequest.model_validate(request(model, gpu, count=count, **engine_args)))
    return ctx, compute_budget(ctx)


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


def test_llama31_70b_params_from_config():
    ctx, b = budget("meta-llama__Meta-Llama-3.1-70B", tensor_parallel_size=4)
    assert b.weights_params == pytest.approx(70.55e9, rel=0.002)


def test_deepseek_v3_mla_tp8_h200():
    """Worked example: MLA latent (512 + 64) × 2 B = 1152 B per layer, not divided by TP; 61 layers = 70,272 B/token;
    block 16 on Hopper → 1,124,352 B; one 163840-token request = 10.72 GiB; weights 78-80 GiB/rank."""
    _, b = budget("deepseek-ai__DeepSeek-V3", "h200-141gb", tensor_parallel_size=8)
    assert b.kv_bytes_per_token_per_gpu == 70_272
    assert b.bytes_per_block == 1_124_352
    assert format_gib(b.needed_bytes_max_model_len) == 10.72
    assert 78 * GIB <= b.weights_bytes_per_gpu <= 80 * GIB
    assert 3.7 <= b.max_concurrency <= 4.15


def test_mla_kv_not_divided_by_tp_and_fp8_halves_it():
    _, tp8 = budget("deepseek-ai__DeepSeek-V3", "h200-141gb", tensor_parallel_size=8)
    _, tp16 = budget("deepseek-ai__DeepSeek-V3", "h100-sxm-80gb", count=8, tensor_parallel_size=16)
    _, fp8 = budget("deepseek-ai__DeepSeek-V3", "h200-141gb", tensor_parallel_size=8, kv_cache_dtype="fp8")
    assert tp8.kv_bytes_per_token_per_gpu == tp16.kv_bytes_per_token_per_gpu == 61 * 1152
    assert fp8.kv_bytes_per_token_per_gpu == 61 * 576
    assert fp8.kv_cache_tokens == pytest.approx(2 * tp8.kv_cache_tokens, rel=0.001)


def test_mla_block_size_32_on_blackwell():
    _, b = budget("deepseek-ai__DeepSeek-V3", "b200-180gb", tensor_parallel_size=8)
    assert b.block_size == 32


def test_kv_heads_replicated_beyond_kv_count():
    """Llama-3.1-8B has 8 KV heads: per-rank KV heads = max(1, 8 // TP) (vllm 0.33.0
    vllm/config/model.py:1663-1683)."""
    _, tp4 = budget("meta-llama__Meta-Llama-3.1-8B", tensor_parallel_size=4)
    _, tp8 = budget("meta-llama__Meta-Llama-3.1-8B", tensor_parallel_size=8)
    assert tp4.kv_bytes_per_token_per_gpu == 2 * 2 * 128 * 2 * 32
    assert tp8.kv_bytes_per_token_per_gpu == 2 * 1 * 128 * 2 * 32


def test_quantized_weights_do_not_shrink_kv():
    _, bf16 = budget("meta-llama__Meta-Llama-3.1-70B", tensor_parallel_size=4)
    _, fp8w = budget("nvidia__Llama-3.1-70B-Instruct-FP8", tensor_parallel_size=4)
    assert fp8w.kv_bytes_per_token_per_gpu == bf16.kv_bytes_per_token_per_gpu
    assert fp8w.weights_bytes_per_gpu < 0.6 * bf16.weights_bytes_per_gpu


def test_sliding_window_layers_gpt_oss():
    """gpt-oss-120b: 18 of 36 layers slide over 128 tokens; at 131072 tokens a request needs ~half the blocks of an
    all-full model."""
    _, b = budget("openai__gpt-oss-120b", count=1, tensor_parallel_size=1)
    full_per_request = 36 * 2 * 8 * 64 * 2 * 131072
    per_request = b.kv_cache_bytes_per_gpu / b.max_concurrency
    assert 0.5 * full_per_request <= per_request <= 0.55 * full_per_request


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
    assert fixed.log_line == ("GPU KV cache size: 485,104 tokens, Maximum concurrency for 131,072 tokens per "
                              "request: 3.70x")
    d = b.as_dict()
    for key in ("gpu_memory_bytes", "usable_bytes", "weights_bytes_per_gpu", "overhead_bytes", "overhead",
                "kv_cache_bytes_per_gpu", "kv_bytes_per_token_per_gpu", "block_size", "num_gpu_blocks",
                "kv_cache_tokens", "max_concurrency", "max_num_seqs_bound", "estimated_max_model_len", "log_line"):
        assert key in d
    assert re.fullmatch(r"GPU KV cache size: [\d,]+ tokens, Maximum concurrency for [\d,]+ tokens per request: "
                        r"\d+\.\d\dx", d["log_line"])


def test_enforce_eager_removes_cuda_graphs_and_old_versions_do_not_count_them():
    _, graphs = budget("meta-llama__Meta-Llama-3.1-8B", count=1)
    _, eager = budget("meta-llama__Meta-Llama-3.1-8B", count=1, enforce_eager=True)
    assert graphs.cuda_graph_bytes > 0 and eager.cuda_graph_bytes == 0
    assert eager.kv_cache_bytes_per_gpu - graphs.kv_cache_bytes_per_gpu == graphs.cuda_graph_bytes
    assert Accounting.for_version("0.33.0").cuda_graphs_in_budget
    assert not Accounting.for_version("0.10.2").cuda_graphs_in_budget
    assert not Accounting.for_version("0.6.3").v1_engine


def test_activation_follows_max_model_len_without_chunked_prefill():
    _, on = budget("meta-llama__Meta-Llama-3.1-8B", count=1, max_model_len=32768)
    _, off = budget("meta-llama__Meta-Llama-3.1-8B", count=1, max_model_len=32768, enable_chunked_prefill=False)
    assert on.profiled_tokens == 8192 and off.profiled_tokens == 32768
    assert off.activation_peak_bytes > on.activation_peak_bytes


def test_non_torch_memory_larger_at_tp_gt_1():
    _, one = budget("meta-llama__Meta-Llama-3.1-8B", tensor_parallel_size=1)
    _, two = budget("meta-llama__Meta-Llama-3.1-8B", tensor_parallel_size=2)
    assert two.non_torch_bytes > one.non_torch_bytes


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


def test_speculative_mtp_adds_a_draft_layer():
    _, base = budget("deepseek-ai__DeepSeek-V3", "h200-141gb", tensor_parallel_size=8)
    _, mtp = budget("deepseek-ai__DeepSeek-V3", "h200-141gb", tensor_parallel_size=8,
                    speculative_config={"method": "mtp", "num_speculative_tokens": 1})
    assert mtp.kv_bytes_per_token_per_gpu == base.kv_bytes_per_token_per_gpu + 1152


def test_pipeline_parallel_partition_and_max_stage():
    assert pp_partition(61, 4) == [15, 15, 16, 15]
    assert pp_partition(61, 2) == [31, 30]
    _, b = budget("deepseek-ai__DeepSeek-V3", "h200-141gb", count=8, tensor_parallel_size=2, pipeline_parallel_size=4)
    assert b.kv_layers_per_gpu == 16


def test_manifest_weights_bytes_used_when_known():
    req = request("meta-llama__Meta-Llama-3.1-70B", tensor_parallel_size=4)
    req["model"]["weights_bytes"] = 141_107_412_992  # bf16 70.55e9 × 2
    ctx = build_context(LaunchRequest.model_validate(req))
    b = compute_budget(ctx)
    assert b.weights_source.startswith("manifest")
    assert b.weights_bytes_per_gpu == pytest.approx(141_107_412_992 / 4, rel=0.01)


def test_gpt_oss_mxfp4_weights():
    """gpt-oss-120b: ~61 GB checkpoint (MXFP4 experts, bf16 attention/embeddings) on one GPU."""
    ctx = build_context(LaunchRequest.model_validate(request("openai__gpt-oss-120b", count=1)))
    est = estimate_weights(ctx.facts, 1, 1, False, 2, None)
    assert 60e9 <= est.total_bytes <= 67e9


def test_validate_puts_the_budget_in_the_result():
    r = validate(LaunchRequest.model_validate(request("meta-llama__Meta-Llama-3.1-70B", tensor_parallel_size=4)))
    assert r.budget is not None and r.budget["kv_bytes_per_token_per_gpu"] == 81_920


def test_capacity_doc_is_current():
    from scripts.gen_capacity import OUT, render

    assert OUT.read_text() == render(), "run: python -m scripts.gen_capacity"


def test_closed_form_max_len_matches_vllms_binary_search():
    """memory.longest_full_attention_len is the closed form of the binary search vLLM runs (longest_fitting) for
    full attention: the same answer for every pool, block size, decode-context parallelism and cap."""
    import math
    import random

    from service.domain.memory import longest_fitting, longest_full_attention_len

    rng = random.Random(7)
    for _ in range(3000):
        bpb = rng.choice([0, 1, 4096, 160 * 1024, rng.randrange(1, 10**7)])
        block, dcp = rng.choice([1, 16, 32, 64, 128]), rng.choice([1, 1, 2, 4])
        avail = rng.randrange(-10**9, 10**11)
        hi = rng.randrange(0, 2_000_000)

        def fits(length, avail=avail, bpb=bpb, block=block, dcp=dcp):
            return avail >= math.ceil(math.ceil(length / dcp) / block) * bpb

        assert longest_full_attention_len(avail, bpb, block, dcp, hi) == longest_fitting(fits, hi)
