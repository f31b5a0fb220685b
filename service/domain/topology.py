"""Multi-node topology: which nodes form one vLLM instance, each node's rank and role, and the argv each node runs.

The world size is TP × PP × DP (``data_parallel_size``). If it fits one node's GPUs, every node runs its own
replica (the same argv). If it spans k nodes (k = ⌈world ÷ GPUs per node⌉), the nodes are taken in the order given
in groups of k, each group one instance; the world must divide evenly over the k nodes and the node count must be a
multiple of k (vllm 0.33.0 vllm/engine/arg_utils.py:2399-2420: "`--nnodes` must evenly divide the total world size").

Per-node commands follow vLLM's multiprocessing form (docs/serving/parallelism_scaling.md, data_parallel_deployment):
every node of a group runs the same ``vllm serve`` with ``--nnodes k --node-rank r --master-addr HEAD --master-port
P``; workers (rank > 0) add ``--headless``. Releases without ``--nnodes`` (before 0.11) use the data-parallel form
when only DP spans nodes (``--data-parallel-size-local``, ``--data-parallel-start-rank``, ``--data-parallel-address``,
``--data-parallel-rpc-port``, ``--headless`` on followers) and are refused otherwise: TP or PP across nodes there
needs a Ray cluster started outside ``vllm serve``, which Preflight does not render.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from dataclasses import dataclass
from typing import Any

from .errors import DomainError
from .render import ArgvError, parse_argv, render_option
from .versions import VersionLine

DEFAULT_MASTER_PORT = 29501  # vLLM's ParallelConfig.master_port default (service/data/vllm/0.33.0.json)
DEFAULT_DP_RPC_PORT = 29550  # vLLM's data_parallel_rpc_port default


@dataclass(frozen=True)
class Placement:
    """One node's place in a plan: its group (instance), rank inside it and role."""

    node: str
    group: int
    rank: int
    role: str  # "replica" (its own instance) | "head" | "worker"
    nnodes: int
    head: str

    def as_dict(self) -> dict[str, Any]:
        return {"group": self.group, "rank": self.rank, "role": self.role, "nnodes": self.nnodes, "head": self.head}


@dataclass(frozen=True)
class Topology:
    form: str  # "replicas" | "nnodes" | "data_parallel"
    nodes_per_instance: int
    groups: tuple[tuple[str, ...], ...]
    placements: dict[str, Placement]
    local_world: int  # GPUs each node uses


MAX_ADDRESS = 253  # a DNS name's longest text form (RFC 1035 §2.3.4); IPv6 text is shorter
_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")  # used with fullmatch ($ allows a final \n)
FORMS = ("nnodes", "data_parallel")
# per-node arguments Preflight renders for every member of a group; a plan's engine_args may not set them
PER_NODE = (
    "node_rank",
    "master_addr",
    "headless",
    "data_parallel_start_rank",
    "data_parallel_address",
    "data_parallel_rank",
    "data_parallel_size_local",
)


# Names every node resolves to itself: RFC 6761 §6.3 reserves ``localhost`` and every name under it for the loopback
# interface, and Debian's and Red Hat's /etc/hosts map these to 127.0.0.1 / ::1.
LOOPBACK_NAMES = frozenset(
    (
        "localhost",
        "localhost.localdomain",
        "localhost4",
        "localhost4.localdomain4",
        "localhost6",
        "localhost6.localdomain6",
        "ip6-localhost",
        "ip6-loopback",
    )
)
THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")  # RFC 1122 §3.2.1.3: a source address only, never a destination
_NUMERIC_LABEL = re.compile(r"0x[0-9a-f]*|[0-9]+")  # what inet_aton(3) reads as a part of an IPv4 address


