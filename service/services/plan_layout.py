"""What a plan body means as a launch: the launch request it implies for a manifest on nodes, the node-safety
checks (env policy, remote code), the signed ``node_checks`` claim, and the layout (topology, group arguments, heads'
addresses and group env) of a multi-node plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ..api.schemas import LaunchTarget, PlanIn
from ..db.models import Manifest, Node
from ..domain import env_policy, node_checks, weights_expect
from ..domain.engine_args import parse_engine_args, resolve_name
from ..domain.errors import DomainError
from ..domain.loading import CODE, judge, option_loads
from ..domain.request import LaunchRequest
from ..domain.topology import PER_NODE, Placement, Topology, address_problem, group_arguments, plan_topology
from ..domain.validate import ValidationResult
from ..domain.versions import resolve_version
from ..errors import Invalid


def _tensor_ranks(manifest: Manifest) -> dict[str, Any]:
    """The manifest's per-layer bytes and linear module shapes from its tensors (absent when not recorded)."""
    tensors = manifest.tensors if isinstance(manifest.tensors, dict) else {}
    ranks, linears = tensors.get("ranks"), tensors.get("linears")
    return {
        **({"tensor_ranks": ranks} if isinstance(ranks, dict) else {}),
        **({"tensor_linears": linears} if isinstance(linears, list) else {}),
    }


def launch_request(
    manifest: Manifest, nodes: list[Node], target: LaunchTarget, *, nodes_per_instance: int | None = None
) -> LaunchRequest:
    """The launch request a plan's target implies: the manifest's model, the nodes' hardware (``hardware.nodes``: the
    nodes one instance spans, ``nodes_per_instance``; by default all the plan's nodes)."""
    first = nodes[0]
    shapes = {(n.gpu_id, n.gpu["memory_bytes"], n.gpu["compute_capability"], n.gpu_count) for n in nodes}
    if len(shapes) > 1:
        seen = ", ".join(f"{n.name}: {n.gpu_count} × {n.gpu.get('name', n.gpu_id)}" for n in nodes[:8])
        raise Invalid(
            f"all nodes of one plan (and so of every group in it) must have the same GPU model and count ({seen})",
            field="nodes",
        )
    gpu: Any = (
        first.gpu_id
        if first.gpu_id != "custom"
        else {
            "name": first.gpu["name"],
            "compute_capability": first.gpu["compute_capability"],
            "memory_bytes": first.gpu["memory_bytes"],
        }
    )
    interconnects = {n.interconnect for n in nodes}
    try:
        return LaunchRequest.model_validate(
            {
                "model": {
                    "name": manifest.name,
                    "uri": manifest.uri,
                    "config": manifest.config,
                    "hf_quant_config": manifest.hf_quant_config,
                    "quantization_txt": manifest.quantization_txt,
                    "checkpoint": manifest.checkpoint,
                    "weights_bytes": manifest.weights_bytes,
                    # the manifest's per-layer bytes and linear shapes from the tensors (absent when not recorded)
                    **_tensor_ranks(manifest),
                },
                "hardware": {
                    "gpu": gpu,
                    "count": first.gpu_count,
                    "nodes": nodes_per_instance or len(nodes),
                    "interconnect": interconnects.pop() if len(interconnects) == 1 else None,
                },
                "environment": target.environment,
                "workload": target.workload,
                "engine_args": target.engine_args,
                "env": target.env,
                "vllm_version": target.vllm_version,
            }
        )
    except ValidationError as exc:
        raise Invalid(
            "the plan does not make a valid launch request: "
            + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5]),
            errors=[
                {"field": ".".join(map(str, e["loc"])), "rule": e["type"], "message": e["msg"]} for e in exc.errors()
            ],
        ) from None


