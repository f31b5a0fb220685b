"""Serving plans to the node agents: the nodes' current assignments read in bulk, ``If-None-Match`` against their
ETags, a multi-node worker's head (its group digest and the group-hold), and the fetch records (``plan.fetched``)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.orm import Session

from .. import audit, metrics
from ..clock import Clock, utc
from ..db.models import Assignment, Node, table_of
from ..domain.group_gate import group_hold
from ..errors import ApiError, NotFound
from .nodes import acked_seqs
from .plans import models_of

ASSIGNMENTS = table_of(Assignment)


REFETCH_RECORD_SECONDS = 60


@dataclass(frozen=True)
class AgentFetch:
    """One fetch: who (``actor``), for which node, the ``If-None-Match`` tags sent, and whether it is the node's own
    agent taking delivery (``record``; an admin reading a node's plan is not a delivery and writes nothing)."""

    actor: str
    node: str
    etags: tuple[str, ...] = ()
    record: bool = True


def etag_matches(etag: str, tags) -> bool:
    """``If-None-Match`` with weak comparison (RFC 9110 §13.1.2, §13.2.1): ``*`` matches any current plan, and
    ``W/`` prefixes are ignored on both sides."""
    strong = etag[2:] if etag.startswith("W/") else etag
    return any(t == "*" or (t[2:] if t.startswith("W/") else t) == strong for t in tags)


def serve_to_agents(
    session: Session, fetches: list[AgentFetch], *, clock: Clock
) -> list[tuple[dict | None, bool] | ApiError]:
    """The agents' fetches, in bulk (one query for the nodes' active assignments, one UPDATE and one audit INSERT for
    the fetches to record). Per fetch, in order: (assignment dict — ``id``, ``plan_id``, ``seq``, ``etag``,
    ``signed``, ``last_fetched_at``, ``fetch_count``, ``node_name``, ``acked_seq`` —, served), with served False when the agent's
    ETag matches; (None, False) for a node with no current plan; NotFound for an unregistered node.

    A served fetch is recorded (``plan.fetched`` with the seq and ETag, and the assignment's fetch counters) the
    first time and again at least ``REFETCH_RECORD_SECONDS`` after the last record; repeats inside that window (a
    client retrying) and fetches that are not deliveries (``record`` False: an admin) write nothing."""
    nodes = sorted({f.node for f in fetches})
    current: dict[str, dict] = {}
    for found in session.execute(
        select(
            ASSIGNMENTS.c.id,
            ASSIGNMENTS.c.plan_id,
            ASSIGNMENTS.c.seq,
            ASSIGNMENTS.c.etag,
            ASSIGNMENTS.c.signed,
            ASSIGNMENTS.c.freshness,
            ASSIGNMENTS.c.last_fetched_at,
            ASSIGNMENTS.c.fetch_count,
            ASSIGNMENTS.c.node_name,
            ASSIGNMENTS.c.group_index,
            ASSIGNMENTS.c.rank,
            ASSIGNMENTS.c.role,
            ASSIGNMENTS.c.group_digest,
        ).where(ASSIGNMENTS.c.node_name.in_(nodes), ASSIGNMENTS.c.status == "active")
    ).mappings():
        if found["node_name"] not in current or found["seq"] > current[found["node_name"]]["seq"]:
            current[found["node_name"]] = dict(found)
    heads_of(session, list(current.values()))
    acked = acked_seqs(session, list(current))
    for name, assignment in current.items():
        assignment["acked_seq"] = acked.get(name, 0)  # signed into the freshness statement (api/routers/agent.py)
    unplanned = [n for n in nodes if n not in current]
    registered = set(session.scalars(select(Node.name).where(Node.name.in_(unplanned)))) if unplanned else set()
    out: list[tuple[dict | None, bool] | ApiError] = []
    record: dict[int, tuple[AgentFetch, dict]] = {}
    for f in fetches:
        row = current.get(f.node)
        if row is None:
            out.append(
                (None, False) if f.node in registered else NotFound(f"node {f.node!r} is not registered", field="name")
            )
        elif etag_matches(row["etag"], f.etags) or (f.record and row.get("hold")):  # a held worker: no delivery
            out.append((row, False))
        else:
            metrics.AGENT_FETCHES.labels("served").inc()
            if f.record and not fetch_recorded_recently(row, clock) and row["id"] not in record:
                record[row["id"]] = (f, row)
            out.append((row, True))
    if record:
        _record_fetches(session, record, clock)
    return out


def _record_fetches(session: Session, record: dict[int, tuple[AgentFetch, dict]], clock: Clock) -> None:
    """Record the served fetches: the assignments' fetch counters in one UPDATE, ``plan.fetched`` in one audit
    INSERT, and the rows handed back updated to match."""
    now = utc(clock)
    session.execute(
        update(ASSIGNMENTS)
        .where(ASSIGNMENTS.c.id == bindparam("_id"))
        .values(
            first_fetched_at=func.coalesce(ASSIGNMENTS.c.first_fetched_at, bindparam("_now")),
            last_fetched_at=bindparam("_now"),
            fetch_count=bindparam("_count"),
        ),
        [{"_id": aid, "_now": now, "_count": (row["fetch_count"] or 0) + 1} for aid, (_, row) in record.items()],
    )
    models = models_of(session, [row["plan_id"] for _, row in record.values()])
    audit.append_many(
        session,
        [
            dict(
                actor=f.actor,
                kind="plan.fetched",
                subject=f"plan:{row['plan_id']}",
                node=f.node,
                plan_id=row["plan_id"],
                model=models[row["plan_id"]],
                payload={"seq": row["seq"], "etag": row["etag"], "refetch": bool(row["fetch_count"])},
            )
            for f, row in record.values()
        ],
    )
    for _, row in record.values():
        row["fetch_count"] = (row["fetch_count"] or 0) + 1
        row["last_fetched_at"] = now


def heads_of(session: Session, rows: list[dict]) -> None:
    """Set ``head_group_digest`` on each assignment row of a multi-node group: the group digest of its group's head's
    current assignment (rank 0 of the same plan and group, active), or None when the head has none. The freshness
    statement carries it, and an agent refuses a plan whose own group digest differs (agent/verify.py): a member
    never starts against a head that is not on the same group plan.

    A worker's row also gets ``hold`` (domain/group_gate.py): None once the head reported this same assignment
    ``started`` or ``running``, else why the worker waits — the fetch answers 409 instead of the plan. Rows of
    single-node plans cost nothing here (no query)."""
    grouped = [r for r in rows if r.get("role") in ("head", "worker")]
    for r in rows:
        r["head_group_digest"] = None
        r["hold"] = None
    if not grouped:
        return
    heads = {
        (p, g): (d, n, rep)
        for p, g, d, n, rep in session.execute(
            select(
                ASSIGNMENTS.c.plan_id,
                ASSIGNMENTS.c.group_index,
                ASSIGNMENTS.c.group_digest,
                ASSIGNMENTS.c.node_name,
                ASSIGNMENTS.c.last_report,
            ).where(
                ASSIGNMENTS.c.plan_id.in_(sorted({r["plan_id"] for r in grouped})),
                ASSIGNMENTS.c.rank == 0,
                ASSIGNMENTS.c.status == "active",
            )
        )
    }
    for r in grouped:
        digest, head, report = heads.get((r["plan_id"], r["group_index"]), (None, None, None))
        r["head_group_digest"] = digest
        hold = group_hold(
            role=r["role"],
            plan_id=r["plan_id"],
            group=r["group_index"],
            head=head,
            head_assigned=head is not None,
            head_digest=digest,
            own_digest=r.get("group_digest"),
            head_report=report,
        )
        r["hold"] = hold.as_dict() if hold is not None else None


def fetch_recorded_recently(row: dict, clock: Clock) -> bool:
    """True when serving this assignment again needs no new record (see ``serve_to_agents``)."""
    last = row.get("last_fetched_at")
    if last is None:
        return False
    if last.tzinfo is None:  # SQLite hands back naive UTC
        last = last.replace(tzinfo=dt.UTC)
    return clock.time() - last.timestamp() < REFETCH_RECORD_SECONDS
