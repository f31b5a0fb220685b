"""Options that make a node import or run code beyond vLLM and the manifest's weights: remote model code, parser and
I/O plugins, worker / scheduler / executor classes, middleware, logits processors, connector modules, compiler
passes — at the top level or nested inside a JSON option (``structured_outputs_config.reasoning_parser_plugin``,
``ec_transfer_config.ec_connector_module_path``). In ``production`` they need a manifest registered with
``allow_remote_code`` (the same gate as ``--trust-remote-code``)."""

from __future__ import annotations

from typing import Any

from .engine_args import EngineArgs, flag

# dest -> the values that load nothing (vLLM's defaults)
CODE_LOADING: dict[str, tuple[Any, ...]] = {
    "trust_remote_code": (None, False),
    "middleware": (None, []),
    "logits_processors": (None, []),
}
CODE_SUFFIXES = ("_plugin", "_cls", "_class", "_module_path", "_processors")
CODE_KEYS = {"inductor_passes", "middleware", "custom_ops_module"}
BUILTIN_EXECUTORS = (None, "mp", "ray", "uni", "external_launcher")
HARMLESS: tuple[object, ...] = (None, "", "auto", [], {}, False)


def _nested(value: Any, path: str, out: list[tuple[str, str]], field: str, depth: int = 0) -> None:
    if depth > 6 or not isinstance(value, dict):
        return
    for key, sub in value.items():
        here = f"{path}.{key}"
        if isinstance(key, str) and (key.endswith(CODE_SUFFIXES) or key in CODE_KEYS) and sub not in HARMLESS:
            out.append((field, f"{here} {sub!r} loads code on the node"))
        elif isinstance(sub, dict):
            _nested(sub, here, out, field, depth + 1)


def code_loading(args: EngineArgs) -> list[tuple[str, str]]:
    """``[(field, why)]`` for every option (or JSON key) that would load code on the node."""
    out: list[tuple[str, str]] = []
    for name, value in args.values.items():
        field = f"engine_args.{name}"
        if name in CODE_LOADING:
            if value not in CODE_LOADING[name]:
                out.append((field, f"{flag(name)} {value!r} loads code on the node"))
        elif name.endswith(CODE_SUFFIXES) and value not in HARMLESS:
            out.append((field, f"{flag(name)} {value!r} loads code on the node"))
        elif name == "distributed_executor_backend" and value not in BUILTIN_EXECUTORS:
            out.append((field, f"{flag(name)} {value!r} is an executor class path: it loads code on the node"))
        elif isinstance(value, dict):
            _nested(value, name, out, field)
    return out
