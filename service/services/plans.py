"""Launch plans: judge a plan body against a manifest and nodes, sign one JWS per node, supersede the nodes'
previous plans (whole multi-node groups), read, revoke and reissue a plan, and show it as the API does. What a body
means as a launch is plan_layout.py; serving plans to the agents is agent_serving.py; their reports, reports.py."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from .. import audit, metrics
from ..api.schemas import PlanIn
from ..clock import Clock, utc
from ..db.models import Assignment, Manifest, Node, Plan, iso
from ..domain.loading import POLICY_RULES
from ..domain.policy_profile import Profile, default_profile
from ..domain.posted_argv import add_notes, read_posted_argv
from ..domain.recommend import recommend
from ..domain.render import shell_command
from ..domain.request import LaunchRequest
from ..domain.topology import group_digest, member_argvs
from ..domain.validate import ValidationResult, validate
from ..domain.versions import resolve_version
from ..errors import Conflict, Invalid, LaunchRejected, NotFound
from ..signing import FRESHNESS_MEDIA_TYPE, PLACEMENT_CLAIMS, freshness_claims, plan_claims, plan_digest
from . import epochs, kv_pool, variants
from . import manifests as manifest_service
from . import nodes as node_service
from .context import Context
from .plan_layout import (
    Layout,
    check_node_safety,
    engine_args_with,
    launch_request,
    node_checks_claim,
    plan_layout,
    weights_expected,
)


def _retire_plan_if_done(session: Session, plan_id: str, *, exclude: int) -> None:
    """A plan whose every assignment has been superseded is itself superseded."""
    still = session.execute(
        select(Assignment.id).where(
            Assignment.plan_id == plan_id, Assignment.status == "active", Assignment.id != exclude
        )
    ).first()
    plan = session.get(Plan, plan_id)
    if still is None and plan is not None and plan.status == "active":
        plan.status = "superseded"


REDACTED = "<redacted>"


def plan_dict(plan: Plan, assignments: list[Assignment] | None = None, *, secrets: bool = True) -> dict[str, Any]:
    """A plan as the API shows it. Without ``secrets`` (an auditor) env values are redacted (names kept) and the
    signed JWS, which carries them, is left out."""
    env = plan.env if secrets else {k: REDACTED for k in plan.env or {}}
    command = plan.command if secrets or not plan.env else shell_command(plan.argv, env)
    out = {
        "id": plan.id,
        "status": plan.status,
        "verdict": plan.verdict,
        "findings": plan.findings,
        "argv": plan.argv,
        "command": command,
        "env": env,
        "budget": plan.budget,
        "vllm_version": plan.vllm_version,
        "manifest_id": plan.manifest_id,
        "created_by": plan.created_by,
        "created_at": iso(plan.created_at),
        "tuning": plan.tuning,
        "weights_check": plan.weights_check,
        "policy": plan.policy,
        "given": plan.given,
    }
    topo = plan.topology or None
    if topo:
        out["topology"] = {"form": topo.get("form"), "nodes_per_instance": topo.get("nodes_per_instance")}
    if assignments is not None:
        out["assignments"] = [
            {
                "node": a.node_name,
                "seq": a.seq,
                "status": a.status,
                "signed": a.signed if secrets else None,
                "last_report": a.last_report,
                "group": a.group_index,
                "rank": a.rank,
                "role": a.role,
                "group_digest": a.group_digest,
                **({"argv": a_argv} if (a_argv := member_argv(topo, a)) is not None else {}),
            }
            for a in assignments
        ]
        if assignments:
            out["signed"] = assignments[0].signed if secrets else None
        if topo:
            out["groups"] = group_states(topo, assignments, secrets=secrets)
    return out


def member_argv(topo: dict | None, a: Assignment) -> list[str] | None:
    """The argv the node of ``a`` runs, from the plan's topology (None for plans made before topologies)."""
    if not topo or a.group_index is None:
        return None
    for g in topo.get("groups", ()):
        if g.get("group") == a.group_index:
            return g.get("argv", {}).get(a.node_name)
    return None


