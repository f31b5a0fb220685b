"""Values inside JSON options judged as vLLM's config classes judge them (service/domain/config_values.py), with the
facts the 0.33.0 catalogue holds (read by scripts/vllm_catalogue_inside.py from each class's pydantic core schema):
what pydantic refuses is refused with its words and the dotted path; what its lax mode converts passes."""

from __future__ import annotations

import pytest

from service.domain.config_values import ABSENT, bad_values, judge
from tests.support.catalogue import LINE, flag_errors, judged


def facts(option: str, key: str) -> dict:
    return LINE.options[option].json_keys["values"][key]


def test_the_033_catalogue_holds_the_facts_of_the_config_classes():
    # vllm 0.33.0 vllm/config/structured_outputs.py (StructuredOutputsBackend), config/logging.py:11 (LogLevel),
    # config/watermarking.py:30-34, config/vllm.py:132-145 (OptimizationLevel, an IntEnum)
    assert facts("structured_outputs_config", "backend") == {
        "choices": ["auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer"]
    }
    assert facts("logging_config", "log_level")["choices"] == [
        "CRITICAL",
        "ERROR",
        "WARNING",
        "INFO",
        "DEBUG",
        "NOTSET",
    ]
    assert facts("watermark_config", "key") == {"ge": 0, "required": True, "type": "int"}
    assert facts("watermark_config", "alpha") == {"ge": 0, "le": 1, "type": "float"}
    assert LINE.options["watermark_config"].json_keys["class"] == "WatermarkConfig"
    assert LINE.options["optimization_level"].value_facts == {
        "choices": [0, 1, 2, 3],
        "class": "VllmConfig",
        "field": "optimization_level",
        "source": "vllm/config/vllm.py:435",
        "type": "int",
    }


@pytest.mark.parametrize(
    "value,ok",
    [
        (3, True),
        ("3", True),  # pydantic lax: a numeric string is an int
        (" 3 ", True),
        (3.0, True),
        (True, True),  # bool is an int to pydantic
        ("1_000", True),
        (3.5, False),
        ("3.5", False),
        ("three", False),
        ([3], False),
        (None, False),
    ],
)
def test_an_int_field_takes_what_pydantic_converts(value, ok):
    assert (judge(value, facts("watermark_config", "context_width")) is None) is ok


@pytest.mark.parametrize(
    "value,ok",
    [(True, True), ("true", True), ("yes", True), ("Off", True), (0, True), (1.0, True), ("2", False), (2, False)],
)
def test_a_bool_field_takes_what_pydantic_converts(value, ok):
    assert (judge(value, facts("structured_outputs_config", "disable_any_whitespace")) is None) is ok


def test_bounds_use_pydantics_words_and_name_the_nearest_allowed_value():
    assert judge("0.5", facts("watermark_config", "alpha")) is None
    assert judge(1.5, facts("watermark_config", "alpha")) == ("Input should be less than or equal to 1", 1)
    assert judge(0, facts("eplb_config", "window_size")) == ("Input should be greater than 0", 1)
    assert judge(None, facts("watermark_config", "deduplicate_contexts_max_history")) is None  # int | None


def test_a_literal_is_exact_and_an_int_enum_reads_the_number_first():
    backend = facts("structured_outputs_config", "backend")
    assert judge("xgrammar", backend) is None
    assert judge("XGrammar", backend) == (
        "Input should be 'auto', 'xgrammar', 'guidance', 'outlines' or 'lm-format-enforcer'",
        None,
    )
    level = LINE.options["optimization_level"].value_facts
    assert judge("2", level) is None and judge("02", level) is None and judge(3, level) is None
    assert judge("O2", level) == ("Input should be 0, 1, 2 or 3", None)
    assert judge("4", level) == ("Input should be 0, 1, 2 or 3", None)


def test_a_union_with_str_takes_any_string():
    # AttentionConfig.indexer_kv_dtype: Literal[...] | str
    dtype = facts("attention_config", "indexer_kv_dtype")
    assert judge("fp8_e5m2", dtype) is None and judge(8, dtype) is not None


def test_nested_classes_and_list_items_are_judged_with_their_path():
    schema = LINE.options["compilation_config"].json_keys
    bad = bad_values({"dynamic_shapes_config": {"type": "nope"}}, schema)
    assert [(b.path, b.value) for b in bad] == [("dynamic_shapes_config.type", "nope")]
    assert bad[0].allowed == ("backed", "unbacked", "backed_size_oblivious")
    bad = bad_values({"torch_profiler_activities": ["CPU", "GPU"]}, LINE.options["profiler_config"].json_keys)
    assert [(b.path, b.value) for b in bad] == [("torch_profiler_activities[1]", "GPU")]


def test_a_missing_required_key_is_field_required():
    bad = bad_values({"algorithm": "gumbel"}, LINE.options["watermark_config"].json_keys)
    assert [(b.path, b.value, b.problem) for b in bad] == [("key", ABSENT, "Field required")]


