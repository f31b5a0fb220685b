"""Cache coherence across service processes: one counter per kind of cached state, bumped in the transaction that
changes the state, polled by every process.

The agents' hot path answers most fetches from two per-process caches (a token's principal, a node's current
assignment; service/api/deps.py). Each entry is stored with the epoch its process had seen when it read the database,
and is used only while that is still the current epoch and the poll is fresh. So a plan created, revoked or
reissued — or a token revoked or rotated — in any process reaches every other process's cache within one poll
interval (``POLL_SECONDS``), not after a TTL; and when the poll cannot reach the database for ``STALE_AFTER``
seconds, the caches are not used at all (requests go to the database, which answers or fails with 503).

Kinds: ``plans`` (assignments: plan create, revoke, reissue) and ``tokens`` (revoke, rotate, node token rotation).
"""

from __future__ import annotations

import logging
import zlib

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from ..clock import SYSTEM, Clock
from ..db.models import CacheEpoch
from ..db.session import READ_ONLY
from ..periodic import PeriodicWorker

SHARDS = 16
POLL_SECONDS = 0.25
STALE_AFTER = 1.0
log = logging.getLogger("preflight.epochs")


def bump(session: Session, kind: str, key: str = "") -> None:
    """Advance ``kind``'s epoch inside the caller's transaction (visible to the pollers when it commits).

    The counter is spread over ``SHARDS`` rows (``kind:0`` … ``kind:15``, the one ``key`` hashes to, created on first
    use by an upsert) and a kind's epoch is their sum: every committed bump raises the sum, while concurrent
    transactions — plans for different nodes — seldom wait on the same row lock."""
    name = f"{kind}:{zlib.crc32(key.encode()) % SHARDS}"
    dialect = session.get_bind().dialect.name
    upsert = (pg_insert if dialect == "postgresql" else sqlite_insert)(CacheEpoch).values(name=name, epoch=1)
    session.execute(
        upsert.on_conflict_do_update(index_elements=[CacheEpoch.name], set_={"epoch": CacheEpoch.epoch + 1})
    )


def read(session: Session) -> dict[str, int]:
    """Each kind's epoch: the sum of its shards."""
    out: dict[str, int] = {}
    for name, epoch in session.execute(select(CacheEpoch.name, CacheEpoch.epoch)).all():
        kind = name.split(":", 1)[0]
        out[kind] = out.get(kind, 0) + epoch
    return out


class EpochWatcher:
    """Polls the epochs every ``POLL_SECONDS`` in a daemon thread. ``current(kind)`` is the epoch to tag a cache
    entry with when it is read from the database; ``valid(kind, tag)`` says whether such an entry may be used."""

    def __init__(
        self, db, poll_seconds: float = POLL_SECONDS, stale_after: float = STALE_AFTER, *, clock: Clock = SYSTEM
    ):
        self.db, self.poll_seconds, self.stale_after, self.clock = db, poll_seconds, stale_after, clock
        self._epochs: dict[str, int] = {}
        self._last_ok = float("-inf")
        self.polls = 0  # successful polls so far (tests count polls, not seconds)
        self._worker = PeriodicWorker("cache-epochs", self.poll, poll_seconds, log=log, log_level=logging.DEBUG)

    def current(self, kind: str) -> int | None:
        """The epoch last seen, or None while the poll is not fresh (then nothing should be cached)."""
        if self.clock.monotonic() - self._last_ok > self.stale_after:
            return None
        return self._epochs.get(kind, 0)

    def valid(self, kind: str, tag: int | None) -> bool:
        return tag is not None and tag == self.current(kind)

    def poll(self) -> None:
        with self.db.engine.connect() as conn:  # a read: on SQLite no write lock (db/session.py READ_ONLY)
            conn = conn.execution_options(**{READ_ONLY: True})
            epochs = read(Session(bind=conn))
            conn.rollback()
        self._epochs, self._last_ok = epochs, self.clock.monotonic()
        self.polls += 1

    def wait_for_poll(self, timeout: float) -> bool:
        """Wake the poller and wait until a poll that started after this call has ended (succeeded or failed)."""
        return self._worker.wait_for_pass(timeout)

    def start(self) -> None:
        try:
            self.poll()
        except Exception as exc:  # noqa: BLE001 - the database may be down at start: the worker keeps trying
            log.warning("cache epochs: %s", exc.__class__.__name__)
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop(timeout=5)
        self._last_ok = float("-inf")


class EpochCache:
    """A per-process cache whose entries carry the epoch of ``kind`` seen before their database read and a TTL; an
    entry is used only while both hold (see the module docstring). ``tag()`` before the read, ``put`` after it."""

    def __init__(self, watcher: EpochWatcher, kind: str, ttl: float, size: int = 100_000):
        self.watcher, self.kind, self.ttl, self.size = watcher, kind, ttl, size
        self._entries: dict = {}

    def tag(self) -> int | None:
        return self.watcher.current(self.kind)

    def get(self, key):
        entry = self._entries.get(key)
        if entry is None or entry[1] <= self.watcher.clock.monotonic() or not self.watcher.valid(self.kind, entry[2]):
            return None
        return entry[0]

    def put(self, key, value, tag: int | None) -> None:
        if tag is None:
            return
        if len(self._entries) >= self.size:
            self._entries.clear()
        self._entries[key] = (value, self.watcher.clock.monotonic() + self.ttl, tag)

    def clear(self) -> None:
        self._entries.clear()