def group_state(members: list[Assignment]) -> str:
    """A group's state from its members' assignments and last reports: ``revoked`` / ``superseded`` when its
    assignments are; ``failed`` when any member's vLLM ended (``exited``, ``failed``: a worker's failure fails the
    instance) or a member refused the plan (``refused``: its checks, or a worker whose head refused it); ``running``
    when the head (rank 0) reports vLLM ready; ``stopped`` when the head was stopped; else ``pending`` (not every
    member started yet) or ``starting``."""
    statuses = {a.status for a in members}
    if statuses & {"revoked"}:
        return "revoked"
    if "active" not in statuses:
        return "superseded"
    reports = {a.last_report for a in members}
    if reports & {"exited", "failed", "refused"}:
        return "failed"
    head = next((a for a in members if (a.rank or 0) == 0), members[0])
    if head.last_report == "running":
        return "running"
    if head.last_report == "stopped":
        return "stopped"
    if all(a.last_report in ("started", "running", "heartbeat") for a in members):
        return "starting"
    return "pending"


def group_states(topo: dict, assignments: list[Assignment], *, secrets: bool = True) -> list[dict[str, Any]]:
    """Per group of the plan: its nodes in rank order, head and head address, nnodes, digest and state."""
    out = []
    for g in topo.get("groups", ()):
        members = sorted((a for a in assignments if a.group_index == g.get("group")), key=lambda a: a.rank or 0)
        item = {
            "group": g.get("group"),
            "nodes": g.get("nodes"),
            "head": g.get("head"),
            "head_address": g.get("head_address"),
            "nnodes": g.get("nnodes"),
            "digest": g.get("digest"),
            "status": group_state(members) if members else None,
        }
        if g.get("env"):
            item["env"] = g["env"] if secrets else {k: REDACTED for k in g["env"]}
        out.append(item)
    return out


def _supersede_groups(session: Session, *, actor: str, names: list[str], plan: Plan, model: str) -> None:
    """Supersede the nodes' active assignments and, with each one that belongs to a multi-node group, every other
    member of that group (a group moves together: a worker never keeps a plan whose head moved on). Audit
    ``plan.superseded`` per assignment (``group_member_of`` names the node that pulled a member along)."""
    previous = (
        session.execute(select(Assignment).where(Assignment.node_name.in_(names), Assignment.status == "active"))
        .scalars()
        .all()
    )
    pulled: list[tuple[Assignment, str]] = [(a, a.node_name) for a in previous]
    groups = {(a.plan_id, a.group_index) for a in previous if a.role in ("head", "worker")}
    if groups:
        for a in (
            session.execute(
                select(Assignment).where(
                    Assignment.plan_id.in_(sorted({p for p, _ in groups})),
                    Assignment.status == "active",
                    Assignment.node_name.not_in(names),
                )
            )
            .scalars()
            .all()
        ):
            if (a.plan_id, a.group_index) in groups:
                cause = next(b.node_name for b in previous if (b.plan_id, b.group_index) == (a.plan_id, a.group_index))
                pulled.append((a, cause))
    for prev, _cause in pulled:
        prev.status = "superseded"
    for prev, cause in pulled:
        _retire_plan_if_done(session, prev.plan_id, exclude=prev.id)
        payload = {"superseded_by": plan.id, "seq": prev.seq}
        if cause != prev.node_name:
            payload["group_member_of"] = cause
        audit.append(
            session,
            actor=actor,
            kind="plan.superseded",
            subject=f"plan:{prev.plan_id}",
            node=prev.node_name,
            plan_id=prev.plan_id,
            model=model,
            payload=payload,
        )


def plan_in(data: dict[str, Any]) -> PlanIn:
    """A plan body made from stored content (an earlier plan's, a rollout's pinned target), validated as ``POST
    /v1/plans`` validates one: Invalid (422) naming the field when it no longer passes."""
    try:
        return PlanIn.model_validate(data)
    except ValidationError as exc:
        raise Invalid(
            "the stored content does not make a valid plan body: "
            + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5]),
            errors=[
                {"field": ".".join(map(str, e["loc"])), "rule": e["type"], "message": e["msg"]} for e in exc.errors()
            ],
        ) from None


