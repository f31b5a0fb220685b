"""The lenient argv reader (service/domain/launch_argv.py): a launch's command line read as vLLM 0.33's parser
reads it, with the element each argument came from."""

from __future__ import annotations

import shlex

import pytest

from service.domain.launch_argv import LaunchArgvError, ReadArgv, config_arguments, read_launch_argv
from service.domain.render import ArgvError, render_argv, validated_arguments
from service.domain.request import LaunchRequest
from service.domain.validate import validate
from tests.support import request
from tests.support.catalogue import JUDGED_ELSEWHERE, LINE, OPTIONS, valid_value
from tests.support.recipes import RECIPES


def read(cmd: str, config: str | None = None) -> ReadArgv:
    return read_launch_argv(shlex.split(cmd), LINE, (lambda _path: config) if config is not None else None)


def error(cmd: str, config: str | None = None) -> LaunchArgvError:
    with pytest.raises(LaunchArgvError) as info:
        read(cmd, config)
    return info.value


def test_vllm_serve_with_the_model_first():
    # vLLM's docs: docs/serving/distributed_serving.md
    r = read("vllm serve meta-llama/Llama-3.1-8B-Instruct --tensor-parallel-size 4 --max-model-len 32k")
    assert r.model == "meta-llama/Llama-3.1-8B-Instruct" and r.model_index == 2
    assert r.engine_args == {"tensor_parallel_size": 4, "max_model_len": 32000}
    assert r.origin == {"tensor_parallel_size": 3, "max_model_len": 5}
    assert r.warnings == [] and r.entry == "vllm serve"


def test_model_option_anywhere_moves_to_the_front():
    r = read("vllm serve -tp 2 --model Qwen/Qwen3-8B --enforce-eager --port 8001")
    assert r.model == "Qwen/Qwen3-8B" and r.model_index == 4
    assert r.engine_args == {"tensor_parallel_size": 2, "enforce_eager": True, "port": 8001}
    assert r.origin["enforce_eager"] == 6
    assert read("vllm serve --model=Qwen/Qwen3-8B -tp 2").model == "Qwen/Qwen3-8B"


def test_a_second_model_option_is_ignored_by_vllm_serve():
    r = read("vllm serve --model a/first --max-model-len 4096 --model b/second")
    assert r.model == "a/first"
    assert r.notes == [
        (6, "--model is given again: `vllm serve` serves the first one ('a/first') and ignores this one")
    ]


@pytest.mark.parametrize("python", ["python", "python3", "/usr/bin/python3.12"])
def test_the_openai_api_server_module(python):
    r = read(f"{python} -m vllm.entrypoints.openai.api_server --model mistralai/Mistral-7B-v0.1 --dtype half")
    assert (r.model, r.model_index, r.entry) == ("mistralai/Mistral-7B-v0.1", 3, "vllm.entrypoints.openai.api_server")
    assert r.engine_args == {"dtype": "half"} and r.origin == {"dtype": 5}


def test_the_api_server_ignores_a_positional_model():
    r = read("python3 -m vllm.entrypoints.openai.api_server some/positional --model org/served")
    assert r.model == "org/served"
    assert r.notes[0][0] == 3 and "ignores the positional 'some/positional'" in r.notes[0][1]


def test_cli_main_module_serve():
    assert read("python -m vllm.entrypoints.cli.main serve org/m -pp 2").engine_args == {"pipeline_parallel_size": 2}


def test_underscores_equals_and_short_options():
    r = read("vllm serve org/m --gpu_memory_utilization=0.85 -tp=2 -qfp8 --max_num_seqs 64")
    assert r.engine_args == {
        "gpu_memory_utilization": 0.85,
        "tensor_parallel_size": 2,
        "quantization": "fp8",
        "max_num_seqs": 64,
    }


@pytest.mark.parametrize("form", ["-O3", "-O 3", "-O=3", "--optimization-level 3"])
def test_optimization_level_forms(form):
    r = read(f"vllm serve org/m {form}")
    assert r.engine_args == {"optimization_level": "3"} and r.origin == {"optimization_level": 3}


