"""Data-parallel launch options: external and hybrid load balancing, ranks and local sizes, as vLLM reads them
before it builds ParallelConfig (vllm 0.33.0 vllm/engine/arg_utils.py:2380-2525; vllm/config/parallel.py:546-555,
1012-1022). Each check applies from the oldest release line read that makes it; the message is that line's."""

from __future__ import annotations

from typing import Any

from ..context import LaunchContext
from ..findings import Finding
from . import Emit, rule
from .gating import at_least, for_line, whole

SRC_DP_EXT = "vllm 0.33.0 vllm/engine/arg_utils.py:2456-2465 (since 0.9.2 the rank makes the launch external)"
SRC_DP = (
    "vllm 0.33.0 vllm/engine/arg_utils.py:2383-2389, 2447-2482, 2518-2525; vllm/config/parallel.py:546-555, 1012-1022 "
    "(local size and rank range since 0.9.2 config.py:1959-1972; load-balancing modes since 0.11.2 "
    "arg_utils.py:1457-1545, parallel.py:287-290; the 0.33 messages since 0.28.0)"
)

MODES = {
    (0, 11): "data_parallel_hybrid_lb and data_parallel_external_lb cannot both be True.",
    (0, 28): "Invalid data-parallel launch options: `--data-parallel-hybrid-lb` and `--data-parallel-external-lb` "
    "cannot be enabled together. Enable only one load-balancing mode.",
}
NEEDS_RANK = {
    (0, 11): "data_parallel_rank or node_rank must be spefified if data_parallel_external_lb is enable.",
    (0, 13): "data_parallel_rank or node_rank must be specified if data_parallel_external_lb is enable.",
    (0, 28): "Invalid data-parallel launch options: `--data-parallel-external-lb` requires a data-parallel rank. Set "
    "`--data-parallel-rank`, or set `--data-parallel-size` greater than 1 and use `--nnodes` with `--node-rank` so "
    "the rank can be inferred.",
}
LOCAL_ONE = {
    (0, 9): "data_parallel_size_local must be 1 when data_parallel_rank is set",
    (0, 11): "data_parallel_size_local must be 1 or None when data_parallel_rank is set",
    (0, 28): "Invalid data-parallel launch options: an external data-parallel rank requires "
    "`--data-parallel-size-local 1`; got {local}. Set it to 1 or omit it.",
}
HYBRID_LOCAL = {
    (0, 11): "data_parallel_size_local must be set to use data_parallel_hybrid_lb.",
    (0, 28): "Invalid data-parallel launch options: `--data-parallel-hybrid-lb` requires `--data-parallel-size-local`. "
    "Set it to the number of data-parallel ranks on this node.",
}


def _external(ctx: LaunchContext) -> bool:
    """External load balancing: ``--data-parallel-external-lb`` (from 0.11), or a ``--data-parallel-rank``."""
    return bool(ctx.args.get("data_parallel_external_lb")) or ctx.args.get("data_parallel_rank") is not None


