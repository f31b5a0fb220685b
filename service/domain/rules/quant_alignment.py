"""Per-rank alignment of quantized weights: int4/int8 quant groups (AWQ, GPTQ, compressed-tensors WNA16) and
FP8 weight blocks must not straddle a tensor-parallel shard (vllm 0.33.0
vllm/model_executor/layers/quantization/auto_awq.py:819-832; utils/marlin_utils.py:306-325;
utils/fp8_utils.py:1296-1344; vllm/distributed/utils.py:137-152)."""

from __future__ import annotations

from ..context import LaunchContext
from ..findings import Finding
from . import Emit, rule
from .parallel import tp_candidates
from .quant_checks import resolved_method
from .shapes import Linear, ignored, linear_layers

SRC_GROUP = (
    "vllm 0.33.0 vllm/model_executor/layers/quantization/auto_awq.py:819-832; utils/marlin_utils.py:306-325; "
    "vllm/distributed/utils.py:137-152; kernels/linear/mixed_precision/marlin.py:57-66"
)
SRC_BLOCK = (
    "vllm 0.33.0 vllm/model_executor/layers/quantization/utils/fp8_utils.py:1296-1344; DeepSeek-V4 MLPs padded to "
    "whole blocks: vllm/models/deepseek_v4/nvidia/model.py:143-152, 1070-1092, 1171-1193"
)


def _group_info(ctx: LaunchContext) -> tuple[int, list[str] | None, str] | None:
    """(group_size, ignore patterns, match mode) for a grouped int4/int8 checkpoint, else None."""
    q = ctx.facts.quant
    method = resolved_method(ctx)
    if q is None or q.group_size is None or q.group_size <= 0:
        return None
    if method in ("auto_awq", "auto_gptq", "moe_wna16"):
        return q.group_size, q.raw.get("modules_to_not_convert"), "substring"
    if method == "compressed-tensors" and q.bits in (4, 8):
        # WNA16 / W4A8 / wNa8o8 integer groups (strategy "group"); float schemes have no straddle rule
        for grp in (q.raw.get("config_groups") or {}).values():
            w = (grp or {}).get("weights") or {}
            if w.get("type") == "int" and w.get("strategy") in ("group", "tensor_group", None):
                return q.group_size, q.raw.get("ignore"), "ct"
    return None


def group_misaligned(ctx: LaunchContext, tp: int) -> list[tuple[Linear, int]]:
    """Row-parallel dense layers whose per-rank input is not a whole number of quant groups at ``tp``.

    Routed experts are exempt: Marlin MoE pads, and what it refuses falls back to the MoE-WNA16 kernel (vllm
    0.33.0 quantization/utils/marlin_utils.py:335-397; auto_awq.py:345-358; auto_gptq.py:241-250). A group as
    large as the whole input (or ``-1``) never straddles."""
    gi = _group_info(ctx)
    if gi is None:
        return []
    g, ignore, mode = gi
    bad = []
    for lin in linear_layers(ctx, tp):
        if lin.kind != "row" or lin.moe or not lin.exact or lin.ranks == 1:
            continue
        if g >= lin.full_in or ignored(lin.name, ignore, mode):
            continue
        if lin.in_rank % g:
            bad.append((lin, g))
    return bad


