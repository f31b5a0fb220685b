"""Budget rules: the per-GPU memory budget (service/domain/memory/) against what vLLM 0.33 needs at start-up
(the KV fit check: vllm 0.33.0 vllm/v1/core/kv_cache_planning.py:50-87, 1533-1557; memory accounting:
vllm/v1/worker/gpu_worker.py:683-757, vllm/v1/worker/utils.py:716-772; docs/operating.md §5 max_num_seqs bound).

These run in phase ``budget``, after ``ctx.budget`` is computed. GiB figures are printed as vLLM prints them,
``round(b / 2**30, 2)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..context import LaunchContext, build_context
from ..engine_args import resolve_name
from ..errors import DomainError
from ..findings import Finding
from ..gpus import GIB
from ..memory import Budget, compute_budget, format_gib
from ..model_facts import accepted_tp_sizes
from . import Emit, rule

SRC_NO_MEM = "vllm 0.33.0 vllm/v1/core/kv_cache_planning.py:56-64"
SRC_FIT = "vllm 0.33.0 vllm/v1/core/kv_cache_planning.py:66-87, 1533-1557"
SRC_FREE = "vllm 0.33.0 vllm/v1/worker/utils.py:716-772; gpu_worker.py:500-544"
SRC_BOUND = "docs/operating.md §5 (bound ≈ KV pool / (KV bytes per token × average sequence length))"
DOCS = "https://docs.vllm.ai/en/latest/configuration/conserving_memory/"

NO_MEMORY_MSG = (
    "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine "
    "(this flag also controls CPU memory reservation on the CPU backend, despite its name). See "
    f"{DOCS} for more details."
)
AUTO_FIT_MSG = (
    "Cannot auto-fit max_model_len: not enough GPU memory available to serve even a single token. "
    "Try increasing `gpu_memory_utilization`."
)

# Memory taken before vLLM's free-memory check at worker start (CUDA context + cuBLAS handle; NCCL communicators at
# world size > 1). Estimates: a torch CUDA context is ~0.3-0.5 GiB on current GPUs, NCCL buffers a few hundred MiB.
STARTUP_RESERVED_BYTES = int(0.5 * GIB)
STARTUP_NCCL_BYTES = int(0.25 * GIB)


def state_per_seq(b: Budget) -> str:
    """A hybrid model's fixed cost per sequence (its Mamba-like layers' state), for the bound messages."""
    mib = b.kv_state_bytes_per_seq / 2**20
    return f" + {mib:,.0f} MiB of recurrent state per sequence" if mib else ""


def _budget(ctx: LaunchContext) -> Budget | None:
    b = ctx.budget
    return b if isinstance(b, Budget) else None


def _budget_at_tp(ctx: LaunchContext, tp: int, *, drop: tuple[str, ...] = (), gpus: int | None = None) -> Budget | None:
    """The budget of this launch at tensor_parallel_size ``tp`` (without the engine arguments ``drop``; on one node
    of ``gpus`` GPUs when given), or None when that launch cannot be judged."""
    args = {
        k: v
        for k, v in ctx.request.engine_args.items()
        if resolve_name(k, ctx.line) not in ("tensor_parallel_size", *drop)  # -tp, tensor-parallel: the same option
    }
    args["tensor_parallel_size"] = tp
    update: dict[str, Any] = {"engine_args": args}
    if gpus is not None:
        update["hardware"] = ctx.request.hardware.model_copy(update={"count": gpus, "nodes": 1})
    try:
        return compute_budget(build_context(ctx.request.model_copy(update=update)))
    except DomainError:
        return None


def _smallest_tp(ctx: LaunchContext, fits: Callable[[Budget], bool]) -> int | None:
    """The smallest TP above the requested one, within the GPUs of the instance and accepted for the model (heads,
    KV heads, vocabulary), whose budget ``fits``."""
    for t in accepted_tp_sizes(ctx.facts, ctx.total_gpus // max(1, ctx.pp)):
        if t > ctx.tp and (b := _budget_at_tp(ctx, t)) is not None and fits(b):
            return t
    return None


def smallest_fitting_tp(ctx: LaunchContext) -> int | None:
    """The smallest larger TP whose budget holds one ``max_model_len`` sequence."""
    return _smallest_tp(ctx, lambda b: b.fits_max_model_len)


def smallest_tp_for_weights(ctx: LaunchContext) -> int | None:
    """The smallest larger TP that leaves the KV pool at least one block."""
    return _smallest_tp(ctx, lambda b: b.pool_raw_bytes > 0 and b.num_gpu_blocks > 0)


@rule("weights_fit", severity="error", source=SRC_NO_MEM, phase="budget")
def weights_fit(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Weights on one GPU (per TP rank and PP stage, after ``cpu_offload_gb``) must fit in
    ``gpu_memory_utilization × total``; otherwise loading runs out of memory or vLLM finds no memory for the cache."""
    b = _budget(ctx)
    if b is None or ctx.args.get("kv_cache_memory_bytes") is not None:
        return []
    if b.weights_bytes_per_gpu < b.usable_bytes:
        return []
    msg = (
        f"Weights need {format_gib(b.weights_bytes_per_gpu)} GiB per GPU ({b.weights_source}) but "
        f"gpu_memory_utilization {b.gpu_memory_utilization} × {format_gib(b.gpu_memory_bytes)} GiB allows "
        f"{format_gib(b.usable_bytes)} GiB: loading fails with CUDA out of memory, or: {NO_MEMORY_MSG}"
    )
    remedy = {
        "tensor_parallel_size": smallest_tp_for_weights(ctx),
        "cpu_offload_gb": round((b.weights_bytes_per_gpu - b.usable_bytes + b.overhead_bytes) / GIB + 1, 1),
    }
    more, data = _needs_more_gpus(ctx, remedy)
    return [
        emit.error(
            "weights_fit",
            msg + more,
            remedy=remedy,
            field="engine_args.tensor_parallel_size",
            weights_gib=format_gib(b.weights_bytes_per_gpu),
            usable_gib=format_gib(b.usable_bytes),
            **data,
        )
    ]


