"""The KV-cache dtype rules (service/domain/rules/kv_cache_dtype.py): the values vLLM accepts, and FP8 / NVFP4 KV
caches against the attention backend, the GPU and MLA."""

from __future__ import annotations

from tests.support import request
from tests.support.rules import errors, found


def test_kv_dtype_values():
    assert errors(request("meta-llama__Llama-3.1-8B-Instruct", count=1, kv_cache_dtype="fp4"), "kv_dtype_invalid")
    (f,) = errors(request("meta-llama__Llama-3.1-8B-Instruct", count=1, kv_cache_dtype="float16"), "kv_dtype_invalid")
    assert 'dtype="bfloat16"' in f.message
    assert not errors(
        request("meta-llama__Llama-3.1-8B-Instruct", count=1, kv_cache_dtype="bfloat16"), "kv_dtype_invalid"
    )


def test_kv_fp8_backend_and_gpu():
    base = "meta-llama__Llama-3.1-8B-Instruct"
    assert not errors(request(base, count=1, kv_cache_dtype="fp8"), "kv_dtype_capability")
    on_a100 = found(request(base, gpu="a100-sxm4-80gb", count=1, kv_cache_dtype="fp8"), "kv_dtype_capability")
    assert [f.severity.value for f in on_a100] == ["info"]
    assert errors(
        request(base, gpu="a100-sxm4-80gb", count=1, kv_cache_dtype="fp8", attention_backend="FLASH_ATTN"),
        "kv_dtype_capability",
    )
    assert errors(
        request(base, count=1, kv_cache_dtype="fp8_e5m2", attention_backend="FLASH_ATTN"), "kv_dtype_capability"
    )
    assert not errors(
        request(base, count=1, kv_cache_dtype="fp8", attention_backend="FLASH_ATTN"), "kv_dtype_capability"
    )


def test_nvfp4_kv_refused_for_mla():
    assert errors(
        request("deepseek-ai__DeepSeek-V3", tensor_parallel_size=8, kv_cache_dtype="nvfp4"), "kv_dtype_capability"
    )
    assert not errors(
        request("deepseek-ai__DeepSeek-V3", tensor_parallel_size=8, kv_cache_dtype="fp8"), "kv_dtype_capability"
    )


def test_fp8_inc_has_no_cuda_backend():
    base = "meta-llama__Llama-3.1-8B-Instruct"
    (f,) = errors(request(base, count=1, kv_cache_dtype="fp8_inc"), "kv_dtype_capability")
    assert "No valid attention backend found for cuda" in f.message and f.remedy == {"kv_cache_dtype": "fp8"}
    assert not errors(request(base, gpu="mi300x-192gb", count=1, kv_cache_dtype="fp8_inc"), "kv_dtype_capability")
    # before 0.24 FlashAttention took every fp8* dtype on Hopper (0.21.0 flash_attn.py:191-196): not judged
    old = request(base, count=1, kv_cache_dtype="fp8_inc")
    old["vllm_version"] = "0.21.0"
    assert not errors(old, "kv_dtype_capability")
