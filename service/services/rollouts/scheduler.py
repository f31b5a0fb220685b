"""The scheduler: every scheduled rollout stepped once per tick, each step its own transaction (a wave's chunks and
a rollback's restores step again at once), and the background thread of a service process that ticks."""

from __future__ import annotations

import logging
import threading

from sqlalchemy import select

from ...db.models import Rollout
from ...domain import rollout as domain
from ...periodic import PeriodicWorker
from ..context import Context
from .common import SCHEDULED
from .stepping import step

log = logging.getLogger("preflight.rollouts")


_TICKING = threading.Lock()  # one tick at a time per process (SQLite's lock serializes processes)


MAX_PER_TICK = 1000  # a node is in one rollout at a time: far more than a fleet runs at once


def due(db) -> list[str]:
    """Ids of the rollouts the scheduler steps, oldest first (a read: no write lock)."""
    with db.read() as session:
        return list(
            session.execute(
                select(Rollout.id)
                .where(Rollout.state.in_(SCHEDULED))
                .order_by(Rollout.created_at, Rollout.id)
                .limit(MAX_PER_TICK)
            ).scalars()
        )


def tick(db, ctx: Context, *, now: float | None = None, after_step=None) -> dict[str, str]:
    """Step every scheduled rollout once, each in its own transaction (the tests call this directly; the scheduler
    thread calls it every ``PREFLIGHT_ROLLOUT_TICK_SECONDS``). Returns {rollout id: action} for the rollouts it
    stepped (locked elsewhere: left out). ``after_step`` (tests) runs inside each step's transaction before it
    commits."""
    if not _TICKING.acquire(blocking=False):
        return {}
    try:
        done: dict[str, str] = {}
        for rid in due(db):
            try:
                for _ in range(domain.MAX_ROLLOUT_NODES):  # a wave's chunks, each its own transaction
                    with db.transaction() as session:
                        action = step(session, rid, ctx=ctx, now=ctx.clock.time() if now is None else now)
                        if after_step is not None and action is not None:
                            after_step(rid, action)
                    if action not in ("signing", "restoring", "halting"):
                        break
                if action is not None:
                    done[rid] = action
            except Exception as exc:  # noqa: BLE001 - one rollout's failed step never stops the others
                log.warning(
                    "rollout %s: step failed, nothing of it kept: %s: %s",
                    rid,
                    exc.__class__.__name__,
                    str(getattr(exc, "detail", exc))[:300],
                )
        return done
    finally:
        _TICKING.release()


class RolloutScheduler:
    """The background worker of a service process: ``tick`` every ``interval`` seconds (0: never started)."""

    def __init__(self, db, ctx: Context, interval: float, on_change=None):
        self.db, self.ctx, self.interval, self.on_change = db, ctx, interval, on_change
        self._worker = PeriodicWorker("rollouts", self._tick, interval, log=log)

    def start(self) -> None:
        if self.interval > 0:
            self._worker.start()

    def stop(self) -> None:
        self._worker.stop(timeout=10)

    def _tick(self) -> None:
        if tick(self.db, self.ctx) and self.on_change is not None:
            self.on_change()
