"""Per-rank alignment of quantized weights: int4/int8 quant groups (AWQ, GPTQ, compressed-tensors WNA16) and
FP8 weight blocks must not straddle a tensor-parallel shard (vllm 0.33.0
vllm/model_executor/layers/quantization/auto_awq.py:819-832; utils/marlin_utils.py:306-325;
utils/fp8_utils.py:1296-1373; fp8.py:547-566; fused_moe/oracle/fp8.py:292-318; vllm/distributed/utils.py:137-152).

The layers' sizes come from the checkpoint's tensors when the request carries their shapes (a manifest's
``tensors.linears``, rules/shapes.py ``checkpoint_layers``): each module's real widths, its group size from its
``scales`` / ``weight_scale``, FP8 block scales from its ``weight_scale_inv``, unquantized modules seen as such; the
finding names the tensor and its shape. Without them, config.json's widths (``linear_layers``). Every finding says
which in ``data.shapes_source``.
"""

from __future__ import annotations

import math

from ..context import LaunchContext
from ..findings import Finding
from . import Emit, rule
from .gating import effective
from .parallel import tp_candidates
from .quant_checks import resolved_method
from .shapes import SHAPES_TENSORS, Linear, checkpoint_layers, ignored, linear_layers, shapes_source

SRC_GROUP = (
    "vllm 0.33.0 vllm/model_executor/layers/quantization/auto_awq.py:819-832; utils/marlin_utils.py:306-325; "
    "vllm/distributed/utils.py:137-152; kernels/linear/mixed_precision/marlin.py:57-66"
)
SRC_BLOCK = (
    "vllm 0.33.0 vllm/model_executor/layers/quantization/utils/fp8_utils.py:1296-1373; linear.py:562-581; "
    "quantization/fp8.py:547-566; fused_moe/oracle/fp8.py:292-318; DeepSeek-V4 MLPs padded to whole blocks: "
    "vllm/models/deepseek_v4/nvidia/model.py:143-152, 1070-1092, 1171-1193"
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
    large as the whole input (or ``-1``) never straddles. From the checkpoint's tensors: each module's input width
    and its group size from its scales (``groups = in / group_size``), a module without scales being unquantized."""
    gi = _group_info(ctx)
    if gi is None:
        return []
    g, ignore, mode = gi
    tensors = checkpoint_layers(ctx, tp)
    bad = []
    for lin in tensors if tensors is not None else linear_layers(ctx, tp):
        if lin.kind != "row" or lin.moe or not lin.exact or lin.ranks == 1:
            continue
        if tensors is not None:
            if lin.quantized not in ("gptq", "awq", "int_pack"):
                continue  # left unquantized (modules_to_not_convert / ignore): no groups
            group = lin.group_size if lin.group_size is not None else g
        elif ignored(lin.name, ignore, mode):
            continue
        else:
            group = g
        if group <= 0 or group >= lin.full_in:
            continue
        if lin.in_rank % group:
            bad.append((lin, group))
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
    source = shapes_source(ctx)
    if source == SHAPES_TENSORS:
        layers = "; ".join(f"{b.shown()} (input {b.full_in})" for b, _ in bad)
    else:
        layers = ", ".join(f"{b.name.rsplit('.', 2)[-2]}.{b.name.rsplit('.', 1)[-1]} K={b.full_in}" for b, _ in bad)
    return [
        emit.error(
            "quant_group_alignment",
            f"{vllm_text} At tensor_parallel_size={ctx.tp} the row-parallel {lin.name.rsplit('.', 1)[-1]} input "
            f"{lin.full_in} splits into {lin.in_rank} per rank = {lin.in_rank / g:g} groups of {g} (a group straddles "
            f"the shard). Affected ({source}): {layers}. Tensor parallel sizes that keep whole groups: {ok}.",
            remedy={"tensor_parallel_size": ok},
            field="engine_args.tensor_parallel_size",
            group_size=g,
            input_size=lin.full_in,
            input_size_per_partition=lin.in_rank,
            shapes_source=source,
            **({"tensor": lin.tensor, "shape": list(lin.shape or ())} if lin.tensor else {}),
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
    """Dense and shared-expert layers whose per-rank dims are not multiples of the FP8 block at ``tp`` (vLLM's
    ``validate_fp8_block_shape``, fp8_utils.py:1296-1344): a row-parallel input % block_k, a column-parallel output
    partition % block_n. A merged layer (QKV, gate/up) with a partition off the block is let through
    (``_maybe_allow_fp8_block_shape_mismatch``, linear.py:562-581: MiMo-V2-Flash's QKV loads at TP=16), one with
    every partition on it passes: merged layers are never refused. Routed experts: ``moe_block_misaligned``. From
    the checkpoint's tensors: the modules whose scales are per block (``weight_scale_inv``), with their real widths;
    modules left in BF16 are not judged."""
    q = ctx.facts.quant
    if q is None or q.weight_block_size is None:
        return []
    bn, bk = q.weight_block_size
    ignore = q.raw.get("ignored_layers") or q.raw.get("modules_to_not_convert")
    tensors = checkpoint_layers(ctx, tp)
    bad = []
    for lin in tensors if tensors is not None else linear_layers(ctx, tp):
        if lin.moe or not lin.exact or lin.ranks == 1 or lin.merged:
            continue
        if tensors is not None and not (lin.quantized == "fp8" and lin.block):
            continue
        if tensors is None and ignored(lin.name, ignore, "substring"):
            continue
        if pads_to_blocks(ctx, lin):
            continue
        if lin.kind == "row" and lin.in_rank % bk:
            bad.append((lin, "k", lin.in_rank, bk))
        elif lin.kind == "column" and lin.parts_out[0] % bn:
            bad.append((lin, "n", lin.parts_out[0], bn))
    return bad


def moe_block_misaligned(ctx: LaunchContext, tp: int) -> tuple[Linear, str, int, int] | None:
    """Routed experts of an FP8 block checkpoint whose per-rank intermediate size is off the block at ``tp``, where
    vLLM cannot adapt: ``fp8`` refines the scale blocks to ``gcd(block_n, block_k, I_rank, hidden)`` when that is at
    least 32 (fused_moe/oracle/fp8.py:292-318, quantization/fp8.py:547-566) and otherwise validates, as
    compressed-tensors always does (compressed_tensors_moe_w8a8_fp8.py:130-140): ``I_rank % block_n`` and, at TP > 1,
    ``I_rank % block_k`` (fp8_utils.py:1347-1373). ``I_rank`` is the expert width over TP × DP without expert
    parallelism, whole with it. A chosen ``--moe-backend`` other than auto may pad instead: not judged."""
    q = ctx.facts.quant
    method = resolved_method(ctx)
    if q is None or q.weight_block_size is None or method not in ("fp8", "compressed-tensors"):
        return None
    if effective(ctx, "moe_backend") not in (None, "auto"):
        return None
    bn, bk = q.weight_block_size
    tensors = checkpoint_layers(ctx, tp)
    experts = [
        lin
        for lin in (tensors if tensors is not None else linear_layers(ctx, tp))
        if lin.moe
        and lin.kind == "column"
        and lin.exact
        and (tensors is None or (lin.quantized == "fp8" and lin.block))
    ]
    for lin in experts:
        ispp, hidden, moe_tp = lin.parts_out[0], lin.full_in, lin.ranks
        if method == "fp8" and (ispp % bn or (moe_tp > 1 and ispp % bk)) and math.gcd(bn, bk, ispp, hidden) >= 32:
            continue  # refined to a finer block the shard holds whole
        if ispp % bn:
            return lin, "moe_n", ispp, bn
        if tp > 1 and ispp % bk:
            return lin, "moe_k", ispp, bk
    return None


def _block_problems(ctx: LaunchContext, tp: int) -> list[tuple[Linear, str, int, int]]:
    moe = moe_block_misaligned(ctx, tp)
    return block_misaligned(ctx, tp) + ([moe] if moe is not None else [])


@rule("fp8_block_alignment", severity="error", source=SRC_BLOCK)
def fp8_block_alignment(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """With an FP8 ``weight_block_size`` [block_n, block_k], every dense and shared-expert layer's per-rank output
    partition must be a multiple of block_n and every row-parallel per-rank input a multiple of block_k
    (DeepSeek-V3/R1 at TP=32: 18432/32 = 576, 576 % 128 ≠ 0); merged layers (QKV, gate/up) are let through.
    Routed experts must split into whole blocks unless vLLM can refine the blocks to at least 32
    (``fp8``; compressed-tensors never refines). DeepSeek-V4's MLPs pad each rank to whole blocks on CUDA
    (``pads_to_blocks``). Sizes from the checkpoint's tensors when the manifest records them, else config.json.
    """
    bad = _block_problems(ctx, ctx.tp)
    block_size = ctx.facts.quant.weight_block_size if ctx.facts.quant else None
    if not bad or block_size is None:
        return []
    ok = [t for t in tp_candidates(ctx) if not _block_problems(ctx, t)]
    lin, axis, size, block = bad[0]
    if axis == "k":
        text = f"Weight input_size_per_partition = {size} is not divisible by weight quantization block_k = {block}."
    elif axis == "n":
        text = f"Weight output_partition_size = {size} is not divisible by weight quantization block_n = {block}."
    elif axis == "moe_n":
        text = (
            f"The output_size of gate's and up's weight = {size} is not divisible by weight quantization "
            f"block_n = {block}."
        )
    else:
        text = f"The input_size of down's weight = {size} is not divisible by weight quantization block_k = {block}."
    source = shapes_source(ctx)

    def where(b: Linear, ax: str, s: int) -> str:
        what = {"k": "in", "n": "out", "moe_n": "expert intermediate", "moe_k": "expert intermediate"}[ax]
        return f"{b.shown() if b.tensor else b.name.split('.', 3)[-1]} ({what} {s} per rank)"

    layers = "; ".join(where(b, ax, s) for b, ax, s, _ in bad)
    hint = ""
    if axis.startswith("moe") and ctx.args.data_parallel_size * ctx.tp > 1 and not ctx.args.enable_expert_parallel:
        hint = " With --enable-expert-parallel the experts are not split."
    return [
        emit.error(
            "fp8_block_alignment",
            f"{text} At tensor_parallel_size={ctx.tp} ({source}): {layers}.{hint} Tensor parallel sizes that keep "
            f"whole blocks: {ok}.",
            remedy={"tensor_parallel_size": ok, **({"enable_expert_parallel": True} if hint else {})},
            field="engine_args.tensor_parallel_size",
            weight_block_size=list(block_size),
            shapes_source=source,
            **({"tensor": lin.tensor, "shape": list(lin.shape or ())} if lin.tensor else {}),
        )
    ]
