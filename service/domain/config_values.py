"""Values inside a JSON engine option judged as vLLM's config class judges them: pydantic validates the object
(``TypeAdapter(cls).validate_json`` in ``parse_dataclass``, vllm 0.33.0 vllm/engine/arg_utils.py:359-364, or
``cls(**dict)`` as in ``create_watermark_config``, arg_utils.py:2190-2196) and vLLM exits on the first
ValidationError. The facts come from the release's own classes (scripts/vllm_catalogue_inside.py ``value_facts``
reads each class's pydantic core schema into the catalogue's ``json_keys.values``): a Literal's or an Enum's
values, a basic type, required keys, numeric bounds.

Pydantic validates in lax mode, so what it converts passes here too: ``"1"``, ``1.0`` and ``true`` for an int,
``1`` or ``"1.5"`` for a float, ``"true"``/``"yes"``/``1`` for a bool, ``"2"`` for an int Enum (pydantic 2
conversion table; checked against pydantic 2.14). Where the conversion is unclear this module accepts: a value is
only refused when pydantic surely refuses it. Fields the generator could not read exactly carry no facts and are
not judged.

A field behind a validator function of vLLM's is judged by what probing the class showed (the generator's
``validated_facts``): a string by its ``fold`` (``lower_underscore``, ``upper``, ``lower`` or ``same``: the probes
tell upper from lower case with letters whose two cases are not inverse) against ``folded``,
any other value by ``other``, or, where the function only passes values on, by the annotation's facts.

Messages use pydantic's words ("Input should be 'auto', 'xgrammar' or 'guidance'", "Field required").
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 8
MAX_PROBLEMS = 8
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_DIGITS = re.compile(r"[+-]?[0-9_]+")  # pydantic reads ASCII digits only ("３" is no integer to it)
ABSENT = object()  # the value of a required key that is missing


@dataclass(frozen=True)
class BadValue:
    """One value pydantic refuses: ``path`` inside the option (``backend``, ``pass_config.x``, ``sizes[2]``),
    the value (``ABSENT`` for a missing required key), pydantic's message and the allowed values (choices or the
    nearest bound) where the field has them."""

    path: str
    value: Any
    problem: str
    allowed: tuple[Any, ...] = ()


def _or(choices: list[Any]) -> str:
    """pydantic's list of expected values: ``'a', 'b' or 'c'``."""
    shown = [repr(c) for c in choices]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


def as_int(v: Any) -> tuple[int | None, str | None]:
    """(the int pydantic reads, None) or (None, its message); (None, None) = accepted but not read (huge)."""
    if isinstance(v, bool) or isinstance(v, int):
        return int(v), None
    if isinstance(v, float):
        if not math.isfinite(v) or not v.is_integer():
            return None, "Input should be a valid integer, got a number with a fractional part"
        return int(v), None
    if isinstance(v, str):
        text = v.strip()
        if not text.isascii():
            return None, "Input should be a valid integer, unable to parse string as an integer"
        if _DIGITS.fullmatch(text):
            try:
                return int(text), None
            except ValueError:  # more digits than Python converts: leave it to vLLM
                return None, None
        try:
            f = float(text)
        except ValueError:
            f = math.nan
        if math.isfinite(f) and f.is_integer():  # "1.0" (pydantic reads it; "1e3" too here: never a false reject)
            return int(f), None
        return None, "Input should be a valid integer, unable to parse string as an integer"
    return None, "Input should be a valid integer"


def as_float(v: Any) -> tuple[float | None, str | None]:
    if isinstance(v, (bool, int, float)):
        try:
            return float(v), None
        except OverflowError:
            return None, None
    if isinstance(v, str):
        if not v.isascii():
            return None, "Input should be a valid number, unable to parse string as a number"
        try:
            return float(v), None
        except ValueError:
            return None, "Input should be a valid number, unable to parse string as a number"
    return None, "Input should be a valid number"


