"""The scheduler rules (service/domain/rules/scheduler.py) with vLLM 0.33's defaults: max_num_batched_tokens
against max_model_len and max_num_seqs."""

from __future__ import annotations

from tests.support import request
from tests.support.rules import errors

LLAMA = "meta-llama__Llama-3.1-8B-Instruct"


def test_chunked_prefill_off_needs_mnbt_ge_max_len():
    (f,) = errors(
        request(LLAMA, count=1, enable_chunked_prefill=False, max_num_batched_tokens=8192), "batched_tokens_vs_max_len"
    )
    assert "(8192) is smaller than max_model_len (131072)" in f.message
    # unset MNBT with chunked prefill off defaults to max(max_model_len, default): fine
    assert not errors(request(LLAMA, count=1, enable_chunked_prefill=False), "batched_tokens_vs_max_len")


def test_max_num_seqs_4096_on_a100_default_mnbt():
    (f,) = errors(
        request(LLAMA, gpu="a100-sxm4-80gb", count=1, max_num_seqs=4096, max_model_len=8192),
        "batched_tokens_lt_max_num_seqs",
    )
    assert "(2048) must be greater than or equal to max_num_seqs (4096)" in f.message
    assert not errors(request(LLAMA, gpu="h100-sxm-80gb", count=1, max_num_seqs=1024), "batched_tokens_lt_max_num_seqs")


def test_max_num_active_seqs_at_most_max_num_seqs():
    llama = "meta-llama__Llama-3.1-8B-Instruct"
    (f,) = errors(request(llama, count=1, max_num_active_seqs=2000), "max_num_active_seqs")
    assert f.message.startswith("max_num_active_seqs (2000) cannot be greater than max_num_seqs (1024).")
    assert not errors(request(llama, count=1, max_num_active_seqs=64), "max_num_active_seqs")
    assert errors(request(llama, count=1, max_num_seqs=32, max_num_active_seqs=64), "max_num_active_seqs")
    # --performance-mode throughput doubles the default (vllm 0.33.0 arg_utils.py:3183-3189)
    assert not errors(
        request(llama, count=1, performance_mode="throughput", max_num_active_seqs=2000), "max_num_active_seqs"
    )


NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
EAGLE = {"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3}


def _async(version: str, **args) -> dict:
    req = request("meta-llama__Llama-3.1-8B-Instruct", count=1, async_scheduling=True, **args)
    req["vllm_version"] = version
    return req


def test_async_scheduling_with_ngram_per_release():
    texts = {
        "0.10.2": "Currently, speculative decoding is not supported with async scheduling.",
        "0.11.2": "Currently, async scheduling is only supported with EAGLE/MTP kind of speculative decoding",
        "0.13.0": "Currently, async scheduling is only supported with EAGLE/MTP kind of speculative decoding",
        "0.15.1": "Currently, async scheduling is only supported with EAGLE/MTP kind of speculative decoding.",
        "0.24.0": "Currently, async scheduling is only supported with EAGLE/MTP/Draft Model/NGram GPU kind of "
        "speculative decoding",
        "0.30.0": "Currently, async scheduling is only supported with EAGLE/MTP/Draft Model/NGram GPU/DSpark kind of "
        "speculative decoding",
        "0.32.0": "Currently, async scheduling is only supported with EAGLE/MTP/Draft Model/NGram GPU/DSpark/DFlash "
        "kind of speculative decoding",
    }
    for version, text in texts.items():
        (f,) = errors(_async(version, speculative_config=NGRAM), "async_scheduling_unsupported")
        assert (f.message, f.remedy) == (text, {"async_scheduling": False}), version
    # 0.33 judges it on the V1 model runner only; EAGLE is allowed from 0.11; without the flag nothing is refused
    assert not errors(_async("0.33.0", speculative_config=NGRAM), "async_scheduling_unsupported")
    assert not errors(_async("0.13.0", speculative_config=EAGLE), "async_scheduling_unsupported")
    (f,) = errors(_async("0.10.2", speculative_config=EAGLE), "async_scheduling_unsupported")
    plain = request("meta-llama__Llama-3.1-8B-Instruct", count=1, speculative_config=NGRAM)
    plain["vllm_version"] = "0.13.0"
    assert not errors(plain, "async_scheduling_unsupported")


def test_async_scheduling_executor_per_release():
    (f,) = errors(_async("0.10.2", distributed_executor_backend="uni"), "async_scheduling_unsupported")
    assert f.message == "Async scheduling is not supported with uni-process backend."
    for version in ("0.11.2", "0.13.0", "0.15.1", "0.18.1"):
        (f,) = errors(_async(version, distributed_executor_backend="ray"), "async_scheduling_unsupported")
        assert f.remedy == {"distributed_executor_backend": "mp"}
        assert not errors(_async(version, distributed_executor_backend="uni"), "async_scheduling_unsupported")
    # from 0.21 the executor class answers: not judged
    assert not errors(_async("0.21.0", distributed_executor_backend="ray"), "async_scheduling_unsupported")
