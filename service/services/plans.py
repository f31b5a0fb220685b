"""Launch plans: validate a request against a manifest and nodes, sign one JWS per node, supersede the node's
previous plan, serve it to the node's agent, take the agent's reports."""

from __future__ import annotations

import time

import uuid
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from sqlalchemy import bindparam, func, insert, select, tuple_, update
from sqlalchemy.orm import Session

from .. import audit, metrics
from ..db.models import Assignment, Manifest, Node, Plan, Report, iso, utcnow
from ..domain.render import shell_command
from ..domain.errors import DomainError
from ..domain.recommend import recommend
from ..domain.group_gate import changes_hold, group_hold
from ..domain.topology import (PER_NODE, Placement, Topology, group_arguments, group_digest, member_argvs,
                               plan_topology)
from ..domain.request import LaunchRequest
from ..domain.validate import validate
from ..errors import ApiError, Conflict, Invalid, LaunchRejected, NotFound
from ..settings import Settings
from ..domain import env_policy, node_checks
from ..domain.code_policy import code_loading
from ..domain.engine_args import parse_engine_args, resolve_name
from ..domain.versions import resolve_version
from ..signing import FRESHNESS_MEDIA_TYPE, PLACEMENT_CLAIMS, KeyStore, freshness_claims, plan_claims, plan_digest
from . import calibration, epochs, kv_pool, variants
from . import manifests as manifest_service
from . import nodes as node_service

ASSIGNMENTS = Assignment.__table__
REPORTS = Report.__table__


def _retire_plan_if_done(session: Session, plan_id: str, *, exclude: int) -> None:
    """A plan whose every assignment has been superseded is itself superseded."""
    still = session.execute(select(Assignment.id).where(Assignment.plan_id == plan_id, Assignment.status == "active",
                                                        Assignment.id != exclude)).first()
    plan = session.get(Plan, plan_id)
    if still is None and plan is not None and plan.status == "active":
        plan.status = "superseded"


def launch_request(manifest: Manifest, nodes: list[Node], body: dict[str, Any], *,
                   nodes_per_instance: int | None = None) -> LaunchRequest:
    """The launch request a plan body implies: the manifest's model, the nodes' hardware (``hardware.nodes``: the
    nodes one instance spans, ``nodes_per_instance``; by default all the plan's nodes)."""
    first = nodes[0]
    shapes = {(n.gpu_id, n.gpu["memory_bytes"], n.gpu["compute_capability"], n.gpu_count) for n in nodes}
    if len(shapes) > 1:
        seen = ", ".join(f"{n.name}: {n.gpu_count} × {n.gpu.get('name', n.gpu_id)}" for n in nodes[:8])
        raise Invalid(f"all nodes of one plan (and so of every group in it) must have the same GPU model and count "
                      f"({seen})", field="nodes")
    gpu: Any = first.gpu_id if first.gpu_id != "custom" else {
        "name": first.gpu["name"], "compute_capability": first.gpu["compute_capability"],
        "memory_bytes": first.gpu["memory_bytes"]}
    interconnects = {n.interconnect for n in nodes}
    try:
        return LaunchRequest.model_validate({
            "model": {"name": manifest.name, "uri": manifest.uri, "config": manifest.config,
                      "hf_quant_config": manifest.hf_quant_config, "quantization_txt": manifest.quantization_txt,
                      "checkpoint": manifest.checkpoint, "weights_bytes": manifest.weights_bytes},
            "hardware": {"gpu": gpu, "count": first.gpu_count, "nodes": nodes_per_instance or len(nodes),
                         "interconnect": interconnects.pop() if len(interconnects) == 1 else None},
            "environment": body.get("environment") or "production",
            "workload": body.get("workload"),
            "engine_args": body.get("engine_args") or {},
            "env": body.get("env") or {},
            "vllm_version": body.get("vllm_version"),
        })
    except ValidationError as exc:
        raise Invalid("the plan does not make a valid launch request: " + "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5]),
            errors=[{"field": ".".join(map(str, e["loc"])), "rule": e["type"], "message": e["msg"]}
                    for e in exc.errors()]) from None


REDACTED = "<redacted>"


