"""The tamper-evident audit log: an append-only hash chain over canonical JSON (RFC 8785, via ``rfc8785``).

Each event stores ``payload_digest = sha256(JCS(payload))`` and
``hash = sha256(JCS({"prev_hash", "ts", "actor", "kind", "subject", "node", "plan_id", "payload_digest"}))``; the first
event's ``prev_hash`` is 64 zeros. Appends serialize on the chain head (a transaction-scoped advisory lock on
PostgreSQL, a process lock plus SQLite's single writer), so concurrent writers never fork the chain.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import threading
from typing import Any

import rfc8785
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from . import metrics
from .db.models import AuditEvent, utcnow

GENESIS = "0" * 64
_ADVISORY_KEY = 0x5052454654  # "PREFT"
_sqlite_lock = threading.Lock()


def canonical(obj: Any) -> bytes:
    return rfc8785.dumps(obj)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _ts(value: dt.datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return value.astimezone(dt.timezone.utc).isoformat(timespec="microseconds")


def event_hash(prev_hash: str, ts: dt.datetime, actor: str, kind: str, subject: str, node: str | None,
               plan_id: str | None, model: str | None, payload_digest: str) -> str:
    return sha256_hex(canonical({
        "prev_hash": prev_hash, "ts": _ts(ts), "actor": actor, "kind": kind, "subject": subject,
        "node": node, "plan_id": plan_id, "model": model, "payload_digest": payload_digest,
    }))


def append(session: Session, *, actor: str, kind: str, subject: str, payload: dict[str, Any],
           node: str | None = None, plan_id: str | None = None, model: str | None = None) -> AuditEvent:
    """Append one event inside the caller's transaction (it commits or rolls back with the state change).

    The chain head is read under a lock held to the end of the transaction: ``pg_advisory_xact_lock`` on
    PostgreSQL (every replica and worker serializes here), a process lock plus SQLite's single writer otherwise.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ADVISORY_KEY})
        return _append_locked(session, actor, kind, subject, payload, node, plan_id, model)
    with _sqlite_lock:
        return _append_locked(session, actor, kind, subject, payload, node, plan_id, model)


def _append_locked(session, actor, kind, subject, payload, node, plan_id, model) -> AuditEvent:
    prev = session.execute(select(AuditEvent.hash).order_by(AuditEvent.id.desc()).limit(1)).scalar()
    prev_hash = prev or GENESIS
    ts = utcnow()
    digest = sha256_hex(canonical(payload))
    ev = AuditEvent(ts=ts, actor=actor, kind=kind, subject=subject, node=node, plan_id=plan_id, model=model,
                    payload=payload, payload_digest=digest, prev_hash=prev_hash,
                    hash=event_hash(prev_hash, ts, actor, kind, subject, node, plan_id, model, digest))
    session.add(ev)
    session.flush()
    metrics.AUDIT_APPENDS.labels(kind).inc()
    return ev


def verify_chain(session: Session, batch: int = 5000, up_to: int | None = None) -> dict[str, Any]:
    """Recompute the chain in id order (up to event ``up_to`` when given). ``{"ok": True, "events": N, "head":
    HASH, "last_id": ID}`` or ``{"ok": False, "events": N, "first_broken": {"id", "kind", "reason"}}``."""
    prev_hash, count, last_id = GENESIS, 0, 0
    while True:
        q = select(AuditEvent).where(AuditEvent.id > last_id).order_by(AuditEvent.id).limit(batch)
        if up_to is not None:
            q = q.where(AuditEvent.id <= up_to)
        rows = session.execute(q).scalars().all()
        if not rows:
            break
        for ev in rows:
            count += 1
            reason = None
            if ev.prev_hash != prev_hash:
                reason = "prev_hash does not link to the previous event (deleted or reordered)"
            elif sha256_hex(canonical(ev.payload)) != ev.payload_digest:
                reason = "payload does not match payload_digest (edited)"
            elif event_hash(ev.prev_hash, ev.ts, ev.actor, ev.kind, ev.subject, ev.node, ev.plan_id, ev.model,
                            ev.payload_digest) != ev.hash:
                reason = "hash does not match the event's fields (edited)"
            if reason:
                return {"ok": False, "events": count, "first_broken": {"id": ev.id, "kind": ev.kind, "reason": reason}}
            prev_hash, last_id = ev.hash, ev.id
        session.expunge_all()
    return {"ok": True, "events": count, "head": prev_hash, "last_id": last_id}


def event_dict(ev: AuditEvent) -> dict[str, Any]:
    return {
        "id": ev.id, "ts": _ts(ev.ts), "actor": ev.actor, "kind": ev.kind, "subject": ev.subject, "node": ev.node,
        "plan_id": ev.plan_id, "model": ev.model, "payload": ev.payload, "payload_digest": ev.payload_digest,
        "prev_hash": ev.prev_hash, "hash": ev.hash,
    }


CHECKPOINT_TYPE = "application/vnd.preflight.audit-checkpoint+jwt"


def checkpoint_claims(session: Session, issuer: str) -> dict[str, Any]:
    """The chain head as of now, to be signed with the service key: ``{"iss", "iat", "events", "last_id",
    "head"}``. Raises ValueError when the chain is broken (a checkpoint never vouches for a broken chain)."""
    out = verify_chain(session)
    if not out["ok"]:
        raise ValueError(f"audit chain broken at event {out['first_broken']['id']}: {out['first_broken']['reason']}")
    return {"iss": issuer, "iat": int(utcnow().timestamp()), "events": out["events"], "last_id": out["last_id"],
            "head": out["head"], "typ": "audit-checkpoint"}


def check_checkpoint(session: Session, claims: dict[str, Any]) -> dict[str, Any]:
    """Recompute a (signature-verified) checkpoint against this database: the chain up to ``last_id`` must be
    intact, hold the same number of events and end in the same head hash."""
    out = verify_chain(session, up_to=int(claims["last_id"]))
    if not out["ok"]:
        return {"ok": False, "reason": "chain broken", "first_broken": out["first_broken"]}
    if out["events"] != claims["events"] or out["head"] != claims["head"]:
        return {"ok": False, "reason": "the chain up to the checkpoint differs (events deleted, inserted or edited)",
                "expected": {"events": claims["events"], "head": claims["head"]},
                "found": {"events": out["events"], "head": out["head"]}}
    return {"ok": True, "events": out["events"], "head": out["head"], "last_id": out["last_id"]}
