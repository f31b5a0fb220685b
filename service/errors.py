"""One exception root for the service; the HTTP adapter maps it to RFC 9457 ``application/problem+json``."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    status = 400
    title = "Bad request"
    type_suffix = "bad-request"

    def __init__(self, detail: str, **extra: Any):
        super().__init__(detail)
        self.detail = detail
        self.extra = extra

    def problem(self) -> dict[str, Any]:
        return {
            "type": f"https://preflight.dev/problems/{self.type_suffix}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            **self.extra,
        }


class NotFound(ApiError):
    status, title, type_suffix = 404, "Not found", "not-found"


class Conflict(ApiError):
    status, title, type_suffix = 409, "Conflict", "conflict"


class Unauthorized(ApiError):
    status, title, type_suffix = 401, "Unauthorized", "unauthorized"


class Forbidden(ApiError):
    status, title, type_suffix = 403, "Forbidden", "forbidden"


class Invalid(ApiError):
    status, title, type_suffix = 422, "Invalid request", "invalid"


class LaunchRejected(ApiError):
    status, title, type_suffix = 422, "Launch rejected", "launch-rejected"


class PreconditionFailed(ApiError):
    status, title, type_suffix = 412, "Precondition failed", "precondition-failed"


class Unavailable(ApiError):
    status, title, type_suffix = 503, "Service unavailable", "unavailable"


class Busy(ApiError):
    """Too much of one kind of work at once (429, ``Retry-After``)."""

    status, title, type_suffix = 429, "Too many requests", "busy"

    def __init__(self, detail: str, *, retry_after: int = 5, **extra: Any):
        super().__init__(detail, **extra)
        self.retry_after = retry_after


class GroupHold(Conflict):
    """A worker of a multi-node group asked for its plan before its head runs it (409, ``Retry-After``, ``hold``:
    domain/group_gate.py)."""

    type_suffix = "group-hold"

    def __init__(self, detail: str, *, retry_after: int = 5, **extra: Any):
        super().__init__(detail, **extra)
        self.retry_after = retry_after
