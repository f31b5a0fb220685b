"""The dtype rules (service/domain/rules/dtype.py): float16-forbidden model types and float16 on a bfloat16
checkpoint."""

from __future__ import annotations

from tests.support import request
from tests.support.rules import errors, found


def test_gemma_fp16_forbidden():
    cfg = {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "hidden_size": 3584,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "num_hidden_layers": 42,
        "intermediate_size": 14336,
        "vocab_size": 256000,
        "max_position_embeddings": 8192,
        "torch_dtype": "float32",
    }
    req = request("meta-llama__Llama-3.1-8B-Instruct", gpu="l4-24gb", count=1, dtype="float16")
    req["model"]["config"] = cfg
    (f,) = errors(req, "fp16_forbidden")
    assert "'gemma2' does not support float16" in f.message
    req["engine_args"] = {}
    assert errors(req, "fp16_forbidden") == []


def test_fp16_on_bf16_checkpoint_warns():
    (f,) = found(request("meta-llama__Llama-3.1-8B-Instruct", count=1, dtype="half"), "fp16_overflow")
    assert f.severity.value == "warning"
    assert found(request("meta-llama__Llama-3.1-8B-Instruct", count=1, dtype="bfloat16"), "fp16_overflow") == []
