"""Names a release accepts for options whose value is looked up in a registry or an enum, read from its source.

    python scripts/vllm_names.py RELEASE_DIR        # the unpacked wheel: RELEASE_DIR/vllm/…; JSON on stdout

Nothing is imported: each name is found with ``ast`` and listed with the file and line that registers it.
- ``reasoning_parsers`` / ``tool_parsers``: what ``ReasoningParserManager`` / ``ToolParserManager`` hold at start-up
  (``list_registered()``, vllm 0.33.0 vllm/reasoning/abs_reasoning_parsers.py:261-264, tool_parsers/
  abstract_tool_parser.py:373-375): the keys of the ``_*_PARSERS_TO_REGISTER`` table that the package's
  ``__init__.py`` registers lazily (0.11+), every ``register_lazy_module("name", …)`` call, and every class decorated
  with ``@…register_module("name")`` / ``(["a", "b"])`` / ``(name=…)`` in the parser packages (how 0.6–0.10 register
  them all, imported by the package). Names from every package directory a release has are united (0.13 keeps a
  copy under vllm/entrypoints/openai/tool_parsers): an extra name only makes Preflight accept more.
- ``attention_backends`` / ``mamba_backends``: the members of ``AttentionBackendEnum`` (vllm 0.33.0
  vllm/v1/attention/backends/registry.py:18-31; vllm/attention/backends/registry.py up to 0.13) and
  ``MambaBackendEnum`` (vllm/config/mamba.py:12-30, from 0.21), whose ``__getitem__`` turns ``--attention-backend``
  / ``--mamba-backend`` (upper-cased) into a member or refuses the name.
A kind the release does not have is absent from the output.
"""

from __future__ import annotations

import ast
import json
import pathlib
import sys
from typing import Any

PARSER_DIRS = {
    "reasoning_parsers": ("vllm/reasoning", "vllm/entrypoints/openai/reasoning_parsers"),
    "tool_parsers": ("vllm/tool_parsers", "vllm/entrypoints/openai/tool_parsers"),
}
ENUMS = {
    "attention_backends": (
        "AttentionBackendEnum",
        ("vllm/v1/attention/backends/registry.py", "vllm/attention/backends/registry.py"),
    ),
    "mamba_backends": ("MambaBackendEnum", ("vllm/config/mamba.py",)),
}


def _strings(node: ast.AST | None) -> list[str]:
    """The string literal, or the strings of a list/tuple literal, that ``node`` is."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _registered(call: ast.Call, method: str) -> list[str]:
    """The names a ``….register_module(...)`` / ``….register_lazy_module(...)`` call registers."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == method):
        return []
    for kw in call.keywords:
        if kw.arg == "name":
            return _strings(kw.value)
    return _strings(call.args[0]) if call.args else []


def _names_in(path: pathlib.Path, rel: str, out: dict[str, str]) -> None:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call):
                    for name in _registered(deco, "register_module"):
                        out.setdefault(name, f"{rel}:{deco.lineno}")
        elif isinstance(node, ast.Call):
            for name in _registered(node, "register_lazy_module"):
                out.setdefault(name, f"{rel}:{node.lineno}")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            ident = getattr(target, "id", "")
            if ident.startswith("_") and ident.endswith("_PARSERS_TO_REGISTER"):
                for key in node.value.keys:
                    for name in _strings(key):
                        out.setdefault(name, f"{rel}:{key.lineno}")  # type: ignore[union-attr]


def parser_names(root: pathlib.Path, dirs: tuple[str, ...]) -> dict[str, str] | None:
    """name -> file:line of every parser the release registers in ``dirs`` (None: no such package)."""
    found: dict[str, str] | None = None
    for d in dirs:
        base = root / d
        if not base.is_dir():
            continue
        found = {} if found is None else found
        for path in sorted(base.rglob("*.py")):
            _names_in(path, str(path.relative_to(root)), found)
    return dict(sorted(found.items())) if found is not None else None


def enum_members(root: pathlib.Path, cls: str, files: tuple[str, ...]) -> dict[str, str] | None:
    """member -> file:line of the Enum class ``cls`` in the first of ``files`` that defines it."""
    for rel in files:
        path = root / rel
        if not path.exists():
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name == cls:
                members = {}
                for stmt in node.body:
                    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                        target = stmt.targets[0]
                        if isinstance(target, ast.Name) and not target.id.startswith("_"):
                            members[target.id] = f"{rel}:{stmt.lineno}"
                return members
    return None


def names(root: pathlib.Path) -> dict[str, Any]:
    """Every kind of name the release has, each {name: file:line}. ``root`` holds the ``vllm`` package."""
    out: dict[str, Any] = {}
    for kind, dirs in PARSER_DIRS.items():
        found = parser_names(root, dirs)
        if found is not None:
            out[kind] = found
    for kind, (cls, files) in ENUMS.items():
        members = enum_members(root, cls, files)
        if members is not None:
            out[kind] = members
    return out


if __name__ == "__main__":
    json.dump(names(pathlib.Path(sys.argv[1])), sys.stdout, indent=1, sort_keys=True)
