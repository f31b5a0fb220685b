"""Findings: what one rule says about one launch request."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dc_field
from enum import Enum
from typing import Any


class Severity(str, Enum):
    """``error``: vLLM 0.33 would refuse (or fail in the worker); ``warning``: it starts but an operator's rule is
    broken; ``info``: a derived fact worth knowing."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True)
class Finding:
    """One rule's verdict on a request.

    ``rule`` is a code from tests/cases/README.md (e.g. ``tp_heads_divisible``); ``message`` carries the numbers;
    ``remedy`` is machine-readable (e.g. ``{"tensor_parallel_size": [1, 2, 4, 8]}``) so a deploy script can act on it;
    ``source`` names the vLLM file/line or guide section the rule mirrors: the source the emitting rule registered
    (``@rule(..., source=...)``; the registry stamps it).
    """

    rule: str
    severity: Severity
    message: str
    remedy: dict[str, Any] | None = None
    source: str = ""
    field: str | None = None
    data: dict[str, Any] = dc_field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rule": self.rule,
            "severity": self.severity.value,
            "message": self.message,
            "remedy": self.remedy,
            "source": self.source,
        }
        if self.field:
            out["field"] = self.field
        if self.data:
            out["data"] = self.data
        return out


def verdict_of(findings: list[Finding]) -> str:
    """``reject`` if any error, else ``warn`` if any warning, else ``accept``."""
    severities = {f.severity for f in findings}
    if Severity.ERROR in severities:
        return "reject"
    if Severity.WARNING in severities:
        return "warn"
    return "accept"
