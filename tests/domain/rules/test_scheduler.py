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
