"""Sealing: committed events get their place in the chain, in insertion order, under the chain lock — at once in
the CLI and tests, from a background thread moments after the commit in a service process."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.orm import Session

from ..db.models import AuditEvent, table_of
from ..periodic import PeriodicWorker
from . import head
from .chain import chain_lock
from .encoding import GENESIS, hash_of
from .keys import audit_keys

if TYPE_CHECKING:
    from .checkpoints import Checkpointer

SEAL_BATCH = 2000
SEAL_INTERVAL = 0.05  # how long a woken sealer lets writes gather before sealing them
SWEEP_INTERVAL = 2.0  # how often an idle sealer looks for events other processes left unsealed
log = logging.getLogger("preflight.audit")
_REFUSED: set[int] = set()  # ids of rows the sealer refused (no valid MAC), to log each once


def _head(session: Session) -> tuple[int, str]:
    """The sealed chain's last (seq, hash): (0, GENESIS) when nothing is sealed yet."""
    head = session.execute(
        select(AuditEvent.chain_seq, AuditEvent.hash)
        .where(AuditEvent.chain_seq.is_not(None))
        .order_by(AuditEvent.chain_seq.desc())
        .limit(1)
    ).first()
    if head is None:
        return 0, GENESIS
    seq, h = head
    assert seq is not None and h is not None  # a sealed event has both
    return seq, h


def seal(session: Session, *, wait: bool = True, batch: int = SEAL_BATCH) -> int:
    """Chain the committed, unsealed events (in id order) under the chain lock; returns how many were sealed.
    With ``wait=False`` it returns 0 at once when another sealer holds the lock. When the database has the service's
    keys, a row without a valid MAC (not written by the service) is left unsealed — verify reports it as forged —,
    and so is a copy of a row (a nonce seen before). Nothing is sealed while the chain's end disagrees with the
    recorded head (a cut tail): sealing on would hide the cut. The sealing transaction moves the recorded head."""
    if not chain_lock(session, wait=wait):
        return 0
    keys = audit_keys(session)
    valid = keys.checker() if keys is not None else None
    seal_mac = keys.seal_signer() if keys is not None else None
    table = table_of(AuditEvent)

    def pending_after(cursor: int):
        # Core rows (attribute access like the ORM's, without an identity map or instance state per event)
        return session.execute(
            select(table).where(table.c.chain_seq.is_(None), table.c.id > cursor).order_by(table.c.id).limit(batch)
        ).all()

    pending = pending_after(0)
    if not pending:  # an idle sweep: nothing to seal, nothing more to read
        return 0
    seq, prev = _head(session)
    trouble = head.problem(session, head.recorded(session), seq, prev, keys)
    if trouble is not None:
        _refuse_to_seal(trouble)
        return 0
    total = 0
    while True:
        cursor = pending[-1].id
        first = _first_with_nonce(session, pending)
        rows = []
        for ev in pending:
            if valid is not None and not valid(ev):
                _refused(ev.id, "has no valid MAC (not written by the service)")
                continue
            if ev.nonce is not None and first.get(ev.nonce) != ev.id:
                _refused(ev.id, "is a copy of another row (its nonce was seen before)")
                continue
            seq += 1
            h = hash_of(ev, seq, prev)
            rows.append(
                {
                    "_id": ev.id,
                    "chain_seq": seq,
                    "prev_hash": prev,
                    "hash": h,
                    "mac": seal_mac(ev, seq, prev, h) if seal_mac is not None else ev.mac,
                }
            )
            prev = h
        if rows:
            session.connection().execute(
                update(table)
                .where(table.c.id == bindparam("_id"))
                .values(
                    chain_seq=bindparam("chain_seq"),
                    prev_hash=bindparam("prev_hash"),
                    hash=bindparam("hash"),
                    mac=bindparam("mac"),
                ),
                rows,
            )
        total += len(rows)
        if len(pending) < batch:
            break
        pending = pending_after(cursor)
        if not pending:
            break
    if total:
        head.record(session, seq, prev, keys)
    session.info["chain_head_seq"] = seq
    return total