def _rejected(version: str, errors: list, profile: Profile) -> str:
    """The detail of a rejected launch: vLLM's refusal, or Preflight's own policy (its safety gates, or the policy
    profile's enforced rules) when only those refused."""
    policy = all(f.rule in POLICY_RULES or "policy" in f.data for f in errors)
    head = (
        f"Preflight's policy (profile {profile.name!r}) refuses this launch"
        if policy
        else f"vLLM {version} would refuse this launch"
    )
    return f"{head}: " + "; ".join(f"{f.rule}: {f.message}" for f in errors)


@dataclass
class Judgement:
    """A plan body judged for a manifest on nodes (``judge``): what ``create`` signs, or a dry run shows. ``plan`` is
    the body as judged (a pinned KV pool filled in)."""

    manifest: Manifest
    nodes: list[Node]
    plan: PlanIn
    request: LaunchRequest
    result: ValidationResult
    layout: Layout
    line: Any
    findings: list[dict[str, Any]]
    policy: Profile
    given: dict[str, Any] | None = None  # a launch posted as an argv: the argv and the engine_args it was read as

    def rejection(self, session: Session) -> LaunchRejected:
        """The 422 of a rejected launch: findings with remedies, the nearest launches that pass and the registered
        quantized variants of the model that would fit these nodes."""
        r = self.result
        return LaunchRejected(
            _rejected(r.vllm_version, r.errors, self.policy),
            findings=self.findings,
            argv=r.argv,
            budget=r.budget,
            alternatives=r.alternatives,
            variants=variants.fitting_variants(session, self.manifest, self.nodes, self.plan, policy=self.policy)
            if variants.needs_memory(self.findings)
            else [],
        )


def judge(
    session: Session, manifest: Manifest, nodes: list[Node], plan: PlanIn, *, policy: Profile | None = None
) -> Judgement:
    """Validate a plan body for a manifest on nodes, as ``create`` signs it (the measured KV pool when pinned, the
    nodes' topology, one validation per instance shape), under the policy profile (the service's
    ``settings.policy``; default: the shipped one). Reads only: ``create`` and the dry run share it, so a dry run
    refuses what the create would (``tuning.auto_apply`` outside benchmark among them)."""
    policy = policy or default_profile()
    from .tuning import initial_memo

    initial_memo(plan.tuning, plan.environment)  # Invalid (422, tuning.auto_apply)
    read, given = None, None
    if plan.argv is not None:  # judged as the engine_args the release's parser reads from it
        read = read_posted_argv(plan.argv, resolve_version(plan.vllm_version)[1], (manifest.name, manifest.uri))
        given = {"argv": list(plan.argv), "engine_args": read.engine_args}
        plan = plan.model_copy(update={"engine_args": dict(read.engine_args), "argv": None})
    plan = kv_pool.apply(session, manifest, nodes, plan)  # kv_cache_pool "pinned": the measured pool
    request = launch_request(manifest, nodes, plan)
    check_node_safety(manifest, request)
    recommendations: list[dict[str, Any]] | None = None
    if len(nodes) > 1 and request.workload is not None:  # the topology follows from the filled TP/PP/DP
        filled, recommendations = recommend(request)
        request = request.model_copy(update={"engine_args": filled})
    layout = plan_layout(request, nodes, plan)
    _, line = resolve_version(request.vllm_version)
    if len(nodes) > 1:
        judged_in = launch_request(
            manifest,
            nodes,
            plan.model_copy(update={"engine_args": engine_args_with(request.engine_args, layout.group_args, line)}),
            nodes_per_instance=layout.topo.nodes_per_instance,
        )
        result = validate(judged_in, model_ref=manifest.uri, fill=False, policy=policy)
        if recommendations is not None:
            result.recommendations = recommendations
    else:
        result = validate(request, model_ref=manifest.uri, policy=policy)
    add_notes(result, read)
    findings = [f.as_dict() for f in result.findings]
    return Judgement(manifest, nodes, plan, request, result, layout, line, findings, policy, given)