SRC_KV_BYTES = "vllm 0.33.0 vllm/v1/worker/gpu_worker.py:656-681 (kv_cache_memory_bytes: profiling skipped, the pool reserved as given)"


@rule(
    "kv_cache_memory_fits",
    severity="error",
    source=SRC_KV_BYTES,
    phase="budget",
    when=("kv_cache_memory_bytes",),
)
def kv_cache_memory_fits(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``kv_cache_memory_bytes`` is reserved as given (vLLM skips its memory profiling and ignores
    ``gpu_memory_utilization``): with the weights it must fit in the GPU's memory, or allocating the KV cache runs out
    of memory at start-up."""
    b = _budget(ctx)
    given = ctx.args.get("kv_cache_memory_bytes")
    if b is None or given is None:
        return []
    need = int(given) + b.weights_bytes_per_gpu
    if need <= b.gpu_memory_bytes:
        return []
    room = max(0, b.gpu_memory_bytes - b.weights_bytes_per_gpu)
    msg = (
        f"kv_cache_memory_bytes {int(given)} ({format_gib(int(given))} GiB) plus the weights "
        f"({format_gib(b.weights_bytes_per_gpu)} GiB per GPU) exceed the GPU's {format_gib(b.gpu_memory_bytes)} GiB: "
        f"vLLM reserves the pool as given, and allocating it runs out of memory at start-up"
    )
    return [
        emit.error(
            "kv_cache_memory_fits",
            msg,
            remedy={"kv_cache_memory_bytes": None},
            field="engine_args.kv_cache_memory_bytes",
            room_bytes=room,
        )
    ]


MAX_GPUS_SEARCHED = 64  # the most GPUs of one model a single node holds (request.MAX_GPUS_PER_NODE)


def smallest_gpu_count(ctx: LaunchContext) -> int | None:
    """The fewest GPUs of this model (tensor parallel across them, one pipeline stage, up to 64) on which the launch
    fits — the weights, the overhead and one ``max_model_len`` request (or any KV when max_model_len is left to vLLM)
    — whatever the node has. None when not even 64 would do."""
    for t in accepted_tp_sizes(ctx.facts, MAX_GPUS_SEARCHED):
        if t <= ctx.tp * max(1, ctx.pp):
            continue
        b = _budget_at_tp(ctx, t, drop=("pipeline_parallel_size", "cpu_offload_gb"), gpus=t)
        if b is not None and b.num_gpu_blocks > 0 and (b.fits_max_model_len or ctx.max_model_len_auto):
            return t
    return None


def _needs_more_gpus(ctx: LaunchContext, remedy: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """When no TP within the node fits: the sentence and data naming the smallest GPU count that would."""
    if remedy.get("tensor_parallel_size"):
        return "", {}
    remedy.pop("tensor_parallel_size", None)
    n = smallest_gpu_count(ctx)
    name = ctx.gpu.name
    at = "" if ctx.max_model_len_auto else f" at max_model_len {ctx.max_model_len:,}"
    if n is None:
        return (
            f" It does not fit on up to {MAX_GPUS_SEARCHED} × {name}{at}: use a quantized variant of the model"
            f"{' or a shorter max_model_len' if at else ''}.",
            {"min_gpus": None},
        )
    return (
        f" It needs at least {n} × {name}{at} (tensor_parallel_size {n}; this launch has {ctx.total_gpus}), "
        f"or a quantized variant of the model.",
        {"min_gpus": n},
    )


@rule("kv_pool_empty", severity="error", source=SRC_NO_MEM, phase="budget")
def kv_pool_empty(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """After weights and overhead (activation peak, non-torch memory, CUDA graphs) nothing is left for even one KV
    block: vLLM raises "No available memory for the cache blocks" (or cannot auto-fit max_model_len)."""
    b = _budget(ctx)
    if b is None or b.num_gpu_blocks > 0:
        return []
    msg = AUTO_FIT_MSG if ctx.max_model_len_auto else NO_MEMORY_MSG
    detail = (
        f" Estimate per GPU: {format_gib(b.usable_bytes)} GiB usable − {format_gib(b.weights_bytes_per_gpu)} "
        f"GiB weights − {format_gib(b.overhead_bytes)} GiB overhead = {format_gib(b.pool_raw_bytes)} GiB for "
        f"the KV cache (one block is {b.bytes_per_block:,} bytes)."
    )
    remedy: dict[str, Any] = {}
    t = smallest_tp_for_weights(ctx)
    if t:
        remedy["tensor_parallel_size"] = t
    # (when the weights alone do not fit, weights_fit already names the GPU count)
    more, data = _needs_more_gpus(ctx, remedy) if b.weights_bytes_per_gpu < b.usable_bytes else ("", {})
    if b.gpu_memory_utilization < 0.9:
        remedy["gpu_memory_utilization"] = 0.9
    return [
        emit.error(
            "kv_pool_empty",
            msg + detail + more,
            remedy=remedy or None,
            field="engine_args.gpu_memory_utilization",
            pool_gib=format_gib(b.pool_raw_bytes),
            **data,
        )
    ]


@rule("kv_cache_fits_max_len", severity="error", source=SRC_FIT, phase="budget")
def kv_cache_fits_max_len(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """The KV pool, less the null block, must hold one ``max_model_len`` request (``cdiv(max_model_len / DCP,
    block_size)`` blocks). Remedy: the largest max_model_len that fits, and the smallest TP that fits the requested
    one."""
    b = _budget(ctx)
    if b is None or b.num_gpu_blocks == 0 or b.fits_max_model_len or ctx.max_model_len_auto:
        return []
    available = max(0, b.kv_cache_bytes_per_gpu - b.bytes_per_block)
    est = b.estimated_max_model_len
    estimated_msg = f"Based on the available memory, the estimated maximum model length is {est}. " if est > 0 else ""
    msg = (
        f"To serve at least one request with the model's max seq len ({ctx.max_model_len}), "
        f"({format_gib(b.needed_bytes_max_model_len)} GiB KV cache is needed, which is larger than the available "
        f"KV cache memory ({format_gib(available)} GiB). {estimated_msg}Try increasing `gpu_memory_utilization` "
        "(which also controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the "
        f"engine. See {DOCS} for more details."
    )
    remedy: dict[str, Any] = {"max_model_len": est}
    t = smallest_fitting_tp(ctx)
    if t:
        remedy["tensor_parallel_size"] = t
    more, data = _needs_more_gpus(ctx, remedy)
    return [
        emit.error(
            "kv_cache_fits_max_len",
            msg + more,
            remedy=remedy,
            field="engine_args.max_model_len",
            needed_gib=format_gib(b.needed_bytes_max_model_len),
            available_gib=format_gib(available),
            estimated_max_model_len=est,
            **data,
        )
    ]


@rule("max_num_seqs_above_bound", severity="warning", source=SRC_BOUND, phase="budget")
def max_num_seqs_above_bound(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``max_num_seqs`` above ``KV pool / (KV bytes per token × workload.avg_seq_len)``: that many sequences of the
    average length cannot be resident at once, so preemption is certain. Needs ``workload.avg_seq_len``."""
    b = _budget(ctx)
    wl = ctx.request.workload
    if b is None or not (wl and wl.avg_seq_len) or b.max_num_seqs_bound is None or b.num_gpu_blocks == 0:
        return []
    bound = b.max_num_seqs_bound
    if ctx.max_num_seqs <= bound:
        return []
    msg = (
        f"max_num_seqs {ctx.max_num_seqs} is above what the KV pool holds at the average sequence length: "
        f"{format_gib(b.kv_cache_bytes_per_gpu)} GiB / ({b.kv_bytes_per_token_per_gpu:,} B/token × "
        f"{wl.avg_seq_len} tokens{state_per_seq(b)}) ≈ {bound} sequences, so the scheduler will preempt. Production value: "
        f"0.7-0.8 × bound ({int(0.75 * bound)}); load tests start at 0.5 × bound ({int(0.5 * bound)})."
    )
    return [
        emit.warning(
            "max_num_seqs_above_bound",
            msg,
            remedy={"max_num_seqs": max(1, int(0.75 * bound))},
            field="engine_args.max_num_seqs",
            bound=bound,
        )
    ]


@rule("max_num_seqs_above_bound_at_max_len", severity="warning", source=SRC_BOUND, phase="budget")
def max_num_seqs_above_bound_at_max_len(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Without ``workload.avg_seq_len``: ``max_num_seqs`` (set, or vLLM's default for the GPU) above what
    the KV pool holds at the effective ``max_model_len`` — the only length known, so the worst case vLLM itself prints
    as "Maximum concurrency for N tokens per request". The command would carry a number of sequences the pool cannot
    keep resident once requests grow long. Remedy: the bound, or a workload to judge against."""
    b = _budget(ctx)
    wl = ctx.request.workload
    if (
        (wl and wl.avg_seq_len)
        or b is None
        or b.num_gpu_blocks == 0
        or b.max_num_seqs_bound is None
        or not b.fits_max_model_len
    ):
        return []
    bound = b.max_num_seqs_bound
    if ctx.max_num_seqs <= bound:
        return []
    origin = "set" if "max_num_seqs" in ctx.args.given else "vLLM's default, not set"
    msg = (
        f"max_num_seqs {ctx.max_num_seqs} ({origin}) is above the {bound} sequences of max_model_len "
        f"{ctx.max_model_len:,} tokens the KV pool holds ({b.kv_cache_tokens:,} tokens: "
        f"{format_gib(b.kv_cache_bytes_per_gpu)} GiB / {b.kv_bytes_per_token_per_gpu:,} B/token"
        f"{state_per_seq(b)}): with long requests "
        f"the scheduler will preempt. Give workload.avg_seq_len (the bound at the average length is higher), or set "
        f"max_num_seqs to at most {bound}."
    )
    return [
        emit.warning(
            "max_num_seqs_above_bound_at_max_len",
            msg,
            remedy={"max_num_seqs": max(1, bound)},
            field="engine_args.max_num_seqs",
            bound=bound,
            seq_len=b.max_num_seqs_bound_seq_len,
        )
    ]


@rule("util_exceeds_free", severity="error", source=SRC_FREE, phase="budget")
def util_exceeds_free(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """At worker start vLLM requests ``ceil(total × gpu_memory_utilization)`` and compares it with the memory free
    after the CUDA context, cuBLAS and NCCL are created; at 1.0 that always fails. The reserved part is an estimate
    (0.5 GiB, + 0.25 GiB for NCCL at world size > 1)."""
    b = _budget(ctx)
    util = ctx.gpu_memory_utilization
    if b is None or not (0 < util <= 1) or ctx.args.get("kv_cache_memory_bytes") is not None:
        return []
    total = b.gpu_memory_bytes
    reserved = STARTUP_RESERVED_BYTES + (STARTUP_NCCL_BYTES if ctx.tp * ctx.pp > 1 else 0)
    free = total - reserved
    requested = b.usable_bytes
    if requested <= free:
        return []
    msg = (
        f"Free memory on device cuda:0 ({format_gib(free)}/{format_gib(total)} GiB) on startup is less than "
        f"desired GPU memory utilization ({util}, {format_gib(requested)} GiB). Decrease GPU memory utilization "
        "or reduce GPU memory used by other processes."
    )
    top = int(free / total * 100) / 100
    return [
        emit.error(
            "util_exceeds_free",
            msg,
            remedy={"gpu_memory_utilization": min(top, 0.95)},
            field="engine_args.gpu_memory_utilization",
            free_gib=format_gib(free),
            requested_gib=format_gib(requested),
        )
    ]
