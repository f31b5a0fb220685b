"""The memory-budget rules (service/domain/rules/budget.py) on real fixture configs on H100 SXM5 80GB: for each code
one launch that trips it (the code, the figures of its message, its remedy) and the launch its remedy gives, which
passes. The cases in tests/cases carry the launches vLLM itself printed."""

from __future__ import annotations

from tests.support import request
from tests.support.rules import found

L70 = "meta-llama__Meta-Llama-3.1-70B"
L8 = "meta-llama__Meta-Llama-3.1-8B"
BUDGET_RULES = (
    "weights_fit",
    "kv_cache_memory_fits",
    "kv_pool_empty",
    "kv_cache_fits_max_len",
    "max_num_seqs_above_bound",
    "max_num_seqs_above_bound_at_max_len",
    "util_exceeds_free",
)


def codes(req: dict) -> list[str]:
    return sorted(f.rule for f in found(req, *BUDGET_RULES))


def test_70b_weights_do_not_fit_one_gpu_and_leave_no_kv_pool():
    req = request(L70, count=1, tensor_parallel_size=1)
    w = found(req, "weights_fit")[0]
    assert (w.severity.value, w.field) == ("error", "engine_args.tensor_parallel_size")
    assert w.message.startswith(
        "Weights need 131.42 GiB per GPU (estimated from config.json (unquantized (2 B/param))) "
        "but gpu_memory_utilization 0.92 × 79.15 GiB allows 72.82 GiB"
    )
    assert "It needs at least 4 × NVIDIA H100 SXM5 80GB at max_model_len 131,072" in w.message
    assert w.remedy == {"cpu_offload_gb": 65.1}
    empty = found(req, "kv_pool_empty")[0]
    assert "72.82 GiB usable − 131.42 GiB weights − 5.52 GiB overhead = -64.12 GiB" in empty.message
    assert codes(request(L70, count=4, tensor_parallel_size=4, max_model_len=8192, max_num_seqs=32)) == []


def test_70b_on_two_gpus_holds_13120_tokens_not_131072():
    f = found(request(L70, count=2, tensor_parallel_size=2, max_model_len=131072), "kv_cache_fits_max_len")[0]
    assert (f.severity.value, f.field) == ("error", "engine_args.max_model_len")
    assert "(20.0 GiB KV cache is needed, which is larger than the available KV cache memory (2.0 GiB)" in f.message
    assert "the estimated maximum model length is 13120" in f.message and f.remedy == {"max_model_len": 13120}
    assert "kv_cache_fits_max_len" not in codes(request(L70, count=2, tensor_parallel_size=2, max_model_len=13120))


def test_kv_cache_memory_bytes_beyond_the_gpu_is_refused():
    f = found(request(L8, count=1, kv_cache_memory_bytes=80 * 2**30), "kv_cache_memory_fits")[0]
    assert f.severity.value == "error" and f.remedy == {"kv_cache_memory_bytes": None}
    assert f.message.startswith(
        "kv_cache_memory_bytes 85899345920 (80.0 GiB) plus the weights (14.96 GiB per GPU) exceed the GPU's 79.15 GiB"
    )
    assert "kv_cache_memory_fits" not in codes(request(L8, count=1, kv_cache_memory_bytes=8 * 2**30))


def test_max_num_seqs_above_what_the_pool_holds_at_max_len_is_a_warning():
    f = found(request(L8, count=1, max_num_seqs=64, max_model_len=8192), "max_num_seqs_above_bound_at_max_len")[0]
    assert (f.severity.value, f.field) == ("warning", "engine_args.max_num_seqs")
    assert f.message.startswith(
        "max_num_seqs 64 (set) is above the 56 sequences of max_model_len 8,192 tokens the KV "
        "pool holds (460,624 tokens: 56.23 GiB / 131,072 B/token)"
    )
    assert f.remedy == {"max_num_seqs": 56}
    assert codes(request(L8, count=1, max_num_seqs=56, max_model_len=8192)) == []
