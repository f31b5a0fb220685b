"""The maximum model length as each release derives it (service/domain/max_len.py), on real configs: Qwen3-8B
(max_position_embeddings 40960, no rope_scaling) extended with YaRN factor 4 from 32768 the way its model card says,
through every form the releases take (--rope-scaling up to 0.10, --hf-overrides rope_scaling / rope_parameters)."""

from __future__ import annotations

import pytest

from service.domain.context import build_context
from service.domain.max_len import LengthInput, derive, length_rules
from service.domain.request import LaunchRequest
from service.domain.validate import validate
from service.domain.versions import resolve_version
from tests.support import model_config

QWEN3 = "Qwen__Qwen3-8B"
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}


def launch(version: str, model: str = QWEN3, config: dict | None = None, **engine_args):
    req = {
        "vllm_version": version,
        "model": {"name": model, "config": config or model_config(model)},
        "hardware": {"gpu": "h100-sxm-80gb", "count": 1},
        "environment": "benchmark",
        "engine_args": engine_args,
    }
    return LaunchRequest.model_validate(req)


def errors(version: str, **engine_args) -> dict[str, str]:
    r = validate(launch(version, **engine_args), alternatives=False)
    return {f.rule: f.message for f in r.findings if f.severity.value == "error"}


def derived(version: str, **engine_args) -> int:
    return build_context(launch(version, **engine_args)).facts.derived_max_model_len


@pytest.mark.parametrize(
    "version,engine_args,expected",
    [
        # up to 0.10 --rope-scaling joins the overrides (0.8.5 vllm/config.py:403-407; 0.10.2 config/__init__.py:581-584)
        ("0.8.5", {"rope_scaling": YARN}, 131072),
        ("0.9.2", {"rope_scaling": YARN}, 131072),
        ("0.10.2", {"rope_scaling": YARN}, 131072),
        ("0.8.5", {"hf_overrides": {"rope_scaling": YARN}}, 131072),
        ("0.9.2", {"hf_overrides": {"rope_scaling": YARN}}, 131072),
        ("0.10.2", {"hf_overrides": {"rope_scaling": YARN}}, 131072),
        ("0.11.2", {"hf_overrides": {"rope_scaling": YARN}}, 131072),
        # up to 0.11 the derivation reads rope_scaling only
        ("0.10.2", {"hf_overrides": {"rope_parameters": YARN}}, 40960),
        # 0.13-0.18 (Transformers 4) read rope_parameters, copied from config.json before the override lands
        ("0.13.0", {"hf_overrides": {"rope_scaling": YARN}}, 40960),
        ("0.18.1", {"hf_overrides": {"rope_scaling": YARN}}, 40960),
        ("0.13.0", {"hf_overrides": {"rope_parameters": YARN}}, 131072),
        # Transformers 5: rope_scaling is rope_parameters' alias; YaRN scales up to 0.29
        ("0.21.0", {"hf_overrides": {"rope_scaling": YARN}}, 131072),
        ("0.28.0", {"hf_overrides": {"rope_parameters": YARN}}, 131072),
        ("0.29.1", {"hf_overrides": {"rope_parameters": YARN}}, 131072),
        # from 0.30 YaRN trusts max_position_embeddings (PR #56446)
        ("0.30.0", {"hf_overrides": {"rope_parameters": YARN}}, 40960),
        ("0.33.0", {"hf_overrides": {"rope_parameters": YARN}}, 40960),
        ("0.33.0", {"hf_overrides": {"rope_parameters": YARN, "max_position_embeddings": 131072}}, 131072),
        ("0.33.0", {}, 40960),
    ],
)
def test_qwen3_8b_yarn_derived_length_per_release(version, engine_args, expected):
    assert derived(version, **engine_args) == expected


@pytest.mark.parametrize(
    "version,engine_args",
    [
        ("0.8.5", {"rope_scaling": YARN}),
        ("0.8.5", {"hf_overrides": {"rope_scaling": YARN}}),
        ("0.9.2", {"rope_scaling": YARN}),
        ("0.10.2", {"rope_scaling": YARN}),
        ("0.10.2", {"hf_overrides": {"rope_scaling": YARN}}),
        ("0.33.0", {"hf_overrides": {"rope_parameters": YARN, "max_position_embeddings": 131072}}),
    ],
)
def test_qwen3_8b_yarn_at_131072_is_accepted(version, engine_args):
    assert errors(version, max_model_len=131072, **engine_args) == {}


