"""GPU capability, bfloat16, float16-forbidden model types, dtype casts and KV-cache dtypes on real configs."""

from __future__ import annotations

import pytest

from tests.support.rules import FIXTURES, errors, found
from tests.support import request

FAMILY = ("gpu_min_capability", "bf16_capability", "fp16_forbidden", "kv_dtype_invalid", "kv_dtype_capability")
GPUS = ("h100-sxm-80gb", "a100-sxm4-80gb", "l40s-48gb", "h200-141gb")


@pytest.mark.parametrize("model", FIXTURES)
@pytest.mark.parametrize("gpu", GPUS)
def test_accept_side_fixture_models_default_dtype(model, gpu):
    assert errors(request(model, gpu=gpu, count=8, nodes=2, tensor_parallel_size=8,
                          distributed_executor_backend="ray"), *FAMILY) == []


@pytest.mark.parametrize("gpu", ("v100-32gb", "v100-16gb"))
def test_v100_cannot_run_033(gpu):
    (f,) = errors(request("meta-llama__Llama-3.1-8B-Instruct", gpu=gpu, count=1, dtype="float16"),
                  "gpu_min_capability")
    assert "7.0" in f.message and f.remedy == {"min_compute_capability": 75}


def test_v100_fine_on_old_line():
    req = request("meta-llama__Llama-3.1-8B-Instruct", gpu="v100-32gb", count=1, dtype="float16")
    req["vllm_version"] = "0.10.1"
    assert errors(req, "gpu_min_capability") == []


def test_bf16_explicit_on_t4_is_error_auto_is_info():
    (f,) = errors(request("meta-llama__Llama-3.1-8B-Instruct", gpu="t4-16gb", count=1, dtype="bfloat16"),
                  "bf16_capability")
    assert "compute capability 7.5" in f.message and f.remedy == {"dtype": "float16"}
    auto = found(request("meta-llama__Llama-3.1-8B-Instruct", gpu="t4-16gb", count=1), "bf16_capability")
    assert [x.severity.value for x in auto] == ["info"] and "Falling back to torch.float16" in auto[0].message


def test_gemma_fp16_forbidden():
    cfg = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 3584,
           "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "num_hidden_layers": 42,
           "intermediate_size": 14336, "vocab_size": 256000, "max_position_embeddings": 8192,
           "torch_dtype": "float32"}
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


def test_kv_dtype_values():
    assert errors(request("meta-llama__Llama-3.1-8B-Instruct", count=1, kv_cache_dtype="fp4"), "kv_dtype_invalid")
    (f,) = errors(request("meta-llama__Llama-3.1-8B-Instruct", count=1, kv_cache_dtype="float16"), "kv_dtype_invalid")
    assert 'dtype="bfloat16"' in f.message
    assert not errors(request("meta-llama__Llama-3.1-8B-Instruct", count=1, kv_cache_dtype="bfloat16"),
                      "kv_dtype_invalid")


def test_kv_fp8_backend_and_gpu():
    base = "meta-llama__Llama-3.1-8B-Instruct"
    assert not errors(request(base, count=1, kv_cache_dtype="fp8"), "kv_dtype_capability")
    on_a100 = found(request(base, gpu="a100-sxm4-80gb", count=1, kv_cache_dtype="fp8"), "kv_dtype_capability")
    assert [f.severity.value for f in on_a100] == ["info"]
    assert errors(request(base, gpu="a100-sxm4-80gb", count=1, kv_cache_dtype="fp8", attention_backend="FLASH_ATTN"),
                  "kv_dtype_capability")
    assert errors(request(base, count=1, kv_cache_dtype="fp8_e5m2", attention_backend="FLASH_ATTN"),
                  "kv_dtype_capability")
    assert not errors(request(base, count=1, kv_cache_dtype="fp8", attention_backend="FLASH_ATTN"),
                      "kv_dtype_capability")


def test_nvfp4_kv_refused_for_mla():
    assert errors(request("deepseek-ai__DeepSeek-V3", tensor_parallel_size=8, kv_cache_dtype="nvfp4"),
                  "kv_dtype_capability")
    assert not errors(request("deepseek-ai__DeepSeek-V3", tensor_parallel_size=8, kv_cache_dtype="fp8"),
                      "kv_dtype_capability")
