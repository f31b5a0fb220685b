"""Abbreviated options: an ``engine_args`` key that is a unique prefix of one of the release's option strings names
that option, as vLLM's parser reads it (argparse ``allow_abbrev``, left on by FlexibleArgumentParser: vllm 0.33.0
vllm/utils/argparse_utils.py:170-180); a prefix of several is refused with argparse's "ambiguous option". Where a
vLLM release is configured (PREFLIGHT_VLLM_PYTHON / PREFLIGHT_VLLM_PYTHONPATH), every prefix of every option string
is also compared with what vLLM's own parser makes of it (scripts/check_abbrev_with_vllm.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import subprocess

import pytest

from service.domain.engine_args import abbreviations, option_form, parse_engine_args, resolve_key
from service.domain.errors import DomainError
from service.domain.recommend import recommend
from service.domain.render import parse_argv, shell_command
from service.domain.request import LaunchRequest
from service.domain.validate import validate
from service.domain.versions import resolve_version, version_lines
from tests.support import request

LINE = resolve_version("0.33.0")[1]
OLD = resolve_version("0.6.6")[1]
LLAMA_70B = "meta-llama__Meta-Llama-3.1-70B"
SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "check_abbrev_with_vllm.py"
PYTHON = os.environ.get("PREFLIGHT_VLLM_PYTHON")
RELEASE = os.environ.get("PREFLIGHT_VLLM_PYTHONPATH")


def _validate(engine_args: dict, count: int = 4, model: str = LLAMA_70B):
    req = request(model, "h100-sxm-80gb", count=count)
    req["engine_args"] = engine_args
    req["model"]["uri"] = "meta-llama/Llama-3.1-70B"
    return validate(LaunchRequest.model_validate(req))


def _errors(result) -> list[str]:
    return [f.rule for f in result.findings if f.severity.value == "error"]


# ------------------------------------------------------------------------------------------------ the catalogue fact


DATA = pathlib.Path(__file__).resolve().parents[2] / "service" / "data" / "vllm"


def test_every_line_records_that_its_parser_takes_abbreviations():
    """Generated from each release's source (scripts/vllm_argparse.py): no supported release passes allow_abbrev, and
    the serve parser keeps argparse's -h/--help."""
    lines = version_lines()
    assert len(lines) == len(list(DATA.glob("*.json"))) >= 16
    for line in lines:
        assert line.allow_abbrev, line.newest
        assert line.help_strings == ("--help", "-h"), line.newest
        assert re.fullmatch(r"vllm/utils(/argparse_utils\.py|/__init__\.py|\.py):\d+-\d+", line.parser_source)
    assert LINE.parser_source == "vllm/utils/argparse_utils.py:170-180"
    assert OLD.parser_source == "vllm/utils.py:1123-1127"


def test_keys_in_the_form_the_parser_looks_up():
    # vllm 0.33.0 vllm/utils/argparse_utils.py:372-393: after '--' underscores become dashes
    assert option_form("tensor_parallel") == "--tensor-parallel"
    assert option_form("--tensor_parallel") == "--tensor-parallel"
    assert option_form("tensor-parallel") == "--tensor-parallel"
    assert option_form("-t") == "-t"


# ---------------------------------------------------------------------------------------------------- a unique prefix


@pytest.mark.parametrize("key", ["--tensor-parallel", "tensor-parallel", "tensor_parallel", "--tensor_parallel", "-t"])
def test_a_unique_prefix_names_its_option(key):
    assert resolve_key(key, LINE) == (
        "tensor_parallel_size",
        ("-tp",) if key == "-t" else ("--tensor-parallel-size",),
    )


