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


@rule(
    "serve_option_pair",
    severity="error",
    source=SRC_SERVE,
    when=("enable_auto_tool_choice", "enable_log_outputs", "sse_keep_alive_interval", "enable_per_request_metrics"),
)
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


@rule(
    "traces_need_endpoint",
    severity="error",
    source=SRC_TRACES,
    when=("collect_detailed_traces",),
)
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


SRC_GRPC_PORT = (
    "vllm 0.33.0 vllm/entrypoints/common/cli_args.py:480-505 (since 0.32.0 entrypoints/launchers/cli_args.py:470-497, "
    "with the option); VLLM_USE_RUST_FRONTEND: vllm/envs.py:1456-1458"
)


def _turned_off(value: str | None) -> bool:
    """The plan's env sets the variable to a number vLLM reads as off (``bool(int(value))``); unset is not off."""
    try:
        return value is not None and int(value.strip()) == 0
    except ValueError:
        return False


def _grpc_port_problems(ctx: LaunchContext, port: int) -> list[tuple[str, dict[str, object], str]]:
    """``validate_grpc_port_arg``'s checks that read only the launch's options (cli_args.py:484-505)."""
    a = ctx.args
    out: list[tuple[str, dict[str, object], str]] = []
    if a.get("grpc"):
        text = (
            "--grpc and --grpc-port are mutually exclusive. Use --grpc --port for the Python gRPC server, or "
            "VLLM_USE_RUST_FRONTEND=1 with --grpc-port for the Rust frontend."
        )
        out.append((text, {"grpc": False}, "engine_args.grpc"))
    if _turned_off(ctx.request.env.get("VLLM_USE_RUST_FRONTEND")):  # unset: the node may set it for itself
        text = "--grpc-port requires VLLM_USE_RUST_FRONTEND=1 vllm serve"
        out.append((text, {"env": {"VLLM_USE_RUST_FRONTEND": "1"}}, "env.VLLM_USE_RUST_FRONTEND"))
    count = whole(a.get("api_server_count"))
    if a.get("headless") or (count is not None and count <= 0):
        text = "--grpc-port requires a Rust frontend; remove --headless and non-positive --api-server-count"
        out.append(
            (text, {"headless": False}, "engine_args.headless" if a.get("headless") else "engine_args.api_server_count")
        )
    if a.get("data_parallel_multi_port_external_lb"):
        text = (
            "--grpc-port is incompatible with --data-parallel-multi-port-external-lb: its frontends would share the "
            "same gRPC port"
        )
        out.append(
            (text, {"data_parallel_multi_port_external_lb": False}, "engine_args.data_parallel_multi_port_external_lb")
        )
    if not 0 <= port <= 65535:
        out.append(("--grpc-port must be between 0 and 65535", {"grpc_port": 0}, "engine_args.grpc_port"))
    elif port != 0 and port == whole(effective(ctx, "port")) and not a.get("uds"):
        text = "--grpc-port must differ from --port when HTTP uses TCP"
        out.append((text, {"grpc_port": port + 1}, "engine_args.grpc_port"))
    return out


@rule("grpc_port", severity="error", source=SRC_GRPC_PORT, when=("grpc_port",))
def grpc_port(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--grpc-port`` (from 0.32) opens the Rust frontend's gRPC listener: not with ``--grpc``, ``--headless``, a
    non-positive ``--api-server-count`` or ``--data-parallel-multi-port-external-lb``; a port in [0, 65535] other
    than the HTTP port; and VLLM_USE_RUST_FRONTEND=1 (refused where the plan's env sets it off; a warning where the
    plan leaves it unset, since the node may set it)."""
    if "grpc_port" not in ctx.args.given or not at_least(ctx, (0, 32)):
        return []
    port = whole(ctx.args.values.get("grpc_port"))
    if port is None:
        return []
    out = [emit.error("grpc_port", t, remedy=r, field=f) for t, r, f in _grpc_port_problems(ctx, port)]
    if "VLLM_USE_RUST_FRONTEND" not in ctx.request.env:
        out.append(
            emit.warning(
                "grpc_port",
                "--grpc-port requires VLLM_USE_RUST_FRONTEND=1 vllm serve: the plan's env does not set it, so vLLM "
                "refuses the launch unless the node sets it for itself.",
                remedy={"env": {"VLLM_USE_RUST_FRONTEND": "1"}},
                field="env.VLLM_USE_RUST_FRONTEND",
            )
        )
    return out


# vllm 0.33.0 vllm/renderers/params.py:27 ReasoningEffort: the keys --reasoning-effort-map may use
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
SRC_EFFORT_MAP = (
    "vllm 0.33.0 vllm/entrypoints/common/cli_args.py:512-528, 550 (validate_reasoning_effort_map in "
    "validate_parsed_serve_args); efforts: vllm/renderers/params.py:27"
)


@rule("reasoning_effort_map", severity="error", source=SRC_EFFORT_MAP, when=("reasoning_effort_map",))
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