def as_bool(v: Any) -> bool | None:
    """The bool pydantic's lax mode reads from ``v``, or None when it refuses it."""
    if _bool_problem(v):
        return None
    return v.lower() in _TRUE if isinstance(v, str) else bool(v)


def _bool_problem(v: Any) -> str | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        if v in (0, 1):
            return None
        return "Input should be a valid boolean" if isinstance(v, float) else _BOOL_PARSE
    if isinstance(v, str):
        return None if v.lower() in _TRUE or v.lower() in _FALSE else _BOOL_PARSE
    return "Input should be a valid boolean"


_BOOL_PARSE = "Input should be a valid boolean, unable to interpret input"
_TYPE_WORDS = {
    "str": "Input should be a valid string",
    "dict": "Input should be a valid dictionary",
    "list": "Input should be a valid list",
    "object": "Input should be a dictionary (the fields of a config class)",
}
_BOUND_WORDS = {
    "ge": "greater than or equal to",
    "gt": "greater than",
    "le": "less than or equal to",
    "lt": "less than",
}


def _bound_problem(x: float, facts: dict[str, Any]) -> tuple[str, Any] | None:
    """The first bound the number breaks (pydantic's message, the nearest allowed value or None)."""
    for bound, words in _BOUND_WORDS.items():
        limit = facts.get(bound)
        if not isinstance(limit, (int, float)) or isinstance(limit, bool):
            continue
        ok = {"ge": x >= limit, "gt": x > limit, "le": x <= limit, "lt": x < limit}[bound]
        if not ok:
            integer = facts.get("type") == "int" and isinstance(limit, int)
            nearest = limit if bound in ("ge", "le") else (limit + (1 if bound == "gt" else -1) if integer else None)
            shown = int(limit) if isinstance(limit, float) and limit.is_integer() else limit  # pydantic: "less than 1"
            return f"Input should be {words} {shown}", nearest
    return None


def _choice_problem(v: Any, facts: dict[str, Any]) -> str | None:
    choices = facts["choices"]
    words = f"Input should be {_or(choices)}"
    kind = facts.get("type")
    if kind == "int" or kind == "float":  # an int/float Enum: pydantic reads the number first ("2" is 2)
        x, problem = as_int(v) if kind == "int" else as_float(v)
        if x is None:
            return None if problem is None else words
        return None if x in choices else words
    if kind == "str" and not isinstance(v, str):
        return words
    # a Literal (or a plain Enum): equal values pass (1.0 and True for 1), a string only equals a string
    return None if any(v == c and isinstance(v, str) == isinstance(c, str) for c in choices) else words


FOLDS = {
    "lower_underscore": lambda s: s.lower().replace("-", "_"),
    "upper": lambda s: s.upper(),
    "lower": lambda s: s.lower(),
    "same": lambda s: s,
}


def _folded_problem(v: Any, facts: dict[str, Any], depth: int) -> tuple[str, Any] | None:
    """A field whose validator folds a string before its Literal/Enum: a string by its fold, anything else by the
    annotation's facts where the probes showed them (``other``)."""
    if v is None:
        return None if facts.get("null") else ("Input should not be None", None)
    fold, folded = FOLDS.get(str(facts["fold"])), facts.get("folded")
    if not isinstance(v, str):
        other = facts.get("other")
        return judge(v, other, depth + 1) if isinstance(other, dict) else None
    if fold is None or not isinstance(folded, list):
        return None
    return None if fold(v) in folded else (f"Input should be {_or(folded)}", None)


