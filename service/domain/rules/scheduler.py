"""Scheduler rules: max_num_batched_tokens against max_model_len and max_num_seqs, with vLLM 0.33's defaults
applied first (vllm 0.33.0 vllm/engine/arg_utils.py:2940-3039, 3151-3240; vllm/config/scheduler.py:317-360)."""

from __future__ import annotations

from typing import Any

from ..context import LaunchContext
from ..findings import Finding
from . import Emit, rule
from .features import v1_forces_chunked_prefill
from .gating import at_least, for_line, whole

SRC = (
    "vllm 0.33.0 vllm/config/scheduler.py:317-360; vllm/engine/arg_utils.py:2940-3039, 3151-3240; "
    "0.8-0.10 V1 forces chunked prefill: 0.10.2 vllm/engine/arg_utils.py:1620-1623"
)


def _origin(ctx: LaunchContext, name: str) -> str:
    if name in ctx.args.given:
        return "set"
    tier = ctx.scheduler_tier.tier if ctx.scheduler_tier else "?"
    return f"vLLM 0.33 default for {ctx.gpu.name} ({tier})"


@rule("batched_tokens_vs_max_len", severity="error", source=SRC)
def batched_tokens_vs_max_len(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """With chunked prefill disabled, max_num_batched_tokens must be at least max_model_len (a prompt is prefilled
    in one step). Not in 0.8-0.10 on the V1 engine, which turns chunked prefill back on."""
    if ctx.enable_chunked_prefill or ctx.max_num_batched_tokens >= ctx.max_model_len:
        return []
    if v1_forces_chunked_prefill(ctx):
        return []
    mnbt, mml = ctx.max_num_batched_tokens, ctx.max_model_len
    return [
        emit.error(
            "batched_tokens_vs_max_len",
            f"max_num_batched_tokens ({mnbt}) is smaller than max_model_len ({mml}). This effectively limits the maximum "
            f"sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. Please increase "
            f"max_num_batched_tokens or decrease max_model_len. (chunked prefill is disabled)",
            remedy={"max_num_batched_tokens": mml, "max_model_len": mnbt, "enable_chunked_prefill": True},
            field="engine_args.max_num_batched_tokens",
        )
    ]


@rule("batched_tokens_lt_max_num_seqs", "batched_tokens_above_capacity", severity="error", source=SRC)
def batched_tokens_lt_max_num_seqs(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """The effective max_num_batched_tokens must be at least max_num_seqs (defaults by GPU tier: 2048 / 256 on
    A100, L40S, RTX…, 8192 / 1024 on H100/H200, 16384 / 1024 at ≥160 GiB; a user-set value is never raised).
    max_num_batched_tokens above max_num_seqs × max_model_len is a vLLM warning (``batched_tokens_above_capacity``)."""
    mnbt, mns, mml = ctx.max_num_batched_tokens, ctx.max_num_seqs, ctx.max_model_len
    if mnbt < mns:
        return [
            emit.error(
                "batched_tokens_lt_max_num_seqs",
                f"max_num_batched_tokens ({mnbt}) must be greater than or equal to max_num_seqs ({mns}). "
                f"(max_num_batched_tokens: {_origin(ctx, 'max_num_batched_tokens')}; max_num_seqs: "
                f"{_origin(ctx, 'max_num_seqs')})",
                remedy={"max_num_batched_tokens": mns, "max_num_seqs": mnbt},
                field="engine_args.max_num_batched_tokens",
            )
        ]
    if mnbt > mns * mml:
        return [
            emit.warning(
                "batched_tokens_above_capacity",
                f"max_num_batched_tokens ({mnbt}) exceeds max_num_seqs * max_model_len ({mns * mml}). This may lead to "
                f"unexpected behavior.",
                remedy={"max_num_batched_tokens": mns * mml},
                field="engine_args.max_num_batched_tokens",
            )
        ]
    return []


SRC_ACTIVE = (
    "vllm 0.33.0 vllm/config/scheduler.py:338-345; vllm/engine/arg_utils.py:3151-3240 (since 0.32.0 "
    "scheduler.py:335-342, with the option)"
)


@rule("max_num_active_seqs", severity="error", source=SRC_ACTIVE, when=("max_num_active_seqs",))
def max_num_active_seqs(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--max-num-active-seqs`` (from 0.32) caps the running sequences below max_num_seqs: it may not exceed the
    effective max_num_seqs."""
    if "max_num_active_seqs" not in ctx.args.given or not at_least(ctx, (0, 32)):
        return []
    active = whole(ctx.args.values.get("max_num_active_seqs"))
    most = ctx.max_num_seqs
    if "max_num_seqs" not in ctx.args.given and ctx.args.get("performance_mode") == "throughput":
        most *= 2  # the defaults doubled (arg_utils.py:3183-3189): at most twice what Preflight derives
    if active is None or active <= most:
        return []
    return [
        emit.error(
            "max_num_active_seqs",
            f"max_num_active_seqs ({active}) cannot be greater than max_num_seqs ({most}). "
            f"(max_num_seqs: {_origin(ctx, 'max_num_seqs')})",
            remedy={"max_num_active_seqs": most, "max_num_seqs": active},
            field="engine_args.max_num_active_seqs",
        )
    ]


SRC_ASYNC = (
    "vllm 0.13.0 vllm/config/vllm.py:542-570 (0.10.2 engine/arg_utils.py:1282-1299; 0.11.2 config/vllm.py:371-399; "
    "0.15.1 :568-588; 0.18.1 :713-737; 0.21.0 :820-838; 0.24.0 :940-958; 0.26.0 :1028-1053; 0.28.0 :1154-1179; 0.30.0 "
    ":1407-1432; 0.32.0 :1553-1579; 0.33.0 checks the V1 model runner only, :1651-1680, not judged)"
)
# what ``--async-scheduling`` refuses the speculative method for, per line: the text vLLM prints; refused are the
# methods that keep their name whatever the draft checkpoint says (``ngram``, ``suffix``; a ``medusa`` or
# ``mlp_speculator`` method may be renamed from the draft's config.json, which Preflight does not see:
# config/speculative.py, e.g. 0.13.0 :244-290, 336-379)
ASYNC_SPEC_TEXT = {
    (0, 10): "Currently, speculative decoding is not supported with async scheduling.",
    (0, 11): "Currently, async scheduling is only supported with EAGLE/MTP kind of speculative decoding",
    (0, 15): "Currently, async scheduling is only supported with EAGLE/MTP kind of speculative decoding.",
    (0, 18): "Currently, async scheduling is only supported with EAGLE/MTP/Draft Model/NGram GPU kind of speculative "
    "decoding",
    (0, 26): "Currently, async scheduling is only supported with EAGLE/MTP/Draft Model/NGram GPU/DSpark kind of "
    "speculative decoding",
    (0, 32): "Currently, async scheduling is only supported with EAGLE/MTP/Draft Model/NGram GPU/DSpark/DFlash kind "
    "of speculative decoding",
}
CPU_PROPOSERS = ("ngram", "[ngram]", "suffix")


def _async_spec_refused(ctx: LaunchContext) -> bool:
    from .speculative import speculative_config

    cfg = speculative_config(ctx)
    if cfg is None:
        return False
    if ctx.line.release[:2] == (0, 10):  # any speculation (arg_utils.py:1295-1299)
        return True
    method = cfg.get("method")
    return method in CPU_PROPOSERS or (method is None and cfg.get("model") in ("ngram", "[ngram]"))


def _async_problems(ctx: LaunchContext) -> list[tuple[str, dict[str, Any], str]]:
    out: list[tuple[str, dict[str, Any], str]] = []
    backend = ctx.args.get("distributed_executor_backend")
    if ctx.line.release[:2] == (0, 10) and backend == "uni":  # arg_utils.py:1288-1290
        text = "Async scheduling is not supported with uni-process backend."
        out.append((text, {"distributed_executor_backend": "mp"}, "distributed_executor_backend"))
    if _async_spec_refused(ctx):
        out.append((for_line(ctx, ASYNC_SPEC_TEXT), {"async_scheduling": False}, "async_scheduling"))
    # 0.11-0.18 allow mp, uni, external_launcher by name; from 0.21 the executor class answers (not judged)
    if backend == "ray" and (0, 11) <= ctx.line.release[:2] <= (0, 18):
        text = (
            "Currently, async scheduling only supports `mp`, `uni`, or `external_launcher` distributed executor "
            "backend, but you chose `ray`."
        )
        out.append((text, {"distributed_executor_backend": "mp"}, "distributed_executor_backend"))
    return out


@rule("async_scheduling_unsupported", severity="error", source=SRC_ASYNC, when=("async_scheduling",))
def async_scheduling_unsupported(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--async-scheduling`` set explicitly, where the release refuses it: with any speculative decoding (0.10) or
    with the ``ngram``/``suffix`` proposers (0.11-0.32); with the ``uni`` executor (0.10) or ``ray`` (0.11-0.18).
    Pipeline parallelism with it: pp_supported."""
    if ctx.args.get("async_scheduling") is not True or not at_least(ctx, (0, 10)) or at_least(ctx, (0, 33)):
        return []
    return [
        emit.error("async_scheduling_unsupported", text, remedy=remedy, field=f"engine_args.{name}")
        for text, remedy, name in _async_problems(ctx)
    ]
