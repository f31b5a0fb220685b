"""KV bytes per token and per request (service/domain/memory/kv_cache.py) on real configs: MLA's latent not divided by
TP, KV heads replicated past their count, sliding-window layers, a draft layer for MTP, and the closed form of vLLM's
longest-fitting length (vllm 0.33.0 vllm/v1/kv_cache_interface.py:586-601)."""

from __future__ import annotations

import pytest

from tests.support.memory import budget


def test_mla_kv_not_divided_by_tp_and_fp8_halves_it():
    _, tp8 = budget("deepseek-ai__DeepSeek-V3", "h200-141gb", tensor_parallel_size=8)
    _, tp16 = budget("deepseek-ai__DeepSeek-V3", "h100-sxm-80gb", count=8, tensor_parallel_size=16)
    _, fp8 = budget("deepseek-ai__DeepSeek-V3", "h200-141gb", tensor_parallel_size=8, kv_cache_dtype="fp8")
    assert tp8.kv_bytes_per_token_per_gpu == tp16.kv_bytes_per_token_per_gpu == 61 * 1152
    assert fp8.kv_bytes_per_token_per_gpu == 61 * 576
    assert fp8.kv_cache_tokens == pytest.approx(2 * tp8.kv_cache_tokens, rel=0.001)


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


def test_speculative_mtp_adds_a_draft_layer():
    _, base = budget("deepseek-ai__DeepSeek-V3", "h200-141gb", tensor_parallel_size=8)
    _, mtp = budget(
        "deepseek-ai__DeepSeek-V3",
        "h200-141gb",
        tensor_parallel_size=8,
        speculative_config={"method": "mtp", "num_speculative_tokens": 1},
    )
    assert mtp.kv_bytes_per_token_per_gpu == base.kv_bytes_per_token_per_gpu + 1152


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
        avail = rng.randrange(-(10**9), 10**11)
        hi = rng.randrange(0, 2_000_000)

        def fits(length, avail=avail, bpb=bpb, block=block, dcp=dcp):
            return avail >= math.ceil(math.ceil(length / dcp) / block) * bpb

        assert longest_full_attention_len(avail, bpb, block, dcp, hi) == longest_fitting(fits, hi)
