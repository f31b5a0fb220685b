"""Creating a rollout: its nodes (names or a selector), the checks that they can be rolled (registered, planned,
in no other rollout, whole multi-node groups), the target judged once per hardware shape and what every wave will be
signed with (pinned), its units and waves. Nothing is stored on a rejection."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ... import audit
from ...api.schemas import PlanIn, RolloutIn
from ...db.models import Manifest, Node, Rollout, RolloutNode, RolloutWave
from ...domain import rollout as domain
from ...domain.gpus import resolve
from ...domain.policy_profile import Profile
from ...errors import Conflict, Invalid
from .. import manifests as manifest_service
from .. import nodes as node_service
from .. import plans as plan_service
from ..context import Context
from .common import MAX_SELECTED, SCHEDULED, TARGET_FIELDS, current_assignments, previous_groups, shape, shape_key


def _select_nodes(session: Session, rollout: RolloutIn) -> list[Node]:
    """The rollout's nodes: ``nodes`` (names, in the order given) or ``selector`` (inventory fields; by name)."""
    names, selector = rollout.nodes, rollout.selector
    if (names is None) == (selector is None):
        raise Invalid(
            "give either nodes (names) or selector (inventory fields)",
            field="nodes",
            errors=[{"field": "nodes", "rule": "rollout_nodes", "message": "give nodes or selector"}],
        )
    if names is not None:
        names = node_service.distinct(names)
        found = {n.name: n for n in session.execute(select(Node).where(Node.name.in_(names))).scalars()}
        missing = [(i, n) for i, n in enumerate(names) if n not in found]
        if missing:
            raise Invalid(
                f"{len(missing)} node(s) not registered: " + ", ".join(n for _, n in missing[:5]),
                field=f"nodes.{missing[0][0]}",
                errors=[
                    {"field": f"nodes.{i}", "rule": "unknown_node", "message": f"node {n!r} is not registered"}
                    for i, n in missing[:50]
                ],
            )
        return [found[n] for n in names]
    assert selector is not None  # exactly one of the two, checked above
    q = select(Node).order_by(Node.name)
    if selector.gpu is not None:
        q = q.where(Node.gpu_id == resolve(selector.gpu, "selector.gpu").id)
    if selector.gpu_count is not None:
        q = q.where(Node.gpu_count == selector.gpu_count)
    chosen: list[Node] = []
    # labels are JSON: matched here, over the rows the columns already narrowed, read in pages (bounded memory)
    after = ""
    while True:
        page = list(session.execute(q.where(Node.name > after).limit(500)).scalars())
        for n in page:
            if all((n.labels or {}).get(k) == v for k, v in selector.labels.items()):
                chosen.append(n)
                if len(chosen) > MAX_SELECTED:
                    raise Invalid(
                        f"the selector matches more than {MAX_SELECTED} nodes: narrow it (labels, gpu, "
                        f"gpu_count) and roll out in several rollouts",
                        field="selector",
                    )
        if len(page) < 500:
            break
        after = page[-1].name
    if not chosen:
        raise Invalid(
            "the selector matches no registered node",
            field="selector",
            errors=[{"field": "selector", "rule": "no_match", "message": "no node matches"}],
        )
    return chosen


def _check_nodes(session: Session, names: list[str], at: Callable[[int], str]) -> tuple[dict[str, Any], list]:
    """The nodes can be rolled: in no rollout that is not over, each with a current plan, and every multi-node
    instance they run whole in the rollout. Returns their current assignments and those instances (``at``: the
    field a node came from)."""
    busy = session.execute(
        select(RolloutNode.node_name, RolloutNode.rollout_id)
        .join(Rollout, Rollout.id == RolloutNode.rollout_id)
        .where(RolloutNode.node_name.in_(names), Rollout.state.in_(SCHEDULED + ("halted",)))
        .limit(1)
    ).first()
    if busy is not None:
        raise Conflict(
            f"node {busy[0]!r} is already in rollout {busy[1]} (not over): finish, abort or wait for it",
            field=at(names.index(busy[0])),
        )
    current = current_assignments(session, names)
    unplanned = [i for i, n in enumerate(names) if n not in current]
    if unplanned:
        raise Invalid(
            f"node {names[unplanned[0]]!r} has no current plan: a rollout changes running nodes and "
            f"restores their previous plan on failure (give the first plan with POST /v1/plans)",
            field=at(unplanned[0]),
            errors=[
                {"field": at(i), "rule": "no_current_plan", "message": f"node {names[i]!r} has no current plan"}
                for i in unplanned[:50]
            ],
        )
    previous = previous_groups(session, current)
    inside = set(names)
    for members in previous:
        outside = [m for m in members if m not in inside]
        if outside:
            member = next(m for m in members if m in inside)
            raise Invalid(
                f"node {member!r} runs one multi-node instance with {', '.join(outside)} (plan "
                f"{current[member].plan_id}), which the rollout does not include: a group moves "
                f"together, so include every member",
                field=at(names.index(member)),
                errors=[
                    {
                        "field": at(names.index(member)),
                        "rule": "partial_group",
                        "message": f"its instance also spans {', '.join(outside)}",
                    }
                ],
            )
    return current, previous


