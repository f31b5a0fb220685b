"""The tensor-parallel head rule (service/domain/rules/parallel.py) on a vision tower: heads that do not split
over TP are refused, unless vLLM replicates that tower's attention."""

from __future__ import annotations

from tests.support import request
from tests.support.rules import errors


def _vlm(vision_type: str, heads: int) -> dict:
    req = request("Qwen__Qwen2.5-72B-Instruct", count=8, tensor_parallel_size=8)
    req["model"]["config"]["vision_config"] = {
        "model_type": vision_type,
        "num_attention_heads": heads,
        "hidden_size": 3200,
    }
    return req


def test_vision_tower_heads_divisible():
    (f,) = errors(_vlm("siglip_vision_model", 12), "tp_heads_divisible")
    assert "vision tower" in f.message and f.remedy["tensor_parallel_size"] == [1, 2, 4]


def test_internvit_falls_back_to_replicated_attention():
    # InternVL3-78B: 25-head InternViT at TP=8 is replicated, not refused (vllm 0.33.0
    # vllm/model_executor/models/intern_vit.py falls back to replicated attention)
    assert errors(_vlm("intern_vit_6b", 25), "tp_heads_divisible") == []


def test_world_size_counts_prefill_context_parallel():
    """vLLM's world is PP × TP × PCP (vllm 0.33.0 vllm/config/parallel.py:964-968)."""
    req = request("meta-llama__Llama-3.1-8B-Instruct", count=2, tensor_parallel_size=2, prefill_context_parallel_size=2)
    (f,) = errors(req, "world_size_exceeds_gpus")
    assert f.message.startswith("World size (4 = TP 2 × PP 1 × PCP 2 × DP 1) is larger than")
    ok = request("meta-llama__Llama-3.1-8B-Instruct", count=4, tensor_parallel_size=2, prefill_context_parallel_size=2)
    assert not errors(ok, "world_size_exceeds_gpus")
