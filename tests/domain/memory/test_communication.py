"""Non-torch memory (service/domain/memory/communication.py): the communication buffers at TP > 1."""

from __future__ import annotations

from tests.support.memory import budget


def test_non_torch_memory_larger_at_tp_gt_1():
    _, one = budget("meta-llama__Meta-Llama-3.1-8B", tensor_parallel_size=1)
    _, two = budget("meta-llama__Meta-Llama-3.1-8B", tensor_parallel_size=2)
    assert two.non_torch_bytes > one.non_torch_bytes
