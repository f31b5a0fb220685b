"""Rendering: a validated launch as the exact ``vllm serve`` argv for the target version, and its shell form.

Rules (../shared/vllm-rules.md §8): the model is the first positional argument; booleans are ``--x`` / ``--no-x``
(never ``--enforce-eager False``); flags the version does not accept are never rendered (``--swap-space`` on 0.33);
``--quantization`` comes from the weight's quantization.txt tag (online ``fp8`` becomes ``fp8_per_tensor``), never
from a human. The values a production plan must pin — TP, max_model_len, gpu_memory_utilization, max_num_seqs,
max_num_batched_tokens — are always rendered with their effective values, so the node runs exactly what was judged.
"""

from __future__ import annotations

import json
import shlex

from .context import LaunchContext
from .rules.quantization import effective_quantization
from .versions import Kind

PINNED = ("tensor_parallel_size", "max_model_len", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens")
SKIP = {"quantization"}  # rendered from the tag


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _value(kind: Kind, value) -> list[str]:
    if kind is Kind.JSON:
        return [json.dumps(value, separators=(",", ":"), sort_keys=True)]
    if kind is Kind.STR_LIST:
        return [str(v) for v in value]
    if isinstance(value, float):
        return [repr(round(value, 6))]
    return [str(value)]


def model_reference(ctx: LaunchContext) -> str:
    m = ctx.request.model
    return m.uri or m.name or m.path or "model"


def render_argv(ctx: LaunchContext, model: str | None = None) -> list[str]:
    """``["vllm", "serve", MODEL, "--flag", "value", ...]`` in a stable order: pinned values first, then the other
    given arguments alphabetically."""
    a = ctx.args
    argv = ["vllm", "serve", model or model_reference(ctx)]
    effective = {
        "tensor_parallel_size": ctx.tp,
        "max_model_len": ctx.max_model_len,
        "gpu_memory_utilization": ctx.gpu_memory_utilization,
        "max_num_seqs": ctx.max_num_seqs,
        "max_num_batched_tokens": ctx.max_num_batched_tokens,
    }
    for name in PINNED:
        argv += [_flag(name), *_value(ctx.line.flags[name], effective[name])]
    if ctx.pp > 1:
        argv += ["--pipeline-parallel-size", str(ctx.pp)]
    quant = effective_quantization(ctx)
    if quant:
        argv += ["--quantization", quant]
    for name in sorted(a.values):
        if name in PINNED or name in SKIP or name == "pipeline_parallel_size" or a.values[name] is None:
            continue
        kind = ctx.line.flags[name]
        value = a.values[name]
        if kind is Kind.BOOL:
            argv.append(_flag(name) if value else "--no-" + name.replace("_", "-"))
        else:
            argv += [_flag(name), *_value(kind, value)]
    for name in sorted(a.unsupported):
        if name in ctx.line.removed:
            continue
        value = a.unsupported[name]
        if isinstance(value, bool):
            argv.append(_flag(name) if value else "--no-" + name.replace("_", "-"))
        elif value is not None:
            argv += [_flag(name), json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return argv


def shell_command(argv: list[str], env: dict[str, str] | None = None) -> str:
    """The argv as one shell-quoted line, environment assignments first."""
    prefix = [f"{k}={shlex.quote(v)}" for k, v in sorted((env or {}).items())]
    return " ".join(prefix + [shlex.quote(x) for x in argv])
