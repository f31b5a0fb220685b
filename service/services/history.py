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
        out.append(
            {
                "plan_id": a.plan_id,
                "node": a.node_name,
                "seq": a.seq,
                "assignment_status": a.status,
                "assigned_at": iso(a.created_at),
                "first_fetched_at": iso(a.first_fetched_at),
                "last_fetched_at": iso(a.last_fetched_at),
                "fetches": a.fetch_count or 0,
                "started_at": iso(rep.get("started")),
                "running_at": iso(rep.get("running")),
                "failed_at": iso(rep.get("failed")),
                "stopped_at": iso(rep.get("stopped")),
                "exited_at": iso(rep.get("exited")),
                "refused_at": iso(rep.get("refused")),
                "last_report": {"status": last[0], "at": iso(last[1]), "message": last[2]} if last else None,
                **_place(a),
            }
        )
    return out


def _place(a: Assignment) -> dict[str, Any]:
    """The assignment's place in its plan's topology (null for plans made before topologies)."""
    return {"group": a.group_index, "rank": a.rank, "role": a.role}


def group_statuses(session: Session, assignments: list[Assignment]) -> dict[tuple[str, int | None], str]:
    """The state of each multi-node group the assignments belong to (services/plans.py ``group_state``)."""
    from .plans import group_state

    pairs = {(a.plan_id, a.group_index) for a in assignments if a.role in ("head", "worker")}
    if not pairs:
        return {}
    members: dict[tuple[str, int | None], list[Assignment]] = {}
    for a in session.execute(select(Assignment).where(Assignment.plan_id.in_(sorted({p for p, _ in pairs})))).scalars():
        if (a.plan_id, a.group_index) in pairs:
            members.setdefault((a.plan_id, a.group_index), []).append(a)
    return {k: group_state(v) for k, v in members.items()}


def _node_argv(plan: Plan, a: Assignment) -> list[str]:
    from .plans import member_argv

    return member_argv(plan.topology, a) or plan.argv


def node_history(session: Session, name: str, *, limit: int = 100, before_seq: int | None = None) -> dict[str, Any]:
    """Plans assigned to a node, newest first, with who approved them, what ran and whether it started."""
    node_service.get(session, name)
    q = (
        select(Assignment, Plan, Manifest)
        .join(Plan, Plan.id == Assignment.plan_id)
        .join(Manifest, Manifest.id == Plan.manifest_id)
        .where(Assignment.node_name == name)
        .order_by(Assignment.seq.desc())
        .limit(limit)
    )
    if before_seq is not None:
        q = q.where(Assignment.seq < before_seq)
    rows = session.execute(q).all()
    placements = {(p["plan_id"]): p for p in _placement_rows(session, [a for a, _, _ in rows])}
    groups = group_statuses(session, [a for a, _, _ in rows])
    items = []
    for a, plan, m in rows:
        items.append(
            {
                **placements[a.plan_id],
                "approved_by": plan.created_by,
                "plan_status": plan.status,
                "manifest": {"name": m.name, "version": m.version, "digest": m.digest},
                "vllm_version": plan.vllm_version,
                "argv": _node_argv(plan, a),
                "group_status": groups.get((a.plan_id, a.group_index)),
            }
        )
    return {"node": name, "items": items, "next": items[-1]["seq"] if len(items) == limit else None}


def plan_placements(session: Session, plan_id: str) -> dict[str, Any]:
    from . import plans as plan_service

    plan, assignments = plan_service.get(session, plan_id)
    out = {
        "plan_id": plan.id,
        "plan_status": plan.status,
        "approved_by": plan.created_by,
        "created_at": iso(plan.created_at),
        "placements": _placement_rows(session, assignments),
    }
    if plan.topology:
        out["groups"] = plan_service.group_states(plan.topology, assignments, secrets=False)
    return out


RUN_STATUSES = ("started", "running", "stopped", "exited", "failed")


def _utc(t):
    import datetime as dt

    if t is None:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


LATE_SECONDS = 30


def _end_after(
    session: Session, name: str, until: Any, open_runs: list[dict[str, Any]], by_id: dict[str, dict[str, Any]]
) -> None:
    """How runs still open at ``until`` ended after it: their end report, or the node's next start."""
    later = (
        select(Report)
        .where(
            Report.node_name == name,
            Report.created_at >= until,
            Report.status.in_(("started", "stopped", "exited", "failed")),
        )
        .order_by(Report.id)
        .limit(1000)
    )
    for r in session.execute(later).scalars():
        details = r.details if isinstance(r.details, dict) else {}
        at = _when(r.created_at, details.get("at"))
        if r.status == "started":
            for still_open in open_runs:
                still_open.update(ended_at=at, end="interrupted")
            break
        run = by_id.get(details.get("run_id") or f"plan:{r.plan_id}")
        if run is not None and run in open_runs:
            run.update(
                ended_at=at,
                end="exited" if r.status == "failed" else r.status,
                exit_status=details.get("status"),
                signal=details.get("signal"),
                tail=details.get("tail"),
            )
            open_runs.remove(run)
        if not open_runs:
            break