@rule("quant_group_alignment", severity="error", source=SRC_GROUP)
def quant_group_alignment(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Every row-parallel layer of a grouped int4/int8 checkpoint (AWQ, GPTQ, compressed-tensors WNA16) must get a
    whole number of quant groups per TP rank: ``(K / TP) % group_size == 0`` for ``o_proj`` and ``down_proj``
    (dense and shared-expert MLPs). AWQ then raises "The input size is not aligned with the quantized weight shape";
    GPTQ silently floors the scale rows (wrong output) — both are rejected.
    """
    bad = group_misaligned(ctx, ctx.tp)
    if not bad:
        return []
    ok = [t for t in tp_candidates(ctx) if not group_misaligned(ctx, t)]
    lin, g = bad[0]
    method = resolved_method(ctx)
    vllm_text = (
        "The input size is not aligned with the quantized weight shape. This can be caused by too large "
        "tensor parallel size."
        if method == "auto_awq"
        else f"Weight input_size_per_partition={lin.in_rank} is not divisible by group_size={g}."
    )
    layers = ", ".join(f"{b.name.rsplit('.', 2)[-2]}.{b.name.rsplit('.', 1)[-1]} K={b.full_in}" for b, _ in bad)
    return [
        emit.error(
            "quant_group_alignment",
            f"{vllm_text} At tensor_parallel_size={ctx.tp} the row-parallel {lin.name.rsplit('.', 1)[-1]} input "
            f"{lin.full_in} splits into {lin.in_rank} per rank = {lin.in_rank / g:g} groups of {g} (a group straddles "
            f"the shard). Affected: {layers}. Tensor parallel sizes that keep whole groups: {ok}.",
            remedy={"tensor_parallel_size": ok},
            field="engine_args.tensor_parallel_size",
            group_size=g,
            input_size=lin.full_in,
            input_size_per_partition=lin.in_rank,
        )
    ]


def pads_to_blocks(ctx: LaunchContext, lin: Linear) -> bool:
    """DeepSeek-V4's MLPs (``DeepseekV4MLP``: its shared experts, and any dense MLP) round each rank's
    intermediate up to whole FP8 blocks (``cdiv(I / block, TP)`` blocks per rank) and the loader zero-pads the
    checkpoint's weights and scales to that size, so no TP size misaligns them. That is the CUDA model (vllm 0.33.0
    vllm/models/deepseek_v4/nvidia/model.py:143-152, 1070-1092, 1171-1193); the ROCm one builds them unpadded
    (amd/model.py:97-130) and is judged like any other."""
    return ctx.facts.model_type == "deepseek_v4" and ctx.gpu.vendor == "NVIDIA" and not lin.moe and ".mlp." in lin.name


def block_misaligned(ctx: LaunchContext, tp: int) -> list[tuple[Linear, str, int, int]]:
    """Dense and shared-expert layers whose per-rank dims are not multiples of the FP8 block at ``tp``:
    column-parallel output partitions % block_n, row-parallel input % block_k. Routed experts are exempt in 0.33
    (the Triton MoE path refines the scale blocks). The fused GQA ``qkv_proj`` is not judged: its
    per-rank partitions follow head counts and replicated KV heads, and vLLM 0.33 loads such layers
    (MiMo-V2-Flash, head_dim 192, loads at TP=16)."""
    q = ctx.facts.quant
    if q is None or q.weight_block_size is None:
        return []
    bn, bk = q.weight_block_size
    ignore = q.raw.get("ignored_layers") or q.raw.get("modules_to_not_convert")
    bad = []
    for lin in linear_layers(ctx, tp):
        if lin.moe or not lin.exact or lin.ranks == 1 or ignored(lin.name, ignore, "substring"):
            continue
        if pads_to_blocks(ctx, lin):
            continue
        if lin.name.endswith("qkv_proj"):
            continue  # fused GQA QKV: per-head partitions, not judged (see block_misaligned docstring)
        if lin.kind == "row" and lin.in_rank % bk:
            bad.append((lin, "k", lin.in_rank, bk))
        elif lin.kind == "column":
            for part in lin.parts_out:
                if part % bn:
                    bad.append((lin, "n", part, bn))
                    break
    return bad


@rule("fp8_block_alignment", severity="error", source=SRC_BLOCK)
def fp8_block_alignment(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """With an FP8 ``weight_block_size`` [block_n, block_k], every dense and shared-expert layer's per-rank output
    partition must be a multiple of block_n and every row-parallel per-rank input a multiple of block_k
    (DeepSeek-V3/R1 at TP=32: 18432/32 = 576, 576 % 128 ≠ 0). Routed MoE experts are refined by the Triton MoE path
    in 0.33 and are not checked; DeepSeek-V4's MLPs pad each rank to whole blocks on CUDA (``pads_to_blocks``).
    """
    bad = block_misaligned(ctx, ctx.tp)
    block_size = ctx.facts.quant.weight_block_size if ctx.facts.quant else None
    if not bad or block_size is None:
        return []
    ok = [t for t in tp_candidates(ctx) if not block_misaligned(ctx, t)]
    lin, axis, size, block = bad[0]
    if axis == "k":
        text = f"Weight input_size_per_partition = {size} is not divisible by weight quantization block_k = {block}."
    else:
        text = f"Weight output_partition_size = {size} is not divisible by weight quantization block_n = {block}."
    layers = "; ".join(
        f"{b.name.split('.', 3)[-1]} ({'in' if ax == 'k' else 'out'} {s} per rank)" for b, ax, s, _ in bad
    )
    return [
        emit.error(
            "fp8_block_alignment",
            f"{text} At tensor_parallel_size={ctx.tp}: {layers}. Tensor parallel sizes that keep whole blocks: {ok}.",
            remedy={"tensor_parallel_size": ok},
            field="engine_args.tensor_parallel_size",
            weight_block_size=list(block_size),
        )
    ]
