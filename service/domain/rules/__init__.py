"""The rule catalogue. Each rule is one small function ``(ctx: LaunchContext) -> list[Finding]`` registered with
``@rule(codes, severity, source)``; its docstring says what it checks. ``docs/rules.md`` is generated from this
registry (``python -m service.domain.rules.catalogue``) and a test keeps it current.

Every module of this package is imported at the bottom, so adding a module adds its rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from ..context import LaunchContext
from ..findings import Finding, Severity

RuleFunc = Callable[[LaunchContext], Iterable[Finding]]


@dataclass(frozen=True)
class RuleInfo:
    codes: tuple[str, ...]
    severity: str
    source: str
    func: RuleFunc
    phase: str  # "config" (before the memory budget) or "budget" (needs ctx.budget)

    @property
    def name(self) -> str:
        return self.func.__name__

    @property
    def what(self) -> str:
        doc = (self.func.__doc__ or "").strip()
        return " ".join(doc.split("\n\n")[0].split())


RULES: list[RuleInfo] = []


def rule(*codes: str, severity: str, source: str, phase: str = "config") -> Callable[[RuleFunc], RuleFunc]:
    """Register a rule. ``severity`` documents the worst severity it emits (``error``/``warning``/``info``)."""

    def deco(func: RuleFunc) -> RuleFunc:
        RULES.append(RuleInfo(codes=tuple(codes), severity=severity, source=source, func=func, phase=phase))
        return func

    return deco


_BY_PHASE: dict[str, tuple[int, tuple[RuleFunc, ...]]] = {}


def run_rules(ctx: LaunchContext, phase: str) -> list[Finding]:
    """Every registered rule of ``phase``, in registration order."""
    hit = _BY_PHASE.get(phase)
    if hit is None or hit[0] != len(RULES):  # rules register at import; a later registration refreshes the list
        hit = _BY_PHASE[phase] = (len(RULES), tuple(info.func for info in RULES if info.phase == phase))
    out: list[Finding] = []
    for func in hit[1]:
        found = func(ctx)
        if found:
            out.extend(found)
    return out


def error(code: str, message: str, *, remedy: dict | None = None, source: str = "", field: str | None = None,
          **data) -> Finding:
    return Finding(code, Severity.ERROR, message, remedy, source, field, data)


def warning(code: str, message: str, *, remedy: dict | None = None, source: str = "", field: str | None = None,
            **data) -> Finding:
    return Finding(code, Severity.WARNING, message, remedy, source, field, data)


def info(code: str, message: str, *, remedy: dict | None = None, source: str = "", field: str | None = None,
         **data) -> Finding:
    return Finding(code, Severity.INFO, message, remedy, source, field, data)


def _register_all() -> None:
    """Import every module of this package so its ``@rule`` functions register (order: module name)."""
    import importlib
    import pkgutil

    for mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        if mod == "catalogue":  # the docs generator, run as ``python -m``; it registers no rules
            continue
        importlib.import_module(f"{__name__}.{mod}")


_register_all()