def _first_with_nonce(session: Session, pending) -> dict[str, int | None]:
    """For the nonces of ``pending``: the id of the only row that may be sealed with it — the lowest id carrying it,
    or None when a row with it is sealed already. One indexed look-up per batch."""
    nonces = list({ev.nonce for ev in pending if ev.nonce is not None})
    if not nonces:
        return {}
    table = table_of(AuditEvent)
    found = session.execute(
        select(table.c.nonce, func.min(table.c.id), func.max(table.c.chain_seq))
        .where(table.c.nonce.in_(nonces))
        .group_by(table.c.nonce)
    ).all()
    return {nonce: (first if sealed is None else None) for nonce, first, sealed in found}


def _refused(event_id: int, why: str) -> None:
    if event_id not in _REFUSED:  # logged once per process, not on every pass
        if len(_REFUSED) > 10_000:
            _REFUSED.clear()
        _REFUSED.add(event_id)
        log.error("audit: event %s %s: left unsealed", event_id, why)


_REFUSED_HEAD: list[str] = []  # the last head problem logged, to log each once per process


def _refuse_to_seal(trouble: head.HeadProblem) -> None:
    if _REFUSED_HEAD != [trouble.reason]:
        _REFUSED_HEAD[:] = [trouble.reason]
        log.error("audit: nothing is sealed while the chain disagrees with its recorded head: %s", trouble.reason)


def check_at_start(db) -> head.HeadProblem | None:
    """The chain's end against the recorded head, read once when a service process starts (logged when they
    disagree; verify reports it, and the sealer seals nothing meanwhile)."""
    with db.read() as session:
        seq, prev = _head(session)
        trouble = head.problem(session, head.recorded(session), seq, prev, audit_keys(session))
    if trouble is not None:
        log.error("audit: at start-up the chain disagrees with its recorded head: %s", trouble.reason)
    return trouble


class Sealer:
    """Per-process sealing. In a service process (``background = True``) writers only signal a background worker,
    which seals what is pending at most ``SEAL_INTERVAL`` seconds later — one lock and one transaction per batch,
    none in the request path. Elsewhere (CLI, tests) ``seal_soon`` seals at once. The worker also sweeps every few
    seconds for events written by other processes that exited before sealing. With a ``checkpointer`` (the service)
    each pass also makes a signed checkpoint when one is due."""

    def __init__(self, db):
        self.db = db
        self.background = False
        self.checkpointer: Checkpointer | None = None
        self.high_water = 0  # the longest chain this process has sealed onto: a shorter one later means a cut tail
        self._worker = PeriodicWorker(
            "audit-sealer", self.seal_now, SWEEP_INTERVAL, log=log, gather=SEAL_INTERVAL, final_pass=True
        )

    def seal_now(self, *, wait: bool = True) -> int:
        made = None
        with self.db.sessions() as s:
            with s.begin():
                n = seal(s, wait=wait)
                if self.checkpointer is not None:
                    made = self.checkpointer.maybe(s)
            self.high_water = max(self.high_water, s.info.get("chain_head_seq", 0))
        if made is not None and self.checkpointer is not None:
            self.checkpointer.publish(made)  # the file outside the database, once the checkpoint is committed
        return n

    def seal_soon(self) -> None:
        if self.background:
            self._worker.wake()
            return
        try:
            self.seal_now(wait=True)
        except Exception as exc:  # never fail the write that already committed; the next seal picks it up
            log.warning("audit seal deferred: %s", exc.__class__.__name__)

    def flush(self, timeout: float = 2.0) -> None:
        """Wait (at most ``timeout`` seconds) until the background worker has completed a pass started after this
        call — what was committed before it is then sealed (if its MAC is valid). No-op without the worker."""
        if self.background:
            self._worker.wait_for_pass(timeout)

    def start(self) -> None:
        try:
            check_at_start(self.db)
        except Exception as exc:  # noqa: BLE001 - a start-up check must not stop the service; verify reports it
            log.warning("audit head not checked at start-up: %s", exc.__class__.__name__)
        self.background = True
        self._worker.start()

    def stop(self) -> None:
        """Stop the worker after a last seal (nothing committed stays unsealed because of a shutdown)."""
        self.background = False
        self._worker.stop()
