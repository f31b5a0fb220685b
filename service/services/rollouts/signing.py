"""Signing a wave: the next chunk of whole units of one hardware shape, as one plan of the values pinned at
creation, recorded on the wave and its nodes in the same transaction; units planned by hand since are left alone,
and a multi-node instance formed since is never split (the rollout halts)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ...api.schemas import PlanIn
from ...db.models import Assignment, Node, Rollout, RolloutNode, RolloutWave
from ...domain.errors import DomainError
from ...errors import ApiError
from .. import nodes as node_service
from .. import plans as plan_service
from ..context import Context
from . import common
from .common import INTERNAL, at_time, current_assignments, event, previous_groups, shape_key
from .restore import halt, halted


class PartialGroup(Exception):
    """Signing would take part of a multi-node instance that runs now (formed after the rollout was created)."""

    def __init__(self, message: str, evidence: dict[str, Any]):
        super().__init__(message)
        self.message, self.evidence = message, evidence


def pinned_plan(r: Rollout, node: Node, names: list[str]) -> PlanIn:
    """The plan a wave signs for ``names``, nodes of ``node``'s shape: the target with the values pinned at
    creation."""
    base = {k: v for k, v in r.target.items() if k not in INTERNAL}
    pin = (r.target.get("pinned") or {}).get(shape_key(node))
    if pin is not None:  # (None: a rollout created before pinning: its target as given)
        base = {
            **base,
            "engine_args": pin["engine_args"],
            "vllm_version": pin["vllm_version"],
            "kv_cache_pool": "utilization",
        }  # a pinned pool is in engine_args.kv_cache_memory_bytes now
    return plan_service.plan_in({**base, "nodes": names})


def sign_chunk(
    session: Session, r: Rollout, wave: RolloutWave, rows: list[RolloutNode], *, ctx: Context, now: float
) -> tuple[str | None, bool]:
    """Sign the next chunk of the wave: whole units of one hardware shape not signed yet, at most SIGN_CHUNK nodes
    (POST /v1/plans' cap), as one plan of the values pinned at creation, recorded on the wave and its nodes in this
    transaction (a crash before the commit signed nothing; after it, the next step goes on with the next chunk).
    Raises PartialGroup when the chunk would take part of a multi-node instance running now. Returns (the plan id,
    whether the wave is now fully signed)."""
    todo = sorted(
        (n for n in rows if n.wave == wave.index and n.new_plan_id is None and n.outcome == "unchanged"),
        key=lambda n: n.position,
    )
    if not todo:
        return None, True
    by_name = {
        n.name: n for n in session.execute(select(Node).where(Node.name.in_([n.node_name for n in todo]))).scalars()
    }
    pinned = r.target.get("pinned")
    changed = [n.node_name for n in todo if pinned is not None and shape_key(by_name[n.node_name]) not in pinned]
    if changed:  # checked before any chunk is signed: the whole wave is refused, nothing of it kept
        raise DomainError(
            "nodes",
            f"the hardware of {', '.join(changed[:5])} changed since the rollout was "
            f"validated (no command was pinned for it): roll it out again",
            rule="rollout_shape",
        )
    shape = shape_key(by_name[todo[0].node_name])
    units: dict[int, list[RolloutNode]] = {}
    for n in todo:
        if shape_key(by_name[n.node_name]) == shape:
            units.setdefault(n.unit, []).append(n)
    chunk: list[RolloutNode] = []
    for members in units.values():
        if chunk and len(chunk) + len(members) > common.SIGN_CHUNK:
            break
        chunk.extend(members)
    names = [n.node_name for n in chunk]
    node_service.lock(session, sorted(names))  # a plan given by hand now waits for this chunk, never interleaves
    current = current_assignments(session, names)
    moved = _planned_by_hand(session, r, chunk, current, now)
    if moved:
        chunk = [n for n in chunk if n.unit not in moved]
        if not chunk:
            wave.state = "waiting"
            return None, len(todo) == sum(1 for n in todo if n.unit in moved)
        names = [n.node_name for n in chunk]
        current = {k: v for k, v in current.items() if k in names}
    inside = set(names)
    for group in previous_groups(session, current):
        outside = [m for m in group if m not in inside]
        if outside:
            plan_id = next(current[m].plan_id for m in group if m in current)
            raise PartialGroup(
                f"wave {wave.index} would take part of a multi-node instance (plan {plan_id}: "
                f"{', '.join(group)}) that runs now: {', '.join(outside)} are not signed with it; planned by hand "
                f"after the rollout was created, it would be split",
                {
                    "rule": "partial_group",
                    "plan_id": plan_id,
                    "group": group,
                    "in_wave": [m for m in group if m in inside],
                    "outside": outside,
                },
            )
    out = plan_service.create(
        session, ctx, actor=f"rollout:{r.id}", plan=pinned_plan(r, by_name[chunk[0].node_name], names)
    )
    seqs, plan_id = out.seqs(), out.plan.id
    at = at_time(now)
    for n in chunk:
        if n.previous_plan_id is None and n.node_name in current:  # a rollout created before it was recorded
            n.previous_plan_id = current[n.node_name].plan_id
        n.new_plan_id, n.new_seq, n.signed_at = plan_id, seqs[n.node_name], at
        n.outcome, n.evidence, n.updated_at = "pending", {}, at
    wave.plan_ids = [*(wave.plan_ids or []), plan_id]
    if wave.signed_at is None:
        wave.signed_at = at
    wave.state = "waiting"
    return plan_id, len(chunk) + sum(1 for n in todo if n.unit in moved) == len(todo)


def _planned_by_hand(
    session: Session, r: Rollout, chunk: list[RolloutNode], current: dict[str, Assignment], now: float
) -> set[int]:
    """Units of the chunk with a node whose current plan is no longer the one it ran when the rollout was created
    (``previous_plan_id``): someone planned it since — their decision, left alone. Every node of such a unit is
    ``superseded_by_hand`` (not signed, not a failure, not restored), one audit event each."""
    moved: dict[int, tuple[str, Assignment | None]] = {}
    for n in chunk:
        cur = current.get(n.node_name)
        if n.previous_plan_id is not None and (cur is None or cur.plan_id != n.previous_plan_id):
            moved.setdefault(n.unit, (n.node_name, cur))
    for n in chunk:
        if n.unit not in moved:
            continue
        who, cur = moved[n.unit]
        n.outcome, n.updated_at = "superseded_by_hand", at_time(now)
        n.evidence = {
            "reason": "superseded_by_hand",
            "before_wave": True,
            "planned_node": who,
            "current_plan_id": cur.plan_id if cur else None,
            "current_seq": cur.seq if cur else None,
        }
        event(session, r, "node_superseded_by_hand", {"unit": n.unit, "evidence": n.evidence}, node=n.node_name)
    return set(moved)


def sign_next(
    session: Session, r: Rollout, wave: RolloutWave, rows: list[RolloutNode], *, ctx: Context, now: float
) -> str:
    """Sign the wave's next chunk; "signing" while chunks remain (``tick`` steps again at once), "sign" when the
    wave is fully signed, "halt" when signing was refused (the manifest or the vLLM catalogue changed since the
    rollout was validated, or a multi-node instance formed since would be split)."""
    try:
        with session.begin_nested():
            plan_id, done = sign_chunk(session, r, wave, rows, ctx=ctx, now=now)
    except PartialGroup as exc:
        halt(session, r, rows, exc.message[:1000], ctx=ctx, evidence=exc.evidence)
        return halted(r)
    except (ApiError, DomainError) as exc:  # the savepoint's rollback undid the chunk's rows (expired: reloaded)
        reason = f"signing wave {wave.index} was refused: {getattr(exc, 'detail', None) or exc}"[:1000]
        halt(session, r, rows, reason, ctx=ctx)
        return halted(r)
    if not done:
        if plan_id is not None:  # (None: every unit of that chunk was planned by hand since: nothing signed)
            event(
                session,
                r,
                "wave_chunk_signed",
                {"plan_id": plan_id, "nodes": [n.node_name for n in rows if n.new_plan_id == plan_id]},
            )
        return "signing"
    event(
        session,
        r,
        "wave_signed",
        {"plan_ids": wave.plan_ids, "nodes": [n.node_name for n in rows if n.wave == wave.index and n.new_plan_id]},
    )
    return "sign"