def test_a_field_behind_a_validator_is_judged_as_probing_the_class_showed():
    """The generator validates the class itself on probe values (scripts/vllm_catalogue_inside.py
    ``validated_facts``): vllm 0.33.0 vllm/config/kernel.py:406-411 lower-cases linear_backend and maps "-" to "_"
    before its Literal; compilation.py:853-871 reads a mode name upper-cased, and 899-913 lets None skip
    validation."""
    linear = facts("kernel_config", "linear_backend")
    assert linear["fold"] == "lower_underscore" and "flashinfer_cutlass" in linear["folded"]
    assert judge("FlashInfer-Cutlass", linear) is None
    assert judge("cublas", linear)[0].startswith("Input should be 'aiter'")
    assert judge(4, linear) is not None  # a non-string reaches the Literal unchanged
    mode = facts("compilation_config", "mode")
    assert mode["fold"] == "upper" and mode["other"] == {"choices": [0, 1, 2, 3], "type": "int"}
    assert [judge(v, mode) for v in ("VLLM_COMPILE", "vllm_compile", 3, 2.0, None)] == [None] * 5
    assert judge("vllm-compile", mode) and judge(7, mode) and judge("2", mode)  # a digit string is no member name
    assert judge("vllm_compıle", mode) is None  # vLLM upper-cases the name: a dotless i reads as I
    # probes with letters whose two cases are not inverse tell vLLM's upper() from its lower()
    assert judge("trıton", facts("kernel_config", "moe_backend"))  # lower-cased there: ı stays ı
    backend = facts("attention_config", "backend")
    assert backend["fold"] == "upper" and judge("flashınfer", backend) is None
    assert judge("to\u212aenspeed_mla", backend)  # the Kelvin sign upper-cases to itself: no member
    assert facts("compilation_config", "use_inductor_graph_partition") == {"null": True, "type": "bool"}


def test_a_validator_that_rewrites_items_keeps_only_the_values_type():
    # AttentionConfig.backend_per_kind maps backend names to Enum members inside the dict (attention.py:240-264):
    # probing confirms only that the value is a dict; the names are left to config_validators.py
    assert facts("attention_config", "backend_per_kind") == {"type": "dict"}
    assert (
        bad_values({"backend_per_kind": {"full_attention": "FLASH_ATTN"}}, LINE.options["attention_config"].json_keys)
        == []
    )


# ------------------------------------------------------------------------------------------- through the rule


@pytest.mark.parametrize(
    "args,path,allowed",
    [
        (
            {"structured_outputs_config": {"backend": "xgrammer"}},
            "structured_outputs_config.backend = 'xgrammer'",
            "Input should be 'auto', 'xgrammar', 'guidance', 'outlines' or 'lm-format-enforcer'",
        ),
        (
            {"logging_config": {"log_level": "debug"}},
            "logging_config.log_level = 'debug'",
            "Input should be 'CRITICAL', 'ERROR', 'WARNING', 'INFO', 'DEBUG' or 'NOTSET'",
        ),
        ({"watermark_config": {"algorithm": "gumbel"}}, "watermark_config.key missing", "Field required"),
        ({"optimization_level": "O2"}, "'O2'", "Input should be 0, 1, 2 or 3"),
    ],
)
def test_values_vllm_033_refuses_are_refused_with_path_value_and_allowed_values(args, path, allowed):
    r = judged(args)
    (f,) = flag_errors(r)
    name = next(iter(args))
    assert f.rule == "flag_unsupported" and f.field == f"engine_args.{name}"
    assert path in f.message and allowed in f.message


def test_the_remedy_is_the_launch_with_an_allowed_value():
    f = flag_errors(judged({"structured_outputs_config": {"backend": "xgrammer", "disable_any_whitespace": True}}))[0]
    assert {"backend": "xgrammar", "disable_any_whitespace": True} in f.remedy["structured_outputs_config"]
    assert flag_errors(judged({"optimization_level": "O2"}))[0].remedy == {"optimization_level": [0, 1, 2, 3]}


@pytest.mark.parametrize(
    "args",
    [
        {"structured_outputs_config": {"backend": "xgrammar"}},
        {"logging_config": {"log_level": "DEBUG", "formatter": "json"}},
        {"watermark_config": {"key": 42}},
        {"optimization_level": 2},
        {"optimization_level": "3"},
        # lax conversions pydantic makes: a numeric string for an int or a float, "yes"/"false" for a bool
        {
            "watermark_config": {
                "key": "42",
                "alpha": "0.25",
                "context_width": 8.0,
                "allow_target_only_watermarking": "yes",
            }
        },
        {"logging_config": {"configure_logging": "false"}},
        {"eplb_config": {"window_size": "1000", "log_balancedness": 1}},
        {"optimization_level": "02"},
    ],
)
def test_valid_and_lax_values_pass(args):
    assert flag_errors(judged(args)) == []


def test_a_catalogue_without_value_facts_judges_keys_only():
    # a line generated before value facts has json_keys without "values": keys are judged, values are not
    keys_only = {k: v for k, v in LINE.options["structured_outputs_config"].json_keys.items() if k != "values"}
    assert bad_values({"backend": "xgrammer"}, keys_only) == []
    assert judge("O2", {}) is None