def check_node_safety(manifest: Manifest, request: LaunchRequest) -> None:
    """What runs on a node is the node's choice: a plan's env may not name the executable, loader or interpreter
    (domain/env_policy.py), and ``trust_remote_code`` in production needs a manifest registered with
    ``allow_remote_code``. Raises Invalid (422) naming the field and the rule."""
    refused = env_policy.refused(request.env)
    if refused:
        raise Invalid("the plan's env sets variables a node does not take from a plan: " + "; ".join(
            f"{name}: {why}" for name, why in refused),
            errors=[{"field": f"env.{name}", "rule": "env_not_allowed", "message": why} for name, why in refused])
    if request.environment != "production" or manifest.allow_remote_code:
        return
    # judged on the parsed arguments, so no spelling (--trust-remote-code, -trust_remote_code) slips past
    _, line = resolve_version(request.vllm_version)
    loading = code_loading(parse_engine_args(request.engine_args, line))
    if loading:
        field, why = loading[0]
        rule = "trust_remote_code_not_allowed" if field == "engine_args.trust_remote_code" else "code_not_allowed"
        raise Invalid(f"{why}: in production the manifest {manifest.name}@{manifest.version} must be registered with "
                      f"allow_remote_code",
                      errors=[{"field": f, "rule": rule if f == field else "code_not_allowed",
                               "message": f"{w}; the manifest does not allow remote code in production"}
                              for f, w in loading])


def plan_dict(plan: Plan, assignments: list[Assignment] | None = None, *, secrets: bool = True) -> dict[str, Any]:
    """A plan as the API shows it. Without ``secrets`` (an auditor) env values are redacted (names kept) and the
    signed JWS, which carries them, is left out."""
    env = plan.env if secrets else {k: REDACTED for k in plan.env or {}}
    command = plan.command if secrets or not plan.env else shell_command(plan.argv, env)
    out = {"id": plan.id, "status": plan.status, "verdict": plan.verdict, "findings": plan.findings,
           "argv": plan.argv, "command": command, "env": env, "budget": plan.budget,
           "vllm_version": plan.vllm_version, "manifest_id": plan.manifest_id, "created_by": plan.created_by,
           "created_at": iso(plan.created_at), "tuning": plan.tuning}
    topo = plan.topology or None
    if topo:
        out["topology"] = {"form": topo.get("form"), "nodes_per_instance": topo.get("nodes_per_instance")}
    if assignments is not None:
        out["assignments"] = [{"node": a.node_name, "seq": a.seq, "status": a.status,
                               "signed": a.signed if secrets else None, "last_report": a.last_report,
                               "group": a.group_index, "rank": a.rank, "role": a.role,
                               "group_digest": a.group_digest,
                               **({"argv": a_argv} if (a_argv := _member_argv(topo, a)) is not None else {})}
                              for a in assignments]
        if assignments:
            out["signed"] = assignments[0].signed if secrets else None
        if topo:
            out["groups"] = group_states(topo, assignments, secrets=secrets)
    return out


def _node_checks(node: Node, manifest: Manifest, result, gpus_used: int) -> dict[str, Any]:
    """The signed ``node_checks`` claim (issue 17): hardware, memory, and the weights files the manifest recorded."""
    args = result.context.args if result.context is not None else None
    return node_checks.node_checks_claim(
        hardware=node_checks.hardware_claim(gpu_id=node.gpu_id, gpu=node.gpu, count=node.gpu_count,
                                            interconnect=node.interconnect),
        memory=node_checks.memory_claim(
            effective=result.effective or {}, budget=result.budget,
            kv_cache_memory_bytes=args.get("kv_cache_memory_bytes") if args is not None else None,
            gpus_used=gpus_used, gpus_per_node=node.gpu_count),
        weights=manifest.files)


def _member_argv(topo: dict | None, a: Assignment) -> list[str] | None:
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
        item = {"group": g.get("group"), "nodes": g.get("nodes"), "head": g.get("head"),
                "head_address": g.get("head_address"), "nnodes": g.get("nnodes"), "digest": g.get("digest"),
                "status": group_state(members) if members else None}
        if g.get("env"):
            item["env"] = g["env"] if secrets else {k: REDACTED for k in g["env"]}
        out.append(item)
    return out


@dataclass
class Layout:
    """Where a plan runs: the topology (domain/topology.py), the group-wide engine arguments validated once, and
    per group its head's address and extra env."""

    topo: Topology
    group_args: dict[str, Any]
    head_addresses: dict[int, str | None]
    group_env: list[dict[str, str]]
    tp: int
    pp: int
    dp: int


def _engine_args_with(raw: dict[str, Any], extra: dict[str, Any], line) -> dict[str, Any]:
    """``raw`` with ``extra`` set by dest name (any spelling of those names in ``raw`` is replaced)."""
    out = {k: v for k, v in raw.items() if resolve_name(k, line) not in extra}
    out.update(extra)
    return out


