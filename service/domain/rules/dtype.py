"""dtype rules: model types vLLM refuses in float16, and casts between float16 and bfloat16
(vllm 0.33.0 vllm/config/model.py:2397-2420, 2507-2516; docs/operating.md §8)."""

from __future__ import annotations

from ..context import DTYPE_ALIASES, FP16_FORBIDDEN_MODEL_TYPES, LaunchContext
from ..findings import Finding
from . import Emit, rule

SRC_FORBIDDEN = "vllm 0.33.0 vllm/config/model.py:2397-2420"
SRC_CAST = "vllm 0.33.0 vllm/config/model.py:2507-2516; docs/operating.md §8"


def _model_types(ctx: LaunchContext) -> set[str]:
    types = {ctx.facts.model_type, ctx.request.model.config.get("model_type") if ctx.request.model.config else None}
    return {t for t in types if t}


@rule("fp16_forbidden", severity="error", source=SRC_FORBIDDEN)
def fp16_forbidden(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """float16 is refused for gemma2, gemma3, gemma3_text and glm4 (numerical instability).

    vLLM: "The model type {model_type!r} does not support float16. Reason: Numerical instability. Please use
    bfloat16 or float32 instead."
    """
    if ctx.dtype != "float16":
        return []
    bad = sorted(_model_types(ctx) & FP16_FORBIDDEN_MODEL_TYPES)
    if not bad:
        return []
    fix = "bfloat16" if ctx.gpu.compute_capability is None or ctx.gpu.compute_capability >= (8, 0) else "float32"
    return [
        emit.error(
            "fp16_forbidden",
            f"The model type {bad[0]!r} does not support float16. Reason: Numerical instability. Please use bfloat16 or "
            f"float32 instead.",
            remedy={"dtype": fix},
            field="engine_args.dtype",
        )
    ]


@rule("fp16_overflow", "dtype_cast", severity="warning", source=SRC_CAST)
def fp16_overflow(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """An explicit ``--dtype float16`` on a bfloat16 checkpoint: vLLM casts with a warning and activations can
    overflow (garbage text, NaN) — ``fp16_overflow`` warning. An explicit bfloat16 on a float16 checkpoint is a
    cast too (``dtype_cast`` info)."""
    requested = DTYPE_ALIASES.get(str(ctx.args.get("dtype", "auto")).lower(), "auto")
    ckpt = ctx.facts.torch_dtype
    if requested == "float16" and ckpt == "bfloat16":
        if _model_types(ctx) & FP16_FORBIDDEN_MODEL_TYPES:
            return []  # fp16_forbidden already refuses it
        return [
            emit.warning(
                "fp16_overflow",
                "Casting torch.bfloat16 to torch.float16. The checkpoint was trained in bfloat16; float16's smaller range "
                "can overflow (garbage text, NaN). Keep --dtype auto (bfloat16) where the GPU supports it.",
                remedy={"dtype": "auto"} if ctx.gpu.bf16 or ctx.gpu.compute_capability is None else None,
                field="engine_args.dtype",
            )
        ]
    if requested == "bfloat16" and ckpt == "float16":
        return [
            emit.info(
                "dtype_cast",
                "Casting torch.float16 to torch.bfloat16.",
                remedy=None,
                field="engine_args.dtype",
            )
        ]
    return []