@dataclass
class Signed:
    """A plan ``create`` signed and stored: the plan, one assignment per node (in the order given) and the
    recommendations its validation made."""

    plan: Plan
    assignments: list[Assignment]
    recommendations: list[dict[str, Any]]

    def seqs(self) -> dict[str, int]:
        """Each node's seq of this plan."""
        return {a.node_name: a.seq for a in self.assignments}


def created_dict(signed: Signed) -> dict[str, Any]:
    """A plan just created as the API answers it: the plan with its assignments and the recommendations."""
    return {**plan_dict(signed.plan, signed.assignments), "recommendations": signed.recommendations}


@dataclass
class _Member:
    """What one node of a plan is signed: its argv and env, and its place in its group."""

    argv: list[str]
    env: dict[str, str]
    group: int
    rank: int
    role: str
    nnodes: int
    head: str
    group_digest: str

    def placement(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "rank": self.rank,
            "role": self.role,
            "nnodes": self.nnodes,
            "head": self.head,
            "group_digest": self.group_digest,
        }


def _groups(j: Judgement, plan_id: str) -> tuple[list[dict[str, Any]], dict[str, _Member]]:
    """The plan's groups as its topology stores them (nodes, head and its address, digest, argv per node, group env)
    and what each node is signed (``_Member``)."""
    layout, result, manifest = j.layout, j.result, j.manifest
    topo = layout.topo
    groups: list[dict[str, Any]] = []
    members: dict[str, _Member] = {}
    for g, names in enumerate(topo.groups):
        argvs, _ = member_argvs(
            topo,
            g,
            result.argv,
            j.line,
            head_address=layout.head_addresses[g] or "",
            tp=layout.tp,
            pp=layout.pp,
            dp=layout.dp,
        )
        env = {**j.request.env, **layout.group_env[g]}
        k = topo.nodes_per_instance
        content = {
            "plan": plan_id,
            "group": g,
            "nnodes": k,
            "vllm_version": result.vllm_version,
            "manifest_digest": manifest.digest,
            "model_uri": manifest.uri,
            "members": [
                {
                    "node": n,
                    "rank": topo.placements[n].rank,
                    "role": topo.placements[n].role,
                    "argv": argvs[n],
                    "env": env,
                }
                for n in names
            ],
        }
        digest = group_digest(content)
        groups.append(
            {
                "group": g,
                "nodes": list(names),
                "head": names[0],
                "head_address": layout.head_addresses[g] if k > 1 else None,
                "nnodes": k,
                "digest": digest,
                "argv": argvs,
                "env": dict(layout.group_env[g]),
            }
        )
        for n in names:
            p = topo.placements[n]
            members[n] = _Member(argvs[n], env, g, p.rank, p.role, k, names[0], digest)
    return groups, members


