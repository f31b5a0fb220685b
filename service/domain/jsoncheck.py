"""Checks on JSON values before they are judged, stored or hashed: finite numbers only, integers within ±2^53
(what JSON parsers agree on, and what RFC 8785 canonical JSON can encode), no NUL characters (PostgreSQL text cannot
hold them), no lone surrogates (``"\\udc00"`` parses as JSON but is not Unicode text: UTF-8 cannot encode it),
bounded nesting."""

from __future__ import annotations

import math
from typing import Any

MAX_SAFE_INT = 2**53 - 1
MAX_DEPTH = 64


class JsonValueError(ValueError):
    """A value JSON cannot carry safely; ``path`` names it (``details.x[1]``), relative to the checked value."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path or 'value'}: {problem}")
        self.path = path


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL character"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "contains a lone surrogate (not valid Unicode text)"
    return None


def check_text(text: str, path: str = "") -> None:
    """A string that can be stored and hashed as UTF-8: no NUL, no lone surrogate. Raises JsonValueError."""
    problem = _text_problem(text)
    if problem:
        raise JsonValueError(path, problem)


def check_json(value: Any, path: str = "", depth: int = 0) -> None:
    """Raise JsonValueError (a ValueError) naming the first offending path (e.g. ``config.hidden_size``).

    A plain walk without paths first (the common case: nothing to report, once per request on the plan path); only
    when it finds something (or something it does not know) does the walk that names the path decide."""
    if _has_problem(value, depth):
        _check_named(value, path, depth)


def _has_problem(value: Any, depth: int) -> bool:
    """False when ``check_json`` surely passes; True when the named walk must decide (it flags a superset: a
    container at the depth limit, a subclass). No paths are built; an explicit stack, so no recursion limit. The
    scalars of a container are judged in its loop (no stack entry, no call): this walk runs once per request."""
    if _scalar_problem(value):
        return True
    stack = [(value, depth)] if type(value) in _CONTAINERS else []
    pop, push, isfinite = stack.pop, stack.append, math.isfinite
    while stack:
        v, d = pop()
        if d >= MAX_DEPTH:
            return True
        if type(v) is dict:
            for k in v:
                if type(k) is not str or "\x00" in k or (not k.isascii() and _text_problem(k)):
                    return True
            items = v.values()
        else:
            items = v
        for x in items:
            t = type(x)
            if t is str:
                if "\x00" in x or (not x.isascii() and _text_problem(x)):
                    return True
            elif t is int:
                if x > MAX_SAFE_INT or x < -MAX_SAFE_INT:
                    return True
            elif t is float:
                if not isfinite(x):
                    return True
            elif t is dict or t is list or t is tuple:
                push((x, d + 1))
            elif x is not None and t is not bool:  # subclasses and other types: the named walk decides
                return True
    return False


_CONTAINERS = (dict, list, tuple)


def _scalar_problem(v: Any) -> bool:
    """For a top-level value: a scalar the named walk must judge, or an unknown type (containers: False)."""
    t = type(v)
    if t is str:
        return "\x00" in v or (not v.isascii() and _text_problem(v) is not None)
    if t is int:
        return bool(v > MAX_SAFE_INT or v < -MAX_SAFE_INT)
    if t is float:
        return not math.isfinite(v)
    return not (v is None or t is bool or t in _CONTAINERS)


def _check_named(value: Any, path: str = "", depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise JsonValueError(path, f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INT:
            raise JsonValueError(path, f"integer {value} is outside ±2^53")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise JsonValueError(path, f"{value} is not a finite number")
    elif isinstance(value, str):
        problem = _text_problem(value)
        if problem:
            raise JsonValueError(path, problem)
    elif isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str) or _text_problem(k):
                raise JsonValueError(path, f"key {k!r} is not a plain string")
            _check_named(v, f"{path}.{k}" if path else k, depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_named(v, f"{path or 'value'}[{i}]", depth + 1)
