"""Recommendations (docs/operating.md §9): the newcomer's Llama-3.1-70B on 8 × H100 and the guide's individual choices."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from service.domain.context import build_context
from service.domain.recommend import recommend, recommended_budget, recommended_max_model_len
from service.domain.request import LaunchRequest
from service.domain.rules.policy import max_model_len_oversized
from service.domain.validate import validate
from tests.support import request

LLAMA70 = "meta-llama__Meta-Llama-3.1-70B"
LLAMA8 = "meta-llama__Llama-3.1-8B-Instruct"


def newcomer(**workload):
    req = request(LLAMA70, "h100-sxm-80gb", count=8)
    req["workload"] = {"avg_seq_len": 2000, "p99_seq_len": 8000, **workload}
    return LaunchRequest.model_validate(req)


def test_newcomer_llama31_70b_8xh100():
    args, why, budget = recommended_budget(newcomer())
    assert args["tensor_parallel_size"] == 8
    assert args["max_model_len"] == 10240  # ceil(8000 × 1.2) = 9600 → next multiple of 1024
    assert args["max_num_batched_tokens"] == 8192
    assert args["enable_chunked_prefill"] is True
    assert args["enforce_eager"] is False
    assert args["gpu_memory_utilization"] == 0.85
    # every value explained, once
    assert sorted(w["field"] for w in why) == sorted(args)
    assert all(w["why"] and w["value"] == args[w["field"]] for w in why)
    # the budget adds up: usable = weights + overhead + KV pool
    assert budget.usable_bytes == budget.weights_bytes_per_gpu + budget.overhead_bytes + budget.kv_cache_bytes_per_gpu
    assert budget.overhead_bytes == budget.activation_peak_bytes + budget.non_torch_bytes + budget.cuda_graph_bytes
    # initial stage: max_num_seqs = 0.5 × bound at the average length
    assert (
        args["max_num_seqs"] == int(0.5 * budget.max_num_seqs_bound)
        or abs(args["max_num_seqs"] - 0.5 * budget.max_num_seqs_bound) <= 2
    )
    # the recommended command validates cleanly and renders
    req = newcomer()
    result = validate(req.model_copy(update={"engine_args": args}))
    assert result.verdict in ("accept", "warn") and not result.errors
    assert "--tensor-parallel-size 8" in result.command and "--max-model-len 10240" in result.command
    assert result.budget["log_line"].startswith("GPU KV cache size: ")


def test_production_stage():
    args, _, budget = recommended_budget(newcomer(stage="production"))
    assert args["gpu_memory_utilization"] == 0.90
    assert abs(args["max_num_seqs"] - 0.75 * budget.max_num_seqs_bound) <= 2


def test_only_fills_what_is_left_out():
    req = newcomer()
    req = req.model_copy(
        update={"engine_args": {"tensor_parallel_size": 4, "max_model_len": 16384, "gpu_memory_utilization": 0.8}}
    )
    args, why = recommend(req)
    assert args["tensor_parallel_size"] == 4 and args["max_model_len"] == 16384
    assert args["gpu_memory_utilization"] == 0.8
    assert {w["field"] for w in why}.isdisjoint({"tensor_parallel_size", "max_model_len", "gpu_memory_utilization"})


def test_batched_tokens_by_shape_and_short_prompts():
    for shape, mnbt in (("long_in_short_out", 4096), ("balanced", 8192), ("short_in_long_out", 16384)):
        args, _ = recommend(newcomer(shape=shape))
        assert args["max_num_batched_tokens"] == mnbt
    args, why = recommend(newcomer(avg_seq_len=200, p99_seq_len=400))
    assert args["enable_chunked_prefill"] is False
    assert args["max_num_batched_tokens"] >= args["max_model_len"]


def test_max_model_len_rule():
    assert recommended_max_model_len(6000, 131072) == 8192  # the guide's "peak ≈ 6k → 8192"
    assert recommended_max_model_len(8000, 131072) == 10240
    assert recommended_max_model_len(200000, 131072) == 131072
    # P99 × 1.2 just above a multiple of 1024 rounds up (854 × 1.2 = 1024.8)
    assert recommended_max_model_len(854, 131072) == 2048
    assert recommended_max_model_len(1707, 131072) == 3072
    assert recommended_max_model_len(3414, 131072) == 5120


def test_max_model_len_rounding_for_every_p99():
    """For every P99 up to 10^6: a multiple of 1024, at least P99 × 1.2, and less than 1024 above it."""
    for p99 in range(1, 10**6 + 1):
        rec = recommended_max_model_len(p99, 1 << 40)
        assert rec % 1024 == 0 and 5 * rec >= 6 * p99 > 5 * (rec - 1024), p99


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p99=st.integers(1, 10**6), derived=st.integers(1, 10**7))
@example(p99=854, derived=131072).via("the recommender filled 2048, the rule wanted 1024")
@example(p99=1707, derived=131072).via("3072 vs 2048")
@example(p99=3414, derived=131072).via("5120 vs 4096")
@example(p99=10**6, derived=2048).via("capped at the derived maximum")
def test_a_launch_at_the_recommended_max_model_len_is_never_oversized(p99, derived):
    req = request(LLAMA8, count=1, environment="production")
    req["model"]["config"]["max_position_embeddings"] = derived
    req["workload"] = {"p99_seq_len": p99}
    launch = LaunchRequest.model_validate(req)
    args, _ = recommend(launch)
    assert args["max_model_len"] == recommended_max_model_len(p99, derived)
    ctx = build_context(launch.model_copy(update={"engine_args": args}))
    assert ctx.facts.derived_max_model_len == derived
    assert "max_model_len_oversized" not in {f.rule for f in max_model_len_oversized(ctx)}


def test_pcie_prefers_smaller_tp():
    req = request("meta-llama__Meta-Llama-3.1-8B", "l40s-48gb", count=8, interconnect="pcie")
    req["workload"] = {"avg_seq_len": 2000, "p99_seq_len": 8000}
    args, why = recommend(LaunchRequest.model_validate(req))
    assert args["tensor_parallel_size"] == 1
    assert "PCIe" in next(w["why"] for w in why if w["field"] == "tensor_parallel_size")
    nvlink = request("meta-llama__Meta-Llama-3.1-8B", "h100-sxm-80gb", count=8)
    nvlink["workload"] = req["workload"]
    args, _ = recommend(LaunchRequest.model_validate(nvlink))
    assert args["tensor_parallel_size"] == 8
