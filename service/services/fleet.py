"""The operators' view of the fleet: plans listed and filtered, each node's current plan with the state its agent
reported, and the dry run of a plan (judged by manifest and node names, nothing stored). Every listing reads in bulk
(a fixed number of queries per page, never one per node or plan)."""

from __future__ import annotations

import datetime as dt
from typing import Any, overload

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from ..api.schemas import PlanIn
from ..db.models import Assignment, Calibration, Manifest, Node, Plan, Report, iso, utcnow
from ..domain.policy_profile import Profile
from ..errors import NotFound
from . import manifests as manifest_service
from . import nodes as node_service
from . import plans as plan_service

# An agent heartbeats every 60 s by default (README, --heartbeat-seconds): a running node not heard from for five
# periods is shown as stale.
STALE_AFTER_SECONDS = 300
RUN_ENDED = ("stopped", "exited", "failed")
NODE_STATUSES = ("running", "starting", "failed", "refused", "stopped", "stale", "pending", "unplanned")
PLAN_STATUSES = ("active", "superseded", "revoked")


@overload
def _utc(t: dt.datetime) -> dt.datetime: ...
@overload
def _utc(t: None) -> None: ...
@overload
def _utc(t: dt.datetime | None) -> dt.datetime | None: ...
def _utc(t: dt.datetime | None) -> dt.datetime | None:
    return t if t is None or t.tzinfo else t.replace(tzinfo=dt.UTC)


# -- plans ------------------------------------------------------------------------------------------------------------


def list_plans(
    session: Session,
    *,
    node: str | None = None,
    model: str | None = None,
    status: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    limit: int = 100,
    after: str | None = None,
    secrets: bool = True,
) -> dict[str, Any]:
    """Plans, newest first, filtered by node (assigned to it), model (manifest name), status and creation time
    ``[since, until)``. ``after`` is the cursor: the id of the last plan of the previous page (``next``)."""
    q = (
        select(Plan, Manifest.name, Manifest.version)
        .join(Manifest, Manifest.id == Plan.manifest_id)
        .order_by(Plan.created_at.desc(), Plan.id.desc())
        .limit(limit)
    )
    if node:
        q = q.where(Plan.id.in_(select(Assignment.plan_id).where(Assignment.node_name == node)))
    if model:
        q = q.where(Manifest.name == model)
    if status:
        q = q.where(Plan.status == status)
    if since:
        q = q.where(Plan.created_at >= since)
    if until:
        q = q.where(Plan.created_at < until)
    if after:
        cursor = session.execute(select(Plan.created_at).where(Plan.id == after)).scalar_one_or_none()
        if cursor is None:
            raise NotFound(f"plan {after!r} (the cursor) does not exist", field="after")
        q = q.where(or_(Plan.created_at < cursor, and_(Plan.created_at == cursor, Plan.id < after)))
    rows = session.execute(q).all()
    by_plan: dict[str, list[Assignment]] = {}
    if rows:
        for a in session.execute(
            select(Assignment).where(Assignment.plan_id.in_([p.id for p, _, _ in rows])).order_by(Assignment.id)
        ).scalars():
            by_plan.setdefault(a.plan_id, []).append(a)
    items = [
        {
            **plan_service.plan_dict(p, by_plan.get(p.id, []), secrets=secrets),
            "model": name,
            "manifest": f"{name}@{version}",
        }
        for p, name, version in rows
    ]
    return {"items": items, "next": rows[-1][0].id if len(rows) == limit else None}


# -- nodes and their state --------------------------------------------------------------------------------------------