@dataclass
class _Judged:
    """The target judged per hardware shape: what each shape's waves are signed with (``pinned``), the verdicts
    (``judged``), the multi-node instances the target forms and their heads."""

    pinned: dict[str, dict[str, Any]] = field(default_factory=dict)
    judged: list[dict[str, Any]] = field(default_factory=list)
    together: list[list[str]] = field(default_factory=list)
    heads: set[str] = field(default_factory=set)


def _judge_shapes(
    session: Session, manifest: Manifest, nodes: list[Node], rollout: RolloutIn, policy: Profile
) -> _Judged:
    """The target judged once per hardware shape, over all the rollout's nodes of that shape (its topology too),
    under the service's policy profile.
    Raises the plan's LaunchRejected when vLLM would refuse it on any shape."""
    shapes: dict[tuple, list[Node]] = {}
    for n in nodes:
        shapes.setdefault(shape(n), []).append(n)
    out = _Judged()
    for shape_nodes in shapes.values():
        # judged, never signed, as one body: a shape may hold more nodes than one plan's cap (the fields were
        # validated as RolloutIn)
        plan = PlanIn.model_construct(
            **{
                **{k: getattr(rollout, k) for k in TARGET_FIELDS},
                "manifest": manifest.id,
                "nodes": [n.name for n in shape_nodes],
            }
        )
        j = plan_service.judge(session, manifest, shape_nodes, plan, policy=policy)
        if j.result.verdict == "reject":
            raise j.rejection(session)
        topo = j.layout.topo
        out.pinned[shape_key(shape_nodes[0])] = _pin(session, manifest, shape_nodes, j)
        out.together.extend(list(g) for g in topo.groups if len(g) > 1)
        out.heads.update(g[0] for g in topo.groups)
        out.judged.append(
            {
                "nodes": len(shape_nodes),
                "gpu": shape_nodes[0].gpu_id,
                "gpu_count": shape_nodes[0].gpu_count,
                "verdict": j.result.verdict,
                "nodes_per_instance": topo.nodes_per_instance,
                "findings": j.findings,
            }
        )
    return out


def create(session: Session, ctx: Context, *, actor: str, rollout: RolloutIn) -> tuple[Rollout, list[dict[str, Any]]]:
    """Store a rollout after validating its target once per distinct hardware shape of its nodes; returns it with
    its warnings. Raises LaunchRejected (422 with findings; nothing stored), Invalid / DomainError naming the field,
    NotFound for an unknown manifest, Conflict when a node is already in a rollout that is not over."""
    waves = [domain.Wave(w.percent, w.bake_s) for w in rollout.waves]
    domain.check_waves(waves)
    gates = domain.Gates(**rollout.gates.model_dump())
    nodes = _select_nodes(session, rollout)
    names = [n.name for n in nodes]
    if len(names) > domain.MAX_ROLLOUT_NODES:
        raise Invalid(f"{len(names)} nodes: at most {domain.MAX_ROLLOUT_NODES} per rollout", field="nodes")

    def at(i: int) -> str:  # the field a node of the rollout came from: its place in nodes, or the selector
        return f"nodes.{i}" if rollout.nodes is not None else "selector"

    node_service.lock(session, sorted(names))  # plans and rollouts for these nodes queue here
    current, previous = _check_nodes(session, names, at)
    manifest = manifest_service.resolve_ref(session, rollout.manifest)
    dumped = rollout.model_dump(mode="json")
    target = {k: dumped[k] for k in TARGET_FIELDS if dumped[k] is not None}
    target["manifest"] = manifest.id  # pinned: "name" (the newest version) must not change between waves
    shaped = _judge_shapes(session, manifest, nodes, rollout, ctx.settings.policy)
    unit_list = domain.units(names, [list(g) for g in previous] + shaped.together)
    per_wave = domain.wave_units(unit_list, waves)
    warnings = []
    if rollout.failure_limit >= len(unit_list):
        warnings.append(
            {
                "rule": "failure_limit_not_limiting",
                "field": "failure_limit",
                "message": f"failure_limit {rollout.failure_limit} is not below the rollout's "
                f"{len(unit_list)} unit(s): no number of failures halts it (it never rolls back "
                f"by itself)",
            }
        )
    now = ctx.now()
    paused = bool(rollout.paused)
    r = Rollout(
        id=str(uuid.uuid4()),
        state="paused" if paused else "pending",
        wave=-1,
        promote=False,
        paused_from="pending" if paused else None,
        target={**target, "pinned": shaped.pinned, "judged": shaped.judged},
        selector=dumped["selector"],
        waves=[{"percent": w.percent, "bake_s": w.bake_s} for w in waves],
        failure_limit=rollout.failure_limit,
        gates={"ready_timeout_s": gates.ready_timeout_s, "kv_tolerance": gates.kv_tolerance},
        steps=0,
        created_by=actor,
        created_at=now,
        updated_at=now,
    )
    session.add(r)
    session.flush()
    _store_waves_and_nodes(session, r, waves, names, unit_list, per_wave, shaped.heads, current)
    audit.append(
        session,
        actor=actor,
        kind="rollout.created",
        subject=f"rollout:{r.id}",
        model=manifest.name,
        payload={
            "rollout": r.id,
            "manifest": f"{manifest.name}@{manifest.version}",
            "nodes": len(names),
            "units": len(unit_list),
            "waves": r.waves,
            "nodes_per_wave": [sum(len(unit_list[u]) for u in us) for us in per_wave],
            "failure_limit": r.failure_limit,
            "gates": r.gates,
            "judged": [{**x, "findings": [f["rule"] for f in x["findings"]]} for x in shaped.judged],
            "pinned": shaped.pinned,
            **({"warnings": warnings} if warnings else {}),
        },
    )
    return r, warnings


