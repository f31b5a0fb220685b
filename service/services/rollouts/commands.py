"""The operators' verbs on a rollout: pause, resume, promote and abort (which restores what it changed)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ...db.models import Rollout, RolloutNode, RolloutWave
from ...domain import rollout as domain
from ...domain.errors import DomainError
from ...errors import Conflict
from ..context import Context
from .common import at_time, event, get
from .restore import close_waves, finish_restore, restore


def command(
    session: Session, ctx: Context, rollout_id: str, verb: str, *, actor: str, reason: str | None = None
) -> Rollout:
    """``pause``, ``resume``, ``promote`` or ``abort`` (restores what the rollout changed). Waits for the row lock a
    scheduler step may hold. Raises NotFound, Conflict (the verb does not apply to the state)."""
    r = get(session, rollout_id, for_update=True)
    try:
        domain.command(r.state, verb, promoted=r.promote)  # raises when the verb does not apply to the state
    except DomainError as exc:
        raise Conflict(exc.message, field="state") from None
    now = ctx.clock.time()
    r.updated_at = at_time(now)
    payload: dict[str, Any] = {"from": r.state, **({"reason": reason} if reason else {})}
    if verb == "pause":
        r.paused_from, r.state = r.state, "paused"
        event(session, r, "paused", payload, actor=actor)
    elif verb == "resume":
        r.state, r.paused_from = r.paused_from or "waiting", None
        if r.state == "baking":  # the bake starts over: the paused time did not count as watched
            wave = session.execute(
                select(RolloutWave).where(RolloutWave.rollout_id == r.id, RolloutWave.index == r.wave)
            ).scalar_one()
            r.bake_until = at_time(now + wave.bake_s)
        event(session, r, "resumed", payload, actor=actor)
    elif verb == "promote":
        r.promote = True
        event(session, r, "promoted", payload, actor=actor)
    else:
        rows = list(
            session.execute(
                select(RolloutNode).where(RolloutNode.rollout_id == r.id).order_by(RolloutNode.position)
            ).scalars()
        )
        why = f"aborted by {actor}" + (f": {reason}" if reason else "")
        if payload["from"] == "halted":  # the restores refused before are tried again
            for n in rows:
                if n.outcome == "not_restored" and n.restored_plan_id is None:
                    n.outcome = "retry_restore"
        r.state, r.reason = "aborting", why
        close_waves(session, r, "aborted")
        event(session, r, "aborted", payload, actor=actor)
        # the first chunk here; a large rollout answers "aborting" and the scheduler restores the rest, a chunk per
        # transaction (the write lock is never held for the whole fleet)
        if not restore(session, r, rows, ctx=ctx, reason=why, actor=actor):
            finish_restore(session, r, rows, actor=actor)
    return r