def _assign(
    ctx: Context,
    j: Judgement,
    plan: Plan,
    node: Node,
    seq: int,
    mine: _Member,
    acked_seq: int,
    expected: dict[str, Any],
) -> Assignment:
    """The node's assignment of ``plan``: its signed plan, and a freshness statement signed with it (the first
    fetches after a rollout — a fleet booting at once — are answered without a signature each). A group member's
    statement carries its head's group digest: in this transaction, the group's own."""
    settings, keys, manifest, result = ctx.settings, ctx.keys, j.manifest, j.result
    claims = plan_claims(
        issuer=settings.issuer,
        audience=settings.audience,
        node=node.name,
        plan_id=plan.id,
        seq=seq,
        manifest_digest=manifest.digest,
        vllm_version=result.vllm_version,
        argv=mine.argv,
        env=mine.env,
        model_uri=manifest.uri,
        placement={k: v for k, v in mine.placement().items() if k in PLACEMENT_CLAIMS},
        node_checks=node_checks_claim(node, manifest, result, j.layout.topo.local_world, expected),
        now=int(ctx.clock.time()),
    )
    signed = keys.sign(claims)
    grouped = mine.role in ("head", "worker")
    fresh = keys.sign(
        freshness_claims(
            issuer=settings.issuer,
            audience=settings.audience,
            node=node.name,
            plan_id=plan.id,
            seq=seq,
            digest=plan_digest(signed),
            ttl=settings.freshness_ttl_seconds,
            acked_seq=acked_seq,
            grouped=grouped,
            head_group_digest=mine.group_digest if grouped else None,
            now=int(ctx.clock.time()),
        ),
        typ=FRESHNESS_MEDIA_TYPE,
        refresh=False,
    )
    return Assignment(
        plan_id=plan.id,
        node_name=node.name,
        seq=seq,
        signed=signed,
        freshness=fresh,
        etag='"' + audit.sha256_hex(signed.encode())[:32] + '"',
        group_index=mine.group,
        rank=mine.rank,
        role=mine.role,
        group_digest=mine.group_digest,
        created_at=ctx.now(),
    )


def create(session: Session, ctx: Context, *, actor: str, plan: PlanIn, tuning: dict[str, Any] | None = None) -> Signed:
    """Validate, sign and store a plan for every named node. Raises LaunchRejected (422, nothing stored) when the
    verdict is reject; DomainError / NotFound / Invalid for bad input.

    The nodes form groups (domain/topology.py): one replica per node when the world TP × PP × DP fits a node, else
    instances of k nodes in the order given. The launch is validated once per instance shape (``hardware.nodes`` =
    k, with the group-wide ``--nnodes``/``--master-port`` or ``--data-parallel-size-local``/``-rpc-port``); each
    node is signed its own argv with its group, rank, role and the group's digest."""
    from .tuning import initial_memo

    if tuning is None:  # a plan's own tuning block starts the loop; the loop passes its memo
        tuning = initial_memo(plan.tuning, plan.environment)
    manifest = manifest_service.resolve_ref(session, plan.manifest)
    names = node_service.distinct(plan.nodes)
    nodes = [node_service.get(session, n) for n in names]
    node_service.lock(session, sorted(names))  # per-node seq: concurrent plans for a node queue here
    j = judge(session, manifest, nodes, plan, policy=ctx.settings.policy)
    result, topo = j.result, j.layout.topo
    metrics.observe_result("plans", result.verdict, j.findings)
    if result.verdict == "reject":
        raise j.rejection(session)
    judged = result.context.request if result.context is not None else j.request  # with recommended values filled
    expected = weights_expected(manifest, j.plan)  # what every node must find in its weights directory
    plan_id = str(uuid.uuid4())
    groups, members = _groups(j, plan_id)
    row = Plan(
        id=plan_id,
        manifest_id=manifest.id,
        request=judged.model_dump(mode="json"),
        verdict=result.verdict,
        findings=j.findings,
        argv=result.argv,
        command=result.command,
        env=dict(j.request.env),
        budget=result.budget,
        recommendations=result.recommendations,
        vllm_version=result.vllm_version,
        created_by=actor,
        tuning=tuning,
        weights_check=weights_check_record(j.plan, actor),
        policy=result.policy,
        given=j.given,
        created_at=ctx.now(),
        topology={
            "form": topo.form,
            "nodes_per_instance": topo.nodes_per_instance,
            "groups": groups,
            "multi_node_form": j.plan.multi_node_form,
            "group_env": j.plan.group_env,
        },
    )
    session.add(row)
    session.flush()
    _supersede_groups(session, actor=actor, names=names, plan=row, model=manifest.name)
    seqs = dict(
        session.execute(
            select(Assignment.node_name, func.max(Assignment.seq))
            .where(Assignment.node_name.in_(names))
            .group_by(Assignment.node_name)
        ).all()
    )
    acked = node_service.acked_seqs(session, names)
    assignments = [
        _assign(
            ctx, j, row, node, (seqs.get(node.name) or 0) + 1, members[node.name], acked.get(node.name, 0), expected
        )
        for node in nodes
    ]
    session.add_all(assignments)
    session.flush()
    _audit_created(session, ctx, actor, row, names, manifest, assignments, result, topo, groups)
    _audit_weights_skip(session, actor, row, names, manifest, j.plan)
    epochs.bump(session, "plans", row.id)  # other processes' plan caches drop the superseded assignments
    return Signed(row, assignments, result.recommendations)