@rule("dp_external_dense", severity="error", source=SRC_DP_EXT, when=("data_parallel_size",))
def dp_external_dense(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """External-load-balancer data parallel (``--data-parallel-rank`` / ``--data-parallel-external-lb`` with
    data_parallel_size > 1) is for MoE models only."""
    if ctx.facts.is_moe or ctx.args.data_parallel_size <= 1 or not _external(ctx):
        return []
    return [
        emit.error(
            "dp_external_dense",
            "Non-MoE models do not support external data parallel mode. For external load balancing, launch independent "
            "vLLM instances without --data-parallel-* arguments.",
            remedy={"drop": ["data_parallel_rank", "data_parallel_external_lb"]},
            field="engine_args.data_parallel_rank",
        )
    ]


Problem = tuple[str, str, dict[str, Any], str]  # (code, message, remedy, field)


def _external_problems(ctx: LaunchContext) -> list[Problem]:
    """An external rank: both load-balancing modes at once, no rank to use, a local size other than 1, a DP size of
    one (arg_utils.py:2383-2389, 2468-2482; parallel.py:551-555)."""
    a, dp = ctx.args, ctx.args.data_parallel_size
    out: list[Problem] = []
    if a.get("data_parallel_hybrid_lb") and a.get("data_parallel_external_lb") and at_least(ctx, (0, 11)):
        out.append(("dp_lb_mode", for_line(ctx, MODES), {"data_parallel_hybrid_lb": False}, "data_parallel_hybrid_lb"))
    inferred = int(a.get("nnodes", 1)) > 1 and dp > 1  # the rank follows from --node-rank (arg_utils.py:2424-2441)
    if a.get("data_parallel_external_lb") and a.get("data_parallel_rank") is None and not inferred:
        if at_least(ctx, (0, 11)):
            out.append(
                ("dp_external_rank", for_line(ctx, NEEDS_RANK), {"data_parallel_rank": 0}, "data_parallel_external_lb")
            )
    local = whole(a.get("data_parallel_size_local"))
    if local is not None and local != 1 and at_least(ctx, (0, 9)):
        text = for_line(ctx, LOCAL_ONE).format(local=local)
        out.append(("dp_external_rank", text, {"data_parallel_size_local": 1}, "data_parallel_size_local"))
    if dp <= 1 and at_least(ctx, (0, 11)):
        out.append(
            (
                "dp_external_rank",
                "data_parallel_external_lb can only be set when data_parallel_size > 1",
                {"drop": ["data_parallel_rank", "data_parallel_external_lb"]},
                "data_parallel_rank" if a.get("data_parallel_rank") is not None else "data_parallel_external_lb",
            )
        )
    return out


def _rank_problems(ctx: LaunchContext, rank: int | None, name: str) -> list[Problem]:
    """The rank vLLM passes on lies in [0, data_parallel_size) (parallel.py:1012-1022; checked when DP > 1)."""
    dp = ctx.args.data_parallel_size
    if rank is None or dp <= 1 or 0 <= rank < dp or not at_least(ctx, (0, 9)):
        return []
    text = f"data_parallel_rank ({rank}) must be in the range [0, {dp})"
    return [("dp_rank_range", text, {name: min(max(rank, 0), dp - 1)}, name)]


def dp_problems(ctx: LaunchContext) -> list[Problem]:
    """Every data-parallel launch problem, in the order vLLM meets them."""
    a, dp = ctx.args, ctx.args.data_parallel_size
    if _external(ctx):
        return _external_problems(ctx) + _rank_problems(ctx, whole(a.get("data_parallel_rank")), "data_parallel_rank")
    local = whole(a.get("data_parallel_size_local"))
    if local is None:
        if a.get("data_parallel_hybrid_lb") and at_least(ctx, (0, 11)):
            return [
                (
                    "dp_lb_mode",
                    for_line(ctx, HYBRID_LOCAL),
                    {"data_parallel_size_local": max(1, ctx.gpus_per_node // max(1, ctx.args.world_size))},
                    "data_parallel_hybrid_lb",
                )
            ]
        return []
    out: list[Problem] = []
    if local > dp and at_least(ctx, (0, 9)):
        text = f"data_parallel_size_local ({local}) must be <= data_parallel_size ({dp})"
        out.append(("dp_size_local", text, {"data_parallel_size_local": dp}, "data_parallel_size_local"))
    start = whole(a.get("data_parallel_start_rank"))
    return out + _rank_problems(ctx, start, "data_parallel_start_rank")


@rule(
    "dp_lb_mode",
    "dp_external_rank",
    "dp_size_local",
    "dp_rank_range",
    severity="error",
    source=SRC_DP,
    when=("data_parallel_external_lb", "data_parallel_rank", "data_parallel_size_local", "data_parallel_hybrid_lb"),
)
def dp_launch_options(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Data-parallel launch options that must agree: hybrid and external load balancing exclude each other; an
    external launch needs a rank (or ``--nnodes`` with ``--node-rank`` to infer it), a local size of 1 and DP > 1;
    hybrid load balancing needs ``--data-parallel-size-local``; the local size may not exceed data_parallel_size; a
    rank lies in [0, data_parallel_size)."""
    return [
        emit.error(code, message, remedy=remedy, field=f"engine_args.{name}")
        for code, message, remedy, name in dp_problems(ctx)
    ]
