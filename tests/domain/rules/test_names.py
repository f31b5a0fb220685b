"""Names vLLM looks up in a registry or an enum (service/domain/rules/names.py), the reasoning-effort map
(serve.py), Mamba SSU algorithms and sampling replay (features.py) and LoRA on a model without SupportsLoRA
(lora.py)."""

from __future__ import annotations

from service.domain.versions import resolve_version
from tests.support import request
from tests.support.rules import errors

LLAMA = "meta-llama__Llama-3.1-8B-Instruct"
KIMI = "moonshotai__Kimi-K2.5"  # KimiK25ForConditionalGeneration: no SupportsLoRA in 0.33.0


def _at(version: str, req: dict) -> dict:
    return {**req, "vllm_version": version}


def test_names_generated_per_release():
    names = resolve_version("0.33.0")[1].names
    assert "qwen3" in names["reasoning_parsers"] and "hermes" in names["tool_parsers"]
    assert names["mamba_backends"] == {
        "TRITON": "vllm/config/mamba.py:28",
        "FLASHINFER": "vllm/config/mamba.py:29",
        "CPU": "vllm/config/mamba.py:30",
    }
    assert "CPU" not in resolve_version("0.26.0")[1].names["mamba_backends"]


def test_reasoning_parser_unknown():
    (f,) = errors(request(LLAMA, count=1, reasoning_parser="x"), "parser_unknown")
    assert f.message.startswith("Reasoning parser 'x' not found. Available parsers: beam, cohere_command3")
    assert f.field == "engine_args.reasoning_parser"
    for ok in ("qwen3", "none", "None"):
        assert not errors(request(LLAMA, count=1, reasoning_parser=ok), "parser_unknown")
    assert not errors(request(LLAMA, count=1, reasoning_parser="x", reasoning_parser_plugin="/p.py"), "parser_unknown")
    # a 0.14 request is judged by 0.13.0's data: it may name a parser 0.14 added
    assert not errors(_at("0.14.0", request(LLAMA, count=1, reasoning_parser="x")), "parser_unknown")
    assert errors(_at("0.13.0", request(LLAMA, count=1, reasoning_parser="x")), "parser_unknown")


def test_tool_parser_unknown_only_with_auto_tool_choice():
    (f,) = errors(request(LLAMA, count=1, enable_auto_tool_choice=True, tool_call_parser="x"), "parser_unknown")
    assert f.message.startswith("invalid tool call parser: x (chose from { ")
    assert not errors(request(LLAMA, count=1, tool_call_parser="x"), "parser_unknown")
    assert not errors(
        request(LLAMA, count=1, enable_auto_tool_choice=True, tool_call_parser="hermes"), "parser_unknown"
    )


def test_backend_unknown():
    (f,) = errors(request(LLAMA, count=1, attention_backend="x"), "backend_unknown")
    assert f.message.startswith("Unknown attention backend: 'X'. Valid options are: FLASH_ATTN, FLASH_ATTN_DIFFKV")
    for ok in ("flash_attn", "FLASHINFER", "auto"):
        assert not errors(request(LLAMA, count=1, attention_backend=ok), "backend_unknown")
    (m,) = errors(request(LLAMA, count=1, mamba_backend="auto"), "backend_unknown")
    assert m.message == "Unknown Mamba SSU backend: 'AUTO'. Valid options are: TRITON, FLASHINFER, CPU"
    assert not errors(request(LLAMA, count=1, mamba_backend="flashinfer"), "backend_unknown")
    assert errors(_at("0.26.0", request(LLAMA, count=1, mamba_backend="cpu")), "backend_unknown")


def test_reasoning_effort_map():
    (f,) = errors(request(LLAMA, count=1, reasoning_effort_map={"no_such_key": 1}), "reasoning_effort_map")
    assert f.message == "Error: --reasoning-effort-map must be a JSON object mapping reasoning efforts to strings."
    (g,) = errors(request(LLAMA, count=1, reasoning_effort_map={"huge": "x"}), "reasoning_effort_map")
    assert g.message.startswith("Error: --reasoning-effort-map has unknown efforts ['huge']")
    assert not errors(request(LLAMA, count=1, reasoning_effort_map={"low": "quick"}), "reasoning_effort_map")


def test_ssu_algorithm_needs_flashinfer():
    (f,) = errors(request(LLAMA, count=1, mamba_ssu_algorithm="simple"), "mamba_ssu_algorithm")
    assert f.remedy == {"mamba_backend": "flashinfer"}
    ok = request(LLAMA, count=1, mamba_ssu_algorithm="simple", mamba_backend="FlashInfer")
    assert not errors(ok, "mamba_ssu_algorithm")


def test_sampling_replay_needs_processed_logprobs():
    (f,) = errors(request(LLAMA, count=1, return_sampling_mask=True), "sampling_replay_logprobs")
    assert f.message.startswith("sampling distribution replay requires logprobs_mode='processed_logprobs'")
    ok = request(LLAMA, count=1, return_sampling_mask=True, logprobs_mode="processed_logprobs")
    assert not errors(ok, "sampling_replay_logprobs")
    assert not errors(request(LLAMA, count=1, return_sampling_mask=False), "sampling_replay_logprobs")


def test_lora_on_a_model_without_supports_lora():
    (f,) = errors(request(KIMI, count=8, trust_remote_code=True, enable_lora=True), "lora_unsupported_model")
    assert f.message.startswith("LoRA is not supported for KimiK25ForConditionalGeneration")
    assert f.remedy == {"enable_lora": False}
    assert not errors(request(LLAMA, count=1, enable_lora=True), "lora_unsupported_model")