def test_tensor_parallel_4_on_llama31_70b_4xh100_is_accepted_at_tp4():
    """Before: flag_unsupported, and the weights sized for TP=1 (131.4 GiB a GPU: weights_fit, kv_pool_empty)."""
    r = _validate({"--tensor-parallel": 4})
    assert r.verdict == "warn" and _errors(r) == []
    assert r.context.tp == 4 and r.context.args.values["tensor_parallel_size"] == 4
    assert round(r.context.budget.weights_bytes_per_gpu / 2**30, 1) == 32.9
    (f,) = [f for f in r.findings if f.rule == "flag_abbreviated"]
    assert f.severity.value == "warning" and f.field == "engine_args.--tensor-parallel"
    assert "'--tensor-parallel' abbreviates --tensor-parallel-size" in f.message
    assert f.remedy == {"rename": {"--tensor-parallel": "tensor_parallel_size"}}
    assert f.data["reference"] == "vllm 0.33.0 vllm/utils/argparse_utils.py:170-180"


def test_the_signed_command_carries_the_full_spelling():
    """render.py renders from dests: the argv and the shell command hold --tensor-parallel-size, never the prefix,
    and parse back (with exact spellings only) to what was judged."""
    r = _validate({"tensor-parallel": 4, "enable-expert-paralle": False, "gpu-memory": 0.85})
    assert r.argv[:5] == ["vllm", "serve", "meta-llama/Llama-3.1-70B", "--tensor-parallel-size", "4"]
    assert "--gpu-memory-utilization" in r.argv and r.argv[r.argv.index("--gpu-memory-utilization") + 1] == "0.85"
    assert not [a for a in r.argv if a in ("--tensor-parallel", "--enable-expert-paralle", "--gpu-memory")]
    assert "--tensor-parallel-size 4" in shell_command(r.argv)
    _, parsed = parse_argv(r.argv, LINE)
    assert parsed["tensor_parallel_size"] == 4 and parsed["gpu_memory_utilization"] == 0.85
    assert "argv_roundtrip" not in {f.rule for f in r.findings}
    assert {f.field for f in r.findings if f.rule == "flag_abbreviated"} == {
        "engine_args.tensor-parallel",
        "engine_args.enable-expert-paralle",
        "engine_args.gpu-memory",
    }


def test_a_negative_prefix_is_the_negative_option():
    args = parse_engine_args({"--no-enable-prefix": True}, LINE)
    assert args.values == {"enable_prefix_caching": False}
    assert args.abbreviated == {"enable_prefix_caching": ("--no-enable-prefix", "--no-enable-prefix-caching")}
    r = _validate({"tensor_parallel_size": 4, "--no-enable-prefix": True})
    # rendered as the release's plain negative (EnableDisableAction: vllm 0.33.0 vllm/utils/argparse_utils.py:120-145)
    assert r.argv[-1] == "--disable-prefix-caching" and "--enable-prefix-caching" not in r.argv
    assert parse_engine_args({"enable-prefix": True}, LINE).values == {"enable_prefix_caching": True}


def test_an_abbreviation_and_the_full_name_are_one_option_given_twice():
    with pytest.raises(DomainError, match="given twice"):
        parse_engine_args({"tensor_parallel_size": 4, "tensor-parallel": 2}, LINE)


# --------------------------------------------------------------------------------------------------- ambiguous prefixes


def test_an_ambiguous_prefix_is_refused_naming_the_candidates():
    r = _validate({"tensor_parallel_size": 4, "--max-num": 256})
    (f,) = [f for f in r.findings if f.rule == "flag_unsupported"]
    assert r.verdict == "reject" and f.field == "engine_args.--max-num"
    assert (
        "'vllm serve: error: ambiguous option: --max-num could match --max-num-active-seqs, --max-num-batched-tokens, "
        "--max-num-queued-reqs, --max-num-queued-tokens, --max-num-scheduled-tokens, --max-num-seqs'" in f.message
    )
    assert f.remedy["did_you_mean"][-1] == "max_num_seqs" and f.remedy["drop"] == ["max_num"]


def test_a_short_prefix_quotes_the_first_candidates_and_the_count():
    (f,) = [f for f in _validate({"tensor_parallel_size": 4, "enable": True}).findings if f.rule == "flag_unsupported"]
    assert "'enable' is a prefix of 50 option strings" in f.message
    assert "could match --enable-auto-tool-choice, " in f.message and ", … (50 in all)'" in f.message


