"""flag_unsupported (service/domain/rules/flags.py): an unknown option names the nearest real ones, a removed one
says when and why, an invalid choice names the choices, JSON keys the config class does not have are refused."""

from __future__ import annotations

import pytest

from service.domain.request import LaunchRequest
from service.domain.validate import validate
from tests.support import request
from tests.support.catalogue import LINE, MODEL, flag_errors, judged


def test_unknown_flag_names_the_nearest_real_ones():
    # (max_num_seq, a prefix of --max-num-seqs alone, is that option to vLLM's parser: tests/domain/test_abbreviations.py)
    result = judged({"max_num_sqes": 8})
    f = next(f for f in result.findings if f.rule == "flag_unsupported")
    assert "--max-num-seqs" in f.message and f.remedy["did_you_mean"][0] == "max_num_seqs"


def test_removed_flag_follows_from_the_data_with_advice():
    result = judged({"swap_space": 4})
    f = next(f for f in result.findings if f.rule == "flag_unsupported")
    assert "removed after vLLM 0.15.1" in f.message and "V1 engine has no CPU swap space" in f.message
    old = judged({"swap_space": 4}, version="0.15.1")
    assert not flag_errors(old) and old.argv[-2:] == ["--swap-space", "4.0"]


def test_invalid_choice_names_the_flag_the_value_and_the_choices():
    r = judged({"mm_encoder_tp_mode": "replicated"})
    f = next(f for f in r.findings if f.rule == "flag_unsupported")
    assert "--mm-encoder-tp-mode" in f.message and "'replicated'" in f.message and "'data'" in f.message


def test_many_near_miss_flags_cost_one_comparison_each():
    from service.domain.rules.flags import _nearest

    keys = {f"{name[:-1]}z_{i}": 1 for i, name in enumerate(sorted(LINE.options, key=len)[-40:] * 5)}
    _nearest.cache_clear()
    req = request(MODEL, count=1)
    req["engine_args"] = keys
    validate(LaunchRequest.model_validate(req))  # with alternatives: each re-validation reuses the comparisons
    assert _nearest.cache_info().misses == len(keys)


@pytest.mark.parametrize(
    "args,path",
    [
        ({"compilation_config": {"level": 3}}, "level"),  # renamed to mode; vLLM 0.33 exits with a validation error
        (
            {"compilation_config": {"pass_config": {"enable_fi_allreduce_fusion": True}}},
            "pass_config.enable_fi_allreduce_fusion",
        ),
        ({"kv_transfer_config": {"kv_connector": "NixlConnector", "kv_rol": "kv_both"}}, "kv_rol"),
    ],
)
def test_json_keys_the_config_class_does_not_have_are_refused(args, path):
    r = judged(args)
    f = next(f for f in r.errors if f.rule == "flag_unsupported")
    assert repr(path) in f.message and f.field == f"engine_args.{next(iter(args))}"


def test_json_keys_the_config_class_has_pass():
    r = judged(
        {
            "compilation_config": {"mode": 3, "pass_config": {"fuse_norm_quant": True}},
            "kv_transfer_config": {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
        }
    )
    assert not flag_errors(r)


@pytest.mark.parametrize(
    ("version", "args", "refused"),
    [
        # up to 0.30 the parser lists the text 'None' among the choices, converts 'None' / '' to None and then
        # finds None missing: "invalid choice: None" (vllm 0.13.0 vllm/engine/arg_utils.py:331-335)
        ("0.13.0", {"all2all_backend": "None"}, True),
        ("0.13.0", {"kv_offloading_backend": ""}, True),
        ("0.24.0", {"mm_encoder_attn_dtype": "None"}, True),
        # from 0.32 it lists None itself: the same text means "not set" (0.33.0 arg_utils.py:436-439)
        ("0.33.0", {"mm_encoder_attn_dtype": "None"}, False),
        ("0.33.0", {"mamba_ssu_algorithm": ""}, False),
        # a null in the request is "not set" on every line
        ("0.13.0", {"all2all_backend": None}, False),
    ],
)
def test_none_as_text_against_the_choices(version, args, refused):
    errors = [f for f in flag_errors(judged(args, version)) if f.field == f"engine_args.{next(iter(args))}"]
    assert bool(errors) is refused, [f.message for f in errors]


@pytest.mark.parametrize(
    ("args", "field", "words"),
    [
        # JSON given as text gets the request body's bounds: vLLM's own JSON parsing takes NaN, a signed plan would
        # carry it and the config class refuse it at start
        ({"speculative_config": '{"method": "ngram", "num_speculative_tokens": NaN}'}, "speculative_config", "finite"),
        ({"speculative_config": '{"method": "ngram", "prompt_lookup_max": Infinity}'}, "speculative_config", "finite"),
        ({"compilation_config": '{"mode": ' + "9" * 5000 + "}"}, "compilation_config", "JSON"),
        # a config class is validated from an object only (pydantic: "Input should be an object")
        ({"compilation_config": [1, 2]}, "compilation_config", "Input should be an object"),
        ({"speculative_config": "[]"}, "speculative_config", "JSON object"),
    ],
)
def test_json_options_refuse_what_vllm_cannot_read(args, field, words):
    from service.domain.errors import DomainError

    with pytest.raises(DomainError) as err:
        judged(args)
    assert err.value.field == f"engine_args.{field}" and words in str(err.value)
