"""Values vLLM looks up by name in a registry or an enum: reasoning and tool-call parsers, attention and Mamba
backends. The names each release accepts are generated from its source (service/data/vllm/names/<release>.json,
scripts/vllm_names.py, each with file:line). A name is refused only for a request of the generated release's own
minor line (a 0.17 request, judged by the 0.15.1 data, may name a parser 0.17 added)."""

from __future__ import annotations

from ..config_validators import in_definition_order
from ..context import LaunchContext
from ..findings import Finding
from . import Emit, rule
from .gating import effective, own_line, vllm_checks

SRC_PARSERS = (
    "vllm 0.33.0 vllm/reasoning/abs_reasoning_parsers.py:237-264 (get_reasoning_parser, from "
    "config/reasoning.py:83-86 in VllmConfig.__post_init__ config/vllm.py:2209-2210; engine core "
    "v1/structured_output/__init__.py since 0.11.2; validate_api_server_args entrypoints/common/cli_args.py:615-630, "
    "entrypoints/openai/api_server.py since 0.9.2); tool parsers with --enable-auto-tool-choice: the same "
    "validate_api_server_args, run by entrypoints/launchers/launcher.py:365-370 setup_server before the engine "
    "(since 0.9.2; then parser/parser_manager.py:33-53, 0.6.6 entrypoints/openai/serving_chat.py:79-91); names: "
    "service/data/vllm/names/"
)
SRC_BACKENDS = (
    "vllm 0.33.0 vllm/v1/attention/backends/registry.py:18-31 via config/attention.py:216-228 and "
    "engine/arg_utils.py:2728-2737 (0.13.0 engine/arg_utils.py:1646-1656); vllm/config/mamba.py:12-22 via "
    "engine/arg_utils.py:2772-2773 (since 0.21.0 engine/arg_utils.py:2058); names: service/data/vllm/names/"
)


def _listed(names: dict[str, str]) -> str:
    """Parser names as vLLM lists them (sorted: list_registered)."""
    return ", ".join(sorted(names))


def _reasoning(ctx: LaunchContext) -> tuple[str, dict[str, object], str] | None:
    """``--reasoning-parser`` not registered (a plugin may register more: then nothing is said). Where the option has
    ``choices`` (0.8-0.10) the parser refuses it itself (flag_unsupported)."""
    name = ctx.args.get("reasoning_parser")
    known = ctx.line.names.get("reasoning_parsers")
    opt = ctx.line.options.get("reasoning_parser")
    if not isinstance(name, str) or not name or known is None or opt is None or opt.choices:
        return None
    if name.lower() == "none" or name in known or ctx.args.get("reasoning_parser_plugin"):
        return None  # "none" is the unset default in 0.33 (engine/arg_utils.py:188-190)
    text = f"Reasoning parser '{name}' not found. Available parsers: {_listed(known)}"
    return text, {"drop": ["reasoning_parser"]}, "reasoning_parser"


def _tool(ctx: LaunchContext) -> tuple[str, dict[str, object], str] | None:
    """``--tool-call-parser`` not registered, looked up when ``--enable-auto-tool-choice`` is on."""
    name = ctx.args.get("tool_call_parser")
    known = ctx.line.names.get("tool_parsers")
    if not isinstance(name, str) or not name or known is None or not effective(ctx, "enable_auto_tool_choice"):
        return None
    if name in known or ctx.args.get("tool_parser_plugin"):
        return None
    text = f"invalid tool call parser: {name} (chose from {{ {','.join(sorted(known))} }})"
    return text, {"drop": ["tool_call_parser", "enable_auto_tool_choice"]}, "tool_call_parser"


@rule("parser_unknown", severity="error", source=SRC_PARSERS, when=("reasoning_parser", "tool_call_parser"))
def parser_unknown(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """A ``--reasoning-parser`` the release does not register (from 0.11, where the option has no ``choices``), or a
    ``--tool-call-parser`` it does not register with ``--enable-auto-tool-choice`` on, and no parser plugin: vLLM's
    lookup raises at start-up."""
    given = ctx.args.given
    if not ("reasoning_parser" in given or "tool_call_parser" in given) or not own_line(ctx):
        return []
    found = (_reasoning(ctx), _tool(ctx))
    return [emit.error("parser_unknown", t, remedy=r, field=f"engine_args.{n}") for t, r, n in filter(None, found)]


def _backend(ctx: LaunchContext, option: str, kind: str, text: str) -> str | None:
    """vLLM's message where the option's value names no member of the enum, else None."""
    value = ctx.args.get(option)
    known = ctx.line.names.get(kind)
    if not isinstance(value, str) or known is None or option not in ctx.line.options:
        return None
    if value.upper() in known:
        return None
    if option == "attention_backend" and value.lower() == "auto" and vllm_checks(ctx, "attention_backend_auto_selects"):
        return None  # automatic selection where config/attention.py maps "auto" to None (from 0.18)
    return text.format(value=value.upper(), valid=in_definition_order(known))


@rule("backend_unknown", severity="error", source=SRC_BACKENDS, when=("attention_backend", "mamba_backend"))
def backend_unknown(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """An ``--attention-backend`` (from 0.13) or ``--mamba-backend`` (from 0.21) that names no member of the
    release's ``AttentionBackendEnum`` / ``MambaBackendEnum`` (the name is upper-cased first)."""
    given = ctx.args.given
    if not ("attention_backend" in given or "mamba_backend" in given) or not own_line(ctx):
        return []
    out = []
    for option, kind, text in (
        ("attention_backend", "attention_backends", "Unknown attention backend: '{value}'. Valid options are: {valid}"),
        ("mamba_backend", "mamba_backends", "Unknown Mamba SSU backend: '{value}'. Valid options are: {valid}"),
    ):
        found = _backend(ctx, option, kind, text)
        if found is not None:
            remedy: dict[str, object] = {"drop": [option]}
            out.append(emit.error("backend_unknown", found, remedy=remedy, field=f"engine_args.{option}"))
    return out