def plan_layout(request: LaunchRequest, nodes: list[Node], body: dict[str, Any]) -> Layout:
    """Group the plan's nodes into instances (vLLM's world TP × PP × DP over the nodes' GPUs) and check what a
    multi-node plan needs: no per-node argument in engine_args (Preflight renders them), ``--nnodes`` if given equal
    to the instance's node count, an address on every head, one env per group. Raises DomainError / Invalid (422)
    naming the field and the numbers."""
    _, line = resolve_version(request.vllm_version)
    args = parse_engine_args(request.engine_args, line)
    tp, pp, dp = args.tensor_parallel_size, args.pipeline_parallel_size, args.data_parallel_size
    names = [n.name for n in nodes]
    gpus = nodes[0].gpu_count
    group_env = list(body.get("group_env") or [])
    world = tp * pp * dp
    k = -(-world // gpus) if world > 0 else 1
    if len(nodes) == 1 or world <= 0 or k > len(nodes):
        # one node, or fewer nodes than one instance needs: the rules judge it (world_size_exceeds_gpus)
        topo = Topology("replicas", 1, tuple((n,) for n in names),
                        {n: Placement(n, i, 0, "replica", 1, n) for i, n in enumerate(names)}, world)
    else:
        topo = plan_topology(names, gpus, tp, pp, dp, line, backend=args.get("distributed_executor_backend"),
                             form=body.get("multi_node_form"))
    # per-node flags are Preflight's to render from the topology — on a one-node plan too, where a signed
    # --headless or --node-rank would make the node a worker of an instance that does not exist (and the agent
    # refuses a replica that is told to be headless)
    for name in PER_NODE:
        if name in args.given and not (topo.form == "replicas" and name == "data_parallel_size_local"):
            raise DomainError(f"engine_args.{name}", f"--{name.replace('_', '-')} differs per node: Preflight "
                              f"renders it for every node of a multi-node plan from the topology (leave it out)",
                              rule="flag_per_node")
    if len(nodes) > 1:
        n_given = args.get("nnodes")
        if n_given is not None and int(n_given) != topo.nodes_per_instance:
            raise DomainError("engine_args.nnodes", f"--nnodes {n_given} but world size {world} (TP {tp} × PP {pp} × "
                              f"DP {dp}) over nodes of {gpus} GPUs makes instances of {topo.nodes_per_instance} "
                              f"node(s): leave --nnodes out (Preflight renders it)", rule="nnodes")
    if group_env and len(group_env) != len(topo.groups):
        raise DomainError("group_env", f"group_env has {len(group_env)} entries but the plan has "
                          f"{len(topo.groups)} group(s) of {topo.nodes_per_instance} node(s): give one per group, in "
                          f"group order", rule="group_env")
    for i, env in enumerate(group_env):
        refused = env_policy.refused(env)
        if refused:
            raise Invalid("group_env sets variables a node does not take from a plan: " + "; ".join(
                f"{name}: {why}" for name, why in refused),
                errors=[{"field": f"group_env.{i}.{name}", "rule": "env_not_allowed", "message": why}
                        for name, why in refused])
    by_name = {n.name: n for n in nodes}
    heads: dict[int, str | None] = {}
    for g, members in enumerate(topo.groups):
        head = by_name[members[0]]
        if topo.nodes_per_instance > 1 and not head.address:
            raise Invalid(f"node {head.name!r} heads group {g} ({', '.join(members)}), a {len(members)}-node "
                          f"instance, but has no address: the other nodes connect to it. Set it with PATCH "
                          f"/v1/nodes/{head.name} {{\"address\": \"10.0.0.1\"}}", field="nodes",
                          errors=[{"field": f"nodes.{names.index(head.name)}", "rule": "head_address",
                                   "message": f"node {head.name!r} has no address"}])
        heads[g] = head.address
    return Layout(topo, group_arguments(topo, line, tp=tp, pp=pp, given=args.values), heads,
                  group_env or [{} for _ in topo.groups], tp, pp, dp)


def _supersede_groups(session: Session, *, actor: str, names: list[str], plan: Plan, model: str) -> None:
    """Supersede the nodes' active assignments and, with each one that belongs to a multi-node group, every other
    member of that group (a group moves together: a worker never keeps a plan whose head moved on). Audit
    ``plan.superseded`` per assignment (``group_member_of`` names the node that pulled a member along)."""
    previous = session.execute(select(Assignment).where(Assignment.node_name.in_(names),
                                                        Assignment.status == "active")).scalars().all()
    pulled: list[tuple[Assignment, str]] = [(a, a.node_name) for a in previous]
    groups = {(a.plan_id, a.group_index) for a in previous if a.role in ("head", "worker")}
    if groups:
        for a in session.execute(select(Assignment).where(
                Assignment.plan_id.in_(sorted({p for p, _ in groups})), Assignment.status == "active",
                Assignment.node_name.not_in(names))).scalars().all():
            if (a.plan_id, a.group_index) in groups:
                cause = next(b.node_name for b in previous if (b.plan_id, b.group_index) == (a.plan_id, a.group_index))
                pulled.append((a, cause))
    for prev, cause in pulled:
        prev.status = "superseded"
    for prev, cause in pulled:
        _retire_plan_if_done(session, prev.plan_id, exclude=prev.id)
        payload = {"superseded_by": plan.id, "seq": prev.seq}
        if cause != prev.node_name:
            payload["group_member_of"] = cause
        audit.append(session, actor=actor, kind="plan.superseded", subject=f"plan:{prev.plan_id}",
                     node=prev.node_name, plan_id=prev.plan_id, model=model, payload=payload)


@dataclass
class Judgement:
    """A plan body judged for a manifest on nodes (``judge``): what ``create`` signs, or a dry run shows."""

    manifest: Manifest
    nodes: list[Node]
    body: dict[str, Any]
    request: LaunchRequest
    result: Any
    layout: Any
    line: Any
    findings: list[dict[str, Any]]

    def rejection(self, session: Session) -> LaunchRejected:
        """The 422 of a rejected launch: findings with remedies, the nearest launches that pass and the registered
        quantized variants of the model that would fit these nodes."""
        r = self.result
        return LaunchRejected(
            f"vLLM {r.vllm_version} would refuse this launch: " + "; ".join(f"{f.rule}: {f.message}" for f in r.errors),
            findings=self.findings, argv=r.argv, budget=r.budget, alternatives=r.alternatives,
            variants=variants.fitting_variants(session, self.manifest, self.nodes, self.body)
            if variants.needs_memory(self.findings) else [])


def judge(session: Session, manifest: Manifest, nodes: list[Node], body: dict[str, Any]) -> Judgement:
    """Validate a plan body for a manifest on nodes, as ``create`` signs it (the measured KV pool when pinned, the
    nodes' topology, one validation per instance shape). Reads only: ``create`` and the dry run share it, so a dry
    run refuses what the create would (``tuning.auto_apply`` outside benchmark among them)."""
    from .tuning import initial_memo

    initial_memo(body.get("tuning"), body.get("environment"))  # Invalid (422, tuning.auto_apply)
    body = kv_pool.apply(session, manifest, nodes, body)  # kv_cache_pool "pinned": the measured pool
    request = launch_request(manifest, nodes, body)
    check_node_safety(manifest, request)
    recommendations: list[dict[str, Any]] | None = None
    if len(nodes) > 1 and request.workload is not None:  # the topology follows from the filled TP/PP/DP
        filled, recommendations = recommend(request)
        request = request.model_copy(update={"engine_args": filled})
    layout = plan_layout(request, nodes, body)
    _, line = resolve_version(request.vllm_version)
    if len(nodes) > 1:
        judged_in = launch_request(manifest, nodes, {**body, "engine_args": _engine_args_with(
            request.engine_args, layout.group_args, line)}, nodes_per_instance=layout.topo.nodes_per_instance)
        result = validate(judged_in, model_ref=manifest.uri, fill=False)
        if recommendations is not None:
            result.recommendations = recommendations
    else:
        result = validate(request, model_ref=manifest.uri)
    return Judgement(manifest, nodes, body, request, result, layout, line, [f.as_dict() for f in result.findings])


def create(session: Session, *, actor: str, settings: Settings, keys: KeyStore, body: dict[str, Any],
           tuning: dict[str, Any] | None = None) -> dict:
    """Validate, sign and store a plan for every named node. Raises LaunchRejected (422, nothing stored) when the
    verdict is reject; DomainError / NotFound / Invalid for bad input.

    The nodes form groups (domain/topology.py): one replica per node when the world TP × PP × DP fits a node, else
    instances of k nodes in the order given. The launch is validated once per instance shape (``hardware.nodes`` =
    k, with the group-wide ``--nnodes``/``--master-port`` or ``--data-parallel-size-local``/``-rpc-port``); each
    node is signed its own argv with its group, rank, role and the group's digest."""
    from .tuning import initial_memo

    if tuning is None:  # a plan's own tuning block starts the loop (issue 16); the loop passes its memo
        tuning = initial_memo(body.get("tuning"), body.get("environment"))
    manifest = manifest_service.resolve_ref(session, body["manifest"])
    names = node_service.distinct(body["nodes"])
    nodes = [node_service.get(session, n) for n in names]
    node_service.lock(session, sorted(names))  # per-node seq: concurrent plans for a node queue here
    j = judge(session, manifest, nodes, body)
    body, request, result, layout, line, findings = j.body, j.request, j.result, j.layout, j.line, j.findings
    metrics.observe_result("plans", result.verdict, findings)
    if result.verdict == "reject":
        raise j.rejection(session)
    judged = result.context.request if result.context is not None else request  # with recommended values filled
    plan_id = str(uuid.uuid4())
    topo = layout.topo
    groups = []
    member_claims: dict[str, dict[str, Any]] = {}
    for g, members in enumerate(topo.groups):
        argvs, _ = member_argvs(topo, g, result.argv, line, head_address=layout.head_addresses[g] or "",
                                tp=layout.tp, pp=layout.pp, dp=layout.dp)
        env = {**request.env, **layout.group_env[g]}
        k = topo.nodes_per_instance
        content = {"plan": plan_id, "group": g, "nnodes": k, "vllm_version": result.vllm_version,
                   "manifest_digest": manifest.digest, "model_uri": manifest.uri,
                   "members": [{"node": n, "rank": topo.placements[n].rank, "role": topo.placements[n].role,
                                "argv": argvs[n], "env": env} for n in members]}
        digest = group_digest(content)
        groups.append({"group": g, "nodes": list(members), "head": members[0],
                       "head_address": layout.head_addresses[g] if k > 1 else None, "nnodes": k, "digest": digest,
                       "argv": argvs, "env": dict(layout.group_env[g])})
        for n in members:
            p = topo.placements[n]
            member_claims[n] = {"argv": argvs[n], "env": env, "group": g, "rank": p.rank, "role": p.role,
                                "nnodes": k, "head": members[0], "group_digest": digest}
    plan = Plan(id=plan_id, manifest_id=manifest.id, request=judged.model_dump(mode="json"),
                verdict=result.verdict, findings=findings, argv=result.argv, command=result.command,
                env=dict(request.env), budget=result.budget, recommendations=result.recommendations,
                vllm_version=result.vllm_version, created_by=actor, tuning=tuning,
                topology={"form": topo.form, "nodes_per_instance": topo.nodes_per_instance, "groups": groups,
                          "multi_node_form": body.get("multi_node_form"),
                          "group_env": body.get("group_env")})
    session.add(plan)
    session.flush()
    _supersede_groups(session, actor=actor, names=names, plan=plan, model=manifest.name)
    seqs = dict(session.execute(select(Assignment.node_name, func.max(Assignment.seq))
                                .where(Assignment.node_name.in_(names)).group_by(Assignment.node_name)).all())
    assignments = []
    for node in nodes:
        mine = member_claims[node.name]
        seq = (seqs.get(node.name) or 0) + 1
        claims = plan_claims(issuer=settings.issuer, audience=settings.audience, node=node.name, plan_id=plan.id,
                             seq=seq, manifest_digest=manifest.digest,
                             vllm_version=result.vllm_version, argv=mine["argv"], env=mine["env"],
                             model_uri=manifest.uri, placement={k: mine[k] for k in PLACEMENT_CLAIMS},
                             node_checks=_node_checks(node, manifest, result, layout.topo.local_world))
        signed = keys.sign(claims)
        # "this is the node's current plan", signed now with the plan: the first fetches after a rollout (a fleet
        # booting at once) are answered without a signature each. A group member's carries its head's group digest:
        # in this transaction, the group's own
        grouped = mine["role"] in ("head", "worker")
        fresh = keys.sign(freshness_claims(issuer=settings.issuer, audience=settings.audience, node=node.name,
                                           plan_id=plan.id, seq=seq, digest=plan_digest(signed),
                                           ttl=settings.freshness_ttl_seconds, grouped=grouped,
                                           head_group_digest=mine["group_digest"] if grouped else None),
                          typ=FRESHNESS_MEDIA_TYPE, refresh=False)
        a = Assignment(plan_id=plan.id, node_name=node.name, seq=seq, signed=signed, freshness=fresh,
                       etag='"' + audit.sha256_hex(signed.encode())[:32] + '"', group_index=mine["group"],
                       rank=mine["rank"], role=mine["role"], group_digest=mine["group_digest"])
        session.add(a)
        assignments.append(a)
    session.flush()
    audit.append(session, actor=actor, kind="plan.created", subject=f"plan:{plan.id}", plan_id=plan.id,
                 node=names[0] if len(names) == 1 else None, model=manifest.name,
                 payload={"manifest": manifest.digest, "nodes": names, "seqs": [a.seq for a in assignments],
                          "plan_digests": [plan_digest(a.signed) for a in assignments],
                          "verdict": result.verdict, "argv": result.argv, "kid": keys.active_kid,
                          "topology": {"form": topo.form, "nodes_per_instance": topo.nodes_per_instance,
                                       "group_digests": [g["digest"] for g in groups]}})
    epochs.bump(session, "plans", plan.id)  # other processes' plan caches drop the superseded assignments
    return {**plan_dict(plan, assignments), "recommendations": result.recommendations}


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
        found = dict(session.execute(select(Plan.id, Manifest.name).join(Manifest, Plan.manifest_id == Manifest.id)
                                     .where(Plan.id.in_(missing))).all())
        _MODEL_OF.update({p: found.get(p) for p in missing})
    return {p: _MODEL_OF.get(p) for p in plan_ids}


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


@dataclass(frozen=True)
class AgentReport:
    """One agent report (``POST /v1/nodes/{node}/reports``)."""

    actor: str
    node: str
    plan_id: str | None
    status: str
    message: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def serve_to_agents(session: Session, fetches: list[AgentFetch]) -> list[tuple[dict | None, bool] | ApiError]:
    """The agents' fetches, in bulk (one query for the nodes' active assignments, one UPDATE and one audit INSERT for
    the fetches to record). Per fetch, in order: (assignment dict — ``id``, ``plan_id``, ``seq``, ``etag``,
    ``signed``, ``last_fetched_at``, ``fetch_count``, ``node_name`` —, served), with served False when the agent's
    ETag matches; (None, False) for a node with no current plan; NotFound for an unregistered node.

    A served fetch is recorded (``plan.fetched`` with the seq and ETag, and the assignment's fetch counters) the
    first time and again at least ``REFETCH_RECORD_SECONDS`` after the last record; repeats inside that window (a
    client retrying) and fetches that are not deliveries (``record`` False: an admin) write nothing."""
    nodes = sorted({f.node for f in fetches})
    current: dict[str, dict] = {}
    for row in session.execute(
            select(ASSIGNMENTS.c.id, ASSIGNMENTS.c.plan_id, ASSIGNMENTS.c.seq, ASSIGNMENTS.c.etag,
                   ASSIGNMENTS.c.signed, ASSIGNMENTS.c.freshness, ASSIGNMENTS.c.last_fetched_at,
                   ASSIGNMENTS.c.fetch_count, ASSIGNMENTS.c.node_name, ASSIGNMENTS.c.group_index,
                   ASSIGNMENTS.c.rank, ASSIGNMENTS.c.role, ASSIGNMENTS.c.group_digest)
            .where(ASSIGNMENTS.c.node_name.in_(nodes), ASSIGNMENTS.c.status == "active")).mappings():
        if row["node_name"] not in current or row["seq"] > current[row["node_name"]]["seq"]:
            current[row["node_name"]] = dict(row)
    heads_of(session, list(current.values()))
    unplanned = [n for n in nodes if n not in current]
    registered = set(session.scalars(select(Node.name).where(Node.name.in_(unplanned)))) if unplanned else set()
    out: list[tuple[dict | None, bool] | ApiError] = []
    record: dict[int, tuple[AgentFetch, dict]] = {}
    for f in fetches:
        row = current.get(f.node)
        if row is None:
            out.append((None, False) if f.node in registered else
                       NotFound(f"node {f.node!r} is not registered", field="name"))
        elif etag_matches(row["etag"], f.etags) or (f.record and row.get("hold")):  # a held worker: no delivery
            out.append((row, False))
        else:
            metrics.AGENT_FETCHES.labels("served").inc()
            if f.record and not fetch_recorded_recently(row) and row["id"] not in record:
                record[row["id"]] = (f, row)
            out.append((row, True))
    if record:
        now = utcnow()
        session.execute(update(ASSIGNMENTS).where(ASSIGNMENTS.c.id == bindparam("_id")).values(
            first_fetched_at=func.coalesce(ASSIGNMENTS.c.first_fetched_at, bindparam("_now")),
            last_fetched_at=bindparam("_now"), fetch_count=bindparam("_count")),
            [{"_id": aid, "_now": now, "_count": (row["fetch_count"] or 0) + 1} for aid, (_, row) in record.items()])
        models = models_of(session, [row["plan_id"] for _, row in record.values()])
        audit.append_many(session, [dict(
            actor=f.actor, kind="plan.fetched", subject=f"plan:{row['plan_id']}", node=f.node,
            plan_id=row["plan_id"], model=models[row["plan_id"]],
            payload={"seq": row["seq"], "etag": row["etag"], "refetch": bool(row["fetch_count"])})
            for f, row in record.values()])
        for _, row in record.values():
            row["fetch_count"] = (row["fetch_count"] or 0) + 1
            row["last_fetched_at"] = now
    return out


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
    heads = {(p, g): (d, n, rep) for p, g, d, n, rep in session.execute(
        select(ASSIGNMENTS.c.plan_id, ASSIGNMENTS.c.group_index, ASSIGNMENTS.c.group_digest,
               ASSIGNMENTS.c.node_name, ASSIGNMENTS.c.last_report)
        .where(ASSIGNMENTS.c.plan_id.in_(sorted({r["plan_id"] for r in grouped})), ASSIGNMENTS.c.rank == 0,
               ASSIGNMENTS.c.status == "active"))}
    for r in grouped:
        digest, head, report = heads.get((r["plan_id"], r["group_index"]), (None, None, None))
        r["head_group_digest"] = digest
        hold = group_hold(role=r["role"], plan_id=r["plan_id"], group=r["group_index"], head=head,
                          head_assigned=head is not None, head_digest=digest, own_digest=r.get("group_digest"),
                          head_report=report)
        r["hold"] = hold.as_dict() if hold is not None else None


def fetch_recorded_recently(row: dict) -> bool:
    """True when serving this assignment again needs no new record (see ``serve_to_agents``)."""
    last = row.get("last_fetched_at")
    if last is None:
        return False
    now = utcnow()
    if last.tzinfo is None:
        last = last.replace(tzinfo=now.tzinfo)
    return (now - last).total_seconds() < REFETCH_RECORD_SECONDS


REPORT_STATUSES = ("fetched", "started", "running", "heartbeat", "stopped", "exited", "refused", "reset", "failed")
PLANLESS_STATUSES = ("refused", "reset")  # may name no plan: a refusal before any plan verified, a state reset


STALE_OK = ("heartbeat", "stopped", "exited", "failed")  # what a node may still say about a plan it no longer runs


def late(r: AgentReport) -> bool:
    """A report the agent queued (offline boot, service away) and delivers now, stamped with its own time: history,
    which may name a plan superseded since."""
    at = r.details.get("at") if isinstance(r.details, dict) else None
    if not isinstance(at, (int, float)) or isinstance(at, bool):
        return False
    now = time.time()
    return now - LATE_WINDOW <= at <= now + 300  # the window the runs view believes an agent's own time in


LATE_WINDOW = 30 * 86400


def report_many(session: Session, reports: list[AgentReport]) -> list[dict[str, Any] | ApiError]:
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
    pairs = sorted({(r.node, r.plan_id) for r in reports if r.plan_id is not None})
    seqs: dict[tuple[str, str], int] = {}
    current: set[tuple[str, str]] = set()
    stale: dict[tuple[str, str], str] = {}  # assigned once, but superseded or revoked since
    heads: dict[tuple[str, str], str | None] = {}  # active head assignments of multi-node groups: last report
    if pairs:
        for node, plan_id, seq, status, role, last in session.execute(
                select(ASSIGNMENTS.c.node_name, ASSIGNMENTS.c.plan_id, ASSIGNMENTS.c.seq, ASSIGNMENTS.c.status,
                       ASSIGNMENTS.c.role, ASSIGNMENTS.c.last_report)
                .where(tuple_(ASSIGNMENTS.c.node_name, ASSIGNMENTS.c.plan_id).in_(pairs))):
            seqs[(node, plan_id)] = max(seq, seqs.get((node, plan_id), seq))
            if status == "active":
                current.add((node, plan_id))
                if role == "head":
                    heads[(node, plan_id)] = last
            else:
                stale.setdefault((node, plan_id), status)
    for pair in current:
        stale.pop(pair, None)
    planless_nodes = {r.node for r in reports if r.plan_id is None}
    known = set(session.scalars(select(Node.name).where(Node.name.in_(planless_nodes)))) if planless_nodes else set()
    assigned = [i for i, r in enumerate(reports) if (r.node, r.plan_id) in seqs
                and ((r.node, r.plan_id) not in stale or r.status in STALE_OK or late(r))]
    beats = [reports[i] for i in assigned if reports[i].status == "heartbeat"]
    ok_idx = [i for i in assigned if reports[i].status != "heartbeat"]
    ok = [reports[i] for i in ok_idx]
    planless_idx = [i for i, r in enumerate(reports) if r.plan_id is None and r.node in known]
    done: dict[int, int | None] = {}  # index in ``reports`` -> new report id (None: nothing stored but accepted)
    now = utcnow()
    if beats:
        session.execute(update(ASSIGNMENTS).where(ASSIGNMENTS.c.node_name == bindparam("_node"),
                                                  ASSIGNMENTS.c.plan_id == bindparam("_plan"))
                        .values(last_heartbeat_at=bindparam("_now")),
                        [{"_node": r.node, "_plan": r.plan_id, "_now": now} for r in beats])
        for i in assigned:
            if reports[i].status == "heartbeat":
                done[i] = None
        metrics.AGENT_REPORTS.labels("heartbeat").inc(len(beats))
    if ok:
        session.execute(update(ASSIGNMENTS).where(ASSIGNMENTS.c.node_name == bindparam("_node"),
                                                  ASSIGNMENTS.c.plan_id == bindparam("_plan"))
                        .values(last_report=bindparam("_status")),
                        [{"_node": r.node, "_plan": r.plan_id, "_status": r.status} for r in ok])
        new_ids = session.execute(
            insert(REPORTS).returning(REPORTS.c.id, sort_by_parameter_order=True),
            [{"plan_id": r.plan_id, "node_name": r.node, "status": r.status, "message": r.message,
              "details": r.details, "created_at": now} for r in ok]).scalars().all()
        done.update(zip(ok_idx, new_ids))
        if any((r.node, r.plan_id) in heads and changes_hold(heads[(r.node, r.plan_id)], r.status) for r in ok):
            # a head's report opens or closes its workers' gate (domain/group_gate.py): the agents' caches of the
            # group's assignments are refreshed like after a plan change (services/epochs.py)
            epochs.bump(session, "plans", ok[0].plan_id or "")
        for r in ok:
            metrics.AGENT_REPORTS.labels(r.status).inc()
            if r.status == "running" and isinstance(r.details.get("vllm"), dict):  # compare with the prediction
                calibration.record(session, plan=session.get(Plan, r.plan_id), node=r.node, details=r.details)
    models = models_of(session, [r.plan_id for r in ok]) if ok else {}
    events = [dict(actor=r.actor, kind=f"agent.{r.status}", subject=f"plan:{r.plan_id}", node=r.node,
                   plan_id=r.plan_id, model=models[r.plan_id],
                   payload={"seq": seqs[(r.node, r.plan_id)], "status": r.status, "message": r.message,
                            "details": r.details}) for r in ok]
    for i in planless_idx:
        r = reports[i]
        metrics.AGENT_REPORTS.labels(r.status).inc()
        events.append(dict(actor=r.actor, kind=f"agent.{r.status}", subject=f"node:{r.node}", node=r.node,
                           payload={"status": r.status, "message": r.message, "details": r.details}))
        done[i] = None
    if events:
        audit.append_many(session, events)
    missing = {r.node for i, r in enumerate(reports) if i not in done}
    registered = set(session.scalars(select(Node.name).where(Node.name.in_(missing)))) if missing else set()
    return [{"id": done[i], "plan_id": r.plan_id, "node": r.node, "status": r.status,
             **({"current": (r.node, r.plan_id) in current} if r.status == "heartbeat" else {})} if i in done else
            Conflict(f"plan {r.plan_id!r} is no longer current on node {r.node!r} (it was "
                     f"{stale[(r.node, r.plan_id)]}): report on the node's current plan", field="plan_id")
            if (r.node, r.plan_id) in stale else
            NotFound(f"plan {r.plan_id!r} was never assigned to node {r.node!r}", field="plan_id")
            if r.node in registered else NotFound(f"node {r.node!r} is not registered", field="name")
            for i, r in enumerate(reports)]


def revoke(session: Session, *, actor: str, plan_id: str) -> Plan:
    plan, assignments = get(session, plan_id)
    if plan.status == "revoked":
        return plan  # already withdrawn: the same answer, no second event
    if not any(a.status == "active" for a in assignments):
        raise Conflict(f"plan {plan_id} is no longer current on any node (it was {plan.status}): nothing to revoke",
                       field="plan_id")
    plan.status = "revoked"
    for a in assignments:
        if a.status == "active":
            a.status = "revoked"
    audit.append(session, actor=actor, kind="plan.revoked", subject=f"plan:{plan_id}", plan_id=plan_id,
                 model=model_of(session, plan_id),
                 payload={"nodes": [a.node_name for a in assignments], "at": utcnow().isoformat()})
    epochs.bump(session, "plans", plan_id)
    return plan


def content_body(old: Plan, assignments: list[Assignment]) -> dict[str, Any]:
    """A plan body with ``old``'s content (manifest, engine args, env, workload, version, multi-node form) for the
    nodes of ``assignments`` — whole groups of ``old`` —, in the order given at first (ranks follow it: by rank within
    each group, groups in order), with the group env of those groups."""
    req = old.request
    topo = old.topology or {}
    ordered = sorted(assignments, key=lambda a: (a.group_index or 0, a.rank or 0, a.id))
    group_env = topo.get("group_env")
    if group_env:
        kept = sorted({a.group_index or 0 for a in ordered})
        group_env = [group_env[g] for g in kept if g < len(group_env)]
    return {"manifest": old.manifest_id, "nodes": [a.node_name for a in ordered],
            "engine_args": req.get("engine_args") or {}, "env": req.get("env") or {},
            "environment": req.get("environment"), "workload": req.get("workload"),
            "vllm_version": req.get("vllm_version"), "multi_node_form": topo.get("multi_node_form"),
            "group_env": group_env}


def reissue(session: Session, *, actor: str, settings: Settings, keys: KeyStore, plan_id: str) -> dict:
    """Rollback: the earlier plan's content (manifest, nodes, engine args, env, workload, version), re-validated
    and signed as a new plan with a new per-node seq."""
    old, assignments = get(session, plan_id)
    # the tuning memo travels with the content (its SLO, auto_apply, the levels that held): a reissue does not
    # restart the loop or drop its SLO
    out = create(session, actor=actor, settings=settings, keys=keys, body=content_body(old, assignments),
                 tuning=old.tuning if isinstance(old.tuning, dict) else None)
    audit.append(session, actor=actor, kind="plan.reissued", subject=f"plan:{out['id']}", plan_id=out["id"],
                 model=model_of(session, out["id"]),
                 payload={"from": plan_id})
    return out
