"""The agents' reports on their nodes' plans, taken in bulk: the run's lifecycle on the assignments, the report
rows, the audit events, the calibration comparison, and a head's report opening its workers' group gate."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import bindparam, insert, select, tuple_, update
from sqlalchemy.orm import Session

from .. import audit, metrics
from ..clock import Clock, utc
from ..db.models import Assignment, Node, Plan, Report, table_of
from ..domain.group_gate import changes_hold
from ..errors import ApiError, Conflict, NotFound
from . import calibration, epochs
from .plans import models_of

ASSIGNMENTS = table_of(Assignment)
REPORTS = table_of(Report)


@dataclass(frozen=True)
class AgentReport:
    """One agent report (``POST /v1/nodes/{node}/reports``)."""

    actor: str
    node: str
    plan_id: str | None
    status: str
    message: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def plan_named(self) -> str:
        """The plan id of a report that names one (every report matched to an assignment does)."""
        assert self.plan_id is not None
        return self.plan_id


REPORT_STATUSES = ("fetched", "started", "running", "heartbeat", "stopped", "exited", "refused", "reset", "failed")


PLANLESS_STATUSES = ("refused", "reset")  # may name no plan: a refusal before any plan verified, a state reset


STALE_OK = ("heartbeat", "stopped", "exited", "failed")  # what a node may still say about a plan it no longer runs


def late(r: AgentReport, clock: Clock) -> bool:
    """A report the agent queued (offline boot, service away) and delivers now, stamped with its own time: history,
    which may name a plan superseded since."""
    at = r.details.get("at") if isinstance(r.details, dict) else None
    if not isinstance(at, (int, float)) or isinstance(at, bool):
        return False
    now = clock.time()
    return now - LATE_WINDOW <= at <= now + 300  # the window the runs view believes an agent's own time in


LATE_WINDOW = 30 * 86400


Pair = tuple[str, str | None]  # (node, plan id) of a report; a report naming no plan is never among the assignments


def _assigned(
    session: Session, reports: list[AgentReport]
) -> tuple[dict[Pair, int], set[Pair], dict[Pair, str], dict[Pair, str | None]]:
    """The assignments the reports name, in one read: per (node, plan) its highest seq; the pairs current (active);
    those assigned once but superseded or revoked since (their status); and the active heads of multi-node groups
    (their last report)."""
    pairs = sorted({(r.node, r.plan_id) for r in reports if r.plan_id is not None})
    seqs: dict[Pair, int] = {}
    current: set[Pair] = set()
    stale: dict[Pair, str] = {}
    heads: dict[Pair, str | None] = {}
    if pairs:
        for node, plan_id, seq, status, role, last in session.execute(
            select(
                ASSIGNMENTS.c.node_name,
                ASSIGNMENTS.c.plan_id,
                ASSIGNMENTS.c.seq,
                ASSIGNMENTS.c.status,
                ASSIGNMENTS.c.role,
                ASSIGNMENTS.c.last_report,
            ).where(tuple_(ASSIGNMENTS.c.node_name, ASSIGNMENTS.c.plan_id).in_(pairs))
        ):
            seqs[(node, plan_id)] = max(seq, seqs.get((node, plan_id), seq))
            if status == "active":
                current.add((node, plan_id))
                if role == "head":
                    heads[(node, plan_id)] = last
            else:
                stale.setdefault((node, plan_id), status)
    for pair in current:
        stale.pop(pair, None)
    return seqs, current, stale, heads


def report_many(session: Session, reports: list[AgentReport], *, clock: Clock) -> list[dict[str, Any] | ApiError]:
    """Agent reports, in bulk and in order (one read of the assignments, one UPDATE, one INSERT of the reports, one
    audit INSERT). Each report's plan must have been assigned to its node, else that report is NotFound and writes
    nothing; ``refused`` and ``reset`` may name no plan (an audit event for the node only). A ``heartbeat`` only
    stamps the assignment's ``last_heartbeat_at`` (no report row, no audit event: cheap at fleet scale) and answers
    ``current``: whether the plan is still the node's current one (false once superseded or revoked). A report on a
    plan the node no longer runs (superseded or revoked) is a Conflict and writes nothing — except a heartbeat (it
    learns that the plan is not current) and the end of a run (``stopped``, ``exited``, ``failed``: the record of when
    the old config stopped) and a report the agent queued and delivers late (``details.at``). A report
    whose details carry vLLM's start-up figures (``details.vllm``) also stores the calibration comparison
    (services/calibration.py). Returns per report ``{"id", "plan_id", "node", "status"}`` (``id`` null for a
    heartbeat and a planless report) or the error."""
    seqs, current, stale, heads = _assigned(session, reports)
    planless_nodes = {r.node for r in reports if r.plan_id is None}
    known = set(session.scalars(select(Node.name).where(Node.name.in_(planless_nodes)))) if planless_nodes else set()
    assigned = [
        i
        for i, r in enumerate(reports)
        if (r.node, r.plan_id) in seqs and ((r.node, r.plan_id) not in stale or r.status in STALE_OK or late(r, clock))
    ]
    beats = [reports[i] for i in assigned if reports[i].status == "heartbeat"]
    ok_idx = [i for i in assigned if reports[i].status != "heartbeat"]
    ok = [reports[i] for i in ok_idx]
    planless_idx = [i for i, r in enumerate(reports) if r.plan_id is None and r.node in known]
    done: dict[int, int | None] = {}  # index in ``reports`` -> new report id (None: nothing stored but accepted)
    now = utc(clock)
    if beats:
        session.execute(
            update(ASSIGNMENTS)
            .where(ASSIGNMENTS.c.node_name == bindparam("_node"), ASSIGNMENTS.c.plan_id == bindparam("_plan"))
            .values(last_heartbeat_at=bindparam("_now")),
            [{"_node": r.node, "_plan": r.plan_id, "_now": now} for r in beats],
        )
        for i in assigned:
            if reports[i].status == "heartbeat":
                done[i] = None
        metrics.AGENT_REPORTS.labels("heartbeat").inc(len(beats))
    if ok:
        _store_reports(session, ok, ok_idx, heads, now, done)
    models = models_of(session, [r.plan_named for r in ok]) if ok else {}
    events = [
        dict(
            actor=r.actor,
            kind=f"agent.{r.status}",
            subject=f"plan:{r.plan_id}",
            node=r.node,
            plan_id=r.plan_id,
            model=models[r.plan_named],
            payload={"seq": seqs[(r.node, r.plan_id)], "status": r.status, "message": r.message, "details": r.details},
        )
        for r in ok
    ]
    for i in planless_idx:
        r = reports[i]
        metrics.AGENT_REPORTS.labels(r.status).inc()
        events.append(
            dict(
                actor=r.actor,
                kind=f"agent.{r.status}",
                subject=f"node:{r.node}",
                node=r.node,
                payload={"status": r.status, "message": r.message, "details": r.details},
            )
        )
        done[i] = None
    if events:
        audit.append_many(session, events)
    missing = {r.node for i, r in enumerate(reports) if i not in done}
    registered = set(session.scalars(select(Node.name).where(Node.name.in_(missing)))) if missing else set()
    return _answers(reports, done, current, stale, registered)


def _store_reports(
    session: Session,
    ok: list[AgentReport],
    ok_idx: list[int],
    heads: dict,
    now: dt.datetime,
    done: dict[int, int | None],
) -> None:
    """Store the accepted reports: the assignments' ``last_report`` in one UPDATE, the report rows in one INSERT
    (their ids into ``done``), the plan caches bumped when a head's report moves its workers' gate, the metrics and
    the calibration comparison."""
    session.execute(
        update(ASSIGNMENTS)
        .where(ASSIGNMENTS.c.node_name == bindparam("_node"), ASSIGNMENTS.c.plan_id == bindparam("_plan"))
        .values(last_report=bindparam("_status")),
        [{"_node": r.node, "_plan": r.plan_id, "_status": r.status} for r in ok],
    )
    new_ids = (
        session.execute(
            insert(REPORTS).returning(REPORTS.c.id, sort_by_parameter_order=True),
            [
                {
                    "plan_id": r.plan_id,
                    "node_name": r.node,
                    "status": r.status,
                    "message": r.message,
                    "details": r.details,
                    "created_at": now,
                }
                for r in ok
            ],
        )
        .scalars()
        .all()
    )
    done.update(zip(ok_idx, new_ids))
    if any((r.node, r.plan_id) in heads and changes_hold(heads[(r.node, r.plan_id)], r.status) for r in ok):
        # a head's report opens or closes its workers' gate (domain/group_gate.py): the agents' caches of the
        # group's assignments are refreshed like after a plan change (services/epochs.py)
        epochs.bump(session, "plans", ok[0].plan_id or "")
    for r in ok:
        metrics.AGENT_REPORTS.labels(r.status).inc()
        if r.status == "running" and isinstance(r.details.get("vllm"), dict):  # compare with the prediction
            calibration.record(session, plan=session.get_one(Plan, r.plan_id), node=r.node, details=r.details)


def _answers(
    reports: list[AgentReport], done: dict[int, int | None], current, stale, registered: set
) -> list[dict[str, Any] | ApiError]:
    """Per report: what was stored, or why nothing was (no longer current, never assigned, no such node)."""
    return [
        {
            "id": done[i],
            "plan_id": r.plan_id,
            "node": r.node,
            "status": r.status,
            **({"current": (r.node, r.plan_id) in current} if r.status == "heartbeat" else {}),
        }
        if i in done
        else Conflict(
            f"plan {r.plan_id!r} is no longer current on node {r.node!r} (it was "
            f"{stale[(r.node, r.plan_id)]}): report on the node's current plan",
            field="plan_id",
        )
        if (r.node, r.plan_id) in stale
        else NotFound(f"plan {r.plan_id!r} was never assigned to node {r.node!r}", field="plan_id")
        if r.node in registered
        else NotFound(f"node {r.node!r} is not registered", field="name")
        for i, r in enumerate(reports)
    ]
