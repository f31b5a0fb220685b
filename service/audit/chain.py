"""Writing to the chain: events appended inside the caller's transaction, the chain lock, and an event as the API
shows it."""

from __future__ import annotations

from secrets import token_hex
from typing import Any

from sqlalchemy import insert, text
from sqlalchemy.orm import Session

from .. import metrics
from ..db.models import AuditEvent, table_of, utcnow
from .encoding import canonical, mac_fields, sha256_hex, ts_text
from .keys import audit_keys

_ADVISORY_KEY = 0x5052454654  # "PREFT"


def append(
    session: Session,
    *,
    actor: str,
    kind: str,
    subject: str,
    payload: dict[str, Any],
    node: str | None = None,
    plan_id: str | None = None,
    model: str | None = None,
) -> None:
    """Record one event inside the caller's transaction (sealed into the chain after it commits). A plain INSERT:
    no lock, no read of the chain head."""
    append_many(
        session,
        [dict(actor=actor, kind=kind, subject=subject, payload=payload, node=node, plan_id=plan_id, model=model)],
    )


def append_many(session: Session, events: list[dict[str, Any]]) -> None:
    """Record several events (dicts with ``append``'s keyword arguments) in one INSERT, in list order — the agents'
    batched writes (services/agent_writes.py)."""
    if not events:
        return
    now = utcnow()
    rows = [
        {
            "ts": now,
            "node": None,
            "plan_id": None,
            "model": None,
            **ev,
            "payload_digest": sha256_hex(canonical(ev["payload"])),
            "nonce": token_hex(16),  # in the MAC: a copy of this row is recognisably a copy (sealing.py)
        }
        for ev in events
    ]
    keys = audit_keys(session)
    sign = keys.signer() if keys is not None else None
    for row in rows:
        row["mac"] = (
            sign(
                mac_fields(
                    row["ts"],
                    row["actor"],
                    row["kind"],
                    row["subject"],
                    row["node"],
                    row["plan_id"],
                    row["model"],
                    row["payload_digest"],
                    row["nonce"],
                )
            )
            if sign
            else None
        )
    session.execute(insert(table_of(AuditEvent)), rows)
    session.info["audit_appended"] = True
    for ev in events:
        metrics.AUDIT_APPENDS.labels(ev["kind"]).inc()


def chain_lock(session: Session, *, wait: bool) -> bool:
    """Take the chain lock for the rest of the transaction: ``pg_advisory_xact_lock`` on PostgreSQL (every replica and
    worker shares it); SQLite has a single writer already. With ``wait=False``, False when another holds it."""
    if session.get_bind().dialect.name != "postgresql":
        return True  # SQLite: the transaction already holds the database's only write lock (BEGIN IMMEDIATE)
    if wait:
        session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ADVISORY_KEY})
        return True
    return bool(session.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": _ADVISORY_KEY}).scalar())


_REFUSED: set[int] = set()  # ids of rows the sealer refused (no valid MAC), to log each once


def event_dict(ev: AuditEvent) -> dict[str, Any]:
    return {
        "id": ev.id,
        "seq": ev.chain_seq,
        "ts": ts_text(ev.ts),
        "actor": ev.actor,
        "kind": ev.kind,
        "subject": ev.subject,
        "node": ev.node,
        "plan_id": ev.plan_id,
        "model": ev.model,
        "payload": ev.payload,
        "payload_digest": ev.payload_digest,
        "prev_hash": ev.prev_hash,
        "hash": ev.hash,
    }