def _store_waves_and_nodes(
    session: Session,
    r: Rollout,
    waves: list[domain.Wave],
    names: list[str],
    unit_list: list,
    per_wave: list,
    heads: set[str],
    current: dict[str, Any],
) -> None:
    """The rollout's waves (pending) and its nodes, each in its unit and wave, unchanged, with its current plan."""
    for i, w in enumerate(waves):
        session.add(
            RolloutWave(rollout_id=r.id, index=i, percent=w.percent, bake_s=w.bake_s, state="pending", plan_ids=[])
        )
    wave_of = {u: w for w, us in enumerate(per_wave) for u in us}
    position = {n: i for i, n in enumerate(names)}
    for u, members in enumerate(unit_list):
        for n in members:
            session.add(
                RolloutNode(
                    rollout_id=r.id,
                    node_name=n,
                    position=position[n],
                    unit=u,
                    wave=wave_of[u],
                    head=n in heads,
                    outcome="unchanged",
                    failed=False,
                    evidence={},
                    updated_at=r.created_at,
                    previous_plan_id=current[n].plan_id,
                )
            )
    session.flush()


def _pin(session: Session, manifest: Manifest, shape_nodes: list[Node], j: plan_service.Judgement) -> dict[str, Any]:
    """What every wave of one hardware shape is signed with, decided once here (the canary proves what the fleet
    gets): the engine arguments with the recommended values filled in, the KV pool measured over all the shape's
    nodes when ``kv_cache_pool`` is pinned (as ``kv_cache_memory_bytes``), and the vLLM version resolved."""
    if j.layout.topo.nodes_per_instance > 1:
        # multi-node instances: every wave signs whole instances, the same shape judge() filled here
        args = j.request.model_dump(mode="json")["engine_args"]
    else:
        # replicas: each node runs what one node alone is judged to run (a wave of one node and one of many sign
        # the same command): the single-node judgement, with the pool decided over all the nodes (j.plan)
        one = plan_service.judge(
            session,
            manifest,
            shape_nodes[:1],
            j.plan.model_copy(update={"kv_cache_pool": "utilization", "nodes": [shape_nodes[0].name]}),
            policy=j.policy,
        )
        if one.result.verdict == "reject":
            raise one.rejection(session)
        req = one.result.context.request if one.result.context is not None else one.request
        args = req.model_dump(mode="json")["engine_args"]
    pool = j.plan.engine_args.get("kv_cache_memory_bytes") if j.plan.kv_cache_pool == "pinned" else None
    return {
        "engine_args": args,
        "vllm_version": j.result.vllm_version,
        **({"kv_cache_memory_bytes": pool} if pool is not None else {}),
    }


def plan_warnings(session: Session, names: list[str]) -> list[dict[str, Any]]:
    """POST /v1/plans: a warning per unfinished rollout that holds some of these nodes (the plan is signed; the
    rollout counts those nodes ``superseded_by_hand`` and leaves them alone)."""
    rows = session.execute(
        select(RolloutNode.rollout_id, RolloutNode.node_name)
        .join(Rollout, Rollout.id == RolloutNode.rollout_id)
        .where(RolloutNode.node_name.in_(names), Rollout.state.in_(SCHEDULED + ("halted",)))
        .order_by(RolloutNode.rollout_id, RolloutNode.position)
    ).all()
    by: dict[str, list[str]] = {}
    for rid, node in rows:
        by.setdefault(rid, []).append(node)
    return [
        {
            "rule": "rollout_in_progress",
            "rollout": rid,
            "nodes": nodes[:50],
            "message": f"rollout {rid} (not over) includes {len(nodes)} of these node(s): this plan replaces the "
            f"rollout's for them; the rollout counts them superseded_by_hand (not a failure) and will "
            f"not restore them",
        }
        for rid, nodes in by.items()
    ]
