"""Restoring what a rollout changed: every node it signed gets its previous plan's content again as a new plan (a
chunk per transaction), the halt that starts it and the end of a rollback or an abort."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ...db.models import Rollout, RolloutNode, RolloutWave
from ...domain.errors import DomainError
from ...errors import ApiError
from .. import nodes as node_service
from .. import plans as plan_service
from ..context import Context
from . import common
from .common import current_assignments, event


def restore(session: Session, r: Rollout, rows: list[RolloutNode], *, ctx: Context, reason: str, actor: str) -> bool:
    """Give every node the rollout changed its previous plan's content again, as a new plan with a higher seq (the
    agents' replay protection accepts it): per unit and previous plan, the whole previous groups together. A node
    whose current plan is no longer the rollout's (someone planned it since) is left alone. Each node restored is an
    audit event with the reason and the evidence. At most one chunk (SIGN_CHUNK nodes, whole units; more when one
    unit is larger) per call, so one transaction holds the write lock for one chunk: returns whether nodes are left
    to restore (the caller's next step, in a new transaction, goes on). Nodes an operator's abort of a halted
    rollout marked ``retry_restore`` are tried again."""
    todo = [
        n
        for n in rows
        if n.new_plan_id and n.restored_plan_id is None and n.outcome not in ("superseded_by_hand", "not_restored")
    ]
    if not todo:
        return False
    node_service.lock(session, sorted(n.node_name for n in todo))  # a plan given by hand now is seen, never lost
    current = current_assignments(session, [n.node_name for n in todo])
    batches: dict[tuple[str | None, int], list[RolloutNode]] = {}
    restored = missed = 0
    for n in todo:
        cur = current.get(n.node_name)
        if cur is None or cur.plan_id != n.new_plan_id:  # planned (or revoked) by hand since: their decision
            n.outcome, n.updated_at = "superseded_by_hand", ctx.now()
            n.evidence = {
                **n.evidence,
                "restore": f"its current plan is {cur.plan_id if cur else 'none'}, no longer "
                f"the rollout's {n.new_plan_id}: left as it is",
            }
            continue
        batches.setdefault((n.previous_plan_id, n.unit), []).append(n)
    # nodes whose previous plan is the same are restored together (its content is identical), whole units, at most
    # SIGN_CHUNK nodes per plan (POST /v1/plans' cap)
    chunks: list[tuple[str | None, list[RolloutNode]]] = []
    for (previous_id, _unit), members in sorted(batches.items(), key=lambda kv: (kv[0][0] or "", kv[0][1])):
        if (
            chunks
            and chunks[-1][0] == previous_id
            and previous_id is not None
            and len(chunks[-1][1]) + len(members) <= common.SIGN_CHUNK
        ):
            chunks[-1][1].extend(members)
        else:
            chunks.append((previous_id, list(members)))
    size = 0
    for previous_id, members in chunks:
        if size and size + len(members) > common.SIGN_CHUNK:
            return True
        size += len(members)
        out: plan_service.Signed | None = None
        failure: str | None = "it had no plan before the rollout"
        if previous_id is not None:
            out, failure = _restore_previous(session, ctx, r, previous_id, {n.node_name for n in members})
        for n in members:
            evidence = dict(n.evidence or {})
            if failure is not None or out is None:
                n.outcome, n.updated_at = "not_restored", ctx.now()
                n.evidence = {**evidence, "restore": failure}
                missed += 1
                continue
            seq = out.seqs()[n.node_name]
            n.restored_plan_id, n.restored_seq, n.outcome, n.updated_at = out.plan.id, seq, "restored", ctx.now()
            n.evidence = evidence
            restored += 1
            event(
                session,
                r,
                "node_restored",
                {
                    "reason": reason,
                    "previous_plan_id": previous_id,
                    "rollout_plan_id": n.new_plan_id,
                    "rollout_seq": n.new_seq,
                    "seq": seq,
                    "evidence": evidence,
                },
                actor=actor,
                node=n.node_name,
                plan_id=out.plan.id,
            )
    return False


def _restore_previous(
    session: Session, ctx: Context, r: Rollout, previous_id: str, wanted: set[str]
) -> tuple[plan_service.Signed | None, str | None]:
    """Sign the content of the plan ``previous_id`` again for the nodes ``wanted`` (whole groups of it), in a
    savepoint: a refusal undoes only this restore. Returns (the new plan, None) or (None, why it was refused)."""
    old, assignments = plan_service.get(session, previous_id)
    if old.status == "revoked":  # withdrawn since: its content is never signed again by a rollback
        return None, f"its previous plan {previous_id} was revoked since: not signed again (give the node a plan)"
    try:
        with session.begin_nested():
            plan = plan_service.content(old, [a for a in assignments if a.node_name in wanted])
            return plan_service.create(
                session,
                ctx,
                actor=f"rollout:{r.id}",
                plan=plan,
                tuning=old.tuning if isinstance(old.tuning, dict) else None,
            ), None
    except (ApiError, DomainError) as exc:
        return None, str(getattr(exc, "detail", None) or getattr(exc, "message", None) or exc)[:500]


def finish_restore(session: Session, r: Rollout, rows: list[RolloutNode], *, actor: str | None = None) -> None:
    """Every restore done: aborting → aborted; a halt → rolled_back, or halted when a node could not be restored
    (an operator's abort tries again). One event with the totals."""
    restored = sum(1 for n in rows if n.outcome == "restored")
    missed = sum(1 for n in rows if n.outcome == "not_restored")
    if missed:  # halted until an operator's abort restores them (it tries the refused restores again)
        r.state = "halted"
        r.reason = f"{missed} node(s) could not be restored (see their evidence): {r.reason or ''}"[:1000]
    else:
        r.state = "aborted" if r.state == "aborting" else "rolled_back"
    event(
        session,
        r,
        "rolled_back" if missed == 0 else "rollback_incomplete",
        {"restored": restored, "not_restored": missed, "reason": r.reason},
        actor=actor,
    )


def _evidence_of(rows: list[RolloutNode]) -> list[dict[str, Any]]:
    return [
        {"node": n.node_name, "unit": n.unit, "wave": n.wave, "plan_id": n.new_plan_id, **n.evidence}
        for n in rows
        if n.failed
    ][:50]


def close_waves(session: Session, r: Rollout, state: str) -> None:
    """A halt or an abort ends the waves: the current one (signed, not done) becomes ``state`` (halted, aborted),
    the ones not started ``cancelled``; done and skipped waves keep theirs."""
    for w in session.execute(select(RolloutWave).where(RolloutWave.rollout_id == r.id)).scalars():
        if w.state in ("waiting", "baking") or (w.index == r.wave and w.state == "pending"):  # (refused at signing)
            w.state = state
        elif w.state == "pending":
            w.state = "cancelled"


def halt(
    session: Session,
    r: Rollout,
    rows: list[RolloutNode],
    reason: str,
    *,
    ctx: Context,
    evidence: dict[str, Any] | None = None,
) -> None:
    r.state, r.reason = "halted", reason
    close_waves(session, r, "halted")
    event(
        session,
        r,
        "halted",
        {"reason": reason, "evidence": _evidence_of(rows), **({"refused": evidence} if evidence else {})},
    )
    if restore(session, r, rows, ctx=ctx, reason=reason, actor=f"rollout:{r.id}"):
        r.state = "rolling_back"  # more chunks to restore: the scheduler's next steps, each its own transaction
        return
    finish_restore(session, r, rows)


def halted(r: Rollout) -> str:
    """The step's answer to a halt: "halt", or "halting" when restores are left (``tick`` steps again at once)."""
    return "halting" if r.state == "rolling_back" else "halt"
