"""The tamper-evident audit log: an append-only hash chain over canonical JSON (RFC 8785, via ``rfc8785``).

Two steps, so that the chain never serializes the requests that write events:

1. **append** — inside the caller's transaction, an event row is inserted with its ``payload_digest =
   sha256(JCS(payload))`` and no chain position yet. It commits or rolls back with the state change it records
   (no half-written rows, no lock held by the request).
2. **seal** — a sealer takes the chain lock (``pg_advisory_xact_lock`` on PostgreSQL, which every replica and worker
   shares; SQLite has a single writer), reads the chain head and gives every committed, unsealed event, in insertion
   order, the next ``chain_seq``, ``prev_hash`` and ``hash = sha256(JCS({"seq", "prev_hash", "ts", "actor", "kind",
   "subject", "node", "plan_id", "model", "payload_digest"}))``. The first event's ``prev_hash`` is 64 zeros.
   In the service a background thread per process seals a burst of writes as one batch moments after they commit
   (``Sealer``); the CLI seals at once; readers that vouch for the chain (verify, checkpoints, listings) seal first.

Verification recomputes every sealed event in ``chain_seq`` order; an edit, deletion or reordering breaks a link and
is reported with the event's id. Events not yet sealed (normally for milliseconds) are counted as ``pending``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import threading
from typing import Any

import rfc8785
from sqlalchemy import bindparam, insert, select, text, update
from sqlalchemy.orm import Session

from . import metrics
from .db.models import AuditEvent, utcnow

GENESIS = "0" * 64
_ADVISORY_KEY = 0x5052454654  # "PREFT"
SEAL_BATCH = 2000
SEAL_INTERVAL = 0.05  # how long a woken sealer lets writes gather before sealing them
SWEEP_INTERVAL = 2.0  # how often an idle sealer looks for events other processes left unsealed
log = logging.getLogger("preflight.audit")


def canonical(obj: Any) -> bytes:
    return rfc8785.dumps(obj)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _ts(value: dt.datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return value.astimezone(dt.timezone.utc).isoformat(timespec="microseconds")


def event_hash(seq: int, prev_hash: str, ts: dt.datetime, actor: str, kind: str, subject: str, node: str | None,
               plan_id: str | None, model: str | None, payload_digest: str) -> str:
    return sha256_hex(canonical({
        "seq": seq, "prev_hash": prev_hash, "ts": _ts(ts), "actor": actor, "kind": kind, "subject": subject,
        "node": node, "plan_id": plan_id, "model": model, "payload_digest": payload_digest,
    }))


def _hash_of(ev: AuditEvent, seq: int, prev_hash: str) -> str:
    return event_hash(seq, prev_hash, ev.ts, ev.actor, ev.kind, ev.subject, ev.node, ev.plan_id, ev.model,
                      ev.payload_digest)


def append(session: Session, *, actor: str, kind: str, subject: str, payload: dict[str, Any],
           node: str | None = None, plan_id: str | None = None, model: str | None = None) -> None:
    """Record one event inside the caller's transaction (sealed into the chain after it commits). A plain INSERT:
    no lock, no read of the chain head."""
    append_many(session, [dict(actor=actor, kind=kind, subject=subject, payload=payload, node=node, plan_id=plan_id,
                               model=model)])


def append_many(session: Session, events: list[dict[str, Any]]) -> None:
    """Record several events (dicts with ``append``'s keyword arguments) in one INSERT, in list order — the agents'
    batched writes (services/agent_writes.py)."""
    if not events:
        return
    now = utcnow()
    rows = [{"ts": now, "node": None, "plan_id": None, "model": None, **ev,
             "payload_digest": sha256_hex(canonical(ev["payload"]))} for ev in events]
    session.execute(insert(AuditEvent.__table__), rows)
    session.info["audit_appended"] = True
    for ev in events:
        metrics.AUDIT_APPENDS.labels(ev["kind"]).inc()


def _lock(session: Session, *, wait: bool) -> bool:
    if session.get_bind().dialect.name != "postgresql":
        return True  # SQLite: the transaction already holds the database's only write lock (BEGIN IMMEDIATE)
    if wait:
        session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ADVISORY_KEY})
        return True
    return bool(session.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": _ADVISORY_KEY}).scalar())


def seal(session: Session, *, wait: bool = True, batch: int = SEAL_BATCH) -> int:
    """Chain the committed, unsealed events (in id order) under the chain lock; returns how many were sealed.
    With ``wait=False`` it returns 0 at once when another sealer holds the lock."""
    if not _lock(session, wait=wait):
        return 0
    head = session.execute(select(AuditEvent.chain_seq, AuditEvent.hash).where(AuditEvent.chain_seq.is_not(None))
                           .order_by(AuditEvent.chain_seq.desc()).limit(1)).first()
    seq, prev = (head[0], head[1]) if head else (0, GENESIS)
    total = 0
    while True:
        pending = session.execute(select(AuditEvent).where(AuditEvent.chain_seq.is_(None)).order_by(AuditEvent.id)
                                  .limit(batch)).scalars().all()
        if not pending:
            return total
        rows = []
        for ev in pending:
            seq += 1
            h = _hash_of(ev, seq, prev)
            rows.append({"_id": ev.id, "chain_seq": seq, "prev_hash": prev, "hash": h})
            prev = h
        table = AuditEvent.__table__
        session.connection().execute(update(table).where(table.c.id == bindparam("_id"))
                                     .values(chain_seq=bindparam("chain_seq"), prev_hash=bindparam("prev_hash"),
                                             hash=bindparam("hash")), rows)
        session.expunge_all()
        total += len(rows)
        if len(rows) < batch:
            return total


class Sealer:
    """Per-process sealing. In a service process (``background = True``) writers only signal a background thread,
    which seals what is pending at most ``SEAL_INTERVAL`` seconds later — one lock and one transaction per batch,
    none in the request path. Elsewhere (CLI, tests) ``seal_soon`` seals at once. The thread also sweeps every few
    seconds for events written by other processes that exited before sealing."""

    def __init__(self, db):
        self.db = db
        self.background = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def seal_now(self, *, wait: bool = True) -> int:
        with self.db.sessions() as s:
            with s.begin():
                return seal(s, wait=wait)

    def seal_soon(self) -> None:
        if self.background:
            self._wake.set()
            return
        try:
            self.seal_now(wait=True)
        except Exception as exc:  # never fail the write that already committed; the next seal picks it up
            log.warning("audit seal deferred: %s", exc.__class__.__name__)

    def start(self) -> None:
        self.background = True
        self._stop.clear()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="audit-sealer", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread after a last seal (nothing committed stays unsealed because of a shutdown)."""
        self.background = False
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while True:
            woken = self._wake.wait(SWEEP_INTERVAL)
            if woken and not self._stop.is_set():
                self._stop.wait(SEAL_INTERVAL)  # let a burst of writes gather into one batch
            self._wake.clear()
            try:
                self.seal_now(wait=True)
            except Exception as exc:  # database down: keep trying
                log.warning("audit sealer: %s", exc.__class__.__name__)
            if self._stop.is_set():
                return


def verify_chain(session: Session, batch: int = 5000, up_to: int | None = None) -> dict[str, Any]:
    """Recompute the sealed chain in ``chain_seq`` order (up to ``up_to`` when given).

    ``{"ok": True, "events": N, "head": HASH, "last_seq": SEQ, "pending": P}`` or
    ``{"ok": False, "events": N, "first_broken": {"id", "seq", "kind", "reason"}}``."""
    prev_hash, count, last_seq, expected_seq = GENESIS, 0, 0, 1
    while True:
        q = (select(AuditEvent).where(AuditEvent.chain_seq.is_not(None), AuditEvent.chain_seq > last_seq)
             .order_by(AuditEvent.chain_seq).limit(batch))
        if up_to is not None:
            q = q.where(AuditEvent.chain_seq <= up_to)
        rows = session.execute(q).scalars().all()
        if not rows:
            break
        for ev in rows:
            count += 1
            reason = None
            if ev.chain_seq != expected_seq or ev.prev_hash != prev_hash:
                reason = "does not link to the previous event (an event was deleted or reordered)"
            elif sha256_hex(canonical(ev.payload)) != ev.payload_digest:
                reason = "payload does not match payload_digest (edited)"
            elif _hash_of(ev, ev.chain_seq, ev.prev_hash) != ev.hash:
                reason = "hash does not match the event's fields (edited)"
            if reason:
                return {"ok": False, "events": count,
                        "first_broken": {"id": ev.id, "seq": ev.chain_seq, "kind": ev.kind, "reason": reason}}
            prev_hash, last_seq, expected_seq = ev.hash, ev.chain_seq, ev.chain_seq + 1
        session.expunge_all()
    pending = session.execute(select(AuditEvent.id).where(AuditEvent.chain_seq.is_(None)).limit(1)).first()
    out = {"ok": True, "events": count, "head": prev_hash, "last_seq": last_seq}
    if up_to is None:
        out["pending"] = 0 if pending is None else session.execute(
            text("SELECT count(*) FROM audit_events WHERE chain_seq IS NULL")).scalar()
    return out


def event_dict(ev: AuditEvent) -> dict[str, Any]:
    return {
        "id": ev.id, "seq": ev.chain_seq, "ts": _ts(ev.ts), "actor": ev.actor, "kind": ev.kind,
        "subject": ev.subject, "node": ev.node, "plan_id": ev.plan_id, "model": ev.model, "payload": ev.payload,
        "payload_digest": ev.payload_digest, "prev_hash": ev.prev_hash, "hash": ev.hash,
    }


CHECKPOINT_TYPE = "application/vnd.preflight.audit-checkpoint+jwt"


def checkpoint_claims(session: Session, issuer: str) -> dict[str, Any]:
    """The chain head as of now (seal first), to be signed with the service key: ``{"iss", "iat", "events",
    "last_seq", "head"}``. Raises ValueError when the chain is broken (a checkpoint never vouches for one)."""
    out = verify_chain(session)
    if not out["ok"]:
        raise ValueError(f"audit chain broken at event {out['first_broken']['id']}: {out['first_broken']['reason']}")
    return {"iss": issuer, "iat": int(utcnow().timestamp()), "events": out["events"], "last_seq": out["last_seq"],
            "head": out["head"], "typ": "audit-checkpoint"}


def check_checkpoint(session: Session, claims: dict[str, Any]) -> dict[str, Any]:
    """Recompute a (signature-verified) checkpoint against this database: the chain up to ``last_seq`` must be
    intact, hold the same number of events and end in the same head hash."""
    out = verify_chain(session, up_to=int(claims["last_seq"]))
    if not out["ok"]:
        return {"ok": False, "reason": "chain broken", "first_broken": out["first_broken"]}
    if out["events"] != claims["events"] or out["head"] != claims["head"]:
        return {"ok": False, "reason": "the chain up to the checkpoint differs (events deleted, inserted or edited)",
                "expected": {"events": claims["events"], "head": claims["head"]},
                "found": {"events": out["events"], "head": out["head"]}}
    return {"ok": True, "events": out["events"], "head": out["head"], "last_seq": out["last_seq"]}
