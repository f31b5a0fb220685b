"""Accuracy of the memory model against the KV figures vLLM printed (tests/cases/kv), and the handed memory cases.

Every case is judged twice: at the release that printed its figure (``evaluate(printing_version=True)``: cases
without ``vllm_version`` use ``notes.vllm_version_approx``) and as the request says (0.33.0 for
those cases). Known misses at the printing release, each for a reason a pre-launch model cannot remove
(``python -m bench.kv_accuracy --printing`` prints every component; docs/capacity.md shows it):

- dsv2-lite (+16.5 %) and llama31-8b-l40s (+24.6 %): both printed by releases that charge the pool with every byte
  on the GPU that this process's torch has not allocated after the profile — the CUDA context, memory of other
  processes, and cached segments the allocator cannot release (vllm 0.6.4.post1 worker/worker.py:200-217, vllm 0.8.5
  v1/worker/gpu_worker.py:194-210; 0.6.6 V0 subtracts the baseline measured at start-up, worker.py:197-201). Their
  logs show 4.5-5 GiB of it (dsv2-lite printed 5.21 GiB "non_torch_memory"; llama31-8b's utilization is not shown
  either), against 0.01-0.28 GiB on every later one-GPU log: nothing in the inputs says what held it. dsv2-lite is
  also a pre-MLA PR build (K and V cached as full heads padded to 256).

Seven cases come from public start-up logs (tests/cases/kv/*llmdplanner*, *qwen2-7b-instruct-*,
llama3-8b-instruct-a6000-*: each quotes the lines it relies on in ``notes.log_excerpt`` with its URL); they cover a
four-segment release (0.10.1.1, whose own accounting must be used: CUDA graphs outside the budget) and phi-2's
two-matrix MLP (weights 5.19 GiB loaded).

The two Qwen2-VL-7B fine-tunes carry the processor their sources give (qwen2vl-7b-ft: the max_pixels 1280 × 28 × 28
its merge notebook saved; ui-tars-7b: max_pixels 2.1-3.2 MP, bounded by its own log — see each case's notes); with
the official processor's 16,384-token dummy image they would be at -10.9 % and -28.6 %.

Judged at 0.33 instead, three cases cannot be compared at all (``NOT_033``): dsv2-lite (0.33 stores the MLA latent,
14× smaller), llama32-11b-vision (mllama is an encoder-decoder model of the V0 engine, not served by 0.33; at 0.6.6
the encoder-decoder profile lands at +0.4 %) and llama31-8b (as above).
"""

from __future__ import annotations

import pytest

from bench.kv_accuracy import evaluate, summary
from service.domain.request import LaunchRequest
from service.domain.validate import validate
from tests.support import CASES, case_request, load_case

KNOWN_MISSES = {"dsv2-lite-h100-premla-v0-pr10927", "llama31-8b-l40s-v1-pr17122"}
NOT_033 = {"dsv2-lite-h100-premla-v0-pr10927", "llama32-11b-vision-h100-eager-pr12126", "llama31-8b-l40s-v1-pr17122"}
PRINTING = {r.id: r for r in evaluate(printing_version=True)}
RESULTS = {r.id: r for r in evaluate()}


@pytest.mark.parametrize("case_id", sorted(set(PRINTING) - KNOWN_MISSES))
def test_kv_tokens_within_case_tolerance_at_printing_release(case_id):
    r = PRINTING[case_id]
    assert r.within_tolerance, f"{case_id}: predicted {r.predicted:,} vs printed {r.printed:,} ({r.error:+.1%})"


@pytest.mark.parametrize("case_id", sorted(set(RESULTS) - KNOWN_MISSES - NOT_033))
def test_kv_tokens_within_case_tolerance(case_id):
    r = RESULTS[case_id]
    assert r.within_tolerance, f"{case_id}: predicted {r.predicted:,} vs printed {r.printed:,} ({r.error:+.1%})"


def test_known_misses_still_miss():
    """A known miss that starts to pass should leave the list (and its reason the docstring)."""
    assert all(not PRINTING[c].within_tolerance for c in KNOWN_MISSES)