def check_node_safety(manifest: Manifest, request: LaunchRequest) -> None:
    """What runs on a node is the node's choice: a plan's env may not name the executable, loader or interpreter, nor
    set what the release imports, unpickles or reads as a path (domain/env_policy.py), and in production what the
    engine arguments would make the node import or unpickle, at any depth, needs a manifest registered with
    ``allow_remote_code`` (domain/loading.py, from facts read out of the release). Raises Invalid (422) naming
    every field and its rule."""
    refused = env_policy.refused(request.env)
    if refused:
        raise Invalid(
            "the plan's env sets variables a node does not take from a plan: "
            + "; ".join(f"{name}: {why}" for name, why in refused),
            errors=[{"field": f"env.{name}", "rule": "env_not_allowed", "message": why} for name, why in refused],
        )
    if request.environment != "production" or manifest.allow_remote_code:
        return
    # judged on the parsed arguments, so no spelling (--trust-remote-code, -trust_remote_code) slips past
    _, line = resolve_version(request.vllm_version)
    loads = [
        x for x in option_loads(parse_engine_args(request.engine_args, line).values, line.loading) if x.kind in CODE
    ]
    verdicts = judge(loads, environment=request.environment, allow_remote_code=False)
    if verdicts:
        raise Invalid(
            f"{verdicts[0].message}: in production the manifest {manifest.name}@{manifest.version} must be "
            f"registered with allow_remote_code (a new version: preflight manifest push DIR --version V "
            f'--allow-remote-code, or POST /v1/manifests with "allow_remote_code": true)',
            errors=[
                {"field": v.field, "rule": v.rule, "message": f"{v.message}; the manifest does not allow remote code"}
                for v in verdicts
            ],
        )


def layout_digest_of(manifest: Manifest) -> str | None:
    """The manifest's checkpoint layout digest (the tensor inventory's digest over every tensor's name, dtype and
    shape: domain/tensors.py), signed into its plans for the nodes to compare with their safetensors headers; None
    for a manifest registered without an inventory. The one place a plan reads it from."""
    tensors = manifest.tensors if isinstance(manifest.tensors, dict) else {}
    value = tensors.get("layout_digest")
    return value if isinstance(value, str) and value else None


def weights_expected(manifest: Manifest, plan: PlanIn) -> dict[str, Any]:
    """The signed ``weights_expected`` claim (domain/weights_expect.py) of a plan for ``manifest``. Raises Invalid
    (422, naming the manifest) for a stored manifest whose tag cannot be read today, rather than signing a plan its
    nodes could not check."""
    try:
        return weights_expect.weights_expected_claim(
            config=manifest.config,
            quantization_txt=manifest.quantization_txt,
            layout_digest=layout_digest_of(manifest),
            environment=plan.environment,
            weights_check=plan.weights_check,
            skip_reason=plan.weights_check_reason,
            signer=plan.weights_signer,
        )
    except DomainError as exc:
        raise Invalid(
            f"the manifest {manifest.name}@{manifest.version} cannot tell its nodes what to check: {exc.message}",
            field="manifest",
        ) from None


