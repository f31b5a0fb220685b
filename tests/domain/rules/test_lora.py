"""The LoRA rules (service/domain/rules/lora.py): LoRAConfig's limits, multimodal LoRAs on a text model and LoRA
with speculative decoding, on real configs."""

from __future__ import annotations

from tests.support import request
from tests.support.rules import errors

LLAMA = "meta-llama__Llama-3.1-8B-Instruct"
SCOUT = "meta-llama__Llama-4-Scout-17B-16E-Instruct"  # multimodal


def _req(version: str | None = None, **args):
    req = request(LLAMA, count=1, enable_lora=True, **args)
    if version:
        req["vllm_version"] = version
    return req


def test_max_loras_at_least_one():
    (f,) = errors(_req(max_loras=0), "lora_limits")
    assert "Input should be greater than or equal to 1" in f.message and f.remedy == {"max_loras": 1}
    (f,) = errors(_req("0.9.2", max_loras=0), "lora_limits")
    assert f.message == "max_loras (0) must be >= 1."
    assert not errors(_req(max_loras=1), "lora_limits")
    # without --enable-lora vLLM builds no LoRAConfig
    assert not errors(request(LLAMA, count=1, max_loras=0), "lora_limits")


def test_max_cpu_loras_not_below_max_loras():
    (f,) = errors(_req(max_loras=4, max_cpu_loras=2), "lora_limits")
    assert f.message == "max_cpu_loras (2) must be >= max_loras (4)." and f.remedy == {"max_cpu_loras": 4}
    assert not errors(_req(max_loras=4, max_cpu_loras=8), "lora_limits")


def test_rank_lists_before_0_11():
    (f,) = errors(_req("0.7.3", max_lora_rank=320), "lora_limits")
    assert f.message == "max_lora_rank (320) must be one of (8, 16, 32, 64, 128, 256)."
    assert f.remedy == {"max_lora_rank": 256}
    # 0.8.x (read with the 0.7 line's options) already takes 320 and 512
    assert not errors(_req("0.8.5", max_lora_rank=320), "lora_limits")
    assert not errors(_req("0.10.2", max_lora_rank=64), "lora_limits")


def test_default_mm_loras_need_a_multimodal_model():
    (f,) = errors(request(LLAMA, count=1, default_mm_loras={"image": "org/lora"}), "lora_mm_non_multimodal")
    assert "non multimodal model" in f.message
    ok = request(SCOUT, tensor_parallel_size=8, enable_lora=True, default_mm_loras={"image": "org/lora"})
    assert not errors(ok, "lora_mm_non_multimodal")


def test_lora_with_speculation_needs_batched_tokens():
    spec = {"method": "ngram", "num_speculative_tokens": 4}
    (f,) = errors(
        _req(max_num_batched_tokens=2048, max_num_seqs=512, speculative_config=spec), "lora_spec_batched_tokens"
    )
    assert "512 × (num_speculative_tokens 4 + 1) = 2560" in f.message
    assert f.remedy["max_num_batched_tokens"] == 2560 and f.remedy["speculative_config"]["num_speculative_tokens"] == 3
    lax = {**spec, "num_speculative_tokens": "4"}  # SpeculativeConfig validates in lax mode: "4" is 4
    assert errors(
        _req(max_num_batched_tokens=2048, max_num_seqs=512, speculative_config=lax), "lora_spec_batched_tokens"
    )
    assert not errors(
        _req(max_num_batched_tokens=4096, max_num_seqs=512, speculative_config=spec), "lora_spec_batched_tokens"
    )
