"""The rendered `vllm serve` argv (service/domain/render.py): flags, removed flags, the quantization tag, the
shell-quoted command and the positional model."""

from __future__ import annotations

import shlex

import pytest

from service.domain.request import LaunchRequest
from service.domain.validate import validate
from tests.support import model_config, request


def argv_of(req: dict) -> list[str]:
    return validate(LaunchRequest.model_validate(req)).argv


def test_booleans_render_as_flags_never_with_values():
    argv = argv_of(
        request(
            "meta-llama__Meta-Llama-3.1-8B",
            count=1,
            enforce_eager=False,
            enable_prefix_caching=True,
            enable_chunked_prefill=False,
            max_num_batched_tokens=131072,
        )
    )
    assert "--no-enforce-eager" in argv and "--enable-prefix-caching" in argv
    # 0.33's parser pairs --enable-chunked-prefill with --disable-chunked-prefill (EnableDisableAction)
    assert "--disable-chunked-prefill" in argv
    assert "False" not in argv and "True" not in argv


def test_removed_flag_is_reported_and_never_rendered():
    result = validate(LaunchRequest.model_validate(request("meta-llama__Meta-Llama-3.1-8B", count=1, swap_space=4)))
    assert "--swap-space" not in result.argv
    assert any(f.rule == "flag_unsupported" and f.severity.value == "error" for f in result.findings)
    old = request("meta-llama__Meta-Llama-3.1-8B", count=1, swap_space=4)
    old["vllm_version"] = "0.17.1"
    assert argv_of(old)[-2:] == ["--swap-space", "4.0"]


def test_bool_given_a_string_value_is_flag_unsupported():
    result = validate(
        LaunchRequest.model_validate(request("meta-llama__Meta-Llama-3.1-8B", count=1, enforce_eager="False"))
    )
    assert [f.rule for f in result.findings if f.severity.value == "error"] == ["flag_unsupported"]
    assert "--enforce-eager" not in result.argv


def test_quantization_comes_from_the_tag():
    req = request("meta-llama__Meta-Llama-3.1-8B", count=1)
    req["model"]["quantization_txt"] = "# online FP8 of a bf16 checkpoint\nfp8\n"
    result = validate(LaunchRequest.model_validate(req))
    assert result.argv[result.argv.index("--quantization") + 1] == "fp8_per_tensor"
    assert any(f.rule == "quant_fp8_online_deprecated" for f in result.findings)


def test_command_is_the_shell_quoted_argv_with_env():
    req = request("meta-llama__Meta-Llama-3.1-8B", count=1, served_model_name=["llama 8b"])
    req["env"] = {"VLLM_LOGGING_LEVEL": "DEBUG"}
    result = validate(LaunchRequest.model_validate(req))
    assert result.command.startswith("VLLM_LOGGING_LEVEL=DEBUG vllm serve ")
    assert shlex.split(result.command)[1:] == result.argv


def test_model_is_the_positional_argument():
    req = {
        "model": {"name": "meta-llama/Llama-3.1-8B", "config": model_config("meta-llama__Meta-Llama-3.1-8B")},
        "hardware": {"gpu": "h100-sxm-80gb"},
    }
    assert argv_of(req)[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B"]


def test_the_round_trip_remembers_parses_within_its_bounds(monkeypatch):
    """The round trip's parse is remembered per (line, argv): the same answer as parse_argv, an argv that does not
    parse is never remembered, a huge one is parsed but not kept, and the entries stay under the bound."""
    from service.domain import render
    from service.domain.versions import resolve_version

    _, line = resolve_version("0.33.0")
    monkeypatch.setattr(render, "_PARSED_BACK", {})
    monkeypatch.setattr(render, "_PARSED_BACK_MAX", 3)
    argv = ("vllm", "serve", "org/m", "--tensor-parallel-size", "8", "--max-model-len", "8192")
    assert render._parsed_back(argv, line) == render.parse_argv(list(argv), line)
    assert render._parsed_back(argv, line) == ("org/m", {"tensor_parallel_size": 8, "max_model_len": 8192})
    with pytest.raises(render.ArgvError):
        render._parsed_back(("vllm", "serve", "org/m", "--no-such-option", "1"), line)
    names = ["a" * 3000, "b" * 3000, "c" * 3000]
    huge = ("vllm", "serve", "org/m", "--served-model-name", *names)
    assert render._parsed_back(huge, line)[1] == {"served_model_name": names}
    for tp in range(1, 9):
        render._parsed_back(("vllm", "serve", "org/m", "--tensor-parallel-size", str(tp)), line)
    assert len(render._PARSED_BACK) == 3
    assert all(len("".join(k[1])) < 100 for k in render._PARSED_BACK)
