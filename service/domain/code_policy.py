"""Options that make a node import or run code beyond vLLM and the manifest's weights: remote model code, parser and
I/O plugins, worker / scheduler / executor classes, middleware, logits processors, connector modules, compiler
passes and compile backends given as import paths, model class overrides, logging config files — at the top level
or nested inside a JSON option (``structured_outputs_config.reasoning_parser_plugin``,
``ec_transfer_config.ec_connector_module_path``), also when the JSON is given as a string option's text. In ``production`` they need a manifest registered with
``allow_remote_code`` (the same gate as ``--trust-remote-code``)."""

from __future__ import annotations

import json
from typing import Any

from .engine_args import EngineArgs, flag

# dest -> the values that load nothing (vLLM's defaults)
CODE_LOADING: dict[str, tuple[Any, ...]] = {
    "trust_remote_code": (None, False),
    "middleware": (None, []),
    "logits_processors": (None, []),
    # {architecture: "module:Class"}: vLLM registers and imports each class (vllm/config/model.py)
    "model_class_overrides": (None, {}),
    # a logging config for logging.config.dictConfig, which imports and calls what the file names
    "log_config_file": (None, ""),
}
CODE_SUFFIXES = ("_plugin", "_cls", "_class", "_module_path", "_processors")
CODE_KEYS = {"inductor_passes", "middleware", "custom_ops_module", "pylogging_config_file"}
BUILTIN_EXECUTORS = (None, "mp", "ray", "uni", "external_launcher")
HARMLESS: tuple[object, ...] = (None, "", "auto", [], {}, False)


def _loads_code(key: object, value: Any) -> bool:
    return isinstance(key, str) and (key.endswith(CODE_SUFFIXES) or key in CODE_KEYS) and value not in HARMLESS


def _nested(value: Any, path: str, out: list[tuple[str, str]], field: str) -> None:
    """Every key at any depth, through dicts and lists alike (MultiConnector takes its connectors as a list, each
    with its own ``kv_connector_module_path``). Depth is bounded by ``jsoncheck.MAX_DEPTH``, which every request
    passes before this runs; the walk uses an explicit stack, so no recursion limit applies."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        node, here = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, sub in items:
            where = f"{here}.{key}" if isinstance(node, dict) else f"{here}[{key}]"
            if isinstance(node, dict) and _loads_code(key, sub):
                out.append((field, f"{where} {sub!r} loads code on the node"))
            elif isinstance(sub, (dict, list)):
                stack.append((sub, where))


def _compile_backend(name: str, value: Any, out: list[tuple[str, str]], field: str) -> None:
    """``compilation_config.backend``: a name torch has not registered is imported with resolve_obj_by_qualname
    (vllm/config/compilation.py ``init_backend``); torch's own backends ("inductor", "eager", …) have no dot."""
    backend = value.get("backend") if name == "compilation_config" and isinstance(value, dict) else None
    if isinstance(backend, str) and "." in backend:
        out.append((field, f"{name}.backend {backend!r} is an import path: it loads code on the node"))


def _json_text(value: Any) -> Any:
    """The object or list a string option's value holds as JSON text (before 0.9 --compilation-config and
    --kv-transfer-config are plain strings vLLM parses itself), else the value unchanged. A string option's value
    is at most engine_args.MAX_TEXT characters, so the parse is bounded."""
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return value
    return value


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
        elif isinstance(parsed := _json_text(value), (dict, list)):
            _compile_backend(name, parsed, out, field)
            _nested(parsed, name, out, field)
    return out