def _audit_created(
    session: Session, ctx: Context, actor: str, row: Plan, names: list[str], manifest, assignments, result, topo, groups
) -> None:
    """The ``plan.created`` audit event: the manifest, the nodes with their seqs and plan digests, the verdict."""
    audit.append(
        session,
        actor=actor,
        kind="plan.created",
        subject=f"plan:{row.id}",
        plan_id=row.id,
        node=names[0] if len(names) == 1 else None,
        model=manifest.name,
        payload={
            "manifest": manifest.digest,
            "nodes": names,
            "seqs": [a.seq for a in assignments],
            "plan_digests": [plan_digest(a.signed) for a in assignments],
            "verdict": result.verdict,
            "argv": result.argv,
            "kid": ctx.keys.active_kid,
            "weights_check": (row.weights_check or {}).get("mode"),
            "topology": {
                "form": topo.form,
                "nodes_per_instance": topo.nodes_per_instance,
                "group_digests": [g["digest"] for g in groups],
            },
        },
    )


def weights_check_record(plan: PlanIn, actor: str) -> dict[str, Any]:
    """How the plan's nodes check its weights, as stored with the plan: ``{"mode": "verify"}``, or for a plan signed
    with ``weights_check: "skip"`` who asked and why (carried into a reissue of the plan's content)."""
    if plan.weights_check != "skip":  # the signer the nodes verify model.sig with, when the plan names one
        return {"mode": "verify", **({"signer": plan.weights_signer} if plan.weights_signer else {})}
    return {"mode": "skip", "reason": plan.weights_check_reason, "requested_by": actor}


def _audit_weights_skip(session: Session, actor: str, row: Plan, names: list[str], manifest, plan: PlanIn) -> None:
    """``plan.weights_check_skipped``: a plan signed for nodes that will not check their weights — who asked, why,
    for which nodes, model and environment. Its own event, so an auditor finds every such plan by kind."""
    if plan.weights_check != "skip":
        return
    audit.append(
        session,
        actor=actor,
        kind="plan.weights_check_skipped",
        subject=f"plan:{row.id}",
        plan_id=row.id,
        node=names[0] if len(names) == 1 else None,
        model=manifest.name,
        payload={
            "requested_by": actor,
            "reason": plan.weights_check_reason,
            "nodes": names,
            "manifest": manifest.digest,
            "model_uri": manifest.uri,
            "environment": plan.environment,
        },
    )


def get(session: Session, plan_id: str) -> tuple[Plan, list[Assignment]]:
    plan = session.get(Plan, plan_id)
    if plan is None:
        raise NotFound(f"plan {plan_id!r} does not exist", field="plan_id")
    rows = session.execute(select(Assignment).where(Assignment.plan_id == plan_id).order_by(Assignment.id)).scalars()
    return plan, list(rows)


_MODEL_OF: dict[str, str | None] = {}


def model_of(session: Session, plan_id: str) -> str | None:
    """The manifest name of a plan (immutable, so memoised per process)."""
    return models_of(session, [plan_id])[plan_id]


def models_of(session: Session, plan_ids: list[str]) -> dict[str, str | None]:
    """``model_of`` for several plans, one query for those not yet memoised."""
    missing = [p for p in set(plan_ids) if p not in _MODEL_OF]
    if missing:
        if len(_MODEL_OF) > 100_000:
            _MODEL_OF.clear()
        found = dict(
            session.execute(
                select(Plan.id, Manifest.name)
                .join(Manifest, Plan.manifest_id == Manifest.id)
                .where(Plan.id.in_(missing))
            ).all()
        )
        _MODEL_OF.update({p: found.get(p) for p in missing})
    return {p: _MODEL_OF.get(p) for p in plan_ids}