def node_states(session: Session, names: list[str], *, now: dt.datetime | None = None) -> dict[str, dict[str, Any]]:
    """Per node: its current plan (the active assignment: id, seq, status, model, verdict, predicted KV tokens), the
    agent's last report, when the agent was last seen, the plan the reports say runs, drift and a status. Five
    queries whatever the number of nodes."""
    if not names:
        return {}
    now = now or utcnow()
    current = _current_assignments(session, names)
    # heartbeats and fetches of any of the node's assignments (an agent still running a superseded plan is alive)
    heard: dict[str, list[dt.datetime]] = {}
    for name, beat, fetched in session.execute(
        select(Assignment.node_name, func.max(Assignment.last_heartbeat_at), func.max(Assignment.last_fetched_at))
        .where(Assignment.node_name.in_(names))
        .group_by(Assignment.node_name)
    ):
        heard[name] = [t for t in (_utc(beat), _utc(fetched)) if t is not None]
    # the newest report of each node, and the newest report that says a run began (what runs, per the agent)
    newest = select(func.max(Report.id)).where(Report.node_name.in_(names)).group_by(Report.node_name)
    began = (
        select(func.max(Report.id))
        .where(Report.node_name.in_(names), Report.status.in_(("started", "running")))
        .group_by(Report.node_name)
    )
    last: dict[str, Report] = {}
    last_run: dict[str, Report] = {}
    for r in session.execute(select(Report).where(or_(Report.id.in_(newest), Report.id.in_(began)))).scalars():
        if r.node_name not in last or r.id > last[r.node_name].id:
            last[r.node_name] = r
        if r.status in ("started", "running") and (r.node_name not in last_run or r.id > last_run[r.node_name].id):
            last_run[r.node_name] = r
    # the planless reports (refused before any plan verified, a reset) are audit events only: the newest per node
    measured: dict[tuple[str, str], int] = {}
    pairs = [(n, c["id"]) for n, c in current.items()]
    if pairs:
        newest_cal = (
            select(func.max(Calibration.id))
            .where(Calibration.node_name.in_([n for n, _ in pairs]))
            .group_by(Calibration.node_name, Calibration.plan_id)
        )
        for c in session.execute(select(Calibration).where(Calibration.id.in_(newest_cal))).scalars():
            measured[(c.node_name, c.plan_id)] = c.actual_kv_tokens
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        cur = current.get(name)
        rep = last.get(name)
        run = last_run.get(name)
        seen = heard.get(name, []) + ([_utc(rep.created_at)] if rep is not None else [])
        last_seen = max(seen) if seen else None
        running_plan = (
            run.plan_id
            if run is not None and not (rep is not None and rep.id > run.id and rep.status in RUN_ENDED)
            else None
        )
        status = _status(cur, rep, running_plan, last_seen, now)
        plan = None
        if cur is not None:
            plan = {k: v for k, v in cur.items() if k not in ("last_heartbeat_at", "last_fetched_at")}
            plan["measured_kv_tokens"] = measured.get((name, cur["id"]))
        out[name] = {
            "plan": plan,
            "last_report": {
                "plan_id": rep.plan_id,
                "status": rep.status,
                "message": rep.message,
                "at": iso(rep.created_at),
            }
            if rep is not None
            else None,
            "last_seen_at": iso(last_seen),
            "running_plan_id": running_plan,
            "drift": cur is not None and running_plan is not None and running_plan != cur["id"],
            "status": status,
        }
    return out


def _current_assignments(session: Session, names: list[str]) -> dict[str, dict[str, Any]]:
    """Per node, its active assignment of the highest seq with its plan and manifest, in one query."""
    current: dict[str, dict[str, Any]] = {}
    for a, p, m_name, m_version in session.execute(
        select(Assignment, Plan, Manifest.name, Manifest.version)
        .join(Plan, Plan.id == Assignment.plan_id)
        .join(Manifest, Manifest.id == Plan.manifest_id)
        .where(Assignment.node_name.in_(names), Assignment.status == "active")
    ):
        if a.node_name in current and current[a.node_name]["seq"] > a.seq:
            continue
        current[a.node_name] = {
            "id": p.id,
            "seq": a.seq,
            "status": p.status,
            "verdict": p.verdict,
            "model": m_name,
            "manifest": f"{m_name}@{m_version}",
            "vllm_version": p.vllm_version,
            "created_at": iso(p.created_at),
            "predicted_kv_tokens": (p.budget or {}).get("kv_cache_tokens"),
            "group": a.group_index,
            "rank": a.rank,
            "role": a.role,
            "last_heartbeat_at": _utc(a.last_heartbeat_at),
            "last_fetched_at": _utc(a.last_fetched_at),
        }
    return current


def _status(
    cur: dict | None, rep: Report | None, running_plan: str | None, last_seen: dt.datetime | None, now: dt.datetime
) -> str:
    """running / starting / failed / refused / stopped / stale / pending (planned, nothing reported on it yet) /
    unplanned (no current plan)."""
    if cur is None:
        return "unplanned"
    # what the last report says about the current plan (None: it is about another plan, or there is none)
    said = rep.status if rep is not None and (rep.plan_id == cur["id"] or rep.plan_id is None) else None
    if said == "refused":
        return "refused"
    if said in ("exited", "failed"):
        return "failed"
    if said == "stopped":
        return "stopped"
    if running_plan is None and said is None:
        return "pending"
    if last_seen is None or (now - last_seen).total_seconds() > STALE_AFTER_SECONDS:
        return "stale"
    if running_plan == cur["id"]:
        return (
            "running"
            if rep is not None and rep.status in ("running", "heartbeat") or cur["last_heartbeat_at"] is not None
            else "starting"
        )
    return "pending" if running_plan is None else "running"  # an older plan runs: drift says so


