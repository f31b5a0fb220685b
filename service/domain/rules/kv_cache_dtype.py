"""KV-cache dtype rules: the value must be one vLLM 0.33 knows and agree with the model dtype, and the attention
backend must be able to store it on this GPU (vllm 0.33.0 vllm/config/cache.py:44-67, 468-475;
vllm/config/vllm.py:1492-1508, 3424-3438; vllm/v1/attention/backends/fa_utils.py:282-311)."""

from __future__ import annotations

from ..context import LaunchContext
from ..findings import Finding
from . import Emit, rule
from .gating import at_least

# CacheDType (vllm 0.33.0 vllm/config/cache.py:44-67)
KV_CACHE_DTYPES = (
    "auto",
    "float16",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "nvfp4_ds_mla",
    "turboquant_k8v4",
    "turboquant_4bit_nc",
    "turboquant_k3v4_nc",
    "turboquant_3bit_nc",
    "octave_k3v4",
    "octave_k3v3",
    "octave_k3v3_compact",
    "ultraquant_4bit",
    "int4_per_token_head",
    "int8_per_token_head",
    "fp8_per_token_head",
    "nvfp4",
    "nvfp4_4over6",
)
SRC_INVALID = "vllm 0.33.0 vllm/config/cache.py:468-475; vllm/config/vllm.py:1492-1508"
SRC_HW = (
    "vllm 0.33.0 vllm/v1/attention/backends/fa_utils.py:282-311; flash_attn.py:290-296, 438-445; "
    "vllm/config/vllm.py:3424-3438; fp8_inc: vllm/platforms/cuda.py:452-475, v1/attention/backend.py:114-119, 306-307 "
    "(no CUDA backend lists it since 0.24.0, whose flash_attn.py:183-193 stopped taking every fp8* dtype)"
)


@rule("kv_dtype_invalid", severity="error", source=SRC_INVALID)
def kv_dtype_invalid(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--kv-cache-dtype`` must be one of vLLM 0.33's cache dtypes, and an explicit float16 / bfloat16 must equal
    the model dtype."""
    kv = ctx.kv_cache_dtype
    if kv not in KV_CACHE_DTYPES:
        return [
            emit.error(
                "kv_dtype_invalid",
                f"Invalid kv_cache_dtype: {kv!r}. Valid values are: {list(KV_CACHE_DTYPES)}",
                remedy={"kv_cache_dtype": "auto"},
                field="engine_args.kv_cache_dtype",
            )
        ]
    if kv in ("float16", "bfloat16") and kv != ctx.dtype:
        return [
            emit.error(
                "kv_dtype_invalid",
                f'kv_cache_dtype="{kv}" is incompatible with dtype="{ctx.dtype}". Please set `--kv-cache-dtype` to auto '
                f"or {ctx.dtype}.",
                remedy={"kv_cache_dtype": "auto"},
                field="engine_args.kv_cache_dtype",
            )
        ]
    return []


@rule("kv_dtype_capability", severity="error", source=SRC_HW)
def kv_dtype_capability(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """The attention backend must store the KV dtype: ``fp8_inc`` (Intel Gaudi's) has no CUDA backend (from 0.24);
    with ``--attention-backend FLASH_ATTN`` an FP8 KV cache needs SM90 or SM100 and ``fp8_e5m2`` is never accepted;
    an ``nvfp4`` KV cache is refused for MLA models. FP8 KV on other GPUs with the automatic backend goes to
    FlashInfer (SM80+) or Triton (info)."""
    kv = ctx.kv_cache_dtype
    if kv == "fp8_inc" and ctx.gpu.vendor.upper() == "NVIDIA" and at_least(ctx, (0, 24)):
        return [
            emit.error(
                "kv_dtype_capability",
                f"No valid attention backend found for cuda with kv_cache_dtype='fp8_inc'. Reasons: every CUDA "
                f"backend: [kv_cache_dtype not supported]. fp8_inc is Intel Gaudi (HPU)'s FP8 KV cache; on "
                f"{ctx.gpu.name} use fp8 (= fp8_e4m3, the same format).",
                remedy={"kv_cache_dtype": "fp8"},
                field="engine_args.kv_cache_dtype",
            )
        ]
    if not kv.startswith(("fp8", "nvfp4")) or kv in ("fp8_ds_mla", "nvfp4_ds_mla"):
        return []
    cc = ctx.gpu.capability_int
    backend = str(ctx.args.get("attention_backend") or "").upper()
    if kv.startswith("nvfp4") and ctx.facts.is_mla:
        return [
            emit.error(
                "kv_dtype_capability",
                "nvfp4 KV cache is not supported with MLA (Multi-head Latent Attention) backends. Please use a different "
                "--kv-cache-dtype (e.g., 'fp8', 'auto', or 'nvfp4_ds_mla' with a sparse MLA backend) for MLA models such "
                "as DeepSeek.",
                remedy={"kv_cache_dtype": "fp8"},
                field="engine_args.kv_cache_dtype",
            )
        ]
    if not kv.startswith("fp8") or cc is None:
        return []
    if backend == "FLASH_ATTN":
        if kv == "fp8_e5m2":
            reason = "FlashAttention never accepts fp8_e5m2 KV cache"
        elif cc // 10 not in (9, 10):
            reason = f"FlashAttention stores FP8 KV only on SM90 (FA3) or SM100 (FA4); this GPU is SM{cc}"
        else:
            return []
        return [
            emit.error(
                "kv_dtype_capability",
                f"Selected backend AttentionBackendEnum.FLASH_ATTN is not valid for this configuration. Reason: "
                f"['{reason}'] (--kv-cache-dtype {kv}).",
                remedy={"attention_backend": None, "kv_cache_dtype": "auto"},
                field="engine_args.attention_backend",
            )
        ]
    if cc // 10 not in (9, 10) and not backend:
        return [
            emit.info(
                "kv_dtype_capability",
                f"FP8 KV cache on SM{cc}: FlashAttention stores FP8 KV only on SM90/SM100, so vLLM selects FlashInfer "
                f"(SM80+) or Triton attention. Using {kv} data type to store kv cache may cause accuracy drop without a "
                f"proper scaling factor.",
                remedy=None,
                field="engine_args.kv_cache_dtype",
            )
        ]
    return []
