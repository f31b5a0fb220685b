"""The speculative-decoding rules (service/domain/rules/speculative.py): SpeculativeConfig's checks between its own
fields and against the launch, each with one refused and one accepted launch on a real config."""

from __future__ import annotations

import pytest

from tests.support import request
from tests.support.rules import errors

LLAMA = "meta-llama__Llama-3.1-8B-Instruct"
DEEPSEEK = "deepseek-ai__DeepSeek-V3"  # num_nextn_predict_layers 1: has MTP weights


def _spec(**spec):
    return request(LLAMA, count=1, max_model_len=8192, speculative_config=spec)


def test_tokens_without_model_or_method():
    (f,) = errors(_spec(num_speculative_tokens=3), "spec_model_missing")
    assert "without speculative model" in f.message
    assert f.remedy == {"speculative_config": {"num_speculative_tokens": 3, "method": "ngram"}}
    (f,) = errors(_spec(method="eagle3", num_speculative_tokens=3), "spec_model_missing")
    assert "eagle3" in f.message
    assert not errors(_spec(method="ngram", num_speculative_tokens=3), "spec_model_missing", "spec_tokens_invalid")
    assert not errors(
        _spec(model="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", num_speculative_tokens=3), "spec_model_missing"
    )


def test_mtp_model_is_offered_mtp():
    req = request(
        DEEPSEEK, tensor_parallel_size=8, max_model_len=8192, speculative_config={"num_speculative_tokens": 1}
    )
    (f,) = errors(req, "spec_model_missing")
    assert f.remedy["speculative_config"]["method"] == "mtp"
    req["engine_args"]["speculative_config"]["method"] = "deepseek_mtp"
    assert not errors(req, "spec_model_missing", "spec_tokens_invalid")


def test_tokens_missing_or_not_positive():
    (f,) = errors(_spec(method="ngram"), "spec_tokens_invalid")
    assert "num_speculative_tokens must be provided" in f.message
    (f,) = errors(_spec(method="ngram", num_speculative_tokens=0), "spec_tokens_invalid")
    assert f.message == "Expected num_speculative_tokens to be greater than zero (0)."
    assert f.remedy["speculative_config"]["num_speculative_tokens"] == 1
    # a draft model may bring n_predict: no count needed up front
    assert not errors(_spec(model="org/mtp-draft"), "spec_tokens_invalid")


