"""What the parts of a rollout share: the states the scheduler steps, the plan cap a chunk is signed in, hardware
shapes, the nodes' current assignments and the multi-node groups they form, the rollout's audit events and its
counters, and reading one rollout."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ... import audit
from ...db.models import Assignment, Node, Rollout, RolloutNode
from ...domain import rollout as domain
from ...errors import NotFound

INTERNAL = ("pinned", "judged")  # kept in Rollout.target beside the target as given; never part of a plan body


TARGET_FIELDS = (
    "manifest",
    "engine_args",
    "env",
    "environment",
    "workload",
    "vllm_version",
    "kv_cache_pool",
    "multi_node_form",
)


# what the scheduler steps (halted waits for an operator; rolling_back and aborting have restores left, a chunk a step)
SCHEDULED = ("pending", "waiting", "baking", "paused") + domain.RESTORING


FAILED = domain.FAILED_REPORTS  # a report on the rollout's plan that fails its node


MAX_SELECTED = domain.MAX_ROLLOUT_NODES


SIGN_CHUNK = 256  # nodes per signed plan: POST /v1/plans' cap (schemas.PlanIn.nodes); a wave is signed in chunks


def epoch(value: dt.datetime | None) -> float | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.timestamp()


def at_time(now: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(now, dt.UTC)


def shape(n: Node) -> tuple:
    return (n.gpu_id, n.gpu.get("memory_bytes"), n.gpu.get("compute_capability"), n.gpu_count)


def shape_key(n: Node) -> str:
    """A hardware shape as a JSON key (the rollout's ``pinned`` is per shape)."""
    return "|".join(str(x) for x in shape(n))


def current_assignments(session: Session, names: list[str]) -> dict[str, Assignment]:
    """Each node's current (active, highest seq) assignment."""
    out: dict[str, Assignment] = {}
    for a in session.execute(
        select(Assignment).where(Assignment.node_name.in_(names), Assignment.status == "active")
    ).scalars():
        if a.node_name not in out or a.seq > out[a.node_name].seq:
            out[a.node_name] = a
    return out


def previous_groups(session: Session, current: dict[str, Assignment]) -> list[list[str]]:
    """The multi-node instances the nodes' current plans form (every active member, in or out of the rollout)."""
    keys = {(a.plan_id, a.group_index) for a in current.values() if a.role in ("head", "worker")}
    if not keys:
        return []
    groups: dict[tuple, list[str]] = {}
    for a in session.execute(
        select(Assignment)
        .where(Assignment.plan_id.in_(sorted({p for p, _ in keys})), Assignment.status == "active")
        .order_by(Assignment.rank)
    ).scalars():
        if (a.plan_id, a.group_index) in keys:
            groups.setdefault((a.plan_id, a.group_index), []).append(a.node_name)
    return list(groups.values())


def event(
    session: Session,
    r: Rollout,
    kind: str,
    payload: dict[str, Any],
    *,
    actor: str | None = None,
    node: str | None = None,
    plan_id: str | None = None,
) -> None:
    r.steps += 1
    audit.append(
        session,
        actor=actor or f"rollout:{r.id}",
        kind=f"rollout.{kind}",
        subject=f"rollout:{r.id}",
        node=node,
        plan_id=plan_id,
        payload={"rollout": r.id, "state": r.state, "wave": r.wave, **payload},
    )


def count_by(states: Iterable[str]) -> dict[str, int]:
    """How many of each: nodes per outcome (``{"ready": 3, "superseded_by_hand": 1}``), units per state."""
    return dict(Counter(states))


def failed_units(rows: list[RolloutNode]) -> int:
    """Units with a failed node (a unit counts once)."""
    return len({n.unit for n in rows if n.failed})


def get(session: Session, rollout_id: str, *, for_update: bool = False) -> Rollout:
    q = select(Rollout).where(Rollout.id == rollout_id)
    if for_update:
        q = q.with_for_update()
    r = session.execute(q).scalar_one_or_none()
    if r is None:
        raise NotFound(f"rollout {rollout_id!r} does not exist", field="rollout_id")
    return r