@pytest.mark.parametrize("version", ["0.8.5", "0.9.2", "0.10.2"])
def test_above_the_scaled_limit_is_refused_with_the_numbers(version):
    found = errors(version, rope_scaling=YARN, max_model_len=131073)
    msg = found["max_len_vs_positions"]
    assert "User-specified max_model_len (131073)" in msg and "max_position_embeddings=131072" in msg
    assert f"vllm {version}" in msg and "original_max_position_embeddings 32768 × factor 4" in msg


def test_033_yarn_does_not_extend_and_says_how_to():
    msg = errors("0.33.0", hf_overrides={"rope_parameters": YARN}, max_model_len=131072)["max_len_vs_positions"]
    assert "max_position_embeddings=40960" in msg and "from vLLM 0.30" in msg
    assert '{"max_position_embeddings": 131072}' in msg


def test_013_names_the_rope_scaling_override_it_does_not_read():
    msg = errors("0.13.0", hf_overrides={"rope_scaling": YARN}, max_model_len=131072)["max_len_vs_positions"]
    assert "max_position_embeddings=40960" in msg and "override rope_parameters instead" in msg


def test_legacy_type_in_an_override_is_a_keyerror_where_the_override_is_not_normalised():
    legacy = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    r = validate(launch("0.8.5", rope_scaling=legacy, max_model_len=131072), alternatives=False)
    f = next(f for f in r.findings if f.rule == "rope_scaling_unreadable")
    assert f.severity.value == "error" and f.field == "engine_args.rope_scaling"
    assert f.remedy == {"rope_scaling": YARN}
    assert "rope_scaling_unreadable" in errors("0.11.2", hf_overrides={"rope_scaling": legacy})
    assert "rope_scaling_unreadable" in errors("0.33.0", hf_overrides={"rope_parameters": legacy})
    # 0.10 applies overrides before patch_rope_scaling; Transformers 5's rope_scaling setter standardises the dict
    assert "rope_scaling_unreadable" not in errors("0.10.2", rope_scaling=legacy, max_model_len=131072)
    assert "rope_scaling_unreadable" not in errors("0.28.0", hf_overrides={"rope_scaling": legacy})


def test_yarn_without_its_original_length():
    no_original = {"rope_type": "yarn", "factor": 4.0}
    # up to 0.29 the derivation starts from rope['original_max_position_embeddings']: KeyError
    assert "rope_scaling_unreadable" in errors("0.10.2", rope_scaling=no_original)
    assert "rope_scaling_unreadable" in errors("0.28.0", hf_overrides={"rope_parameters": no_original})
    # from config.json Transformers 5 fills it with max_position_embeddings: 40960 × 4
    cfg = {**model_config(QWEN3), "rope_scaling": no_original}
    assert build_context(launch("0.28.0", config=cfg)).facts.derived_max_model_len == 163840
    # from 0.30 YaRN is not read for the length at all
    assert "rope_scaling_unreadable" not in errors("0.33.0", hf_overrides={"rope_parameters": no_original})


@pytest.mark.parametrize(
    "name,expected",
    [
        ("deepseek-ai__DeepSeek-V3", 163840),  # yarn 40 × 4096 = max_position_embeddings
        ("openai__gpt-oss-120b", 131072),  # yarn 32 × 4096
        ("moonshotai__Kimi-K2.5", 262144),  # text_config: yarn 64 × 4096
        ("meta-llama__Llama-3.1-8B-Instruct", 131072),  # llama3 never scales
        ("Qwen__Qwen2.5-72B-Instruct", 32768),
    ],
)
@pytest.mark.parametrize("version", ["0.6.6", "0.8.5", "0.10.2", "0.13.0", "0.28.0", "0.33.0"])
def test_real_configs_derive_the_same_length_in_every_release(name, expected, version):
    config = model_config(name)
    text = config.get("text_config", config)
    assert derive(text, text.get("model_type"), length=LengthInput(length_rules(version), {})).derived == expected


