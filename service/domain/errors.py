"""Errors of the domain core: bad input that cannot be judged at all (distinct from findings, which judge it)."""

from __future__ import annotations

from typing import Any


class DomainError(ValueError):
    """Input the domain cannot work with.

    ``field`` is a dotted path into the launch request (``hardware.gpu``, ``model.quantization_txt``),
    ``rule`` the short name of what was violated. The HTTP layer maps it to a 422 problem+json.
    """

    def __init__(self, field: str, message: str, *, rule: str = "invalid", accepted: list[str] | None = None):
        super().__init__(message)
        self.field = field
        self.message = message
        self.rule = rule
        self.accepted = accepted

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"field": self.field, "rule": self.rule, "message": self.message}
        if self.accepted is not None:
            out["accepted"] = self.accepted
        return out
