"""Which config ran where: a node's plan history and a plan's placements, from assignments (with their recorded
fetch times) and the agents' reports."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..db.models import Assignment, Manifest, Plan, Report, iso
from . import nodes as node_service


def _placement_rows(session: Session, assignments: list[Assignment]) -> list[dict[str, Any]]:
    if not assignments:
        return []
    keys = {(a.plan_id, a.node_name) for a in assignments}
    plan_ids = {a.plan_id for a in assignments}
    reports: dict[tuple[str, str], dict[str, Any]] = {}
    for r in session.execute(select(Report).where(Report.plan_id.in_(plan_ids)).order_by(Report.id)).scalars():
        if (r.plan_id, r.node_name) not in keys:
            continue
        d = reports.setdefault((r.plan_id, r.node_name), {})
        d.setdefault(r.status, r.created_at)
        d["_last"] = (r.status, r.created_at, r.message)
    out = []
    for a in assignments:
        rep = reports.get((a.plan_id, a.node_name), {})
        last = rep.get("_last")
        out.append({
            "plan_id": a.plan_id, "node": a.node_name, "seq": a.seq, "assignment_status": a.status,
            "assigned_at": iso(a.created_at),
            "first_fetched_at": iso(a.first_fetched_at), "last_fetched_at": iso(a.last_fetched_at),
            "fetches": a.fetch_count or 0,
            "started_at": iso(rep.get("started")), "running_at": iso(rep.get("running")),
            "failed_at": iso(rep.get("failed")),
            "last_report": {"status": last[0], "at": iso(last[1]), "message": last[2]} if last else None,
        })
    return out


def node_history(session: Session, name: str, *, limit: int = 100, before_seq: int | None = None) -> dict[str, Any]:
    """Plans assigned to a node, newest first, with who approved them, what ran and whether it started."""
    node_service.get(session, name)
    q = (select(Assignment, Plan, Manifest).join(Plan, Plan.id == Assignment.plan_id)
         .join(Manifest, Manifest.id == Plan.manifest_id).where(Assignment.node_name == name)
         .order_by(Assignment.seq.desc()).limit(limit))
    if before_seq is not None:
        q = q.where(Assignment.seq < before_seq)
    rows = session.execute(q).all()
    placements = {(p["plan_id"]): p for p in _placement_rows(session, [a for a, _, _ in rows])}
    items = []
    for a, plan, m in rows:
        items.append({**placements[a.plan_id], "approved_by": plan.created_by, "plan_status": plan.status,
                      "manifest": {"name": m.name, "version": m.version, "digest": m.digest},
                      "vllm_version": plan.vllm_version, "argv": plan.argv})
    return {"node": name, "items": items, "next": items[-1]["seq"] if len(items) == limit else None}


def plan_placements(session: Session, plan_id: str) -> dict[str, Any]:
    from . import plans as plan_service

    plan, assignments = plan_service.get(session, plan_id)
    return {"plan_id": plan.id, "plan_status": plan.status, "approved_by": plan.created_by,
            "created_at": iso(plan.created_at), "placements": _placement_rows(session, assignments)}