# A multi-node group is as healthy as its least healthy member: the first of these any member shows is the group's
GROUP_STATUS_ORDER = ("failed", "refused", "stale", "stopped", "unplanned", "pending", "starting", "running")


def group_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fleet as an operator reads it: one row per single node, and one row per multi-node group (the members of
    one group of one plan: role ``head``/``worker``), in the order of each row's first node. A group row is its
    head's row (plan, model, KV figures) with ``members`` (names in rank order), ``gpu_count`` summed, ``status``
    the least healthy member's (GROUP_STATUS_ORDER), ``drift`` when any member drifts, ``last_seen_at`` the oldest
    member's (a group is only as alive as its quietest node) and ``member_statuses``."""
    out: list[dict[str, Any]] = []
    groups: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        plan = r.get("plan") or {}
        if plan.get("role") not in ("head", "worker"):
            out.append(r)
            continue
        key = (plan["id"], plan.get("group") or 0)
        g = groups.get(key)
        if g is None:
            g = groups[key] = {"_members": []}
            out.append(g)
        g["_members"].append(r)
    for g in groups.values():
        members = sorted(g.pop("_members"), key=lambda r: r["plan"].get("rank") or 0)
        head = members[0]
        seen = [m["last_seen_at"] for m in members]
        g.update(head)
        g.update(
            members=[m["name"] for m in members],
            member_statuses={m["name"]: m["status"] for m in members},
            gpu_count=sum(m.get("gpu_count") or 0 for m in members),
            status=next((st for st in GROUP_STATUS_ORDER if any(m["status"] == st for m in members)), head["status"]),
            drift=any(m.get("drift") for m in members),
            last_seen_at=None if None in seen else min(seen, key=dt.datetime.fromisoformat),
        )
    return out


def node_view(node: Node, state: dict[str, Any] | None) -> dict[str, Any]:
    """A node as the listings show it: its inventory and its state (``node_states``)."""
    return {**node_service.node_dict(node), **(state or {})}


def list_nodes(session: Session, *, limit: int, after: str | None) -> dict[str, Any]:
    rows = node_service.list_nodes(session, limit=limit, after=after)
    states = node_states(session, [n.name for n in rows])
    return {
        "items": [node_view(n, states[n.name]) for n in rows],
        "next": rows[-1].name if len(rows) == limit else None,
    }


def get_node(session: Session, name: str) -> dict[str, Any]:
    node = node_service.get(session, name)
    return node_view(node, node_states(session, [name])[name])


# -- dry run ----------------------------------------------------------------------------------------------------------


def dry_run(session: Session, plan: PlanIn, *, policy: Profile | None = None) -> dict[str, Any]:
    """What ``POST /v1/plans`` would decide for this body, by manifest and node names: validated and rendered, nothing
    stored (no plan, no assignment, no seq, no audit event, nothing signed). Raises LaunchRejected (422) when vLLM
    would refuse the launch, as the real call does; NotFound / Invalid for bad input."""
    manifest = manifest_service.resolve_ref(session, plan.manifest)
    names = node_service.distinct(plan.nodes)
    nodes = [node_service.get(session, n) for n in names]
    j = plan_service.judge(session, manifest, nodes, plan, policy=policy)
    result = j.result
    if result.verdict == "reject":
        exc = j.rejection(session)
        exc.extra["dry_run"] = True
        raise exc
    return {
        "dry_run": True,
        "verdict": result.verdict,
        "findings": j.findings,
        "argv": result.argv,
        "command": result.command,
        "env": dict(j.request.env),
        "budget": result.budget,
        "vllm_version": result.vllm_version,
        "recommendations": result.recommendations,
        "alternatives": result.alternatives,
        "policy": result.policy,
        **({"given": j.given} if j.given else {}),
        "manifest": f"{manifest.name}@{manifest.version}",
        "nodes": names,
        "nodes_per_instance": j.layout.topo.nodes_per_instance,
    }
