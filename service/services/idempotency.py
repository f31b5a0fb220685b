"""``Idempotency-Key`` for POST /v1/plans and /v1/manifests: the same key and body replay the first response; the
same key with another body is a 422. The key row is written in the same transaction as the resource, so a crash
leaves neither; a concurrent duplicate blocks on the unique index until the first commits, then replays it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from .. import audit
from ..db.models import IdempotencyKey
from ..db.session import Database
from ..errors import Invalid


def scope(route: str, principal: str) -> str:
    """Keys are scoped per caller: the same key from two principals names two requests (one caller never receives
    another's response). Stored in the ``route`` column: the route and a digest of the principal's name."""
    return f"{route} {audit.sha256_hex(principal.encode())[:24]}"


def run(
    db: Database,
    *,
    route: str,
    principal: str,
    key: str | None,
    request: BaseModel,
    status_code: int,
    action: Callable[[Session], dict[str, Any]],
) -> tuple[int, dict[str, Any], bool]:
    """Run ``action(session)`` once per (route, principal, key): the request is compared by its JSON's digest, the
    answer (``action``'s JSON) stored with the key. Returns (status, response, replayed)."""
    route = scope(route, principal)
    if not key:
        with db.transaction() as s:
            return status_code, action(s), False
    if len(key) > 256:
        raise Invalid("Idempotency-Key is longer than 256 characters", field="Idempotency-Key")
    digest = audit.sha256_hex(audit.canonical(request.model_dump(mode="json")))
    for _ in range(3):
        stored = _lookup(db, route, key)
        if stored is not None:
            return _replay(stored, digest)
        try:
            with db.transaction() as s:
                row = IdempotencyKey(route=route, key=key, request_hash=digest, status_code=status_code, response={})
                s.add(row)
                s.flush()  # takes the unique index entry now: a concurrent twin waits here
                response = action(s)
                row.response = response
                return status_code, response, False
        except IntegrityError:
            continue  # the twin committed first: replay its response
    stored = _lookup(db, route, key)
    if stored is None:  # pragma: no cover - would need three lost races in a row
        raise Invalid("could not settle the Idempotency-Key; retry", field="Idempotency-Key")
    return _replay(stored, digest)


def _lookup(db: Database, route: str, key: str):
    with db.transaction() as s:
        row = s.execute(
            select(IdempotencyKey).where(IdempotencyKey.route == route, IdempotencyKey.key == key)
        ).scalar_one_or_none()
        return None if row is None else (row.request_hash, row.status_code, row.response)


def _replay(stored, digest: str) -> tuple[int, dict[str, Any], bool]:
    request_hash, status_code, response = stored
    if request_hash != digest:
        raise Invalid("this Idempotency-Key was used with a different request body", field="Idempotency-Key")
    return status_code, response, True
