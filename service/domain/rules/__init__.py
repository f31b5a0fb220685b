"""The rule catalogue. Each rule is one small function ``(ctx, emit) -> list[Finding]`` registered with
``@rule(codes, severity, source)``; its docstring says what it checks. ``docs/rules.md`` is generated from this
registry (``python -m service.domain.rules.catalogue``) and a test keeps it current.

A rule builds its findings only through the ``Emit`` the registry hands it: ``emit.error(code, message, ...)``
(``warning``, ``info``) accepts one of the rule's own codes and stamps the rule's registered source, so a rule
cannot speak for another and its source is written once, in ``@rule(...)``. The decorated name is the rule as
callers use it: ``(ctx) -> list[Finding]``.

Every module of this package is imported at the bottom, so adding a module adds its rules.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..context import LaunchContext
from ..findings import Finding, Severity

Phase = Literal["config", "budget"]  # "config": before the memory budget; "budget": needs ctx.budget
RuleFunc = Callable[[LaunchContext], list[Finding]]


class Emit:
    """The finding builder bound to one registered rule: its codes and its source."""

    __slots__ = ("codes", "source")

    def __init__(self, codes: tuple[str, ...], source: str) -> None:
        self.codes = codes
        self.source = source

    def _finding(
        self,
        code: str,
        severity: Severity,
        message: str,
        remedy: dict[str, Any] | None,
        field: str | None,
        data: dict[str, Any],
    ) -> Finding:
        if code not in self.codes:  # a programming error: the rule registered other codes
            raise ValueError(f"a rule registered for {self.codes} emitted {code!r}")
        return Finding(code, severity, message, remedy, self.source, field, data)

    def error(
        self, code: str, message: str, *, remedy: dict[str, Any] | None = None, field: str | None = None, **data: Any
    ) -> Finding:
        return self._finding(code, Severity.ERROR, message, remedy, field, data)

    def warning(
        self, code: str, message: str, *, remedy: dict[str, Any] | None = None, field: str | None = None, **data: Any
    ) -> Finding:
        return self._finding(code, Severity.WARNING, message, remedy, field, data)

    def info(
        self, code: str, message: str, *, remedy: dict[str, Any] | None = None, field: str | None = None, **data: Any
    ) -> Finding:
        return self._finding(code, Severity.INFO, message, remedy, field, data)


RuleBody = Callable[[LaunchContext, Emit], list[Finding]]


@dataclass(frozen=True)
class RuleInfo:
    codes: tuple[str, ...]
    severity: str
    source: str
    func: RuleFunc
    phase: Phase
    # the undecorated body and its Emit: what run_rules calls (one call per rule instead of two)
    body: RuleBody | None = field(default=None, compare=False, repr=False)
    emit: Emit | None = field(default=None, compare=False, repr=False)
    # the options the rule judges: with none of them among the launch's engine arguments it finds nothing (a test
    # runs every such rule without them, on every release line), so run_rules does not call it
    when: frozenset[str] | None = None

    @property
    def name(self) -> str:
        return self.func.__name__

    @property
    def what(self) -> str:
        doc = (self.func.__doc__ or "").strip()
        return " ".join(doc.split("\n\n")[0].split())


RULES: list[RuleInfo] = []


def rule(
    *codes: str, severity: str, source: str, phase: Phase = "config", when: tuple[str, ...] = ()
) -> Callable[[RuleBody], RuleFunc]:
    """Register a rule. ``severity`` documents the worst severity it emits (``error``/``warning``/``info``);
    ``when``: the engine arguments without which the rule finds nothing (it is then not called)."""

    def deco(body: RuleBody) -> RuleFunc:
        emit = Emit(tuple(codes), source)

        @functools.wraps(body)
        def run(ctx: LaunchContext) -> list[Finding]:
            return body(ctx, emit)

        RULES.append(
            RuleInfo(
                codes=tuple(codes),
                severity=severity,
                source=source,
                func=run,
                phase=phase,
                body=body,
                emit=emit,
                when=frozenset(when) or None,
            )
        )
        return run

    return deco


_Bound = tuple[RuleBody, Emit, "frozenset[str] | None"]
_BY_PHASE: dict[str, tuple[int, tuple[_Bound, ...]]] = {}


def _bound(info: RuleInfo) -> _Bound:
    if info.body is not None and info.emit is not None:
        return info.body, info.emit, info.when
    func = info.func
    return (lambda ctx, _emit: func(ctx)), Emit(info.codes, info.source), info.when


def run_rules(ctx: LaunchContext, phase: Phase) -> list[Finding]:
    """Every registered rule of ``phase``, in registration order."""
    hit = _BY_PHASE.get(phase)
    if hit is None or hit[0] != len(RULES):  # rules register at import; a later registration refreshes the list
        hit = _BY_PHASE[phase] = (len(RULES), tuple(_bound(info) for info in RULES if info.phase == phase))
    out: list[Finding] = []
    given = ctx.args.values.keys()
    for body, emit, when in hit[1]:
        if when is not None and given.isdisjoint(when):
            continue
        found = body(ctx, emit)
        if found:
            out.extend(found)
    return out


def _register_all() -> None:
    """Import every module of this package so its ``@rule`` functions register (order: module name)."""
    import importlib
    import pkgutil

    for mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        if mod == "catalogue":  # the docs generator, run as ``python -m``; it registers no rules
            continue
        importlib.import_module(f"{__name__}.{mod}")


_register_all()