def test_accuracy_summary_achieved():
    s = summary(list(PRINTING.values()))
    assert s["cases"] == 20
    assert s["within_5"] >= 12 / 20
    assert s["median_abs_error"] <= 0.04
    s = summary(list(RESULTS.values()))
    assert s["within_10"] >= 17 / 20 and s["median_abs_error"] <= 0.05


def test_accuracy_target():
    """KV tokens within ±10 % of vLLM's printed figure on at least 90 % of the memory cases, at the
    release that printed them; the misses are the known ones above (18 of 20; the first 13 cases alone: 11)."""
    results = list(PRINTING.values())
    assert summary(results)["within_10"] >= 0.9
    assert {r.id for r in results if abs(r.error) > 0.10} == KNOWN_MISSES


# Printed "Model loading took X GiB" against the weights the model estimates from config.json alone. The one miss:
# qwen25-05b-bnb (0.44 vs 0.52 GiB: bitsandbytes 4-bit of a 0.5 B model, where what bitsandbytes keeps unquantized
# and its quant state are a large share; not modelled).
WEIGHTS_MISSES = {"qwen25-05b-bnb-rtx4090-48gb-v0100-unsloth"}


@pytest.mark.parametrize(
    "case_id",
    sorted(i for i, r in PRINTING.items() if r.component("weights_gib") is not None and i not in WEIGHTS_MISSES),
)
def test_weights_within_3_percent_of_what_vllm_loaded(case_id):
    c = PRINTING[case_id].component("weights_gib")
    assert abs(c.error) <= 0.03, f"{case_id}: {c.predicted_gib:.2f} GiB vs {c.printed_gib:.2f} printed"


def judge(case_id: str):
    case = load_case(CASES / "handed" / f"{case_id}.json")
    result = validate(LaunchRequest.model_validate(case_request(case)))
    errors = {f.rule for f in result.findings if f.severity.value == "error"}
    warnings = {f.rule for f in result.findings if f.severity.value == "warning"}
    return case["expect"], result, errors, warnings


@pytest.mark.parametrize(
    "case_id", ["kvfit-llama33-70b-fp8-1xh100-default", "weights-dsv3-32x4090", "util-1.0-llama2-70b-tp2"]
)
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


@pytest.mark.parametrize(
    "case_id",
    [
        "good-deepseek-r1-8xh200-tp8-ep",
        "good-gptoss-120b-1xh100",
        "good-gptoss-120b-1xa100",
        "fp8-qwen3-235b-fp8-tp8",
        "good-deepseek-v3-fp8-2x8xh100-tp16-sglang",
    ],
)
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
    ok = validate(
        LaunchRequest.model_validate(
            request(
                "meta-llama__Meta-Llama-3.1-70B", "h100-sxm-80gb", count=8, tensor_parallel_size=2, max_model_len=est
            )
        )
    )
    assert "kv_cache_fits_max_len" not in {x.rule for x in ok.findings}
    too_long = validate(
        LaunchRequest.model_validate(
            request(
                "meta-llama__Meta-Llama-3.1-70B",
                "h100-sxm-80gb",
                count=8,
                tensor_parallel_size=2,
                max_model_len=est + 16,
            )
        )
    )
    assert "kv_cache_fits_max_len" in {x.rule for x in too_long.findings}


KV_CASES = sorted((CASES / "kv").glob("*.json"))


@pytest.mark.parametrize("path", KV_CASES, ids=lambda p: p.stem)
def test_a_kv_case_that_started_is_not_refused(path):
    """Every KV case is a launch vLLM started and printed figures for: whatever its release, no rule refuses it
    (a real 0.7.3 start with max_num_batched_tokens below max_model_len, granite-30-3b-a800m, is one of them)."""
    case = load_case(path)
    if case.get("expect", {}).get("verdict") != "accept" or case.get("id") in NOT_033 or path.stem in NOT_033:
        pytest.skip("not an accepted launch, or judged at 0.33 without its printing release (NOT_033)")
    result = validate(LaunchRequest.model_validate(case_request(case)))
    assert result.verdict != "reject", [f.rule for f in result.findings if f.severity.value == "error"]
