"""The catalogue generated from vLLM (service/data/vllm): every option of the 0.33 line is accepted with a valid
value of its kind and refused with an invalid one, the rendered argv parses back to what was validated, known-good
recipe launches pass, and argv smuggling is refused."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

from service.domain.errors import DomainError
from service.domain.render import parse_argv
from service.domain.versions import Kind, resolve_version, version_lines
from tests.support.catalogue import JUDGED_ELSEWHERE, LINE, OPTIONS, flag_errors, judged, valid_value


def invalid_value(opt):
    return {
        Kind.BOOL: "yes",
        Kind.FLAG: "yes",
        Kind.BOOL_VALUE: "yes",
        Kind.INT: "two",
        Kind.FLOAT: "half",
        Kind.STR: {"not": "a string"},
        Kind.JSON: "{not json",
        Kind.JSON_OR_STR: "{not json",
        Kind.SIZE: "4 kB",
        Kind.SIZE_OR_AUTO: "4 kB",
    }[opt.kind]


def test_the_033_catalogue_is_vllm_033s_own():
    assert LINE.newest == "0.33.0" and LINE.source["wheel"].startswith("vllm-0.33.0-")
    assert len(LINE.source["sha256"]) == 64
    assert len(LINE.options) >= 300  # was 65 hand-copied options
    for recipe_flag in (
        "mm_encoder_tp_mode",
        "api_server_count",
        "enable_sleep_mode",
        "lora_modules",
        "kv_transfer_config",
        "data_parallel_hybrid_lb",
        "skip_mm_profiling",
        "disable_custom_all_reduce",
        "ssl_keyfile",
    ):
        assert recipe_flag in LINE.options, recipe_flag
    assert LINE.options["tensor_parallel_size"].spellings[:2] == ("--tensor-parallel-size", "-tp")
    assert LINE.options["mm_encoder_tp_mode"].choices == ("data", "weights")
    assert LINE.default_gpu_memory_utilization == 0.92
    assert "LlamaForCausalLM" in LINE.architectures and LINE.architectures["LlamaForCausalLM"].supports_pp


@pytest.mark.parametrize("name", OPTIONS)
def test_every_033_option_accepts_a_valid_value_and_the_argv_round_trips(name):
    opt = LINE.options[name]
    value = valid_value(opt)
    if name in JUDGED_ELSEWHERE:
        pytest.skip("value judged by its own rule")
    result = judged({name: value})
    assert flag_errors(result) == [], [f.message for f in flag_errors(result)]
    _, parsed = parse_argv(result.argv, LINE)
    if opt.kind is Kind.FLAG or (opt.kind is Kind.BOOL and value is False and not opt.negative_flag):
        return
    assert name in parsed


@pytest.mark.parametrize("name", OPTIONS)
def test_every_033_option_refuses_an_invalid_value(name):
    opt = LINE.options[name]
    bad = invalid_value(opt)
    if opt.kind is Kind.STR and opt.choices is None and name not in ("served_model_name",):
        bad = {"not": "a string"}
    try:
        result = judged({name: bad})
    except DomainError as e:
        assert e.field == f"engine_args.{name}"
        return
    errors = [f for f in result.findings if f.severity.value == "error" and f.field == f"engine_args.{name}"]
    assert errors, f"{name}={bad!r} was not refused"


def test_spellings_and_negations_come_from_the_release():
    r = judged({"-tp": 1, "no_enforce_eager": True, "disable_custom_all_reduce": True})
    assert "--no-enforce-eager" in r.argv and "--disable-custom-all-reduce" in r.argv
    old = judged({"enable_chunked_prefill": False}, version="0.7.3")  # StoreBoolean in 0.7: --x false
    i = old.argv.index("--enable-chunked-prefill")
    assert old.argv[i + 1] == "false" and not flag_errors(old)


# ---------------------------------------------------------------------------------------------------- smuggling


def test_list_value_cannot_smuggle_options():
    with pytest.raises(DomainError) as e:
        judged({"served_model_name": ["x", "--max-model-len", "131072", "--gpu-memory-utilization", "0.99"]})
    assert e.value.field == "engine_args.served_model_name" and e.value.rule == "argv_injection"


@pytest.mark.parametrize(
    "args",
    [
        {"chat_template": "--model=/tmp/other"},
        {"served_model_name": "--config=/tmp/evil.yaml"},
        {"tool_call_parser": "-O3"},
        {"lora_modules": ["a=/x", "--trust-remote-code"]},
        {"api_key": "--enable-sleep-mode"},
    ],
)
def test_values_that_vllm_would_read_as_options_are_refused(args):
    with pytest.raises(DomainError) as e:
        judged(args)
    assert e.value.rule == "argv_injection"


@pytest.mark.parametrize(
    "args",
    [
        {"served_model_name": ["a", "b"]},
        {"lora_modules": ["sql=/loras/sql", "chat=/loras/chat"], "enable_lora": True},
        {"middleware": ["m1.Mw", "m2.Mw"]},
        {"limit_mm_per_prompt": {"image": 2, "video": 0}},
        {"compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE"}},
        {"kv_transfer_config": {"kv_connector": "NixlConnector", "kv_role": "kv_both"}},
        {"allowed_origins": ["https://a.example", "https://b.example"]},
        {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}},
        {"hf_overrides": {"max_position_embeddings": 65536}},
    ],
)
def test_list_and_json_values_round_trip(args):
    r = judged(args)
    assert flag_errors(r) == [], [f.message for f in flag_errors(r)]
    _, parsed = parse_argv(r.argv, LINE)
    for k, v in args.items():
        assert parsed[k] == (v if not isinstance(v, str) else v)


def test_parse_argv_refuses_what_vllm_would_read_differently():
    base = ["vllm", "serve", "m", "--max-model-len", "8192"]
    for extra in (
        ["--model", "/x"],
        ["--config", "c.yaml"],
        ["-O3"],
        ["--compilation-config.mode", "3"],
        ["--max-model-len", "4096"],
        ["stray"],
        ["--no-such-flag"],
    ):
        with pytest.raises(ValueError):
            parse_argv(base + extra, LINE)
    assert parse_argv(base + ["--served-model-name", "a", "b", "--enforce-eager"], LINE)[1] == {
        "max_model_len": 8192,
        "served_model_name": ["a", "b"],
        "enforce_eager": True,
    }


def test_hf_overrides_is_judged_not_passed_through():
    # the override raises the derived length, so a longer max_model_len passes the positions check ...
    assert not any(
        f.rule == "max_len_vs_positions"
        for f in judged({"max_model_len": 262144, "hf_overrides": {"max_position_embeddings": 262144}}).findings
    )
    assert any(
        f.rule == "max_len_vs_positions" and f.severity.value == "error"
        for f in judged({"max_model_len": 262144}).findings
    )
    # ... and an override of the heads is judged by the head rules
    r = judged({"hf_overrides": {"num_attention_heads": 30}, "tensor_parallel_size": 1})
    assert r.effective["gpu"]
    assert any(f.rule == "flag_unjudged" for f in judged({"hf_overrides": "my_module.rewrite"}).findings)
    assert any(f.rule == "flag_unjudged" for f in judged({"model_loader_extra_config": {"x": 1}}).findings)
    with pytest.raises(DomainError):
        judged({"model": "/tmp/other"})


# ------------------------------------------------------------------------------------------ regenerate and compare


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed here (generation runs scripts/gen_vllm_catalogue.py in a throw-away environment)",
)
def test_catalogue_matches_the_installed_vllm(tmp_path):  # pragma: no cover - needs vLLM
    import vllm

    version = vllm.__version__
    path = pathlib.Path(__file__).resolve().parents[2] / "service" / "data" / "vllm" / f"{version}.json"
    if not path.exists():
        pytest.skip(f"no catalogue for vLLM {version}")
    out = subprocess.run(
        [sys.executable, str(path.parent.parent.parent.parent / "scripts" / "vllm_catalogue_inside.py")],
        capture_output=True,
        text=True,
        check=True,
    )
    fresh, stored = json.loads(out.stdout), json.loads(path.read_text())
    stored.pop("source", None)
    assert fresh["options"] == stored["options"] and fresh["registry"] == stored["registry"]


def test_every_line_carries_its_source():
    lines = version_lines()
    assert [l.newest for l in lines][-1] == "0.33.0" and len(lines) >= 3
    for l in lines:
        assert l.source["wheel"].startswith(f"vllm-{l.newest}-") and len(l.source["sha256"]) == 64


def test_quantization_facts_come_from_the_release():
    from service.domain.rules.quant_checks import ACT_DTYPES, CAPABILITY_OVERRIDES, MIN_CAPABILITY, TORCH_NAMES

    details = LINE.quant_details
    assert details["fp8"]["min_capability"] == 75 and details["fp_quant"]["min_capability"] == 100
    assert set(LINE.deprecated_quant) == {"fbgemm_fp8", "fp_quant"}
    # the hand-kept fallbacks never contradict a constant the release declares (GPTQ's Marlin override aside)
    for method, need in MIN_CAPABILITY.items():
        declared = details.get(method, {}).get("min_capability")
        assert declared in (None, need) or method in CAPABILITY_OVERRIDES, method
    for method, dtypes in ACT_DTYPES.items():
        declared = details.get(method, {}).get("act_dtypes")
        if declared:
            assert set(TORCH_NAMES.get(n, n) for n in declared) >= set(dtypes), method


# ------------------------------------------------------------------------ hostile and unusual values, kept as regressions


@pytest.mark.parametrize(
    "args",
    [
        {
            "chat_template": "-1.5",
            "cpu_offload_gb": 20,
            "served_model_name": ["llama"],
        },  # '-1.5' is a dotted key to vLLM
        {"api_key": "-0.5"},
        {"served_model_name": ["-1.5", "x"]},
    ],
)
def test_negative_decimals_are_refused_as_dotted_keys(args):
    with pytest.raises(DomainError) as e:
        judged(args)
    assert e.value.rule == "argv_injection"


@pytest.mark.parametrize("name", ["cpu_offload_gb", "watermark", "kv_offloading_size", "mm_processor_cache_gb"])
def test_negative_floats_are_out_of_range(name):
    with pytest.raises(DomainError) as e:
        judged({name: -1e-7})
    assert e.value.rule == "range" and e.value.field == f"engine_args.{name}"


def test_parse_argv_models_vllms_dotted_key_rule():
    with pytest.raises(ValueError):
        parse_argv(["vllm", "serve", "m", "--chat-template", "-1.5", "--cpu-offload-gb", "20.0"], LINE)


def test_optional_values_that_vllm_reads_as_none():
    r = judged({"served_model_name": "", "middleware": []})
    assert "--served-model-name" not in r.argv and "--middleware" not in r.argv and not flag_errors(r)


@pytest.mark.parametrize(
    "version",
    [
        "0.33.0+++",
        "0.33.0-anything",
        "0.6.6-",
        "0.33.x",
        "0.33.0.",
        "\uff10.\uff13\uff13.\uff10",
        "\u0660.\u0663\u0663.\u0660",  # non-ASCII digits
        "0.10.1.1.1.1.1",
        "0." + "3" * 40,
        "0.33rc1+abcdefghijklmnopqrstuvw",
    ],
)  # 33 characters once normalised
def test_junk_versions_are_refused(version):
    with pytest.raises(DomainError) as e:
        resolve_version(version)
    assert e.value.field == "vllm_version"


@pytest.mark.parametrize(
    "version, line, accounting",
    [
        ("0.10.1.1", "0.10", (0, 10, 1)),  # a real release with four segments (PyPI vllm 0.10.1.1)
        ("0.10.1.1+cu128", "0.10", (0, 10, 1)),
        ("0.6.4.post2.dev", "0.6", (0, 6, 4)),
        ("v0.26.0", "0.26", (0, 26, 0)),
    ],
)
def test_every_pep440_release_spelling_resolves_to_its_line_and_accounting(version, line, accounting):
    from service.domain.memory import Accounting

    assert resolve_version(version)[1].line == line
    assert Accounting.for_version(version).version == accounting  # never silently the newest release's rules


@pytest.mark.parametrize(
    "given, signed",
    [
        ("00.33.0", "0.33.0"),
        ("0.0033.0", "0.33.0"),
        ("0.33.00000", "0.33.0"),
        ("v0.26.0", "0.26.0"),
        ("0.33", "0.33.0"),
        ("0.33rc1", "0.33.0rc1"),
        ("0.10.1.1", "0.10.1.1"),
        ("0.6.3.dev114+g4f95ffee", "0.6.3.dev114+g4f95ffee"),
        ("0.33.0post1", "0.33.0.post1"),
        ("0.33.0.post1", "0.33.0.post1"),
        ("0.33.0rc01", "0.33.0rc1"),
        ("0.33.0.rc1", "0.33.0rc1"),
        ("0.33.0.dev", "0.33.0.dev0"),
        ("0.33.0+A", "0.33.0+a"),
    ],
)
def test_one_version_is_signed_in_one_spelling(given, signed):
    assert resolve_version(given)[0] == signed