def test_help_strings_count_as_argparse_counts_them():
    assert resolve_key("he", LINE) == ("he", ("--headless", "--help"))  # ambiguous
    assert resolve_key("--hel", LINE) == ("hel", ())  # --help alone: no engine argument
    assert parse_engine_args({"--hel": True}, LINE).unsupported == {"hel": True}


def test_a_short_option_with_its_value_in_the_key_is_no_abbreviation():
    # argparse reads -qfoo as -q foo: a value inside the key
    assert abbreviations("-qfoo", LINE) == () and resolve_key("-qfoo", LINE) == ("qfoo", ())


def test_the_same_prefix_is_judged_by_each_release():
    """--max-num-s is --max-num-seqs in 0.6.6; 0.33.0 added --max-num-scheduled-tokens."""
    assert resolve_key("max-num-s", OLD) == ("max_num_seqs", ("--max-num-seqs",))
    assert resolve_key("max-num-s", LINE) == ("max_num_s", ("--max-num-scheduled-tokens", "--max-num-seqs"))


# -------------------------------------------------------------------------------------- a parser without abbreviations


def test_a_release_whose_parser_refuses_abbreviations_refuses_the_prefix():
    """No supported release turns allow_abbrev off; a catalogue that says so (or says nothing: the default) makes
    the prefix an unknown option, as argparse with allow_abbrev=False reports it."""
    strict = dataclasses.replace(LINE, allow_abbrev=False)
    args = parse_engine_args({"--tensor-parallel": 4}, strict)
    assert args.unsupported == {"tensor_parallel": 4} and not args.abbreviated
    assert resolve_key("-tp", strict) == ("tensor_parallel_size", ())  # exact spellings are untouched
    assert dataclasses.replace(LINE, allow_abbrev=False, help_strings=()).allow_abbrev is False


# ------------------------------------------------------------------------------------------ the other users of keys


def test_remedies_and_alternatives_treat_the_prefix_as_the_option():
    full, short = _validate({"tensor_parallel_size": 1}), _validate({"tensor-parallel": 1})
    assert _errors(full) == _errors(short) == ["weights_fit", "kv_pool_empty"]
    assert [f.remedy for f in full.findings] == [f.remedy for f in short.findings if f.rule != "flag_abbreviated"]
    assert short.alternatives == full.alternatives and short.alternatives[0] == {"tensor_parallel_size": 4}


def test_recommend_keeps_an_abbreviated_tensor_parallel_size():
    req = request(LLAMA_70B, "h100-sxm-80gb", count=4)
    req["engine_args"] = {"tensor-parallel": 4}
    args, why = recommend(LaunchRequest.model_validate(req))
    assert args["tensor_parallel_size"] == 4 and "tensor_parallel" not in args
    assert "tensor_parallel_size" not in {w["field"] for w in why}


# ------------------------------------------------------------------------------------------ vLLM's own parser


@pytest.mark.skipif(
    not (PYTHON and RELEASE), reason="no vLLM release configured (PREFLIGHT_VLLM_PYTHON / PREFLIGHT_VLLM_PYTHONPATH)"
)
def test_every_prefix_as_vllms_own_parser_reads_it():  # pragma: no cover - needs vLLM
    res = subprocess.run(
        [PYTHON, str(SCRIPT)], capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": RELEASE}
    )
    assert res.returncode == 0, res.stderr[-2000:]
    seen = json.loads(res.stdout)
    line = resolve_version(seen["vllm_version"])[1]
    assert seen["allow_abbrev"] == line.allow_abbrev and len(seen["prefixes"]) > 1000
    for prefix, (kind, *rest) in seen["prefixes"].items():
        exact = prefix in line.parser_strings
        found = abbreviations(prefix, line)
        if kind == "option":
            assert (prefix if exact else found) in (rest[0], (rest[0],)), prefix
        elif kind == "ambiguous":
            named = rest[0].split(" could match ", 1)[1].split(", ")
            assert not exact and sorted(named) == list(found), prefix
        else:
            assert not exact and not found, prefix
