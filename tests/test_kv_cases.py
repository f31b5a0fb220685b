"""Accuracy of the memory model against the KV figures vLLM printed (tests/cases/kv), and the handed memory cases.

Cases without ``vllm_version`` are judged as the request says (0.33.0). Three cases are not reproducible by a
pre-launch model and are known misses (see bench/kv_accuracy.py): dsv2-lite (printed by a pre-MLA 0.6.4 build; 0.33
stores the latent, 14× smaller), llama31-8b-l40s (early V1 charged other processes' memory to the instance: ~5.6 GiB
unexplained), llama32-11b-vision (mllama encoder-decoder profiling of 128 image sequences: 36.6 GiB of activations).
"""

from __future__ import annotations

import pytest

from bench.kv_accuracy import evaluate, summary
from service.domain.request import LaunchRequest
from service.domain.validate import validate
from tests.support import CASES, case_request, load_case

KNOWN_MISSES = {"dsv2-lite-h100-premla-v0-pr10927", "llama31-8b-l40s-v1-pr17122",
                "llama32-11b-vision-h100-eager-pr12126"}
RESULTS = {r.id: r for r in evaluate()}


@pytest.mark.parametrize("case_id", sorted(set(RESULTS) - KNOWN_MISSES))
def test_kv_tokens_within_case_tolerance(case_id):
    r = RESULTS[case_id]
    assert r.within_tolerance, f"{case_id}: predicted {r.predicted:,} vs printed {r.printed:,} ({r.error:+.1%})"


def test_accuracy_summary_achieved():
    s = summary(list(RESULTS.values()))
    assert s["within_10"] >= 8 / 11
    assert s["within_5"] >= 7 / 11
    assert s["median_abs_error"] <= 0.05


@pytest.mark.xfail(strict=True, reason="issue 4 target (±10 % on 80 % of cases) not met: 3 of 11 cases are known "
                                       "misses, see module docstring")
def test_accuracy_issue_target():
    assert summary(list(RESULTS.values()))["within_10"] >= 0.8


def judge(case_id: str):
    case = load_case(CASES / "handed" / f"{case_id}.json")
    result = validate(LaunchRequest.model_validate(case_request(case)))
    errors = {f.rule for f in result.findings if f.severity.value == "error"}
    warnings = {f.rule for f in result.findings if f.severity.value == "warning"}
    return case["expect"], result, errors, warnings


@pytest.mark.parametrize("case_id", ["kvfit-llama33-70b-fp8-1xh100-default", "weights-dsv3-32x4090",
                                     "util-1.0-llama2-70b-tp2"])
def test_handed_memory_rejections(case_id):
    expect, result, errors, _ = judge(case_id)
    assert result.verdict == "reject"
    assert errors & set(expect["rules"]), errors


def test_handed_max_num_seqs_above_bound():
    expect, result, errors, warnings = judge("guide-max-num-seqs-1024-long-seqs")
    assert not errors and "max_num_seqs_above_bound" in warnings
    bound = result.budget["max_num_seqs_bound"]
    assert 60 <= bound <= 100  # the case summary: "about 75 sequences"


MEMORY_RULES = {"weights_fit", "kv_pool_empty", "kv_cache_fits_max_len", "util_exceeds_free"}


@pytest.mark.parametrize("case_id", ["good-deepseek-r1-8xh200-tp8-ep", "good-gptoss-120b-1xh100",
                                     "good-gptoss-120b-1xa100", "fp8-qwen3-235b-fp8-tp8",
                                     "good-deepseek-v3-fp8-2x8xh100-tp16-sglang"])
def test_handed_accepts_have_no_memory_errors(case_id):
    _, result, errors, _ = judge(case_id)
    assert not errors & MEMORY_RULES, errors
    assert result.budget["kv_cache_tokens"] > result.budget["max_model_len"]


def test_kv_fit_message_and_remedy():
    _, result, _, _ = judge("kvfit-llama33-70b-fp8-1xh100-default")
    f = next(f for f in result.findings if f.rule in ("kv_pool_empty", "kv_cache_fits_max_len"))
    assert "No available memory for the cache blocks" in f.message or "estimated maximum model length" in f.message


def test_kv_cache_fits_max_len_remedy_gives_len_and_tp():
    from tests.support import request
    req = request("meta-llama__Meta-Llama-3.1-70B", "h100-sxm-80gb", count=8, tensor_parallel_size=2)
    result = validate(LaunchRequest.model_validate(req))
    f = next(f for f in result.findings if f.rule == "kv_cache_fits_max_len")
    assert f.message.startswith("To serve at least one request with the model's max seq len (131072), (")
    assert "Based on the available memory, the estimated maximum model length is" in f.message
    est = f.remedy["max_model_len"]
    assert 0 < est < 131072 and f.remedy["tensor_parallel_size"] == 4
    ok = validate(LaunchRequest.model_validate(
        request("meta-llama__Meta-Llama-3.1-70B", "h100-sxm-80gb", count=8, tensor_parallel_size=2,
                max_model_len=est)))
    assert "kv_cache_fits_max_len" not in {x.rule for x in ok.findings}
    too_long = validate(LaunchRequest.model_validate(
        request("meta-llama__Meta-Llama-3.1-70B", "h100-sxm-80gb", count=8, tensor_parallel_size=2,
                max_model_len=est + 16)))
    assert "kv_cache_fits_max_len" in {x.rule for x in too_long.findings}
