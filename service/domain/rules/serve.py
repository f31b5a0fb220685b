"""``vllm serve`` option pairs that the API server checks before it loads anything (vllm 0.33.0
vllm/entrypoints/common/cli_args.py:531-577 ``validate_parsed_serve_args``; the tracing pair in
vllm/config/observability.py:216-222). Each check applies from the oldest release line read that makes it."""

from __future__ import annotations

from ..context import LaunchContext
from ..findings import Finding
from . import Emit, rule
from .gating import at_least, effective, whole

SRC_SERVE = (
    "vllm 0.33.0 vllm/entrypoints/common/cli_args.py:552-572 (tool choice since 0.6.6 "
    "entrypoints/openai/cli_args.py:265-268; log outputs since 0.11.2 cli_args.py:294-295; per-request metrics since "
    "0.26.0 cli_args.py:400-406; SSE keep-alive since 0.30.0 launchers/cli_args.py:453-458)"
)
SRC_TRACES = "vllm 0.33.0 vllm/config/observability.py:216-222 (since 0.11.2 observability.py:117-122)"


def _tool_choice(ctx: LaunchContext) -> tuple[str, dict[str, object], str] | None:
    if effective(ctx, "enable_auto_tool_choice") and not ctx.args.get("tool_call_parser"):
        return (
            "Error: --enable-auto-tool-choice requires --tool-call-parser",
            {"enable_auto_tool_choice": False},
            "enable_auto_tool_choice",
        )
    return None


def _log_outputs(ctx: LaunchContext) -> tuple[str, dict[str, object], str] | None:
    if at_least(ctx, (0, 11)) and effective(ctx, "enable_log_outputs") and not effective(ctx, "enable_log_requests"):
        return (
            "Error: --enable-log-outputs requires --enable-log-requests",
            {"enable_log_requests": True},
            "enable_log_outputs",
        )
    return None


def _keep_alive(ctx: LaunchContext) -> tuple[str, dict[str, object], str] | None:
    interval = whole(ctx.args.get("sse_keep_alive_interval"))
    if at_least(ctx, (0, 30)) and interval is not None and interval < 0:
        return (
            "Error: --sse-keep-alive-interval must be a non-negative integer (0 disables keep-alive comments). "
            f"(got {interval})",
            {"sse_keep_alive_interval": 0},
            "sse_keep_alive_interval",
        )
    return None


def _request_metrics(ctx: LaunchContext) -> tuple[str, dict[str, object], str] | None:
    if at_least(ctx, (0, 26)) and effective(ctx, "enable_per_request_metrics") and effective(ctx, "disable_log_stats"):
        return (
            "Error: --enable-per-request-metrics requires engine statistics logging; remove --disable-log-stats to "
            "enable per-request metrics.",
            {"disable_log_stats": False},
            "enable_per_request_metrics",
        )
    return None


@rule("serve_option_pair", severity="error", source=SRC_SERVE)
def serve_option_pair(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Options of the OpenAI server that need another: ``--enable-auto-tool-choice`` needs ``--tool-call-parser``;
    ``--enable-log-outputs`` needs ``--enable-log-requests`` (from 0.11); ``--enable-per-request-metrics`` needs
    engine statistics, so no ``--disable-log-stats`` (from 0.26); ``--sse-keep-alive-interval`` is not negative
    (from 0.30)."""
    found = (check(ctx) for check in (_tool_choice, _log_outputs, _keep_alive, _request_metrics))
    return [
        emit.error("serve_option_pair", message, remedy=remedy, field=f"engine_args.{name}")
        for message, remedy, name in (f for f in found if f is not None)
    ]


@rule("traces_need_endpoint", severity="error", source=SRC_TRACES)
def traces_need_endpoint(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--collect-detailed-traces`` sends spans to an OpenTelemetry collector: it needs ``--otlp-traces-endpoint``
    (from 0.11)."""
    if (
        not at_least(ctx, (0, 11))
        or not ctx.args.get("collect_detailed_traces")
        or ctx.args.get("otlp_traces_endpoint")
    ):
        return []
    return [
        emit.error(
            "traces_need_endpoint",
            "collect_detailed_traces requires `--otlp-traces-endpoint` to be set.",
            remedy={"drop": ["collect_detailed_traces"]},
            field="engine_args.collect_detailed_traces",
        )
    ]


# vllm 0.33.0 vllm/renderers/params.py:27 ReasoningEffort: the keys --reasoning-effort-map may use
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
SRC_EFFORT_MAP = (
    "vllm 0.33.0 vllm/entrypoints/common/cli_args.py:512-528, 550 (validate_reasoning_effort_map in "
    "validate_parsed_serve_args); efforts: vllm/renderers/params.py:27"
)


@rule("reasoning_effort_map", severity="error", source=SRC_EFFORT_MAP)
def reasoning_effort_map(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--reasoning-effort-map`` (from 0.33) is a JSON object whose values are strings and whose keys are reasoning
    efforts (``none`` … ``max``)."""
    if "reasoning_effort_map" not in ctx.args.given or not at_least(ctx, (0, 33)):
        return []
    value = ctx.args.get("reasoning_effort_map")
    if value is None:
        return []
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        text = "Error: --reasoning-effort-map must be a JSON object mapping reasoning efforts to strings."
    elif unknown := sorted(set(value) - set(REASONING_EFFORTS)):
        text = (
            f"Error: --reasoning-effort-map has unknown efforts {unknown}; keys must be one of "
            f"{list(REASONING_EFFORTS)}."
        )
    else:
        return []
    return [
        emit.error(
            "reasoning_effort_map",
            text,
            remedy={"drop": ["reasoning_effort_map"]},
            field="engine_args.reasoning_effort_map",
        )
    ]
