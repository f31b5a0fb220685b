"""Helpers for the rules that mirror a check vLLM makes between options: a check applies from the oldest release line
whose source was read and found to make it (``at_least``), with the message that line prints (``for_line``). This
module registers no rules."""

from __future__ import annotations

import json
from functools import cache
from typing import Any, TypeVar

from ..config_values import as_bool, as_float, as_int
from ..context import LaunchContext
from ..versions import DATA_DIR, Architecture, parse_version

Line = tuple[int, int]
T = TypeVar("T")


def at_least(ctx: LaunchContext, line: Line) -> bool:
    """The target release line is ``line`` or newer (a request for 0.31.2 is judged by the 0.30 line's data)."""
    return ctx.line.release[:2] >= line


def for_line(ctx: LaunchContext, texts: dict[Line, T]) -> T:
    """The text of the newest entry whose line is not newer than the target line (the oldest entry otherwise)."""
    here = ctx.line.release[:2]
    fitting = [line for line in texts if line <= here]
    return texts[max(fitting) if fitting else min(texts)]


@cache
def check_lines() -> dict[str, Any]:
    """``service/data/vllm/checks/check_lines.json``: per check vLLM makes, the release lines whose source makes it, where,
    and with which message (scripts/vllm_check_lines.py, read from each line's wheel)."""
    data: dict[str, Any] = json.loads((DATA_DIR / "checks" / "check_lines.json").read_text())
    return data


def own_line(ctx: LaunchContext) -> bool:
    """The request names a release of the generated catalogue's own minor line (a later release may add names)."""
    asked = parse_version(ctx.version)
    return asked is not None and asked[:2] == ctx.line.release[:2]


def vllm_checks(ctx: LaunchContext, check: str) -> bool:
    """The target release line makes ``check`` at start-up: its source holds the check's message and the check is
    not marked unreachable there. An unknown check id is a KeyError (a typo must not silently switch a rule off)."""
    return ctx.line.newest in check_lines()["checks"][check]["lines"]


def vllm_message(ctx: LaunchContext, check: str) -> str | None:
    """The message the target line's source gives for ``check`` (f-string fields as ``{expr}``), None where the line
    does not make it."""
    found = check_lines()["checks"][check]["found"].get(ctx.line.newest)
    return str(found[0]["text"]) if found else None


def effective(ctx: LaunchContext, name: str) -> Any:
    """An option's value as vLLM holds it: the request's, else the release's parser default (None when the release
    has no such option)."""
    if name in ctx.args.given:
        return ctx.args.values.get(name)
    opt = ctx.line.options.get(name)
    return opt.default if opt is not None else None


def registry_arch(ctx: LaunchContext) -> Architecture | None:
    """The release's registry entry for the model: the first of config.json's architectures the release has."""
    for arch in ctx.facts.architectures:
        found = ctx.line.architectures.get(arch)
        if found is not None:
            return found
    return None


def whole(value: Any) -> int | None:
    """A JSON integer (not a boolean), else None: a value of another type is judged by the option's own checks."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def number(value: Any) -> float | None:
    """A JSON number (not a boolean), else None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# Values inside a config class that pydantic validates in lax mode (SpeculativeConfig, EPLBConfig, ...): a check
# between its fields sees what pydantic converted ("3" and 3.0 are 3, "yes" is True); None where pydantic refuses
# the value (its own type error says so) — service/domain/config_values.py


def lax_int(value: Any) -> int | None:
    """The int pydantic's lax mode reads from ``value`` (``"3"``, ``3.0``, ``True``), else None."""
    return as_int(value)[0]


def lax_number(value: Any) -> float | None:
    """The float pydantic's lax mode reads from ``value`` (``"0.5"``, ``1``), else None."""
    return as_float(value)[0]


def lax_true(value: Any) -> bool:
    """``value`` is True for a bool field in pydantic's lax mode (``True``, ``1``, ``"yes"``, ``"true"``, ...)."""
    return as_bool(value) is True
