"""A rollout as the API shows it: the target as given (the manifest as ``name@version``, env values redacted for
auditors), waves and per-node outcomes and evidence; and the listing, newest first."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, tuple_
from sqlalchemy.orm import Session

from ...db.models import Manifest, Rollout, RolloutNode, RolloutWave, iso
from ...errors import Invalid
from .. import plans as plan_service
from .common import INTERNAL, count_by, failed_units


def manifest_refs(session: Session, ids: set[Any]) -> dict[Any, str]:
    """``name@version`` of the pinned manifests (stored by id), one query for a page of rollouts."""
    ids = {i for i in ids if isinstance(i, int)}
    if not ids:
        return {}
    return {
        i: f"{name}@{version}"
        for i, name, version in session.execute(
            select(Manifest.id, Manifest.name, Manifest.version).where(Manifest.id.in_(ids))
        )
    }


def _target_view(target: dict[str, Any], secrets: bool, refs: dict[Any, str]) -> dict[str, Any]:
    """The target as given, with the manifest as ``name@version`` (``manifest_id``: the id it is pinned by)."""
    target = {k: v for k, v in target.items() if k not in INTERNAL}
    mid = target.get("manifest")
    target = {**target, "manifest": refs.get(mid, mid), "manifest_id": mid}
    if secrets or not target.get("env"):
        return target
    return {**target, "env": {k: plan_service.REDACTED for k in target["env"]}}


def rollout_dict(
    session: Session,
    r: Rollout,
    *,
    detail: bool = True,
    secrets: bool = True,
    counts: tuple[int, int] | None = None,
    refs: dict[Any, str] | None = None,
) -> dict[str, Any]:
    """A rollout as the API shows it; without ``detail`` (the listing) no waves' or nodes' rows, and ``counts``
    (nodes, failed units) and the manifests' ``refs`` given by the caller."""
    if refs is None:
        refs = manifest_refs(session, {r.target.get("manifest")})
    rows = (
        []
        if not detail
        else list(
            session.execute(
                select(RolloutNode).where(RolloutNode.rollout_id == r.id).order_by(RolloutNode.position)
            ).scalars()
        )
    )
    total, failures = counts if counts is not None else (len(rows), failed_units(rows))
    out = {
        "id": r.id,
        "state": r.state,
        "wave": r.wave,
        "promote": r.promote,
        "paused_from": r.paused_from,
        "target": _target_view(r.target, secrets, refs),
        "pinned": r.target.get("pinned"),
        "judged": r.target.get("judged"),
        "selector": r.selector,
        "failure_limit": r.failure_limit,
        "failures": failures,
        "gates": r.gates,
        "bake_until": iso(r.bake_until),
        "reason": r.reason,
        "nodes_total": total,
        "created_by": r.created_by,
        "created_at": iso(r.created_at),
        "updated_at": iso(r.updated_at),
    }
    if not detail:
        out["waves"] = r.waves
        return out
    waves = list(
        session.execute(select(RolloutWave).where(RolloutWave.rollout_id == r.id).order_by(RolloutWave.index)).scalars()
    )
    out["waves"] = [
        {
            "index": w.index,
            "percent": w.percent,
            "bake_s": w.bake_s,
            "state": w.state,
            "plan_ids": w.plan_ids,
            "signed_at": iso(w.signed_at),
            "settled_at": iso(w.settled_at),
            "done_at": iso(w.done_at),
            "nodes": [n.node_name for n in rows if n.wave == w.index],
        }
        for w in waves
    ]
    out["outcomes"] = count_by(n.outcome for n in rows)  # e.g. {"ready": 3, "superseded_by_hand": 1}: what it changed
    out["nodes"] = _node_views(rows)
    return out


def _node_views(rows: list[RolloutNode]) -> list[dict[str, Any]]:
    """The rollout's nodes as the API shows them: unit, wave, outcome, the plans before and after, the evidence."""
    return [
        {
            "node": n.node_name,
            "unit": n.unit,
            "wave": n.wave,
            "head": n.head,
            "outcome": n.outcome,
            "failed": n.failed,
            "previous_plan_id": n.previous_plan_id,
            "new_plan_id": n.new_plan_id,
            "new_seq": n.new_seq,
            "restored_plan_id": n.restored_plan_id,
            "restored_seq": n.restored_seq,
            "signed_at": iso(n.signed_at),
            "evidence": n.evidence,
        }
        for n in rows
    ]


def list_rollouts(
    session: Session, *, state: str | None, limit: int, after: str | None, secrets: bool
) -> dict[str, Any]:
    """Rollouts, newest first; ``next`` is the cursor (pass it as ``after``)."""
    q = select(Rollout).order_by(Rollout.created_at.desc(), Rollout.id.desc()).limit(limit)
    if state:
        q = q.where(Rollout.state == state)
    if after:
        ref = session.get(Rollout, after)
        if ref is None:
            raise Invalid(f"after: rollout {after!r} does not exist", field="after")
        q = q.where(tuple_(Rollout.created_at, Rollout.id) < tuple_(ref.created_at, ref.id))
    rows = list(session.execute(q).scalars())
    ids = [r.id for r in rows]
    totals = (
        dict(
            session.execute(
                select(RolloutNode.rollout_id, func.count())
                .where(RolloutNode.rollout_id.in_(ids))
                .group_by(RolloutNode.rollout_id)
            ).all()
        )
        if ids
        else {}
    )
    failed = (
        dict(
            session.execute(
                select(RolloutNode.rollout_id, func.count(RolloutNode.unit.distinct()))
                .where(RolloutNode.rollout_id.in_(ids), RolloutNode.failed.is_(True))
                .group_by(RolloutNode.rollout_id)
            ).all()
        )
        if ids
        else {}
    )
    refs = manifest_refs(session, {r.target.get("manifest") for r in rows})
    return {
        "items": [
            rollout_dict(
                session, r, detail=False, secrets=secrets, refs=refs, counts=(totals.get(r.id, 0), failed.get(r.id, 0))
            )
            for r in rows
        ],
        "next": rows[-1].id if len(rows) == limit else None,
    }