def test_dotted_keys_merge_into_one_json_value_that_replaces_a_whole_one():
    r = read(
        "vllm serve org/m --compilation-config '{\"mode\": 3}' "
        "--compilation-config.cudagraph_mode FULL_DECODE_ONLY --compilation-config.pass_config.fuse_norm_quant=true "
        "--compilation-config.compile_sizes+ 1,2"
    )
    # appended after everything (vllm/utils/argparse_utils.py:505-509): the JSON given whole is replaced
    assert r.engine_args["compilation_config"] == {
        "cudagraph_mode": "FULL_DECODE_ONLY",
        "pass_config": {"fuse_norm_quant": True},
        "compile_sizes": ["1", "2"],
    }
    assert r.origin["compilation_config"] == 5
    assert r.notes[0][0] == 5 and "--compilation-config is given twice (also word 3)" in r.notes[0][1]


def test_dotted_short_key_and_human_readable_value():
    r = read("vllm serve org/m -cc.max_cudagraph_capture_size 1k")
    assert r.engine_args == {"compilation_config": {"max_cudagraph_capture_size": 1000}}


def test_abbreviation_is_read_and_noted():
    r = read("vllm serve org/m --tensor-parallel 4 --max-model 8192")
    assert r.engine_args == {"tensor_parallel_size": 4, "max_model_len": 8192}
    assert r.notes == [
        (3, "'--tensor-parallel' is read as --tensor-parallel-size (an abbreviation)"),
        (5, "'--max-model' is read as --max-model-len (an abbreviation)"),
    ]


def test_ambiguous_abbreviation_is_refused_at_its_word():
    e = error("vllm serve org/m --max-num 4")
    assert e.index == 3 and str(e).startswith("ambiguous option: --max-num could match --max-num-active-seqs,")


def test_repeated_option_last_wins_with_a_warning():
    r = read("vllm serve org/m --max-model-len 4096 --port 8000 --max-model-len 8192")
    assert r.engine_args["max_model_len"] == 8192 and r.origin["max_model_len"] == 7
    assert r.notes == [(7, "--max-model-len is given twice (also word 3): the last value, 8192, wins")]


def test_negatives_enable_disable_and_lists():
    r = read(
        "vllm serve org/m --no-enable-prefix-caching --disable-chunked-prefill --served-model-name a b "
        "--middleware x.A --middleware y.B --cuda-graph-sizes 1 2 4"
    )
    assert r.engine_args["enable_prefix_caching"] is False and r.engine_args["enable_chunked_prefill"] is False
    assert r.engine_args["served_model_name"] == ["a", "b"]
    assert r.engine_args["middleware"] == ["x.A", "y.B"]  # an append option accumulates


