"""Sealing: committed events get their place in the chain, in insertion order, under the chain lock — at once in
the CLI and tests, from a background thread moments after the commit in a service process."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from ..db.models import AuditEvent, table_of
from ..periodic import PeriodicWorker
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
    keys, a row without a valid MAC (not written by the service) is left unsealed — verify reports it as forged."""
    if not chain_lock(session, wait=wait):
        return 0
    keys = audit_keys(session)
    valid = keys.checker() if keys is not None else None
    seal_mac = keys.seal_signer() if keys is not None else None
    seq, prev = _head(session)
    session.info["chain_head_seq"] = seq
    total = 0
    cursor = 0
    table = table_of(AuditEvent)
    while True:
        # Core rows (attribute access like the ORM's, without an identity map or instance state per event)
        pending = session.execute(
            select(table).where(table.c.chain_seq.is_(None), table.c.id > cursor).order_by(table.c.id).limit(batch)
        ).all()
        if not pending:
            return total
        cursor = pending[-1].id
        full = len(pending) == batch
        rows = []
        for ev in pending:
            if valid is not None and not valid(ev):
                if ev.id not in _REFUSED:  # logged once per process, not on every pass
                    if len(_REFUSED) > 10_000:
                        _REFUSED.clear()
                    _REFUSED.add(ev.id)
                    log.error("audit: event %s has no valid MAC (not written by the service): left unsealed", ev.id)
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
        session.info["chain_head_seq"] = seq
        if not full:
            return total


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
        self.background = True
        self._worker.start()

    def stop(self) -> None:
        """Stop the worker after a last seal (nothing committed stays unsealed because of a shutdown)."""
        self.background = False
        self._worker.stop()