def test_model_max_length_replaces_the_smallest_key_from_08():
    text = {"max_position_embeddings": 8192, "model_max_length": 131072}
    assert derive(text, "cohere", length=LengthInput(length_rules("0.7.3"), {})).derived == 8192
    assert derive(text, "cohere", length=LengthInput(length_rules("0.8.5"), {})).derived == 131072


def test_longrope_default_is_the_original_length_from_011():
    longrope = {"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}
    text = {"max_position_embeddings": 131072, "original_max_position_embeddings": 4096, "rope_scaling": longrope}
    old = derive(text, "phi3", length=LengthInput(length_rules("0.10.2"), {}))
    new = derive(text, "phi3", length=LengthInput(length_rules("0.11.2"), {}))
    assert (old.derived, old.default) == (131072, 131072)
    assert (new.derived, new.default) == (131072, 4096)


def test_linear_scales_and_gemma3_never_from_08():
    text = {"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2.0}}
    for version in ("0.6.6", "0.10.2", "0.33.0"):
        assert derive(text, "llama", length=LengthInput(length_rules(version), {})).derived == 8192
    assert derive(text, "gemma3_text", length=LengthInput(length_rules("0.7.3"), {})).derived == 8192
    assert derive(text, "gemma3_text", length=LengthInput(length_rules("0.8.5"), {})).derived == 4096


def test_qwen3_is_judged_by_the_08_line_and_registered_there():
    version, line = resolve_version("0.8.5")
    assert (version, line.newest) == ("0.8.5", "0.8.5")
    assert "Qwen3ForCausalLM" in line.architectures and "Qwen3MoeForCausalLM" in line.architectures
    assert "Qwen3ForCausalLM" not in resolve_version("0.7.3")[1].architectures
    r = validate(launch("0.8.5"), alternatives=False)
    assert not any(f.rule == "arch_unsupported" for f in r.findings)


def _field_of(version: str, config: dict | None = None, **engine_args) -> str:
    from service.domain.errors import DomainError

    with pytest.raises(DomainError) as e:
        build_context(launch(version, config=config, **engine_args))
    return e.value.field


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"num_hidden_layers": "abc"}, "engine_args.hf_overrides.num_hidden_layers"),
        ({"rope_parameters": {**YARN, "factor": "x"}}, "engine_args.hf_overrides.rope_parameters.factor"),
        ({"max_position_embeddings": -1}, "engine_args.hf_overrides.max_position_embeddings"),
        ({"text_config": {"num_hidden_layers": 5}}, "engine_args.hf_overrides.text_config.num_attention_heads"),
    ],
)
def test_a_bad_value_an_override_set_is_named_where_it_was_given(overrides, field):
    """The value came from --hf-overrides, not from config.json: the 422 names the engine argument."""
    assert _field_of("0.33.0", hf_overrides=overrides) == field


def test_a_bad_value_of_config_json_is_still_named_in_the_config():
    config = {**model_config(QWEN3), "num_hidden_layers": "abc"}
    assert _field_of("0.33.0", config=config, hf_overrides={"max_position_embeddings": 65536}) == (
        "model.config.num_hidden_layers"
    )


def test_a_top_level_original_length_is_named_at_the_top_level():
    """The loader copies the top-level original_max_position_embeddings into the rope dict (0.13+): a bad one is
    config.json's top-level key, not a rope dict key the config never had."""
    config = {**model_config(QWEN3), "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    config["original_max_position_embeddings"] = "abc"
    assert _field_of("0.33.0", config=config) == "model.config.original_max_position_embeddings"


@pytest.mark.parametrize("factor", [0, 1e-9])
def test_a_rope_factor_that_derives_no_length_is_a_422_naming_it(factor):
    """length × factor below one token: vLLM derives max_model_len 0 and its scheduler config refuses the
    max_num_batched_tokens it fills from it (min(max_num_seqs × 0, …) = 0 < 1)."""
    config = {**model_config(QWEN3), "rope_scaling": {"rope_type": "dynamic", "factor": factor}}
    assert _field_of("0.33.0", config=config) == "model.config.rope_scaling.factor"


def test_a_bad_rope_scaling_option_is_named_as_the_option():
    """Up to 0.10 --rope-scaling joins the overrides as rope_scaling: its bad factor is that option's."""
    assert _field_of("0.8.5", rope_scaling={**YARN, "factor": "x"}) == "engine_args.rope_scaling.factor"
