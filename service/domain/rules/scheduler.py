"""Scheduler rules: max_num_batched_tokens against max_model_len and max_num_seqs, with vLLM 0.33's defaults
applied first (vllm 0.33.0 vllm/engine/arg_utils.py:2940-3039, 3151-3240; vllm/config/scheduler.py:317-360)."""

from __future__ import annotations

from typing import Any

from ..context import LaunchContext
from ..findings import Finding
from . import Emit, rule
from .features import chunked_prefill_enabled
from .gating import at_least, for_line, lax_true, vllm_checks, whole

SRC = (
    "vllm 0.33.0 vllm/config/scheduler.py:317-360; vllm/engine/arg_utils.py:2940-3039, 3151-3240 (the lines per check: "
    "service/data/vllm/checks/check_lines.json); before 0.11 the engine's chunked prefill: 0.10.2 "
    "vllm/engine/arg_utils.py:1566-1596, 1620-1623"
)


def _origin(ctx: LaunchContext, name: str) -> str:
    if name in ctx.args.given:
        return "set"
    tier = ctx.scheduler_tier.tier if ctx.scheduler_tier else "?"
    return f"vLLM 0.33 default for {ctx.gpu.name} ({tier})"


@rule("batched_tokens_vs_max_len", severity="error", source=SRC)
def batched_tokens_vs_max_len(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """With chunked prefill disabled, max_num_batched_tokens must be at least max_model_len (a prompt is prefilled
    in one step). Before 0.11 chunked prefill is what the engine makes of the flag (``chunked_prefill_enabled``); a
    default max_num_batched_tokens is then at least max_model_len."""
    if chunked_prefill_enabled(ctx) or "max_num_batched_tokens" not in ctx.args.given:
        return []
    mnbt, mml = ctx.max_num_batched_tokens, ctx.max_model_len
    if mnbt >= mml:
        return []
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
    if mnbt < mns and vllm_checks(ctx, "batched_tokens_at_least_max_num_seqs"):
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


SRC_PARTIAL = (
    "vllm 0.26.0 vllm/config/scheduler.py:315-319 (since 0.11.2 scheduler.py:292-296; 0.7.3-0.10.2 with a lower bound "
    "of 1 too, 0.10.2 config/scheduler.py:296-302; gone in 0.28; service/data/vllm/checks/check_lines.json)"
)


@rule(
    "partial_prefill_bounds",
    severity="error",
    source=SRC_PARTIAL,
    when=("max_long_partial_prefills", "max_num_partial_prefills"),
)
def partial_prefill_bounds(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``max_long_partial_prefills`` may not exceed ``max_num_partial_prefills`` (0.7-0.26; up to 0.10 it must also
    be at least 1, later the field's own bound says so)."""
    if not vllm_checks(ctx, "long_partial_prefills_bounds"):
        return []
    given = ctx.args.given
    num = whole(ctx.args.get("max_num_partial_prefills")) if "max_num_partial_prefills" in given else 1
    long = whole(ctx.args.get("max_long_partial_prefills")) if "max_long_partial_prefills" in given else 1
    if num is None or long is None or num < 1 or 1 <= long <= num or (long < 1 and at_least(ctx, (0, 11))):
        return []
    if at_least(ctx, (0, 11)):
        text = (
            f"self.max_long_partial_prefills={long} must be less than or equal to self.max_num_partial_prefills={num}."
        )
    else:
        text = (
            f"max_long_partial_prefills ({long}) must be greater than or equal to 1 and less than or equal to "
            f"max_num_partial_prefills ({num})."
        )
    return [
        emit.error(
            "partial_prefill_bounds",
            text,
            remedy={"max_long_partial_prefills": max(1, min(long, num))},
            field="engine_args.max_long_partial_prefills",
        )
    ]


SRC_STRUCTURED = (
    "vllm 0.33.0 vllm/config/structured_outputs.py:64-75 (since 0.9.2 config.py:3627-3633, the --guided-decoding-* "
    "options up to 0.10.2 config/__init__.py:3016-3022; 0.11.2 forwards those options after the check, "
    "arg_utils.py:1720-1732; service/data/vllm/checks/check_lines.json)"
)


def _structured_outputs(ctx: LaunchContext) -> tuple[object, bool, bool] | None:
    """(backend, disable_any_whitespace, disable_additional_properties) as the release's config checks them: the
    keys of ``--structured-outputs-config`` where the line has it (0.11+), else the ``--guided-decoding-*`` options;
    None when the backend carries options (``xgrammar:…``, read by the release itself) or is not a name."""
    if ctx.line.option("structured_outputs_config") is not None:
        raw = ctx.args.get("structured_outputs_config")
        cfg = raw if isinstance(raw, dict) else {}
        backend = cfg.get("backend", "auto")
        flags = (lax_true(cfg.get("disable_any_whitespace")), lax_true(cfg.get("disable_additional_properties")))
    else:
        backend = ctx.args.get("guided_decoding_backend", "auto")
        flags = (
            ctx.args.get("guided_decoding_disable_any_whitespace") is True,
            ctx.args.get("guided_decoding_disable_additional_properties") is True,
        )
    if not isinstance(backend, str) or ":" in backend:
        return None
    return backend, flags[0], flags[1]


@rule(
    "structured_output_options",
    severity="error",
    source=SRC_STRUCTURED,
    when=(
        "structured_outputs_config",
        "guided_decoding_disable_any_whitespace",
        "guided_decoding_disable_additional_properties",
    ),
)
def structured_output_options(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Structured-output JSON options a backend lacks: ``disable_any_whitespace`` needs the xgrammar or guidance
    backend, ``disable_additional_properties`` the guidance backend (the default ``auto`` is neither; from 0.9)."""
    found = _structured_outputs(ctx)
    if found is None:
        return []
    backend, no_space, no_extra = found
    texts = []
    if no_space and backend not in ("xgrammar", "guidance") and vllm_checks(ctx, "structured_output_whitespace"):
        texts.append("disable_any_whitespace is only supported for xgrammar and guidance backends.")
    elif no_extra and backend != "guidance" and vllm_checks(ctx, "structured_output_additional_properties"):
        texts.append("disable_additional_properties is only supported for the guidance backend.")
    name: str = "guided_decoding_backend"
    remedy: Any = "guidance"
    if ctx.line.option("structured_outputs_config") is not None:
        raw = ctx.args.get("structured_outputs_config")
        name, remedy = "structured_outputs_config", {**(raw if isinstance(raw, dict) else {}), "backend": "guidance"}
    return [
        emit.error("structured_output_options", t, remedy={name: remedy}, field=f"engine_args.{name}") for t in texts
    ]


SRC_CUDAGRAPH = (
    "vllm 0.24.0 vllm/config/vllm.py:1677-1699 (_set_cudagraph_sizes; enforce_eager or another cudagraph mode: "
    ":1060-1067, 1289-1299; bitsandbytes forces eager: config/model.py:1087-1110; deepep_high_throughput: "
    "config/compilation.py:1190-1202); service/data/vllm/checks/check_lines.json"
)


def _cudagraph_mode_left_to_vllm(ctx: LaunchContext) -> bool:
    """CUDA graphs stay on as vLLM decides by default: no eager mode, no compilation or optimization settings, no
    quantization or all2all backend that turns them off (each of those may set the mode to NONE: not judged)."""
    a = ctx.args
    if lax_true(a.get("enforce_eager")) or str(ctx.gpu.vendor).lower() != "nvidia":
        return False
    if any(a.get(n) is not None for n in ("compilation_config", "optimization_level", "all2all_backend")):
        return False
    # bitsandbytes, asked for or read from the checkpoint, may force eager mode (vllm 0.24.0 config/model.py:1090-1110)
    hf_quant = (ctx.request.model.config or {}).get("quantization_config")
    from_checkpoint = hf_quant.get("quant_method") if isinstance(hf_quant, dict) else None
    return "bitsandbytes" not in (a.get("quantization"), from_checkpoint)


@rule("cudagraph_capture_size", severity="error", source=SRC_CUDAGRAPH, when=("max_cudagraph_capture_size",))
def cudagraph_capture_size(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """With CUDA graphs on, the largest capture size is min(``--max-cudagraph-capture-size``,
    max_num_batched_tokens) and must be at least 1."""
    size = whole(ctx.args.get("max_cudagraph_capture_size"))
    if size is None or size >= 1 or not vllm_checks(ctx, "cudagraph_max_size_positive"):
        return []
    if not _cudagraph_mode_left_to_vllm(ctx):
        return []
    return [
        emit.error(
            "cudagraph_capture_size",
            "AssertionError: Maximum cudagraph size should be greater than or equal to 1 when using cuda graph. "
            f"(--max-cudagraph-capture-size is {size}; leave it unset, or run without CUDA graphs: --enforce-eager.)",
            remedy={"drop": ["max_cudagraph_capture_size"], "enforce_eager": True},
            field="engine_args.max_cudagraph_capture_size",
        )
    ]
