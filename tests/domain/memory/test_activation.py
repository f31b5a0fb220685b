"""The activation peak (service/domain/memory/activation.py): the profiled tokens follow max_model_len without
chunked prefill."""

from __future__ import annotations

from tests.support.memory import budget


def test_activation_follows_max_model_len_without_chunked_prefill():
    _, on = budget("meta-llama__Meta-Llama-3.1-8B", count=1, max_model_len=32768)
    _, off = budget("meta-llama__Meta-Llama-3.1-8B", count=1, max_model_len=32768, enable_chunked_prefill=False)
    assert on.profiled_tokens == 8192 and off.profiled_tokens == 32768
    assert off.activation_peak_bytes > on.activation_peak_bytes