def _embedded_ipv4(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 one carries and may be routed to: IPv4-mapped, 6to4, and the deprecated
    IPv4-compatible ``::a.b.c.d`` (RFC 4291 §2.5.5)."""
    if ip.version == 4:
        return []
    assert isinstance(ip, ipaddress.IPv6Address)
    out = [a for a in (ip.ipv4_mapped, ip.sixtofour) if a is not None]
    if ip.packed[:12] == bytes(12) and int(ip) > 1:
        out.append(ipaddress.IPv4Address(ip.packed[12:]))
    return out


def _ip_problem(value: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    for a in (ip, *_embedded_ipv4(ip)):
        if a.is_loopback:
            return f"{value} is a loopback address: every other node would reach itself there, not this node"
        if (
            a.is_unspecified
            or a.is_multicast
            or (a.version == 4 and a in THIS_NETWORK)
            or (a.version == 4 and a == ipaddress.IPv4Address("255.255.255.255"))
        ):
            return f"{value} is not an address another node can connect to"
        if a.is_link_local:
            return f"{value} is a link-local address (no route beyond one link): give an address other nodes can reach"
    return None


def address_problem(value: str) -> str | None:
    """Why ``value`` is not an address other nodes can reach a head at (an IPv4/IPv6 address or a DNS name of
    1-63 character labels of letters, digits and inner hyphens, at most 253 characters), or None. It is rendered as
    ``--master-addr`` / ``--data-parallel-address``, so nothing that argparse could read as an option or a shell
    could split is accepted; and nothing that names the host it is read on — loopback (127.0.0.0/8, ::1, IPv4 in
    IPv6, ``localhost`` and names under it, LOOPBACK_NAMES), unspecified, link-local —, which on every other node of
    the group would be that node itself."""
    if not isinstance(value, str) or not value or len(value) > MAX_ADDRESS:
        return f"must be an IP address or a DNS name of 1 to {MAX_ADDRESS} characters"
    if not value.isascii() or not value.isprintable() or any(c.isspace() for c in value):
        return "must be an IP address or a DNS name: no spaces, control or non-ASCII characters"
    if "%" in value:
        return "an IPv6 scope id (%...) is local to one host: give an address other nodes can reach"
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        ip = None
    if ip is not None:
        return _ip_problem(value, ip)
    name = (value[:-1] if value.endswith(".") else value).lower()
    labels = name.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels) or labels[-1].isdigit():
        return (
            "must be an IP address or a DNS name (labels of letters, digits and inner hyphens, 1 to 63 "
            "characters each, separated by dots)"
        )
    if len(labels) <= 4 and all(_NUMERIC_LABEL.fullmatch(label) for label in labels):
        return f"{value} is an IPv4 address in a numeric form resolvers read differently: write it as a.b.c.d"
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return f"{value} names the loopback interface: every other node would reach itself there, not this node"
    return None


def plan_topology(
    nodes: list[str],
    gpus_per_node: int,
    tp: int,
    pp: int,
    dp: int,
    line: VersionLine,
    backend: str | None = None,
    form: str | None = None,
) -> Topology:
    """Group ``nodes`` into instances. Raises DomainError (field ``nodes`` or ``engine_args.*``) with the numbers.

    ``form`` picks the multi-node form when both apply: ``nnodes`` (the default where the release has
    ``--nnodes``) or ``data_parallel`` (only DP spans nodes: TP × PP fits one node and DP ranks divide evenly)."""
    world = tp * pp * dp
    if world <= gpus_per_node:
        placements = {n: Placement(n, i, 0, "replica", 1, n) for i, n in enumerate(nodes)}
        return Topology("replicas", 1, tuple((n,) for n in nodes), placements, world)
    k = -(-world // gpus_per_node)
    if world % k:
        raise DomainError(
            "engine_args.tensor_parallel_size",
            f"World size {world} (TP {tp} × PP {pp} × DP {dp}) does not divide evenly over the {k} nodes of "
            f"{gpus_per_node} GPUs it needs: vLLM requires `--nnodes {k}` to evenly divide the total world size.",
            rule="nnodes",
        )
    if len(nodes) % k:
        raise DomainError(
            "nodes",
            f"World size {world} (TP {tp} × PP {pp} × DP {dp}) spans {k} nodes of {gpus_per_node} GPUs, so the nodes "
            f"form instances of {k}; {len(nodes)} node(s) is not a multiple of {k} (give {k * max(1, len(nodes) // k)} "
            f"or {k * (len(nodes) // k + 1)} nodes).",
            rule="nnodes",
        )
    if backend == "ray":
        raise DomainError(
            "engine_args.distributed_executor_backend",
            "A multi-node plan with --distributed-executor-backend ray needs a Ray cluster started outside vllm serve "
            "(ray start on every node), which Preflight does not render or supervise. Leave the backend unset (or mp): "
            "Preflight renders vLLM's multiprocessing form (--nnodes/--node-rank/--master-addr, --headless workers).",
            rule="nnodes",
        )
    dp_form_fits = tp * pp <= gpus_per_node and dp > 1 and dp % k == 0 and "data_parallel_start_rank" in line.options
    if form == "data_parallel" and not dp_form_fits:
        raise DomainError(
            "multi_node_form",
            f"The data-parallel form spreads whole DP ranks over nodes: it needs data_parallel_size > 1 divisible by "
            f"the {k} nodes of an instance and TP × PP = {tp * pp} within one node's {gpus_per_node} GPUs "
            f"(DP {dp}). Use the nnodes form.",
            rule="nnodes",
        )
    if form == "data_parallel":
        pass
    elif "nnodes" in line.options:
        form = "nnodes"
    elif dp_form_fits:
        form = "data_parallel"
    else:
        raise DomainError(
            "vllm_version",
            f"vLLM {line.newest} has no --nnodes: TP × PP = {tp * pp} across nodes needs a Ray cluster, which Preflight "
            f"does not render. Use vLLM 0.11 or newer for the multiprocessing multi-node form.",
            rule="nnodes",
        )
    groups = tuple(tuple(nodes[i : i + k]) for i in range(0, len(nodes), k))
    placements = {}
    for g, members in enumerate(groups):
        for r, n in enumerate(members):
            placements[n] = Placement(n, g, r, "head" if r == 0 else "worker", k, members[0])
    return Topology(form, k, groups, placements, world // k)


def node_arguments(
    topo: Topology,
    placement: Placement,
    line: VersionLine,
    *,
    head_address: str,
    tp: int,
    pp: int,
    dp: int,
    master_port: int = DEFAULT_MASTER_PORT,
    rpc_port: int = DEFAULT_DP_RPC_PORT,
) -> dict[str, Any]:
    """The per-node engine arguments (by dest) a node adds to the group's argv.

    Workers (rank > 0) take ``--headless``: no API server; with ``node_rank_within_dp > 0`` vLLM runs only a
    multiprocessing executor that joins the head's torch.distributed group at ``--master-addr:--master-port``, else
    its local DP engines, which hand-shake with ``--data-parallel-address:--data-parallel-rpc-port`` (vllm 0.33.0
    vllm/entrypoints/cli/serve.py:181-245; ranks and local DP sizes inferred in vllm/engine/arg_utils.py:2399-2440,
    the DP address defaulting to ``--master-addr`` at arg_utils.py:2539-2555)."""
    if placement.role == "replica":
        return {}
    if topo.form == "nnodes":
        out: dict[str, Any] = {
            "nnodes": placement.nnodes,
            "node_rank": placement.rank,
            "master_addr": head_address,
            "master_port": master_port,
        }
    else:  # data-parallel form: DP ranks spread over nodes, each node dp_local ranks
        dp_local = topo.local_world // (tp * pp)
        # the head takes no --data-parallel-start-rank: with one and without --headless vLLM infers hybrid load
        # balancing (vllm 0.33.0 vllm/engine/arg_utils.py:2486-2491), which the documented head command does not
        out = {
            "data_parallel_size_local": dp_local,
            "data_parallel_address": head_address,
            "data_parallel_rpc_port": rpc_port,
        }
        if placement.rank > 0:
            out["data_parallel_start_rank"] = placement.rank * dp_local
    if placement.rank > 0:
        out["headless"] = True
    return {k: v for k, v in out.items() if k in line.options}


def node_argv(group_argv: list[str], extra: dict[str, Any], line: VersionLine) -> list[str]:
    """The group's argv with this node's arguments appended (in a fixed order)."""
    argv = list(group_argv)
    for name in (
        "nnodes",
        "node_rank",
        "master_addr",
        "master_port",
        "data_parallel_size_local",
        "data_parallel_start_rank",
        "data_parallel_address",
        "data_parallel_rpc_port",
        "headless",
    ):
        if name in extra:
            argv += render_option(line.options[name], extra[name])
    return argv


GROUP_WIDE = ("nnodes", "master_port", "data_parallel_size_local", "data_parallel_rpc_port")


def group_arguments(topo: Topology, line: VersionLine, *, tp: int, pp: int, given: dict[str, Any]) -> dict[str, Any]:
    """The engine arguments every member of a group shares, validated once for the group (``--nnodes`` and
    ``--master-port``, or ``--data-parallel-size-local`` and ``--data-parallel-rpc-port``); ``given`` (the plan's
    parsed engine arguments) wins for the ports."""
    if topo.form == "replicas":
        return {}
    if topo.form == "nnodes":
        out = {"nnodes": topo.nodes_per_instance, "master_port": given.get("master_port") or DEFAULT_MASTER_PORT}
    else:
        out = {
            "data_parallel_size_local": topo.local_world // (tp * pp),
            "data_parallel_rpc_port": given.get("data_parallel_rpc_port") or DEFAULT_DP_RPC_PORT,
        }
    return {k: v for k, v in out.items() if k in line.options}


def member_arguments(
    topo: Topology, placement: Placement, line: VersionLine, *, head_address: str, tp: int, pp: int, dp: int
) -> dict[str, Any]:
    """What one member adds to its group's validated argv: ``node_arguments`` without the group-wide ones."""
    extra = node_arguments(topo, placement, line, head_address=head_address, tp=tp, pp=pp, dp=dp)
    return {k: v for k, v in extra.items() if k not in GROUP_WIDE}


def group_digest(content: dict[str, Any]) -> str:
    """SHA-256 (hex) over the canonical JSON (sorted keys, no spaces, UTF-8) of a group's whole signed content —
    every member's node, rank, role, argv and env with the plan's id, version and manifest digest: the same on every
    member, different when any member's command differs."""
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def member_argvs(
    topo: Topology, group: int, argv: list[str], line: VersionLine, *, head_address: str, tp: int, pp: int, dp: int
) -> tuple[dict[str, list[str]], dict[str, dict[str, Any]]]:
    """Each member's own argv — the group's validated argv plus its rank's arguments (``member_arguments``) — and
    what it must parse to. Every argv is parsed back with the release's parser semantics (render.parse_argv, the
    argv_roundtrip rule's reading) and must give exactly the validated arguments plus its own; else DomainError
    (field ``nodes``, rule ``argv_roundtrip``): nothing is signed. Replicas run the validated argv itself."""
    members = topo.groups[group]
    if topo.form == "replicas":
        return {name: list(argv) for name in members}, {}
    _, base = parse_argv(argv, line)
    argvs, expected = {}, {}
    for name in members:
        extra = member_arguments(topo, topo.placements[name], line, head_address=head_address, tp=tp, pp=pp, dp=dp)
        mine = node_argv(argv, extra, line)
        try:
            _, parsed = parse_argv(mine, line)
        except ArgvError as exc:
            raise DomainError(
                "nodes", f"node {name}'s argv does not parse back: {exc}", rule="argv_roundtrip"
            ) from None
        if parsed != {**base, **extra}:
            raise DomainError(
                "nodes",
                f"node {name}'s argv parses back to other arguments than the ones validated",
                rule="argv_roundtrip",
            )
        argvs[name], expected[name] = mine, parsed
    return argvs, expected
