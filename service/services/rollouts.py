"""Staged rollouts (issue 19): create a rollout (the target validated once per hardware shape, nothing stored on a
rejection), advance it one step at a time under a row lock (``tick``; the scheduler thread calls it), restore every
node it changed when failures pass the limit, and the operators' pause / resume / promote / abort.

Steps are idempotent: a wave's plans are signed in the same transaction that records them on the wave and its nodes
and moves the rollout on, so a scheduler that dies before the commit signed nothing, and one that dies after it
left a state the next scheduler (in any process) continues from. On PostgreSQL each step takes the rollout's row
with ``SELECT … FOR UPDATE SKIP LOCKED``: two workers or replicas never step the same rollout at once (the second
skips it); on SQLite the single write lock serializes them and a process-local lock keeps one tick per process.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import uuid
from collections import Counter
from typing import Any, Iterable

from sqlalchemy import Text, cast, func, or_, select, tuple_
from sqlalchemy.orm import Session

from .. import audit
from ..db.models import Assignment, Manifest, Node, Plan, Report, Rollout, RolloutNode, RolloutWave, iso, utcnow
from ..domain import rollout as domain
from ..domain.errors import DomainError
from ..domain.gpus import resolve
from ..errors import ApiError, Conflict, Invalid, NotFound
from ..settings import Settings
from ..signing import KeyStore
from . import manifests as manifest_service
from . import nodes as node_service
from . import plans as plan_service

log = logging.getLogger("preflight.rollouts")
INTERNAL = ("pinned", "judged")  # kept in Rollout.target beside the target as given; never part of a plan body
TARGET_FIELDS = ("manifest", "engine_args", "env", "environment", "workload", "vllm_version", "kv_cache_pool",
                 "multi_node_form")
# what the scheduler steps (halted waits for an operator; rolling_back and aborting have restores left, a chunk a step)
SCHEDULED = ("pending", "waiting", "baking", "paused") + domain.RESTORING
FAILED = domain.FAILED_REPORTS  # a report on the rollout's plan that fails its node
MAX_SELECTED = domain.MAX_ROLLOUT_NODES
# The hook for a gate over vLLM's metrics (preemptions, P99 from the tuning loop's windows, when it exists): a
# function of domain.Observed returning an Outcome (not "ready": the node fails with its reason) or None. None here:
# no metrics gate.
METRICS_GATE: domain.MetricsGate | None = None


def _epoch(value: dt.datetime | None) -> float | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return value.timestamp()


def _at(now: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(now, dt.timezone.utc)


def _shape(n: Node) -> tuple:
    return (n.gpu_id, n.gpu.get("memory_bytes"), n.gpu.get("compute_capability"), n.gpu_count)


def _shape_key(n: Node) -> str:
    """A hardware shape as a JSON key (the rollout's ``pinned`` is per shape)."""
    return "|".join(str(x) for x in _shape(n))


SIGN_CHUNK = 256  # nodes per signed plan: POST /v1/plans' cap (schemas.PlanIn.nodes); a wave is signed in chunks


class PartialGroup(Exception):
    """Signing would take part of a multi-node instance that runs now (formed after the rollout was created)."""

    def __init__(self, message: str, evidence: dict[str, Any]):
        super().__init__(message)
        self.message, self.evidence = message, evidence


# -- create ----------------------------------------------------------------------------------------------------------

def _select_nodes(session: Session, body: dict[str, Any]) -> list[Node]:
    """The rollout's nodes: ``nodes`` (names, in the order given) or ``selector`` (inventory fields; by name)."""
    names, selector = body.get("nodes"), body.get("selector")
    if (names is None) == (selector is None):
        raise Invalid("give either nodes (names) or selector (inventory fields)", field="nodes",
                      errors=[{"field": "nodes", "rule": "rollout_nodes", "message": "give nodes or selector"}])
    if names is not None:
        names = node_service.distinct(names)
        found = {n.name: n for n in session.execute(select(Node).where(Node.name.in_(names))).scalars()}
        missing = [(i, n) for i, n in enumerate(body["nodes"]) if n not in found]
        if missing:
            raise Invalid(f"{len(missing)} node(s) not registered: " + ", ".join(n for _, n in missing[:5]),
                          field=f"nodes.{missing[0][0]}",
                          errors=[{"field": f"nodes.{i}", "rule": "unknown_node",
                                   "message": f"node {n!r} is not registered"} for i, n in missing[:50]])
        return [found[n] for n in names]
    q = select(Node).order_by(Node.name)
    if selector.get("gpu") is not None:
        q = q.where(Node.gpu_id == resolve(selector["gpu"], "selector.gpu").id)
    if selector.get("gpu_count") is not None:
        q = q.where(Node.gpu_count == selector["gpu_count"])
    labels = selector.get("labels") or {}
    chosen: list[Node] = []
    # labels are JSON: matched here, over the rows the columns already narrowed, read in pages (bounded memory)
    after = ""
    while True:
        page = list(session.execute(q.where(Node.name > after).limit(500)).scalars())
        for n in page:
            if all((n.labels or {}).get(k) == v for k, v in labels.items()):
                chosen.append(n)
                if len(chosen) > MAX_SELECTED:
                    raise Invalid(f"the selector matches more than {MAX_SELECTED} nodes: narrow it (labels, gpu, "
                                  f"gpu_count) and roll out in several rollouts", field="selector")
        if len(page) < 500:
            break
        after = page[-1].name
    if not chosen:
        raise Invalid("the selector matches no registered node", field="selector",
                      errors=[{"field": "selector", "rule": "no_match", "message": "no node matches"}])
    return chosen


def _current(session: Session, names: list[str]) -> dict[str, Assignment]:
    """Each node's current (active, highest seq) assignment."""
    out: dict[str, Assignment] = {}
    for a in session.execute(select(Assignment).where(Assignment.node_name.in_(names),
                                                      Assignment.status == "active")).scalars():
        if a.node_name not in out or a.seq > out[a.node_name].seq:
            out[a.node_name] = a
    return out


def _previous_groups(session: Session, current: dict[str, Assignment]) -> list[list[str]]:
    """The multi-node instances the nodes' current plans form (every active member, in or out of the rollout)."""
    keys = {(a.plan_id, a.group_index) for a in current.values() if a.role in ("head", "worker")}
    if not keys:
        return []
    groups: dict[tuple, list[str]] = {}
    for a in session.execute(select(Assignment).where(Assignment.plan_id.in_(sorted({p for p, _ in keys})),
                                                      Assignment.status == "active")
                             .order_by(Assignment.rank)).scalars():
        if (a.plan_id, a.group_index) in keys:
            groups.setdefault((a.plan_id, a.group_index), []).append(a.node_name)
    return list(groups.values())


def create(session: Session, *, actor: str, body: dict[str, Any]) -> dict[str, Any]:
    """Store a rollout after validating its target once per distinct hardware shape of its nodes. Raises
    LaunchRejected (422 with findings; nothing stored), Invalid / DomainError naming the field, NotFound for an
    unknown manifest, Conflict when a node is already in a rollout that is not over."""
    waves = [domain.Wave(w["percent"], w.get("bake_s", 0)) for w in body["waves"]]
    domain.check_waves(waves)
    gates = domain.Gates(**(body.get("gates") or {}))
    nodes = _select_nodes(session, body)
    names = [n.name for n in nodes]
    if len(names) > domain.MAX_ROLLOUT_NODES:
        raise Invalid(f"{len(names)} nodes: at most {domain.MAX_ROLLOUT_NODES} per rollout", field="nodes")

    def at(i: int) -> str:  # the field a node of the rollout came from: its place in nodes, or the selector
        return f"nodes.{i}" if body.get("nodes") is not None else "selector"

    node_service.lock(session, sorted(names))  # plans and rollouts for these nodes queue here
    busy = session.execute(select(RolloutNode.node_name, RolloutNode.rollout_id)
                           .join(Rollout, Rollout.id == RolloutNode.rollout_id)
                           .where(RolloutNode.node_name.in_(names), Rollout.state.in_(SCHEDULED + ("halted",)))
                           .limit(1)).first()
    if busy is not None:
        raise Conflict(f"node {busy[0]!r} is already in rollout {busy[1]} (not over): finish, abort or wait for it",
                       field=at(names.index(busy[0])))
    current = _current(session, names)
    unplanned = [i for i, n in enumerate(names) if n not in current]
    if unplanned:
        raise Invalid(f"node {names[unplanned[0]]!r} has no current plan: a rollout changes running nodes and "
                      f"restores their previous plan on failure (give the first plan with POST /v1/plans)",
                      field=at(unplanned[0]),
                      errors=[{"field": at(i), "rule": "no_current_plan",
                               "message": f"node {names[i]!r} has no current plan"} for i in unplanned[:50]])
    previous = _previous_groups(session, current)
    inside = set(names)
    for members in previous:
        outside = [m for m in members if m not in inside]
        if outside:
            member = next(m for m in members if m in inside)
            raise Invalid(f"node {member!r} runs one multi-node instance with {', '.join(outside)} (plan "
                          f"{current[member].plan_id}), which the rollout does not include: a group moves "
                          f"together, so include every member", field=at(names.index(member)),
                          errors=[{"field": at(names.index(member)), "rule": "partial_group",
                                   "message": f"its instance also spans {', '.join(outside)}"}])
    manifest = manifest_service.resolve_ref(session, body["manifest"])
    target = {k: body[k] for k in TARGET_FIELDS if body.get(k) is not None}
    target["manifest"] = manifest.id  # pinned: "name" (the newest version) must not change between waves
    # the target judged once per hardware shape, over all the rollout's nodes of that shape (its topology too)
    shapes: dict[tuple, list[Node]] = {}
    for n in nodes:
        shapes.setdefault(_shape(n), []).append(n)
    together: list[list[str]] = [list(g) for g in previous]
    judged = []
    heads: set[str] = set()
    pinned: dict[str, dict[str, Any]] = {}
    for shape_nodes in shapes.values():
        j = plan_service.judge(session, manifest, shape_nodes, {**target, "nodes": [n.name for n in shape_nodes]})
        if j.result.verdict == "reject":
            raise j.rejection(session)
        topo = j.layout.topo
        pinned[_shape_key(shape_nodes[0])] = _pin(session, manifest, shape_nodes, target, j)
        together.extend(list(g) for g in topo.groups if len(g) > 1)
        heads.update(g[0] for g in topo.groups)
        judged.append({"nodes": len(shape_nodes), "gpu": shape_nodes[0].gpu_id, "gpu_count": shape_nodes[0].gpu_count,
                       "verdict": j.result.verdict, "nodes_per_instance": topo.nodes_per_instance,
                       "findings": j.findings})
    unit_list = domain.units(names, together)
    per_wave = domain.wave_units(unit_list, waves)
    wave_of = {u: w for w, us in enumerate(per_wave) for u in us}
    warnings = []
    if body.get("failure_limit", 0) >= len(unit_list):
        warnings.append({"rule": "failure_limit_not_limiting", "field": "failure_limit",
                         "message": f"failure_limit {body.get('failure_limit', 0)} is not below the rollout's "
                                    f"{len(unit_list)} unit(s): no number of failures halts it (it never rolls back "
                                    f"by itself)"})
    now = utcnow()
    paused = bool(body.get("paused"))
    r = Rollout(id=str(uuid.uuid4()), state="paused" if paused else "pending", wave=-1, promote=False,
                paused_from="pending" if paused else None, target={**target, "pinned": pinned, "judged": judged},
                selector=body.get("selector"), waves=[{"percent": w.percent, "bake_s": w.bake_s} for w in waves],
                failure_limit=body.get("failure_limit", 0),
                gates={"ready_timeout_s": gates.ready_timeout_s, "kv_tolerance": gates.kv_tolerance},
                steps=0, created_by=actor, created_at=now, updated_at=now)
    session.add(r)
    session.flush()
    for i, w in enumerate(waves):
        session.add(RolloutWave(rollout_id=r.id, index=i, percent=w.percent, bake_s=w.bake_s, state="pending",
                                plan_ids=[]))
    position = {n: i for i, n in enumerate(names)}
    for u, members in enumerate(unit_list):
        for n in members:
            session.add(RolloutNode(rollout_id=r.id, node_name=n, position=position[n], unit=u, wave=wave_of[u],
                                    head=n in heads, outcome="unchanged", failed=False, evidence={}, updated_at=now,
                                    previous_plan_id=current[n].plan_id))
    session.flush()
    audit.append(session, actor=actor, kind="rollout.created", subject=f"rollout:{r.id}", model=manifest.name,
                 payload={"rollout": r.id, "manifest": f"{manifest.name}@{manifest.version}", "nodes": len(names),
                          "units": len(unit_list), "waves": r.waves,
                          "nodes_per_wave": [sum(len(unit_list[u]) for u in us) for us in per_wave],
                          "failure_limit": r.failure_limit, "gates": r.gates,
                          "judged": [{**x, "findings": [f["rule"] for f in x["findings"]]} for x in judged],
                          "pinned": pinned, **({"warnings": warnings} if warnings else {})})
    out = rollout_dict(session, r)
    if warnings:
        out["warnings"] = warnings
    return out


def _pin(session: Session, manifest, shape_nodes: list[Node], target: dict[str, Any], j) -> dict[str, Any]:
    """What every wave of one hardware shape is signed with, decided once here (the canary proves what the fleet
    gets): the engine arguments with the recommended values filled in, the KV pool measured over all the shape's
    nodes when ``kv_cache_pool`` is pinned (as ``kv_cache_memory_bytes``), and the vLLM version resolved."""
    if j.layout.topo.nodes_per_instance > 1:
        # multi-node instances: every wave signs whole instances, the same shape judge() filled here
        args = j.request.model_dump(mode="json")["engine_args"]
    else:
        # replicas: each node runs what one node alone is judged to run (a wave of one node and one of many sign
        # the same command): the single-node judgement, with the pool decided over all the nodes (j.body)
        one = plan_service.judge(session, manifest, shape_nodes[:1], {**j.body, "kv_cache_pool": "utilization",
                                                                       "nodes": [shape_nodes[0].name]})
        if one.result.verdict == "reject":
            raise one.rejection(session)
        req = one.result.context.request if one.result.context is not None else one.request
        args = req.model_dump(mode="json")["engine_args"]
    pool = (j.body.get("engine_args") or {}).get("kv_cache_memory_bytes") \
        if target.get("kv_cache_pool") == "pinned" else None
    return {"engine_args": args, "vllm_version": j.result.vllm_version,
            **({"kv_cache_memory_bytes": pool} if pool is not None else {})}


def _pinned_body(r: Rollout, node: Node) -> dict[str, Any]:
    """The plan body a wave signs for a node of this shape: the target with the values pinned at creation."""
    base = {k: v for k, v in r.target.items() if k not in INTERNAL}
    pin = (r.target.get("pinned") or {}).get(_shape_key(node))
    if pin is None:  # a rollout created before pinning: its target as given
        return base
    return {**base, "engine_args": pin["engine_args"], "vllm_version": pin["vllm_version"],
            "kv_cache_pool": "utilization"}  # a pinned pool is in engine_args.kv_cache_memory_bytes now


def plan_warnings(session: Session, names: list[str]) -> list[dict[str, Any]]:
    """POST /v1/plans: a warning per unfinished rollout that holds some of these nodes (the plan is signed; the
    rollout counts those nodes ``superseded_by_hand`` and leaves them alone)."""
    rows = session.execute(select(RolloutNode.rollout_id, RolloutNode.node_name)
                           .join(Rollout, Rollout.id == RolloutNode.rollout_id)
                           .where(RolloutNode.node_name.in_(names), Rollout.state.in_(SCHEDULED + ("halted",)))
                           .order_by(RolloutNode.rollout_id, RolloutNode.position)).all()
    by: dict[str, list[str]] = {}
    for rid, node in rows:
        by.setdefault(rid, []).append(node)
    return [{"rule": "rollout_in_progress", "rollout": rid, "nodes": nodes[:50],
             "message": f"rollout {rid} (not over) includes {len(nodes)} of these node(s): this plan replaces the "
                        f"rollout's for them; the rollout counts them superseded_by_hand (not a failure) and will "
                        f"not restore them"} for rid, nodes in by.items()]


# -- view ------------------------------------------------------------------------------------------------------------

def _manifest_refs(session: Session, ids: set[Any]) -> dict[Any, str]:
    """``name@version`` of the pinned manifests (stored by id), one query for a page of rollouts."""
    ids = {i for i in ids if isinstance(i, int)}
    if not ids:
        return {}
    return {i: f"{name}@{version}" for i, name, version in
            session.execute(select(Manifest.id, Manifest.name, Manifest.version).where(Manifest.id.in_(ids)))}


def _target_view(target: dict[str, Any], secrets: bool, refs: dict[Any, str]) -> dict[str, Any]:
    """The target as given, with the manifest as ``name@version`` (``manifest_id``: the id it is pinned by)."""
    target = {k: v for k, v in target.items() if k not in INTERNAL}
    mid = target.get("manifest")
    target = {**target, "manifest": refs.get(mid, mid), "manifest_id": mid}
    if secrets or not target.get("env"):
        return target
    return {**target, "env": {k: plan_service.REDACTED for k in target["env"]}}


def rollout_dict(session: Session, r: Rollout, *, detail: bool = True, secrets: bool = True,
                 counts: tuple[int, int] | None = None, refs: dict[Any, str] | None = None) -> dict[str, Any]:
    """A rollout as the API shows it; without ``detail`` (the listing) no waves' or nodes' rows, and ``counts``
    (nodes, failed units) and the manifests' ``refs`` given by the caller."""
    if refs is None:
        refs = _manifest_refs(session, {r.target.get("manifest")})
    rows = [] if not detail else list(session.execute(select(RolloutNode).where(RolloutNode.rollout_id == r.id)
                                                      .order_by(RolloutNode.position)).scalars())
    total, failures = counts if counts is not None else (len(rows), _failures(rows))
    out = {"id": r.id, "state": r.state, "wave": r.wave, "promote": r.promote, "paused_from": r.paused_from,
           "target": _target_view(r.target, secrets, refs), "pinned": r.target.get("pinned"), "judged": r.target.get("judged"), "selector": r.selector,
           "failure_limit": r.failure_limit,
           "failures": failures, "gates": r.gates, "bake_until": iso(r.bake_until), "reason": r.reason,
           "nodes_total": total, "created_by": r.created_by, "created_at": iso(r.created_at),
           "updated_at": iso(r.updated_at)}
    if not detail:
        out["waves"] = r.waves
        return out
    waves = list(session.execute(select(RolloutWave).where(RolloutWave.rollout_id == r.id)
                                 .order_by(RolloutWave.index)).scalars())
    out["waves"] = [{"index": w.index, "percent": w.percent, "bake_s": w.bake_s, "state": w.state,
                     "plan_ids": w.plan_ids, "signed_at": iso(w.signed_at), "settled_at": iso(w.settled_at),
                     "done_at": iso(w.done_at), "nodes": [n.node_name for n in rows if n.wave == w.index]}
                    for w in waves]
    out["outcomes"] = _counts(n.outcome for n in rows)  # e.g. {"ready": 3, "superseded_by_hand": 1}: what it changed
    out["nodes"] = [{"node": n.node_name, "unit": n.unit, "wave": n.wave, "head": n.head, "outcome": n.outcome,
                     "failed": n.failed, "previous_plan_id": n.previous_plan_id, "new_plan_id": n.new_plan_id,
                     "new_seq": n.new_seq, "restored_plan_id": n.restored_plan_id, "restored_seq": n.restored_seq,
                     "signed_at": iso(n.signed_at), "evidence": n.evidence} for n in rows]
    return out


def _counts(states: Iterable[str]) -> dict[str, int]:
    """How many of each: nodes per outcome (``{"ready": 3, "superseded_by_hand": 1}``), units per state."""
    return dict(Counter(states))


def _failures(rows: list[RolloutNode]) -> int:
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


def list_rollouts(session: Session, *, state: str | None, limit: int, after: str | None,
                  secrets: bool) -> dict[str, Any]:
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
    totals = dict(session.execute(select(RolloutNode.rollout_id, func.count()).where(RolloutNode.rollout_id.in_(ids))
                                  .group_by(RolloutNode.rollout_id)).all()) if ids else {}
    failed = dict(session.execute(select(RolloutNode.rollout_id, func.count(RolloutNode.unit.distinct()))
                                  .where(RolloutNode.rollout_id.in_(ids), RolloutNode.failed.is_(True))
                                  .group_by(RolloutNode.rollout_id)).all()) if ids else {}
    refs = _manifest_refs(session, {r.target.get("manifest") for r in rows})
    return {"items": [rollout_dict(session, r, detail=False, secrets=secrets, refs=refs,
                                   counts=(totals.get(r.id, 0), failed.get(r.id, 0))) for r in rows],
            "next": rows[-1].id if len(rows) == limit else None}


# -- one step ----------------------------------------------------------------------------------------------------------

def _event(session: Session, r: Rollout, kind: str, payload: dict[str, Any], *, actor: str | None = None,
           node: str | None = None, plan_id: str | None = None) -> None:
    r.steps += 1
    audit.append(session, actor=actor or f"rollout:{r.id}", kind=f"rollout.{kind}", subject=f"rollout:{r.id}",
                 node=node, plan_id=plan_id, payload={"rollout": r.id, "state": r.state, "wave": r.wave, **payload})


def _observe(session: Session, r: Rollout, rows: list[RolloutNode], now: float) -> list[str]:
    """Judge every signed, not yet restored node against the gates from its reports on the rollout's plan; update
    outcomes and evidence. Returns the names of nodes that failed in this step."""
    signed = [n for n in rows if n.new_plan_id and n.outcome in ("pending", "ready")]
    if not signed:
        return []
    gates = domain.Gates(**r.gates)
    pairs = sorted({(n.node_name, n.new_plan_id) for n in signed})
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    # per (node, plan) the first report of each status, and the newest "running" that carries vLLM's KV figure (a
    # vLLM that restarted prints its pool again: the gate judges what runs now; a later report without the figure
    # hides nothing): at most five rows per node, however much it reported
    mine = tuple_(Report.node_name, Report.plan_id).in_(pairs)
    firsts = (select(func.min(Report.id)).where(mine, Report.status.in_(("running",) + FAILED))
              .group_by(Report.node_name, Report.plan_id, Report.status))
    figured = set(session.scalars(
        select(func.max(Report.id)).where(mine, Report.status == "running",
                                          cast(Report.details, Text).like('%"kv_cache_tokens"%'))
        .group_by(Report.node_name, Report.plan_id)))
    for rid, node, plan_id, status, message, details, created in session.execute(
            select(Report.id, Report.node_name, Report.plan_id, Report.status, Report.message, Report.details,
                   Report.created_at).where(or_(Report.id.in_(firsts), Report.id.in_(figured)))
            .order_by(Report.id)):
        s = seen.setdefault((node, plan_id), {})
        at = _epoch(created)
        if status == "running":
            vllm = (details or {}).get("vllm") if isinstance(details, dict) else None
            tokens = vllm.get("kv_cache_tokens") if isinstance(vllm, dict) else None
            first = s.get("running", (at, None))[0]  # when it first ran; the figure of the newest that has one
            s["running"] = (first, tokens if isinstance(tokens, int) and not isinstance(tokens, bool)
                            else s.get("running", (at, None))[1])
        elif "failure" not in s:
            d = details if isinstance(details, dict) else {}
            said = message or d.get("reason") or d.get("tail")  # what the agent said it was: evidence
            s["failure"] = (status, at, said if isinstance(said, str) else None)
            code = d.get("status")  # vLLM's exit status on an "exited" report
            s["exit_status"] = code if isinstance(code, int) and not isinstance(code, bool) else None
    budgets = dict(session.execute(select(Plan.id, Plan.budget)
                                   .where(Plan.id.in_(sorted({n.new_plan_id for n in signed})))).all())
    failed_now = []
    current = _current(session, [n.node_name for n in signed])
    for n in sorted(signed, key=lambda n: not n.head):  # heads first: a headless worker is ready with its head
        cur = current.get(n.node_name)
        if cur is None or cur.plan_id != n.new_plan_id:
            # planned (or revoked) by hand during its wave: someone else's decision, not the rollout's failure
            n.outcome, n.updated_at = "superseded_by_hand", utcnow()
            n.evidence = {"reason": "superseded_by_hand", "current_plan_id": cur.plan_id if cur else None,
                          "current_seq": cur.seq if cur else None}
            _event(session, r, "node_superseded_by_hand", {"unit": n.unit, "evidence": n.evidence},
                   node=n.node_name, plan_id=n.new_plan_id)
            continue
        s = seen.get((n.node_name, n.new_plan_id), {})
        running = s.get("running")
        predicted = (budgets.get(n.new_plan_id) or {}).get("kv_cache_tokens")
        o = domain.node_outcome(domain.Observed(
            node=n.node_name, signed_at=_epoch(n.signed_at) or now, running_at=running[0] if running else None,
            failure=s.get("failure"), exit_status=s.get("exit_status"),
            predicted_kv_tokens=predicted if isinstance(predicted, int) else None,
            measured_kv_tokens=running[1] if running else None,
            head_ready=None if n.head else all(m.outcome == "ready" for m in rows if m.unit == n.unit and m.head)),
            gates, now, metrics_gate=METRICS_GATE)
        evidence = {**o.evidence, **({"reason": o.reason} if o.reason else {})}
        if o.state != n.outcome or (o.state != "pending" and evidence != n.evidence):
            if o.state == "failed":
                failed_now.append(n.node_name)
                n.failed = True
            n.outcome, n.evidence, n.updated_at = o.state, evidence, utcnow()
    return failed_now


def _units_of(rows: list[RolloutNode], wave: int) -> dict[int, list[RolloutNode]]:
    out: dict[int, list[RolloutNode]] = {}
    for n in rows:
        if n.wave == wave:
            out.setdefault(n.unit, []).append(n)
    return out


def _unit_outcomes(rows: list[RolloutNode], wave: int) -> dict[int, domain.Outcome]:
    return {u: domain.unit_outcome([domain.Outcome(m.outcome if m.outcome in ("pending", "ready", "failed",
                                                                              "superseded_by_hand")
                                                   else "pending") for m in members], [m.head for m in members])
            for u, members in _units_of(rows, wave).items()}


def _sign_chunk(session: Session, r: Rollout, wave: RolloutWave, rows: list[RolloutNode], *, settings: Settings,
                keys: KeyStore, now: float) -> tuple[str | None, bool]:
    """Sign the next chunk of the wave: whole units of one hardware shape not signed yet, at most SIGN_CHUNK nodes
    (POST /v1/plans' cap), as one plan of the values pinned at creation, recorded on the wave and its nodes in this
    transaction (a crash before the commit signed nothing; after it, the next step goes on with the next chunk).
    Raises PartialGroup when the chunk would take part of a multi-node instance running now. Returns (the plan id,
    whether the wave is now fully signed)."""
    todo = sorted((n for n in rows if n.wave == wave.index and n.new_plan_id is None
                   and n.outcome == "unchanged"), key=lambda n: n.position)
    if not todo:
        return None, True
    by_name = {n.name: n for n in session.execute(select(Node).where(
        Node.name.in_([n.node_name for n in todo]))).scalars()}
    pinned = r.target.get("pinned")
    changed = [n.node_name for n in todo if pinned is not None and _shape_key(by_name[n.node_name]) not in pinned]
    if changed:  # checked before any chunk is signed: the whole wave is refused, nothing of it kept
        raise DomainError("nodes", f"the hardware of {', '.join(changed[:5])} changed since the rollout was "
                          f"validated (no command was pinned for it): roll it out again", rule="rollout_shape")
    shape = _shape_key(by_name[todo[0].node_name])
    units: dict[int, list[RolloutNode]] = {}
    for n in todo:
        if _shape_key(by_name[n.node_name]) == shape:
            units.setdefault(n.unit, []).append(n)
    chunk: list[RolloutNode] = []
    for members in units.values():
        if chunk and len(chunk) + len(members) > SIGN_CHUNK:
            break
        chunk.extend(members)
    names = [n.node_name for n in chunk]
    node_service.lock(session, sorted(names))  # a plan given by hand now waits for this chunk, never interleaves
    current = _current(session, names)
    moved = _planned_by_hand(session, r, chunk, current)
    if moved:
        chunk = [n for n in chunk if n.unit not in moved]
        if not chunk:
            wave.state = "waiting"
            return None, len(todo) == sum(1 for n in todo if n.unit in moved)
        names = [n.node_name for n in chunk]
        current = {k: v for k, v in current.items() if k in names}
    inside = set(names)
    for members in _previous_groups(session, current):
        outside = [m for m in members if m not in inside]
        if outside:
            plan_id = next(current[m].plan_id for m in members if m in current)
            raise PartialGroup(
                f"wave {wave.index} would take part of a multi-node instance (plan {plan_id}: "
                f"{', '.join(members)}) that runs now: {', '.join(outside)} are not signed with it; planned by hand "
                f"after the rollout was created, it would be split",
                {"rule": "partial_group", "plan_id": plan_id, "group": members,
                 "in_wave": [m for m in members if m in inside], "outside": outside})
    out = plan_service.create(session, actor=f"rollout:{r.id}", settings=settings, keys=keys,
                              body={**_pinned_body(r, by_name[chunk[0].node_name]), "nodes": names})
    seqs = {a["node"]: a["seq"] for a in out["assignments"]}
    at = _at(now)
    for n in chunk:
        if n.previous_plan_id is None and n.node_name in current:  # a rollout created before it was recorded
            n.previous_plan_id = current[n.node_name].plan_id
        n.new_plan_id, n.new_seq, n.signed_at = out["id"], seqs[n.node_name], at
        n.outcome, n.evidence, n.updated_at = "pending", {}, utcnow()
    wave.plan_ids = [*(wave.plan_ids or []), out["id"]]
    if wave.signed_at is None:
        wave.signed_at = at
    wave.state = "waiting"
    return out["id"], len(chunk) + sum(1 for n in todo if n.unit in moved) == len(todo)


def _planned_by_hand(session: Session, r: Rollout, chunk: list[RolloutNode], current: dict[str, Assignment]) -> set[int]:
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
        n.outcome, n.updated_at = "superseded_by_hand", utcnow()
        n.evidence = {"reason": "superseded_by_hand", "before_wave": True, "planned_node": who,
                      "current_plan_id": cur.plan_id if cur else None, "current_seq": cur.seq if cur else None}
        _event(session, r, "node_superseded_by_hand", {"unit": n.unit, "evidence": n.evidence}, node=n.node_name)
    return set(moved)


def _restore(session: Session, r: Rollout, rows: list[RolloutNode], *, settings: Settings, keys: KeyStore,
             reason: str, actor: str) -> bool:
    """Give every node the rollout changed its previous plan's content again, as a new plan with a higher seq (the
    agents' replay protection accepts it): per unit and previous plan, the whole previous groups together. A node
    whose current plan is no longer the rollout's (someone planned it since) is left alone. Each node restored is an
    audit event with the reason and the evidence. At most one chunk (SIGN_CHUNK nodes, whole units; more when one
    unit is larger) per call, so one transaction holds the write lock for one chunk: returns whether nodes are left
    to restore (the caller's next step, in a new transaction, goes on). Nodes an operator's abort of a halted
    rollout marked ``retry_restore`` are tried again."""
    todo = [n for n in rows if n.new_plan_id and n.restored_plan_id is None
            and n.outcome not in ("superseded_by_hand", "not_restored")]
    if not todo:
        return False
    node_service.lock(session, sorted(n.node_name for n in todo))  # a plan given by hand now is seen, never lost
    current = _current(session, [n.node_name for n in todo])
    batches: dict[tuple[int, str | None], list[RolloutNode]] = {}
    restored = missed = 0
    for n in todo:
        cur = current.get(n.node_name)
        if cur is None or cur.plan_id != n.new_plan_id:  # planned (or revoked) by hand since: their decision
            n.outcome, n.updated_at = "superseded_by_hand", utcnow()
            n.evidence = {**n.evidence, "restore": f"its current plan is {cur.plan_id if cur else 'none'}, no longer "
                                                   f"the rollout's {n.new_plan_id}: left as it is"}
            continue
        batches.setdefault((n.previous_plan_id, n.unit), []).append(n)
    # nodes whose previous plan is the same are restored together (its content is identical), whole units, at most
    # SIGN_CHUNK nodes per plan (POST /v1/plans' cap)
    chunks: list[tuple[str | None, list[RolloutNode]]] = []
    for (previous_id, _unit), members in sorted(batches.items(), key=lambda kv: (kv[0][0] or "", kv[0][1])):
        if chunks and chunks[-1][0] == previous_id and previous_id is not None \
                and len(chunks[-1][1]) + len(members) <= SIGN_CHUNK:
            chunks[-1][1].extend(members)
        else:
            chunks.append((previous_id, list(members)))
    size = 0
    for i, (previous_id, members) in enumerate(chunks):
        if size and size + len(members) > SIGN_CHUNK:
            return True
        size += len(members)
        failure = None
        if previous_id is None:
            failure = "it had no plan before the rollout"
        else:
            old, assignments = plan_service.get(session, previous_id)
            wanted = {n.node_name for n in members}
            body = plan_service.content_body(old, [a for a in assignments if a.node_name in wanted])
            if old.status == "revoked":  # withdrawn since: its content is never signed again by a rollback
                failure = f"its previous plan {previous_id} was revoked since: not signed again (give the node a plan)"
            else:
                try:
                    with session.begin_nested():  # a refusal undoes only this restore
                        out = plan_service.create(session, actor=f"rollout:{r.id}", settings=settings, keys=keys,
                                                  body=body, tuning=old.tuning if isinstance(old.tuning, dict) else None)
                except (ApiError, DomainError) as exc:
                    failure = str(getattr(exc, "detail", None) or getattr(exc, "message", None) or exc)[:500]
        for n in members:
            evidence = dict(n.evidence or {})
            if failure is not None:
                n.outcome, n.updated_at = "not_restored", utcnow()
                n.evidence = {**evidence, "restore": failure}
                missed += 1
                continue
            seq = next(a["seq"] for a in out["assignments"] if a["node"] == n.node_name)
            n.restored_plan_id, n.restored_seq, n.outcome, n.updated_at = out["id"], seq, "restored", utcnow()
            n.evidence = evidence
            restored += 1
            _event(session, r, "node_restored", {"reason": reason, "previous_plan_id": previous_id,
                                                 "rollout_plan_id": n.new_plan_id, "rollout_seq": n.new_seq,
                                                 "seq": seq, "evidence": evidence},
                   actor=actor, node=n.node_name, plan_id=out["id"])
    return False


def _finish_restore(session: Session, r: Rollout, rows: list[RolloutNode], *, actor: str | None = None) -> None:
    """Every restore done: aborting → aborted; a halt → rolled_back, or halted when a node could not be restored
    (an operator's abort tries again). One event with the totals."""
    restored = sum(1 for n in rows if n.outcome == "restored")
    missed = sum(1 for n in rows if n.outcome == "not_restored")
    if missed:  # halted until an operator's abort restores them (it tries the refused restores again)
        r.state = "halted"
        r.reason = f"{missed} node(s) could not be restored (see their evidence): {r.reason or ''}"[:1000]
    else:
        r.state = "aborted" if r.state == "aborting" else "rolled_back"
    _event(session, r, "rolled_back" if missed == 0 else "rollback_incomplete",
           {"restored": restored, "not_restored": missed, "reason": r.reason}, actor=actor)


def _evidence_of(rows: list[RolloutNode]) -> list[dict[str, Any]]:
    return [{"node": n.node_name, "unit": n.unit, "wave": n.wave, "plan_id": n.new_plan_id, **n.evidence}
            for n in rows if n.failed][:50]


def _close_waves(session: Session, r: Rollout, state: str) -> None:
    """A halt or an abort ends the waves: the current one (signed, not done) becomes ``state`` (halted, aborted),
    the ones not started ``cancelled``; done and skipped waves keep theirs."""
    for w in session.execute(select(RolloutWave).where(RolloutWave.rollout_id == r.id)).scalars():
        if w.state in ("waiting", "baking") or (w.index == r.wave and w.state == "pending"):  # (refused at signing)
            w.state = state
        elif w.state == "pending":
            w.state = "cancelled"


def _halt(session: Session, r: Rollout, rows: list[RolloutNode], reason: str, *, settings: Settings,
          keys: KeyStore, evidence: dict[str, Any] | None = None) -> None:
    r.state, r.reason = "halted", reason
    _close_waves(session, r, "halted")
    _event(session, r, "halted", {"reason": reason, "evidence": _evidence_of(rows),
                                  **({"refused": evidence} if evidence else {})})
    if _restore(session, r, rows, settings=settings, keys=keys, reason=reason, actor=f"rollout:{r.id}"):
        r.state = "rolling_back"  # more chunks to restore: the scheduler's next steps, each its own transaction
        return
    _finish_restore(session, r, rows)


def _lock(session: Session, rollout_id: str) -> Rollout | None:
    """The rollout's row, locked for this transaction; None when another worker holds it (PostgreSQL SKIP LOCKED) or
    it is no longer the scheduler's."""
    q = select(Rollout).where(Rollout.id == rollout_id, Rollout.state.in_(SCHEDULED))
    if session.get_bind().dialect.name == "postgresql":
        q = q.with_for_update(skip_locked=True)
    return session.execute(q).scalar_one_or_none()


def step(session: Session, rollout_id: str, *, settings: Settings, keys: KeyStore, now: float) -> str | None:
    """One step of one rollout, in the caller's transaction: observe the nodes, then do what the state machine says
    (sign the next wave, start the bake, complete, halt and restore). Returns the action taken ("none" when only
    observations changed), or None when the rollout was not available (locked elsewhere, or over)."""
    r = _lock(session, rollout_id)
    if r is None:
        return None
    rows = list(session.execute(select(RolloutNode).where(RolloutNode.rollout_id == r.id)
                                .order_by(RolloutNode.position)).scalars())
    failed_now = [] if r.state in domain.RESTORING else _observe(session, r, rows, now)
    for name in failed_now:
        n = next(x for x in rows if x.node_name == name)
        _event(session, r, "node_failed", {"unit": n.unit, "evidence": n.evidence}, node=name, plan_id=n.new_plan_id)
    waves = list(session.execute(select(RolloutWave).where(RolloutWave.rollout_id == r.id)
                                 .order_by(RolloutWave.index)).scalars())
    units = _unit_outcomes(rows, r.wave) if r.wave >= 0 else {}
    view = domain.View(state=r.state, wave=r.wave, waves=tuple(domain.Wave(w.percent, w.bake_s) for w in waves),
                       failure_limit=r.failure_limit, failures=_failures(rows), wave_units=len(units),
                       wave_settled=sum(1 for o in units.values() if o.state != "pending"),
                       bake_until=_epoch(r.bake_until), promote=r.promote,
                       wave_sizes=tuple(sum(1 for n in rows if n.wave == w.index) for w in waves))
    d = domain.step(view, now)
    if d.action == "none" and r.state == "waiting" and 0 <= r.wave < len(waves) \
            and any(n.wave == r.wave and n.new_plan_id is None and n.outcome == "unchanged" for n in rows):
        r.updated_at = utcnow()
        return _sign_next(session, r, waves[r.wave], rows, settings=settings, keys=keys, now=now)
    if d.action == "none":
        if failed_now:
            r.updated_at = utcnow()
        return "none"
    r.updated_at = utcnow()
    if d.action == "restore":  # the next chunk of a rollback or an abort
        actor = f"rollout:{r.id}"
        if _restore(session, r, rows, settings=settings, keys=keys, reason=r.reason or r.state, actor=actor):
            return "restoring"
        _finish_restore(session, r, rows)
        return "restore"
    if d.action == "halt":
        _halt(session, r, rows, d.reason or "failures", settings=settings, keys=keys)
        return _halted(r)
    if d.action == "bake":
        wave = waves[r.wave]
        wave.state, wave.settled_at = "baking", _at(now)
        r.state, r.bake_until = "baking", _at(d.bake_until)
        _event(session, r, "wave_settled", {"bake_until": iso(r.bake_until), "units": _counts(o.state for o in units.values())})
        return "bake"
    # leaving the current wave: it is done
    if 0 <= r.wave < len(waves):
        w = waves[r.wave]
        if w.settled_at is None:
            w.settled_at = _at(now)
        w.state, w.done_at = "done", _at(now)
        _event(session, r, "wave_done", {"units": _counts(o.state for o in units.values()), "promoted": r.promote})
    if r.wave >= 0:  # a promote given in pending skips wave 0's bake: kept until wave 0 is left
        r.promote = False
    r.bake_until = None
    if d.action == "complete":
        for skipped in waves[r.wave + 1:]:  # left empty (a unit overshot them): nothing to sign or bake
            if skipped.state == "pending":
                skipped.state = "skipped"
                _event(session, r, "wave_skipped", {"index": skipped.index, "reason": "no nodes left for this wave"})
        r.state = "completed"
        _event(session, r, "completed", {"failures": view.failures, "outcomes": _counts(n.outcome for n in rows)})
        return "complete"
    # sign: a refusal now (the manifest or the vLLM catalogue changed since the rollout was validated) halts it
    for skipped in waves[max(r.wave, -1) + 1:d.wave]:  # empty (a unit overshot them): nothing to sign or bake
        skipped.state = "skipped"
        _event(session, r, "wave_skipped", {"index": skipped.index, "reason": "no nodes left for this wave"})
    r.state, r.wave = "waiting", d.wave
    return _sign_next(session, r, waves[d.wave], rows, settings=settings, keys=keys, now=now)


def _halted(r: Rollout) -> str:
    """The step's answer to a halt: "halt", or "halting" when restores are left (``tick`` steps again at once)."""
    return "halting" if r.state == "rolling_back" else "halt"


def _sign_next(session: Session, r: Rollout, wave: RolloutWave, rows: list[RolloutNode], *, settings: Settings,
               keys: KeyStore, now: float) -> str:
    """Sign the wave's next chunk; "signing" while chunks remain (``tick`` steps again at once), "sign" when the
    wave is fully signed, "halt" when signing was refused (the manifest or the vLLM catalogue changed since the
    rollout was validated, or a multi-node instance formed since would be split)."""
    try:
        with session.begin_nested():
            plan_id, done = _sign_chunk(session, r, wave, rows, settings=settings, keys=keys, now=now)
    except PartialGroup as exc:
        _halt(session, r, rows, exc.message[:1000], settings=settings, keys=keys, evidence=exc.evidence)
        return _halted(r)
    except (ApiError, DomainError) as exc:  # the savepoint's rollback undid the chunk's rows (expired: reloaded)
        reason = f"signing wave {wave.index} was refused: {getattr(exc, 'detail', None) or exc}"[:1000]
        _halt(session, r, rows, reason, settings=settings, keys=keys)
        return _halted(r)
    if not done:
        if plan_id is not None:  # (None: every unit of that chunk was planned by hand since: nothing signed)
            _event(session, r, "wave_chunk_signed", {"plan_id": plan_id,
                                                     "nodes": [n.node_name for n in rows if n.new_plan_id == plan_id]})
        return "signing"
    _event(session, r, "wave_signed", {"plan_ids": wave.plan_ids,
                                       "nodes": [n.node_name for n in rows if n.wave == wave.index and n.new_plan_id]})
    return "sign"


# -- operators ---------------------------------------------------------------------------------------------------------

def command(session: Session, rollout_id: str, verb: str, *, actor: str, settings: Settings, keys: KeyStore,
            reason: str | None = None) -> dict[str, Any]:
    """``pause``, ``resume``, ``promote`` or ``abort`` (restores what the rollout changed). Waits for the row lock a
    scheduler step may hold. Raises NotFound, Conflict (the verb does not apply to the state)."""
    r = get(session, rollout_id, for_update=True)
    try:
        domain.command(r.state, verb, promoted=r.promote)  # raises when the verb does not apply to the state
    except DomainError as exc:
        raise Conflict(exc.message, field="state") from None
    now = time.time()
    r.updated_at = utcnow()
    payload: dict[str, Any] = {"from": r.state, **({"reason": reason} if reason else {})}
    if verb == "pause":
        r.paused_from, r.state = r.state, "paused"
        _event(session, r, "paused", payload, actor=actor)
    elif verb == "resume":
        r.state, r.paused_from = r.paused_from or "waiting", None
        if r.state == "baking":  # the bake starts over: the paused time did not count as watched
            wave = session.execute(select(RolloutWave).where(RolloutWave.rollout_id == r.id,
                                                             RolloutWave.index == r.wave)).scalar_one()
            r.bake_until = _at(now + wave.bake_s)
        _event(session, r, "resumed", payload, actor=actor)
    elif verb == "promote":
        r.promote = True
        _event(session, r, "promoted", payload, actor=actor)
    else:
        rows = list(session.execute(select(RolloutNode).where(RolloutNode.rollout_id == r.id)
                                    .order_by(RolloutNode.position)).scalars())
        why = f"aborted by {actor}" + (f": {reason}" if reason else "")
        if payload["from"] == "halted":  # the restores refused before are tried again
            for n in rows:
                if n.outcome == "not_restored" and n.restored_plan_id is None:
                    n.outcome = "retry_restore"
        r.state, r.reason = "aborting", why
        _close_waves(session, r, "aborted")
        _event(session, r, "aborted", payload, actor=actor)
        # the first chunk here; a large rollout answers "aborting" and the scheduler restores the rest, a chunk per
        # transaction (the write lock is never held for the whole fleet)
        if not _restore(session, r, rows, settings=settings, keys=keys, reason=why, actor=actor):
            _finish_restore(session, r, rows, actor=actor)
    return rollout_dict(session, r)


# -- the scheduler ------------------------------------------------------------------------------------------------------

_TICKING = threading.Lock()  # one tick at a time per process (SQLite's lock serializes processes)


MAX_PER_TICK = 1000  # a node is in one rollout at a time: far more than a fleet runs at once


def due(db) -> list[str]:
    """Ids of the rollouts the scheduler steps, oldest first (a read: no write lock)."""
    with db.read() as session:
        return list(session.execute(select(Rollout.id).where(Rollout.state.in_(SCHEDULED))
                                    .order_by(Rollout.created_at, Rollout.id).limit(MAX_PER_TICK)).scalars())


def tick(db, *, settings: Settings, keys: KeyStore, now: float | None = None,
         after_step=None) -> dict[str, str]:
    """Step every scheduled rollout once, each in its own transaction (the tests call this directly; the scheduler
    thread calls it every ``PREFLIGHT_ROLLOUT_TICK_SECONDS``). Returns {rollout id: action} for the rollouts it
    stepped (locked elsewhere: left out). ``after_step`` (tests) runs inside each step's transaction before it
    commits."""
    if not _TICKING.acquire(blocking=False):
        return {}
    try:
        done: dict[str, str] = {}
        for rid in due(db):
            try:
                for _ in range(domain.MAX_ROLLOUT_NODES):  # a wave's chunks, each its own transaction
                    with db.transaction() as session:
                        action = step(session, rid, settings=settings, keys=keys,
                                      now=time.time() if now is None else now)
                        if after_step is not None and action is not None:
                            after_step(rid, action)
                    if action not in ("signing", "restoring", "halting"):
                        break
                if action is not None:
                    done[rid] = action
            except Exception as exc:  # noqa: BLE001 - one rollout's failed step never stops the others
                log.warning("rollout %s: step failed, nothing of it kept: %s: %s", rid, exc.__class__.__name__,
                            str(getattr(exc, "detail", exc))[:300])
        return done
    finally:
        _TICKING.release()


class RolloutScheduler:
    """The background thread of a service process: ``tick`` every ``interval`` seconds (0: never started)."""

    def __init__(self, db, settings: Settings, keys: KeyStore, interval: float, on_change=None):
        self.db, self.settings, self.keys, self.interval, self.on_change = db, settings, keys, interval, on_change
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.interval <= 0:
            return
        self._stop.clear()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="rollouts", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                done = tick(self.db, settings=self.settings, keys=self.keys)
                if done and self.on_change is not None:
                    self.on_change()
            except Exception as exc:  # noqa: BLE001 - database down: the next tick tries again
                log.warning("rollout scheduler: %s", exc.__class__.__name__)
