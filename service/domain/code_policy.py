"""Options that make a node import or run code beyond vLLM and the manifest's weights: remote model code, parser and
I/O plugins, worker classes, middleware, logits processors, KV connector modules. In ``production`` they need a
manifest registered with ``allow_remote_code`` (the same gate as ``--trust-remote-code``)."""

from __future__ import annotations

from typing import Any

from .engine_args import EngineArgs

# dest -> the values that load nothing (vLLM's defaults)
CODE_LOADING: dict[str, tuple[Any, ...]] = {
    "trust_remote_code": (None, False),
    "tool_parser_plugin": (None, ""),
    "reasoning_parser_plugin": (None, ""),
    "io_processor_plugin": (None, ""),
    "worker_cls": (None, "auto"),
    "worker_extension_cls": (None, ""),
    "middleware": (None, []),
    "logits_processors": (None, []),
}


def code_loading(args: EngineArgs) -> list[tuple[str, str]]:
    """``[(field, why)]`` for every option that would load code on the node."""
    out = []
    for name, harmless in CODE_LOADING.items():
        value = args.values.get(name)
        if value not in harmless:
            out.append((f"engine_args.{name}", f"--{name.replace('_', '-')} {value!r} loads code on the node"))
    kv = args.values.get("kv_transfer_config")
    if isinstance(kv, dict) and kv.get("kv_connector_module_path"):
        out.append(("engine_args.kv_transfer_config", f"kv_connector_module_path {kv['kv_connector_module_path']!r} "
                                                      f"imports a module on the node"))
    return out