def revoke(session: Session, *, actor: str, plan_id: str, clock: Clock) -> Plan:
    plan, assignments = get(session, plan_id)
    if plan.status == "revoked":
        return plan  # already withdrawn: the same answer, no second event
    if not any(a.status == "active" for a in assignments):
        raise Conflict(
            f"plan {plan_id} is no longer current on any node (it was {plan.status}): nothing to revoke",
            field="plan_id",
        )
    plan.status = "revoked"
    for a in assignments:
        if a.status == "active":
            a.status = "revoked"
    audit.append(
        session,
        actor=actor,
        kind="plan.revoked",
        subject=f"plan:{plan_id}",
        plan_id=plan_id,
        model=model_of(session, plan_id),
        payload={"nodes": [a.node_name for a in assignments], "at": utc(clock).isoformat()},
    )
    epochs.bump(session, "plans", plan_id)
    return plan


def content(old: Plan, assignments: list[Assignment], **changes: Any) -> PlanIn:
    """A plan body with ``old``'s content (manifest, engine args, env, workload, version, multi-node form) for the
    nodes of ``assignments`` — whole groups of ``old`` —, in the order given at first (ranks follow it: by rank within
    each group, groups in order), with the group env of those groups; ``changes`` replace fields (the tuning loop's
    engine args)."""
    req = old.request or {}
    topo = old.topology or {}
    ordered = sorted(assignments, key=lambda a: (a.group_index or 0, a.rank or 0, a.id))
    group_env = topo.get("group_env")
    if group_env:
        kept = sorted({a.group_index or 0 for a in ordered})
        group_env = [group_env[g] for g in kept if g < len(group_env)]
    return plan_in(
        {
            "manifest": old.manifest_id,
            "nodes": [a.node_name for a in ordered],
            "engine_args": req.get("engine_args") or {},
            "env": req.get("env") or {},
            "environment": req.get("environment") or "production",
            "workload": req.get("workload"),
            "vllm_version": req.get("vllm_version"),
            "multi_node_form": topo.get("multi_node_form"),
            "group_env": group_env,
            **_weights_check_of(old),
            **changes,
        }
    )


def _weights_check_of(old: Plan) -> dict[str, Any]:
    """The plan body fields that sign ``old``'s weights check again: a skip stays a skip, with its reason (the new
    plan's own ``plan.weights_check_skipped`` names who reissued it), and an expected weights signer stays."""
    wc = old.weights_check if isinstance(old.weights_check, dict) else {}
    if wc.get("mode") == "skip" and isinstance(wc.get("reason"), str) and wc["reason"].strip():
        return {"weights_check": "skip", "weights_check_reason": wc["reason"]}
    if isinstance(wc.get("signer"), dict):  # a signed-weights plan stays one (re-validated by plan_in)
        return {"weights_signer": wc["signer"]}
    return {}


def reissue(session: Session, ctx: Context, *, actor: str, plan_id: str) -> Signed:
    """Rollback: the earlier plan's content (manifest, nodes, engine args, env, workload, version), re-validated
    and signed as a new plan with a new per-node seq."""
    old, assignments = get(session, plan_id)
    # the tuning memo travels with the content (its SLO, auto_apply, the levels that held): a reissue does not
    # restart the loop or drop its SLO
    out = create(
        session,
        ctx,
        actor=actor,
        plan=content(old, assignments),
        tuning=old.tuning if isinstance(old.tuning, dict) else None,
    )
    audit.append(
        session,
        actor=actor,
        kind="plan.reissued",
        subject=f"plan:{out.plan.id}",
        plan_id=out.plan.id,
        model=model_of(session, out.plan.id),
        payload={"from": plan_id},
    )
    return out