def node_checks_claim(
    node: Node, manifest: Manifest, result: ValidationResult, gpus_used: int, expected: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The signed ``node_checks`` claim: hardware, memory, the weights files the manifest recorded and the weights
    every node must find (``expected``: ``weights_expected``)."""
    args = result.context.args if result.context is not None else None
    return node_checks.node_checks_claim(
        hardware=node_checks.hardware_claim(
            gpu_id=node.gpu_id, gpu=node.gpu, count=node.gpu_count, interconnect=node.interconnect
        ),
        memory=node_checks.memory_claim(
            effective=result.effective or {},
            budget=result.budget,
            kv_cache_memory_bytes=args.get("kv_cache_memory_bytes") if args is not None else None,
            gpus_used=gpus_used,
            gpus_per_node=node.gpu_count,
        ),
        weights=manifest.files,
        weights_expected=expected,
    )


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


def engine_args_with(raw: dict[str, Any], extra: dict[str, Any], line) -> dict[str, Any]:
    """``raw`` with ``extra`` set by dest name (any spelling of those names in ``raw`` is replaced)."""
    out = {k: v for k, v in raw.items() if resolve_name(k, line) not in extra}
    out.update(extra)
    return out


def plan_layout(request: LaunchRequest, nodes: list[Node], plan: PlanIn) -> Layout:
    """Group the plan's nodes into instances (vLLM's world TP × PP × DP over the nodes' GPUs) and check what a
    multi-node plan needs: no per-node argument in engine_args (Preflight renders them), ``--nnodes`` if given equal
    to the instance's node count, an address on every head, one env per group. Raises DomainError / Invalid (422)
    naming the field and the numbers."""
    _, line = resolve_version(request.vllm_version)
    args = parse_engine_args(request.engine_args, line)
    tp, pp, dp = args.tensor_parallel_size, args.pipeline_parallel_size, args.data_parallel_size
    names = [n.name for n in nodes]
    gpus = nodes[0].gpu_count
    group_env = list(plan.group_env or [])
    world = tp * pp * dp
    k = -(-world // gpus) if world > 0 else 1
    if len(nodes) == 1 or world <= 0 or k > len(nodes):
        # one node, or fewer nodes than one instance needs: the rules judge it (world_size_exceeds_gpus)
        topo = Topology(
            "replicas",
            1,
            tuple((n,) for n in names),
            {n: Placement(n, i, 0, "replica", 1, n) for i, n in enumerate(names)},
            world,
        )
    else:
        topo = plan_topology(
            names, gpus, tp, pp, dp, line, backend=args.get("distributed_executor_backend"), form=plan.multi_node_form
        )
    # per-node flags are Preflight's to render from the topology — on a one-node plan too, where a signed
    # --headless or --node-rank would make the node a worker of an instance that does not exist (and the agent
    # refuses a replica that is told to be headless)
    for name in PER_NODE:
        if name in args.given and not (topo.form == "replicas" and name == "data_parallel_size_local"):
            raise DomainError(
                f"engine_args.{name}",
                f"--{name.replace('_', '-')} differs per node: Preflight "
                f"renders it for every node of a multi-node plan from the topology (leave it out)",
                rule="flag_per_node",
            )
    if len(nodes) > 1:
        n_given = args.get("nnodes")
        if n_given is not None and int(n_given) != topo.nodes_per_instance:
            raise DomainError(
                "engine_args.nnodes",
                f"--nnodes {n_given} but world size {world} (TP {tp} × PP {pp} × "
                f"DP {dp}) over nodes of {gpus} GPUs makes instances of {topo.nodes_per_instance} "
                f"node(s): leave --nnodes out (Preflight renders it)",
                rule="nnodes",
            )
    _check_group_env(group_env, topo)
    heads = _head_addresses(topo, nodes)
    return Layout(
        topo,
        group_arguments(topo, line, tp=tp, pp=pp, given=args.values),
        heads,
        group_env or [{} for _ in topo.groups],
        tp,
        pp,
        dp,
    )


def _head_addresses(topo: Topology, nodes: list[Node]) -> dict[int, str | None]:
    """Each group's head address, which the group's other nodes connect to: required on the head of a multi-node
    instance, and one accepted at registration today (a loopback name stored before it was refused is not)."""
    by_name = {n.name: n for n in nodes}
    names = [n.name for n in nodes]
    heads: dict[int, str | None] = {}
    for g, members in enumerate(topo.groups):
        head = by_name[members[0]]
        if topo.nodes_per_instance > 1 and not head.address:
            raise Invalid(
                f"node {head.name!r} heads group {g} ({', '.join(members)}), a {len(members)}-node "
                f"instance, but has no address: the other nodes connect to it. Set it with PATCH "
                f'/v1/nodes/{head.name} {{"address": "10.0.0.1"}}',
                field="nodes",
                errors=[
                    {
                        "field": f"nodes.{names.index(head.name)}",
                        "rule": "head_address",
                        "message": f"node {head.name!r} has no address",
                    }
                ],
            )
        stored = address_problem(head.address) if topo.nodes_per_instance > 1 and head.address else None
        if stored:  # an address stored before it was refused at registration (a loopback name, …)
            raise Invalid(
                f"node {head.name!r} heads group {g} but its address {head.address!r} is refused: {stored}. Set "
                f"another with PATCH /v1/nodes/{head.name}",
                field="nodes",
                errors=[{"field": f"nodes.{names.index(head.name)}", "rule": "head_address", "message": stored}],
            )
        heads[g] = head.address
    return heads


def _check_group_env(group_env: list, topo: Topology) -> None:
    """One env per group, in group order, and none setting a variable a node does not take from a plan."""
    if group_env and len(group_env) != len(topo.groups):
        raise DomainError(
            "group_env",
            f"group_env has {len(group_env)} entries but the plan has "
            f"{len(topo.groups)} group(s) of {topo.nodes_per_instance} node(s): give one per group, in "
            f"group order",
            rule="group_env",
        )
    for i, env in enumerate(group_env):
        refused = env_policy.refused(env)
        if refused:
            raise Invalid(
                "group_env sets variables a node does not take from a plan: "
                + "; ".join(f"{name}: {why}" for name, why in refused),
                errors=[
                    {"field": f"group_env.{i}.{name}", "rule": "env_not_allowed", "message": why}
                    for name, why in refused
                ],
            )