def _when(received, agent_at):
    """When a report's event happened: the service's receipt time, unless the report was delivered late (queued by
    an agent that could not reach the service, e.g. during an offline boot) — then the agent's own ``at``, when it
    lies between 30 days before receipt and receipt."""
    import datetime as dt

    received = _utc(received)
    if isinstance(agent_at, (int, float)) and not isinstance(agent_at, bool):
        try:
            t = dt.datetime.fromtimestamp(agent_at, dt.UTC)
        except (OverflowError, OSError, ValueError):
            return received
        if received - dt.timedelta(days=30) <= t <= received - dt.timedelta(seconds=LATE_SECONDS):
            return t
    return received


def node_runs(session: Session, name: str, *, since=None, until=None, limit: int = 1000) -> dict[str, Any]:
    """Which plan ran on a node, and when: one item per run of vLLM (the agent's ``started`` report, tied to its
    later reports by ``details.run_id``), oldest first, overlapping ``[since, until)``. A run ends with ``stopped``
    (asked to stop) or ``exited`` (ended by itself); one with no end report ends at the node's next start
    (``end: "interrupted"``: the node lost power or the agent was killed) or is still open (``ended_at`` null, with
    the last heartbeat). Times are the service's receipt times, except for reports delivered late (``_when``)."""
    node_service.get(session, name)
    q = select(Report).where(Report.node_name == name, Report.status.in_(RUN_STATUSES)).order_by(Report.id)
    if until is not None:
        q = q.where(Report.created_at < until)
    runs, by_id = _fold_runs(session, q)
    open_runs = [r for r in runs if r["ended_at"] is None]
    if until is not None and open_runs:
        _end_after(session, name, until, open_runs, by_id)
    since, until = _utc(since), _utc(until)
    runs = [
        r
        for r in runs
        if (until is None or r["started_at"] < until)
        and (since is None or r["ended_at"] is None or r["ended_at"] > since)
    ][-limit:]
    plan_ids = {r["plan_id"] for r in runs}
    info: dict[str, Any] = {}
    if plan_ids:
        for a, plan, m in session.execute(
            select(Assignment, Plan, Manifest)
            .join(Plan, Plan.id == Assignment.plan_id)
            .join(Manifest, Manifest.id == Plan.manifest_id)
            .where(Assignment.node_name == name, Assignment.plan_id.in_(plan_ids))
        ):
            info[a.plan_id] = (a, plan, m)
    groups = group_statuses(session, [a for a, _, _ in info.values()])
    out = []
    for run in runs:
        a, plan, m = info.get(run["plan_id"], (None, None, None))
        beat = _utc(a.last_heartbeat_at) if a is not None else None
        out.append(
            {
                **run,
                "started_at": iso(run["started_at"]),
                "running_at": iso(run["running_at"]),
                "ended_at": iso(run["ended_at"]),
                "seq": a.seq if a else None,
                "argv": _node_argv(plan, a) if plan and a else None,
                **(_place(a) if a else {"group": None, "rank": None, "role": None}),
                "group_status": groups.get((a.plan_id, a.group_index)) if a else None,
                "manifest": {"name": m.name, "version": m.version, "digest": m.digest} if m else None,
                "last_heartbeat_at": iso(beat)
                if run["ended_at"] is None and beat and beat >= run["started_at"]
                else None,
            }
        )
    return {"node": name, "since": iso(since), "until": iso(until), "items": out}


def _fold_runs(session: Session, q) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The node's run reports folded into runs, oldest first, and the same runs by run id."""
    runs: list[dict[str, Any]] = []
    by_id: dict[str, dict[str, Any]] = {}
    for r in session.execute(q).scalars():
        details = r.details if isinstance(r.details, dict) else {}
        run_id = details.get("run_id") or f"plan:{r.plan_id}"
        at = _when(r.created_at, details.get("at"))
        if r.status == "started":
            for other in runs:  # one vLLM per node: a new start ends every run still open
                if other["ended_at"] is None:
                    other.update(ended_at=at, end="interrupted")
            started = {
                "run_id": run_id,
                "plan_id": r.plan_id,
                "started_at": at,
                "running_at": None,
                "ended_at": None,
                "end": None,
                "exit_status": None,
                "signal": None,
                "vllm": None,
                "tail": None,
                "offline_boot": details.get("offline_boot"),
            }
            runs.append(started)
            by_id[run_id] = started
            continue
        run = by_id.get(run_id)
        if run is None or run["ended_at"] is not None and r.status == "running":
            continue
        if r.status == "running":
            run["running_at"] = at
            run["vllm"] = details.get("vllm")
        elif run["ended_at"] is None:
            run.update(
                ended_at=at,
                end="exited" if r.status == "failed" else r.status,
                exit_status=details.get("status"),
                signal=details.get("signal"),
                tail=details.get("tail"),
            )
    return runs, by_id
