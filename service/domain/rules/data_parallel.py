"""Data-parallel launch options: external and hybrid load balancing, ranks and local sizes, as vLLM reads them
before it builds ParallelConfig (vllm 0.33.0 vllm/engine/arg_utils.py:2380-2525; vllm/config/parallel.py:546-555,
1012-1022). Each check applies from the oldest release line read that makes it; the message is that line's."""

from __future__ import annotations

from typing import Any

from ..context import LaunchContext
from ..findings import Finding
from . import Emit, rule
from .gating import at_least, effective, for_line, vllm_checks, whole

SRC_DP_EXT = "vllm 0.33.0 vllm/engine/arg_utils.py:2456-2465 (since 0.9.2 the rank makes the launch external)"
SRC_DP = (
    "vllm 0.33.0 vllm/engine/arg_utils.py:2383-2389, 2447-2482, 2518-2525; vllm/config/parallel.py:546-555, 1012-1022 "
    "(local size, rank range and DP > 1 for an external rank since 0.9.2 config.py:1959-1983; hybrid LB needs a "
    "local size since 0.10.2 arg_utils.py:1250-1253; load-balancing modes since 0.11.2 arg_utils.py:1457-1545; the "
    "0.33 messages since 0.28.0; the lines per check: service/data/vllm/checks/check_lines.json)"
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
    (0, 10): "data_parallel_size_local must be set to use data_parallel_hybrid_lb.",
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
    if (
        a.get("data_parallel_hybrid_lb")
        and a.get("data_parallel_external_lb")
        and vllm_checks(ctx, "dp_lb_modes_exclusive")
    ):
        out.append(("dp_lb_mode", for_line(ctx, MODES), {"data_parallel_hybrid_lb": False}, "data_parallel_hybrid_lb"))
    inferred = int(a.get("nnodes", 1)) > 1 and dp > 1  # the rank follows from --node-rank (arg_utils.py:2424-2441)
    if a.get("data_parallel_external_lb") and a.get("data_parallel_rank") is None and not inferred:
        if vllm_checks(ctx, "dp_external_needs_rank"):
            out.append(
                ("dp_external_rank", for_line(ctx, NEEDS_RANK), {"data_parallel_rank": 0}, "data_parallel_external_lb")
            )
    local = whole(a.get("data_parallel_size_local"))
    if local is not None and local != 1 and vllm_checks(ctx, "dp_external_local_one"):
        text = for_line(ctx, LOCAL_ONE).format(local=local)
        out.append(("dp_external_rank", text, {"data_parallel_size_local": 1}, "data_parallel_size_local"))
    if dp <= 1 and vllm_checks(ctx, "dp_external_needs_dp"):
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
    if rank is None or dp <= 1 or 0 <= rank < dp or not vllm_checks(ctx, "dp_rank_range"):
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
        if a.get("data_parallel_hybrid_lb") and vllm_checks(ctx, "dp_hybrid_needs_local"):
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
    if local > dp and vllm_checks(ctx, "dp_local_at_most_dp"):
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


SRC_FT = "vllm 0.33.0 vllm/engine/arg_utils.py:2447-2456 (since 0.28.0 arg_utils.py:2114-2122, with the option)"


@rule("dp_fault_tolerance", severity="error", source=SRC_FT, when=("enable_fault_tolerance",))
def dp_fault_tolerance(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--enable-fault-tolerance`` works with external load balancing only: it needs ``--data-parallel-external-lb``
    or a ``--data-parallel-rank`` (from 0.28)."""
    if "enable_fault_tolerance" not in ctx.args.given:
        return []
    if not ctx.args.get("enable_fault_tolerance") or _external(ctx) or not at_least(ctx, (0, 28)):
        return []
    return [
        emit.error(
            "dp_fault_tolerance",
            "Fault tolerance requires external load balancer mode (--data-parallel-external-lb or "
            "--data-parallel-rank). Internal LB mode is not supported.",
            remedy={"enable_fault_tolerance": False},
            field="engine_args.enable_fault_tolerance",
        )
    ]


SRC_MULTI_PORT = (
    "vllm 0.33.0 vllm/entrypoints/launchers/dp_supervisor.py:41-115, called by "
    "vllm/entrypoints/common/cli_args.py:573-578 (the same since 0.24.0 entrypoints/openai/dp_supervisor.py:37-108)"
)


def _multi_port_problems(ctx: LaunchContext) -> list[tuple[str, dict[str, Any], str]]:
    """What ``validate_multi_port_external_lb_args`` refuses, each check that reads only the launch's options."""
    a, dp = ctx.args, ctx.args.data_parallel_size
    out: list[tuple[str, dict[str, Any], str]] = []
    if a.get("grpc"):
        out.append(("Error: --data-parallel-multi-port-external-lb does not support --grpc", {"grpc": False}, "grpc"))
    if a.get("uds") is not None:
        out.append(("Error: --data-parallel-multi-port-external-lb does not support --uds", {"drop": ["uds"]}, "uds"))
    if whole(a.get("api_server_count")) not in (None, 1):
        text = "Error: --data-parallel-multi-port-external-lb currently requires --api-server-count=1"
        out.append((text, {"api_server_count": 1}, "api_server_count"))
    if a.get("data_parallel_rank") is not None:
        text = "Error: --data-parallel-multi-port-external-lb manages child --data-parallel-rank values internally"
        out.append((text, {"drop": ["data_parallel_rank"]}, "data_parallel_rank"))
    if a.get("data_parallel_external_lb") or a.get("data_parallel_hybrid_lb"):
        text = (
            "Error: --data-parallel-multi-port-external-lb cannot be combined with --data-parallel-external-lb or "
            "--data-parallel-hybrid-lb"
        )
        out.append(
            (text, {"data_parallel_external_lb": False, "data_parallel_hybrid_lb": False}, "data_parallel_external_lb")
        )
    if dp < 2:
        text = "Error: --data-parallel-multi-port-external-lb requires --data-parallel-size > 1"
        out.append((text, {"data_parallel_size": 2}, "data_parallel_size"))
        return out  # the local-size checks below compare with DP
    local = whole(a.get("data_parallel_size_local"))
    if local is None or local < 2:
        text = "Error: --data-parallel-multi-port-external-lb requires --data-parallel-size-local >= 2"
        out.append((text, {"data_parallel_size_local": dp}, "data_parallel_size_local"))
    elif local > dp:
        text = "Error: --data-parallel-size-local cannot exceed --data-parallel-size"
        out.append((text, {"data_parallel_size_local": dp}, "data_parallel_size_local"))
    elif dp % local:
        text = "Error: --data-parallel-size must be divisible by --data-parallel-size-local"
        out.append(
            (
                text,
                {"data_parallel_size_local": [d for d in range(2, dp + 1) if dp % d == 0]},
                "data_parallel_size_local",
            )
        )
    else:
        out += _multi_port_ranks(ctx, local)
    return out


def _multi_port_ranks(ctx: LaunchContext, local: int) -> list[tuple[str, dict[str, Any], str]]:
    """The supervised ranks stay below DP and their ports clear the supervisor's (dp_supervisor.py:41-48, 97-115)."""
    a = ctx.args
    start = whole(a.get("data_parallel_start_rank"))
    if start is None:
        start = (whole(a.get("node_rank")) or 0) * local
    out: list[tuple[str, dict[str, Any], str]] = []
    if start + local > a.data_parallel_size:
        text = "Error: multi-port supervised ranks would exceed --data-parallel-size"
        name = "data_parallel_start_rank" if "data_parallel_start_rank" in a.given else "node_rank"
        out.append((text, {name: max(0, a.data_parallel_size - local) if name != "node_rank" else 0}, name))
    port, supervisor = whole(effective(ctx, "port")), whole(effective(ctx, "data_parallel_supervisor_port"))
    if port is not None and supervisor is not None and port <= supervisor <= port + local - 1:
        text = (
            f"Error: --data-parallel-supervisor-port {supervisor} overlaps with child rank ports "
            f"{port}-{port + local - 1}"
        )
        out.append((text, {"data_parallel_supervisor_port": port + local}, "data_parallel_supervisor_port"))
    return out


@rule("dp_multi_port", severity="error", source=SRC_MULTI_PORT, when=("data_parallel_multi_port_external_lb",))
def dp_multi_port(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--data-parallel-multi-port-external-lb`` (from 0.24) supervises one server per local DP rank: no ``--grpc``,
    ``--uds``, other load-balancing mode or ``--data-parallel-rank``, one API server, data_parallel_size > 1 and a
    ``--data-parallel-size-local`` of at least 2 dividing it."""
    if "data_parallel_multi_port_external_lb" not in ctx.args.given:
        return []
    if not ctx.args.get("data_parallel_multi_port_external_lb") or not at_least(ctx, (0, 24)):
        return []
    return [emit.error("dp_multi_port", t, remedy=r, field=f"engine_args.{n}") for t, r, n in _multi_port_problems(ctx)]