def judge(v: Any, facts: dict[str, Any], depth: int = 0, folds: bool = True) -> tuple[str, Any] | None:
    """(pydantic's message, the nearest allowed value or None) when pydantic refuses ``v`` itself (not its items or
    values: ``problems`` looks inside); None when it passes or the facts do not say. ``folds``: judge names read
    through a validator (off for a request of another release than the catalogue's: a later one may add names)."""
    if "fold" in facts:
        return _folded_problem(v, facts, depth) if folds and depth <= MAX_DEPTH else None
    if v is None:
        if facts.get("null") or not (facts.get("type") or facts.get("choices") or facts.get("any_of")):
            return None
        if "choices" in facts:
            return f"Input should be {_or(facts['choices'])}", None
    if "any_of" in facts:  # a union passes when one member takes the value whole (its items and values too)
        found = [problems(v, m, "", depth + 1) for m in facts["any_of"] if isinstance(m, dict)]
        if not found or any(not p for p in found):
            return None
        said = (f"{p[0].path}: {p[0].problem}" if p[0].path else p[0].problem for p in found)
        return " | ".join(dict.fromkeys(said)), None
    if "choices" in facts:
        problem = _choice_problem(v, facts)
        return (problem, None) if problem else None
    kind = facts.get("type")
    if kind == "int" or kind == "float":
        x, problem = as_int(v) if kind == "int" else as_float(v)
        if problem:
            return problem, None
        return _bound_problem(x, facts) if x is not None else None
    if kind == "bool":
        problem = _bool_problem(v)
        return (problem, None) if problem else None
    expected = {"str": str, "dict": dict, "list": list, "object": dict}.get(kind or "")
    if expected is not None and not isinstance(v, expected):
        return _TYPE_WORDS[kind or ""], None
    return None


def problems(v: Any, facts: dict[str, Any], path: str = "", depth: int = 0, folds: bool = True) -> list[BadValue]:
    """What pydantic refuses in ``v`` (up to MAX_PROBLEMS): the value itself, else a list's items (``path[2]``)
    and a dict's values (``path.key``), as deep as the facts go (``items``/``values``; vLLM's
    ``dict[str, dict[str, Any]]`` or ``str | dict[str, str]``)."""
    if depth > MAX_DEPTH or not isinstance(facts, dict):
        return []
    found = judge(v, facts, depth, folds)
    if found:
        problem, nearest = found
        listed = facts.get("choices") or facts.get("folded") or ()
        allowed = tuple(listed) or ((nearest,) if nearest is not None else ())
        return [BadValue(path, v, problem, allowed)]
    out: list[BadValue] = []
    inner = facts.get("items") if isinstance(v, list) else facts.get("values") if isinstance(v, dict) else None
    if isinstance(inner, dict):
        pairs = enumerate(v) if isinstance(v, list) else v.items()
        for key, item in pairs:
            where = f"{path}[{key}]" if isinstance(v, list) else f"{path}.{key}" if path else str(key)
            out += problems(item, inner, where, depth + 1, folds)
            if len(out) >= MAX_PROBLEMS:
                break
    return out[:MAX_PROBLEMS]


def bad_values(
    value: dict[str, Any],
    schema: dict[str, Any],
    prefix: str = "",
    depth: int = 0,
    out: list[BadValue] | None = None,
    folds: bool = True,
) -> list[BadValue]:
    """Every value of a JSON option (up to MAX_PROBLEMS) that the option's config class refuses, with its dotted
    path; ``schema`` is the option's ``json_keys`` (``values``: the facts per key, ``keys``: nested classes)."""
    out = [] if out is None else out
    facts = schema.get("values")
    if not isinstance(facts, dict) or depth > MAX_DEPTH:
        return out
    for key, f in facts.items():
        if f.get("required") and key not in value and len(out) < MAX_PROBLEMS:
            out.append(BadValue(prefix + key, ABSENT, "Field required"))
    subs = schema.get("keys") or {}
    for key, v in value.items():
        if len(out) >= MAX_PROBLEMS:
            break
        found = problems(v, facts.get(key) or {}, prefix + key, depth, folds)
        if found:
            out += found
        elif isinstance(v, dict) and isinstance(subs.get(key), dict):
            bad_values(v, subs[key], f"{prefix}{key}.", depth + 1, out, folds)
    return out[:MAX_PROBLEMS]