def test_flag_and_config_key():
    req = request(LLAMA, count=1, spec_tokens=3, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    (f,) = errors(req, "spec_flag_conflict")
    assert f.message == "--spec-tokens and --speculative-config['num_speculative_tokens'] are mutually exclusive"
    ok = request(LLAMA, count=1, spec_tokens=3, speculative_config={"method": "ngram"})
    assert not errors(ok, "spec_flag_conflict", "spec_tokens_invalid", "spec_model_missing")


def test_prompt_lookup_window():
    (f,) = errors(
        _spec(method="ngram", num_speculative_tokens=3, prompt_lookup_min=5, prompt_lookup_max=2), "spec_prompt_lookup"
    )
    assert f.message == "prompt_lookup_min=5 must be <= prompt_lookup_max=2"
    assert f.remedy["speculative_config"]["prompt_lookup_min"] == 2
    # one bound given stands for both
    assert not errors(_spec(method="ngram", num_speculative_tokens=3, prompt_lookup_max=2), "spec_prompt_lookup")
    assert not errors(
        _spec(method="ngram", num_speculative_tokens=3, prompt_lookup_min=2, prompt_lookup_max=5), "spec_prompt_lookup"
    )


def test_draft_tensor_parallel_size():
    def req(draft_tp, **spec):
        return request(
            LLAMA,
            count=4,
            tensor_parallel_size=4,
            speculative_config={
                "model": "org/draft",
                "num_speculative_tokens": 3,
                "draft_tensor_parallel_size": draft_tp,
                **spec,
            },
        )

    (f,) = errors(req(2), "spec_draft_tp")
    assert "cannot be other value than 1 or target model tensor_parallel_size" in f.message
    assert f.remedy["speculative_config"]["draft_tensor_parallel_size"] == [1, 4]
    assert not errors(req(1), "spec_draft_tp") and not errors(req(4), "spec_draft_tp")
    # n-gram has no draft model: its draft TP is never read
    assert not errors(req(2, method="ngram", model=None), "spec_draft_tp")
    (f,) = errors(_spec(method="ngram", num_speculative_tokens=3, tensor_parallel_size=2), "spec_draft_tp")
    assert "'draft_tensor_parallel_size' instead" in f.message


def test_sampling_options():
    (f,) = errors(_spec(method="ngram", num_speculative_tokens=3, synthetic_acceptance_length=2.0), "spec_sampling")
    assert "only valid with rejection_sample_method='synthetic'" in f.message
    synthetic = {"method": "ngram", "num_speculative_tokens": 3, "rejection_sample_method": "synthetic"}
    (f,) = errors(_spec(**synthetic, synthetic_acceptance_rates=[0.9, 0.95, 0.5]), "spec_sampling")
    assert f.message == "synthetic_acceptance_rates must be non-increasing, got [0.9, 0.95, 0.5]."
    (f,) = errors(_spec(**synthetic, synthetic_acceptance_length=5.0), "spec_sampling")
    assert f.message == "synthetic_acceptance_length must be in [1, 4], got 5.0."
    assert not errors(_spec(**synthetic, synthetic_acceptance_rates=[0.9, 0.7, 0.5]), "spec_sampling")
    (f,) = errors(_spec(method="ngram", num_speculative_tokens=1, rejection_sample_method="fly"), "spec_sampling")
    assert f.message == "FLy requires num_speculative_tokens to be at least 2."
    assert not errors(_spec(method="ngram", num_speculative_tokens=4, rejection_sample_method="fly"), "spec_sampling")


def test_method_options():
    (f,) = errors(
        _spec(method="ngram", num_speculative_tokens=3, index_share_for_mtp_iteration=True), "spec_method_option"
    )
    assert "only supported with method='mtp'" in f.message
    ok = request(
        DEEPSEEK,
        tensor_parallel_size=8,
        speculative_config={"method": "mtp", "num_speculative_tokens": 1, "index_share_for_mtp_iteration": True},
    )
    assert not errors(ok, "spec_method_option")


def test_per_request_metrics_need_speculation():
    (f,) = errors(request(LLAMA, count=1, per_request_spec_decode_metrics="summary"), "spec_metrics_without_spec")
    assert f.remedy == {"per_request_spec_decode_metrics": "none"}
    ok = _spec(method="ngram", num_speculative_tokens=3)
    ok["engine_args"]["per_request_spec_decode_metrics"] = "detailed"
    assert not errors(ok, "spec_metrics_without_spec")


def test_gated_by_release():
    # 0.10: num_speculative_tokens without a model is refused unless the target's model type lends itself as the
    # draft (deepseek_v3, mimo, ...: vllm 0.10.2 config/__init__.py:2047-2065); Llama does not
    old = _spec(num_speculative_tokens=3)
    old["vllm_version"] = "0.10.2"
    (f,) = errors(old, "spec_model_missing")
    assert f.message.startswith("num_speculative_tokens was provided without speculative model. (")
    older = _spec(num_speculative_tokens=3)
    older["vllm_version"] = "0.7.3"
    assert not errors(older, "spec_model_missing")  # 0.6-0.7 build speculation from other options
    assert errors(_spec(num_speculative_tokens=3), "spec_model_missing")


# SpeculativeConfig is a pydantic dataclass validated in lax mode (vllm 0.33.0 vllm/config/speculative.py:406-413):
# "0" and 0.0 are the int 0, "yes" and 1 the bool True; the checks between its fields see the converted values
@pytest.mark.parametrize(
    "spec,rule",
    [
        ({"method": "ngram", "num_speculative_tokens": "0"}, "spec_tokens_invalid"),
        ({"method": "ngram", "num_speculative_tokens": 0.0}, "spec_tokens_invalid"),
        (
            {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": "5", "prompt_lookup_max": "2"},
            "spec_prompt_lookup",
        ),
        ({"model": "org/draft", "num_speculative_tokens": 3, "draft_tensor_parallel_size": "3"}, "spec_draft_tp"),
        (
            {"model": "org/draft", "method": "eagle", "num_speculative_tokens": 3, "use_heterogeneous_vocab": "yes"},
            "spec_sampling",
        ),
        (
            {
                "method": "ngram",
                "num_speculative_tokens": "2",
                "rejection_sample_method": "synthetic",
                "synthetic_acceptance_rates": ["0.5", "0.9"],
            },
            "spec_sampling",
        ),
        ({"method": "ngram", "num_speculative_tokens": "1", "rejection_sample_method": "fly"}, "spec_sampling"),
        (
            {
                "method": "ngram",
                "num_speculative_tokens": 3,
                "enable_adaptive_verification": 1,
                "use_local_argmax_reduction": "true",
            },
            "spec_method_option",
        ),
    ],
)
def test_values_pydantic_converts_are_judged_as_converted(spec, rule):
    assert errors(_spec(**spec), rule)