def test_json_values_and_negative_numbers():
    r = read(
        'vllm serve org/m --speculative-config \'{"method": "ngram", "num_speculative_tokens": 3}\' '
        "--max-model-len -1 --hf-overrides.rope_parameters.factor 4.0"
    )
    assert r.engine_args["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 3}
    assert r.engine_args["max_model_len"] == -1
    assert r.engine_args["hf_overrides"] == {"rope_parameters": {"factor": 4.0}}


def test_config_file_values_come_first_and_the_command_line_wins():
    yaml_text = (
        "tensor-parallel-size: 4\nmax_model_len: 8192\nenable-prefix-caching: false\n"
        "compilation-config:\n  mode: 3\nserved-model-name: [a, b]\n"
    )
    r = read("vllm serve org/m --config serve.yaml -tp 2", yaml_text)
    assert r.engine_args == {
        "tensor_parallel_size": 2,
        "max_model_len": 8192,
        "enable_prefix_caching": False,
        "compilation_config": {"mode": 3},
        "served_model_name": ["a", "b"],
    }
    assert r.origin["tensor_parallel_size"] == 5 and r.origin["max_model_len"] == 3
    assert r.config_keys == {
        "max_model_len": "max_model_len",
        "enable_prefix_caching": "enable-prefix-caching",
        "compilation_config": "compilation-config",
        "served_model_name": "served-model-name",
    }
    assert r.config_file == "serve.yaml" and r.warnings == []


def test_model_from_the_config_file():
    r = read("vllm serve --config c.yml --max-num-seqs 8", "model: Qwen/Qwen3-0.6B\nport: 8001\n")
    assert (r.model, r.model_index) == ("Qwen/Qwen3-0.6B", None)
    assert r.engine_args == {"port": 8001, "max_num_seqs": 8}


def test_config_file_as_vllm_reads_it():
    # YAML 1.1 as PyYAML reads it (yes is true); false becomes --no-x only where the parser has it
    assert config_arguments("enforce-eager: yes\ndisable-log-stats: false\nport: 8000\n", LINE) == [
        ("--enforce-eager", "enforce-eager"),
        ("--port", "port"),
        ("8000", "port"),
    ]


def test_config_problems():
    assert error("vllm serve org/m --config c.yaml").index == 4  # nothing to read it with
    assert "cannot be read here" in str(error("vllm serve org/m --config c.yaml"))
    assert "only a .yaml / .yml" in str(error("vllm serve org/m --config c.json", "{}"))
    assert "No model specified" in str(error("vllm serve --config c.yaml", "port: 1\n"))
    assert "mapping" in str(error("vllm serve org/m --config c.yaml", "- a\n- b\n"))
    assert "given twice" in str(error("vllm serve org/m --config a.yaml --config b.yaml", "port: 1\n"))


def test_config_with_equals_is_ignored_by_vllm():
    r = read("vllm serve org/m --config=c.yaml --port 8000")
    assert r.engine_args == {"port": 8000}
    assert r.notes[0][0] == 3 and "accepted and ignored" in r.notes[0][1]


def test_removed_flag_passes_through_for_flag_unsupported():
    r = read("vllm serve org/m --swap-space 4 --max-model-len 4096")
    assert r.engine_args == {"swap_space": "4", "max_model_len": 4096} and r.origin["swap_space"] == 3


def test_unknown_option_names_the_nearest_spellings():
    e = error("vllm serve org/m --max-modle-len 4096")
    assert (e.index, e.field) == (3, "max_modle_len")
    assert "did you mean --max-model-len" in str(e)
    assert isinstance(e, ArgvError)


@pytest.mark.parametrize(
    ("cmd", "index", "text"),
    [
        ("vllm serve org/m stray", 3, "unrecognized arguments"),
        ("vllm serve org/m --enforce-eager=true", 3, "ignored explicit argument"),
        ("vllm serve org/m --max-model-len abc", 4, "must be an integer"),
        ("vllm serve org/m --max-model-len", 3, "expected one argument"),
        ("vllm serve org/m --tensor-parallel-size --port 1", 3, "expected one argument"),
        ("vllm serve --served-model-name x -tp 2", 2, "first positional argument"),
        ("vllm serve org/m --help", 3, "help"),
        ("vllm chat org/m", 1, "is not `vllm serve`"),
        ("docker run org/m", 0, "does not start vLLM's server"),
        ("vllm serve org/m --model", 3, "--model is the last word"),
        ("vllm serve org/m -- --port 1", 3, "'--' ends the options"),
    ],
)
def test_refusals_name_the_word(cmd, index, text):
    e = error(cmd)
    assert e.index == index and text in str(e)


def test_no_model_is_refused():
    assert "no model is given" in str(error("vllm serve --port 8000"))


def test_bounded():
    with pytest.raises(LaunchArgvError, match="more than 4096"):
        read_launch_argv(["vllm", "serve", "m", *["--enforce-eager"] * 5000], LINE)


def _roundtrip_cases():
    out = []
    for name in OPTIONS:
        if name not in JUDGED_ELSEWHERE:
            req = request("meta-llama__Meta-Llama-3.1-8B", count=1)
            req["engine_args"] = {name: valid_value(LINE.options[name])}
            req["model"]["uri"] = "meta-llama/Llama-3.1-8B"
            out.append(pytest.param(req, id=name))
    for _, model, hw, nodes, args in RECIPES:
        req = request(model, gpu=hw[0], count=hw[1], nodes=nodes, environment="benchmark")
        req["engine_args"], req["model"]["uri"] = args, "org/" + model.split("__", 1)[1]
        out.append(pytest.param(req, id="recipe-" + model))
    return out


@pytest.mark.parametrize("req", _roundtrip_cases())
def test_rendered_argv_reads_back_identically(req):
    result = validate(LaunchRequest.model_validate(req), alternatives=False)
    argv = render_argv(result.context)  # (result.argv hides secrets such as --api-key)
    r = read_launch_argv(argv, result.context.line)
    assert r.model == argv[2]
    assert r.engine_args == validated_arguments(result.context)
    assert r.warnings == []


DEEP = "[" * 1100 + "]" * 1100  # deeper than json.loads goes: vLLM fails at start-up


@pytest.mark.parametrize(("words", "index"), [(["--compilation-config", DEEP], 4), (["-cc.x", DEEP], 3)])
def test_json_nested_deeper_than_the_parser_goes_names_the_element(words, index):
    with pytest.raises(LaunchArgvError) as exc:
        read_launch_argv(["vllm", "serve", "m", *words], LINE)
    assert exc.value.index == index and "nested too deeply" in str(exc.value)


def test_an_empty_model_is_refused_at_the_word_that_gives_it():
    assert (error("vllm serve ''").index, error("vllm serve -tp 2 --model=").index) == (2, 4)
    e = error("vllm serve --config serve.yaml", "model: ''\ntensor-parallel-size: 2\n")
    assert (e.index, e.key, str(e)) == (2, "model", "the model is empty: name it as `vllm serve MODEL`")


def test_bounded_messages():
    """A prefix of every option lists ten and a count; 400 values are refused at the option word."""
    e = error("vllm serve org/m --=x")
    assert e.index == 3 and str(e).startswith("ambiguous option: -- could match --")
    assert str(e).count(", ") == 9 and str(e).endswith(" more")
    e = error("vllm serve org/m --served-model-name " + " ".join(f"n{i}" for i in range(400)))
    assert (e.index, e.field, str(e)) == (
        3,
        "served_model_name",
        "argument --served-model-name: 400 values, more than the 64 Preflight reads",
    )


def test_a_config_files_unknown_key_is_refused_with_its_key():
    e = error("vllm serve --config serve.yaml", "model: org/m\ntensor-paralel-size: 4\nmax-modl-len: 4096\n")
    assert (e.index, e.key) == (2, "tensor-paralel-size") and "did you mean --tensor-parallel-size" in str(e)


def test_bare_human_readable_numbers_in_a_config_class_json_option():
    """vllm 0.33.0 engine/arg_utils.py:302-321, 371: parse_dataclass expands bare 1k / 2K tokens (not inside JSON
    strings) before validating; the catalogue records which options' parsers do (``json_numbers``)."""
    assert LINE.options["compilation_config"].json_numbers and not LINE.options["speculative_config"].json_numbers
    read = read_launch_argv(
        ["vllm", "serve", "m", "--compilation-config", '{"max_cudagraph_capture_size": 1k, "cache_dir": "1k"}'], LINE
    )
    assert read.engine_args["compilation_config"] == {"max_cudagraph_capture_size": 1000, "cache_dir": "1k"}
    read = read_launch_argv(
        ["vllm", "serve", "m", "--compilation-config", '{"cudagraph_capture_sizes": [1k, 2K]}'], LINE
    )
    assert read.engine_args["compilation_config"] == {"cudagraph_capture_sizes": [1000, 2048]}
