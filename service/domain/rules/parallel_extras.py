"""More parallelism rules: MLP and vocabulary splits, pipeline stages vs layers, expert parallel on dense models,
EPLB, context parallel, the Ray-only nsight option and multi-node settings (data-parallel launch options:
data_parallel.py) (vllm 0.33.0 vllm/model_executor/layers/linear.py:497,
502, 1708; vocab_parallel_embedding.py:286-306; vllm/distributed/utils.py:198-241; vllm/config/parallel.py:570-592,
1106-1114; vllm/engine/arg_utils.py:2390-2465)."""

from __future__ import annotations

import re
from typing import Any

from ..context import LaunchContext
from ..findings import Finding
from ..memory import pp_partition
from ..model_facts import padded_vocab
from . import Emit, rule
from .gating import at_least, effective, for_line, lax_int, lax_true, registry_arch, vllm_checks, whole
from .parallel import tp_candidates
from .shapes import dense_mlp_present, moe_ranks, shared_expert_size

SRC_MLP = "vllm 0.33.0 vllm/model_executor/layers/linear.py:497, 502, 1708; fused_moe/config.py:1352"
SRC_VOCAB = "vllm 0.33.0 vllm/model_executor/layers/vocab_parallel_embedding.py:36, 95-97, 286-306"
SRC_PP_LAYERS = "vllm 0.33.0 vllm/distributed/utils.py:198-241"
SRC_EP = "vllm 0.33.0 vllm/config/model.py:1498-1503, 1566-1567; vllm/config/parallel.py:570-592"
SRC_EPLB = (
    "vllm 0.33.0 vllm/config/parallel.py:566-592, 975-981 (elastic EP since 0.18.1 parallel.py:394-401; EPLB's "
    "parallelism and num_redundant_experts without EPLB since 0.10.2 config/parallel.py:362-373; the lines per check: "
    "service/data/vllm/checks/check_lines.json)"
)
SRC_DCP = (
    "vllm 0.33.0 vllm/config/parallel.py:594-607 (since 0.10.2 vllm/engine/arg_utils.py:1177-1181; PCP spans since "
    "0.26.0 parallel.py:510-520)"
)
SRC_NSIGHT = (
    "vllm 0.33.0 vllm/config/parallel.py:1137-1141, 1173-1176 (every line: 0.10.2 config/parallel.py:442-444, 0.6.6 "
    "config.py:1341-1343; up to 0.10.2 a world size beyond the node's GPUs defaults to Ray, 0.10.2 parallel.py:384-392; "
    "service/data/vllm/checks/check_lines.json)"
)
SRC_NNODES = "vllm 0.33.0 vllm/config/parallel.py:1106-1114; vllm/engine/arg_utils.py:2390-2420"


def mlp_splits(ctx: LaunchContext, tp: int) -> list[tuple[str, int, int]]:
    """(what, size, ranks) for every MLP width that does not split evenly at ``tp``."""
    f = ctx.facts
    bad = []
    if f.intermediate_size and dense_mlp_present(f) and f.intermediate_size % tp:
        bad.append(("intermediate_size", f.intermediate_size, tp))
    shared = shared_expert_size(f)
    if shared and shared % tp:
        bad.append(("shared expert intermediate size", shared, tp))
    if f.is_moe and f.moe_intermediate_size:
        ranks = moe_ranks(ctx) if tp == ctx.tp else tp * ctx.args.data_parallel_size
        if ranks > 1 and f.moe_intermediate_size % ranks:
            bad.append(("moe_intermediate_size", f.moe_intermediate_size, ranks))
    return bad


@rule("tp_mlp_divisible", severity="error", source=SRC_MLP)
def tp_mlp_divisible(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """The dense MLP width (``intermediate_size``, shared experts included) must be divisible by TP, and the MoE
    expert width by TP × DP when experts are tensor-split (no expert parallel); the worker otherwise fails with
    ``AssertionError: {n} is not divisible by {tp}``."""
    bad = mlp_splits(ctx, ctx.tp)
    if not bad:
        return []
    what, size, ranks = bad[0]
    ok = [t for t in tp_candidates(ctx) if not mlp_splits(ctx, t)]
    remedy: dict[str, Any] = {"tensor_parallel_size": ok}
    hint = ""
    if what == "moe_intermediate_size":
        remedy["enable_expert_parallel"] = True
        hint = " With --enable-expert-parallel the experts are not split."
    return [
        emit.error(
            "tp_mlp_divisible",
            f"{size} is not divisible by {ranks}: {what} {size} cannot be split over {ranks} ranks "
            f"(tensor_parallel_size={ctx.tp}, data_parallel_size={ctx.args.data_parallel_size}).{hint} Valid "
            f"tensor_parallel_size: {ok}.",
            remedy=remedy,
            field="engine_args.tensor_parallel_size",
        )
    ]


@rule("tp_vocab_divisible", severity="error", source=SRC_VOCAB)
def tp_vocab_divisible(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """The vocabulary padded to a multiple of 64 must be divisible by TP (only ever fails for TP sizes that are not
    powers of two, e.g. 3, 5, 6, 7)."""
    vocab, tp = ctx.facts.vocab_size, ctx.tp
    if not vocab or tp == 1:
        return []
    padded = padded_vocab(vocab)
    if padded % tp == 0:
        return []
    ok = [t for t in tp_candidates(ctx) if padded % t == 0]
    return [
        emit.error(
            "tp_vocab_divisible",
            f"{padded} is not divisible by {tp}: the vocabulary ({vocab}, padded to {padded}) cannot be split over "
            f"tensor_parallel_size={tp}. Valid tensor_parallel_size: {ok}.",
            remedy={"tensor_parallel_size": ok},
            field="engine_args.tensor_parallel_size",
        )
    ]


@rule("pp_layers", severity="error", source=SRC_PP_LAYERS)
def pp_layers(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Pipeline stages vs layers: more stages than layers leaves empty stages (error); ``VLLM_PP_LAYER_PARTITION``
    must name one count per stage summing to the layer count (error); an uneven default split is reported (info)."""
    pp, layers = ctx.pp, ctx.facts.num_hidden_layers
    if pp <= 1:
        return []
    env = ctx.request.env.get("VLLM_PP_LAYER_PARTITION")
    # the default split as a remedy (one entry per stage: only when every stage gets a layer, so pp <= layers)
    default = ",".join(map(str, pp_partition(layers, pp))) if pp <= layers else None
    if env:
        try:
            parts = [int(x) for x in env.split(",")]  # the env value is at most 4096 characters
        except ValueError:
            return [
                emit.error(
                    "pp_layers",
                    f"Invalid partition string: {env}",
                    remedy={"env": {"VLLM_PP_LAYER_PARTITION": None}},
                    field="env.VLLM_PP_LAYER_PARTITION",
                )
            ]
        if len(parts) != pp:
            return [
                emit.error(
                    "pp_layers",
                    f"len(partitions)={len(parts)} does not match pp_size={pp}.",
                    remedy={"env": {"VLLM_PP_LAYER_PARTITION": default}},
                    field="env.VLLM_PP_LAYER_PARTITION",
                )
            ]
        if sum(parts) != layers:
            return [
                emit.error(
                    "pp_layers",
                    f"sum(partitions)={sum(parts)} does not match num_hidden_layers={layers}.",
                    remedy={"env": {"VLLM_PP_LAYER_PARTITION": default}},
                    field="env.VLLM_PP_LAYER_PARTITION",
                )
            ]
        return []
    if pp > layers:
        return [
            emit.error(
                "pp_layers",
                f"pipeline_parallel_size={pp} exceeds the model's {layers} layers: some pipeline stages would hold no "
                f"layer.",
                remedy={"pipeline_parallel_size": layers},
                field="engine_args.pipeline_parallel_size",
            )
        ]
    parts = pp_partition(layers, pp)
    if layers % pp:
        return [
            emit.info(
                "pp_layers",
                f"{layers} layers over {pp} pipeline stages split unevenly: {parts} (vLLM adds the remainder to the stages "
                f"before the last; override with VLLM_PP_LAYER_PARTITION).",
                remedy=None,
                field="engine_args.pipeline_parallel_size",
                stages=parts,
            )
        ]
    return []


@rule("ep_requires_moe", "eplb_requires_ep", severity="error", source=SRC_EP)
def ep_requires_moe(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--enable-expert-parallel`` needs a model with experts ("Number of experts in the model must be greater than
    0 when expert parallelism is enabled."); EPLB needs expert parallel (``eplb_requires_ep``)."""
    out = []
    if ctx.args.enable_expert_parallel and not ctx.facts.is_moe:
        out.append(
            emit.error(
                "ep_requires_moe",
                "Number of experts in the model must be greater than 0 when expert parallelism is enabled. "
                f"({ctx.request.model.name or 'this model'} is dense: no num_experts / n_routed_experts / "
                "num_local_experts in config.json.)",
                remedy={"enable_expert_parallel": False},
                field="engine_args.enable_expert_parallel",
            )
        )
    if ctx.args.get("enable_eplb") and not ctx.args.enable_expert_parallel:
        out.append(
            emit.error(
                "eplb_requires_ep",
                "enable_expert_parallel must be True to use EPLB.",
                remedy={"enable_expert_parallel": True},
                field="engine_args.enable_eplb",
            )
        )
    return out


@rule("nnodes", severity="error", source=SRC_NNODES, when=("nnodes",))
def nnodes(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Multi-node ``--nnodes N`` launches: the executor must be mp, uni or external_launcher (not ray), the data
    parallel backend mp, the total world size DP × PP × TP divisible by N, ``--node-rank`` in [0, N), and N no more
    than the nodes the request describes."""
    a = ctx.args
    n = int(a.get("nnodes", 1))
    if n <= 1:
        return []
    out = []
    backend = a.get("distributed_executor_backend")
    if backend is not None and backend not in ("mp", "uni", "external_launcher"):
        out.append(
            emit.error(
                "nnodes",
                "nnodes > 1 can only be set when distributed executor backend is mp, uni or "
                f"external_launcher. (got {backend})",
                remedy={"distributed_executor_backend": "mp"},
                field="engine_args.distributed_executor_backend",
            )
        )
    if a.get("data_parallel_backend") not in (None, "mp"):
        out.append(
            emit.error(
                "nnodes",
                f"--nnodes {n} requires --data-parallel-backend mp (got {a.get('data_parallel_backend')}).",
                remedy={"data_parallel_backend": "mp"},
                field="engine_args.data_parallel_backend",
            )
        )
    world = a.data_parallel_size * a.world_size
    if world % n:
        out.append(
            emit.error(
                "nnodes",
                f"`--nnodes {n}` must evenly divide the total world size ({world} = DP "
                f"{a.data_parallel_size} × PP {a.pipeline_parallel_size} × TP {a.tensor_parallel_size}).",
                remedy={"nnodes": [d for d in range(1, min(world, ctx.nodes) + 1) if world % d == 0]},
                field="engine_args.nnodes",
            )
        )
    rank = a.get("node_rank")
    if rank is not None and not 0 <= int(rank) < n:
        out.append(
            emit.error(
                "nnodes",
                f"`--node-rank` must be between 0 and {n - 1} (got {rank}).",
                remedy={"node_rank": list(range(min(n, ctx.nodes)))},
                field="engine_args.node_rank",
            )
        )
    port = a.get("master_port")
    if port is not None and not 0 <= int(port) <= 65535:
        # only a multi-node launch uses it: tcp://master_addr:master_port (vllm 0.33.0
        # vllm/distributed/parallel_state.py:1875-1878, entrypoints/cli/serve.py:221-223); the socket refuses it
        out.append(
            emit.error(
                "nnodes",
                f"--master-port {port} is no TCP port (0-65535): the nodes of a multi-node launch meet there.",
                remedy={"master_port": 29501},
                field="engine_args.master_port",
            )
        )
    if n > ctx.nodes:
        out.append(
            emit.error(
                "nnodes",
                f"--nnodes {n} but the hardware has {ctx.nodes} node(s).",
                remedy={"nnodes": ctx.nodes},
                field="engine_args.nnodes",
            )
        )
    return out


EPLB_PARALLELISM = {
    (0, 10): "EPLB requires tensor_parallel_size or data_parallel_size to be greater than 1, but got TP={tp},DP={dp}.",
    (0, 26): "EPLB requires tensor, prefill-context, or data parallelism, but got TP={tp}, PCP={pcp}, DP={dp}.",
}


def _redundant_experts(ctx: LaunchContext) -> int:
    """``eplb_config.num_redundant_experts``, overridden by the deprecated ``--num-redundant-experts`` (0.10-0.11
    forward it into the EPLB config before ParallelConfig checks it: 0.10.2 arg_utils.py:1302-1304)."""
    old = whole(ctx.args.get("num_redundant_experts"))
    if old is not None:
        return old
    cfg = ctx.args.get("eplb_config")
    return (lax_int(cfg.get("num_redundant_experts")) or 0) if isinstance(cfg, dict) else 0


@rule("eplb_options", severity="error", source=SRC_EPLB)
def eplb_options(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """EPLB's own conditions: elastic EP needs EPLB and no pipeline parallelism (from 0.18); EPLB with expert
    parallel needs TP, PCP or DP above 1 (from 0.10); ``eplb_config.num_redundant_experts`` needs EPLB (from 0.10)."""
    a = ctx.args
    eplb = bool(a.get("enable_eplb"))
    out: list[tuple[str, dict[str, Any], str]] = []
    if a.get("enable_elastic_ep") and vllm_checks(ctx, "elastic_ep_needs_eplb"):
        if not eplb:
            out.append(
                ("Elastic EP is only supported with enable_eplb=True.", {"enable_eplb": True}, "enable_elastic_ep")
            )
        elif ctx.pp > 1:
            text = f"Elastic EP is not supported with pipeline parallelism (pipeline_parallel_size={ctx.pp})."
            out.append((text, {"pipeline_parallel_size": 1}, "pipeline_parallel_size"))
    pcp = int(a.get("prefill_context_parallel_size", 1))
    needs_parallelism = vllm_checks(ctx, "eplb_needs_parallelism")
    if eplb and a.enable_expert_parallel and ctx.tp * pcp * a.data_parallel_size <= 1 and needs_parallelism:
        text = for_line(ctx, EPLB_PARALLELISM).format(tp=ctx.tp, pcp=pcp, dp=a.data_parallel_size)
        out.append(
            (
                text,
                {"enable_eplb": False, "tensor_parallel_size": [t for t in tp_candidates(ctx) if t > 1]},
                "enable_eplb",
            )
        )
    redundant = _redundant_experts(ctx)
    if not eplb and redundant and vllm_checks(ctx, "eplb_redundant_needs_eplb"):
        text = (
            f"num_redundant_experts is set to {redundant} but EPLB is not enabled. Either enable EPLB or unset "
            "num_redundant_experts."
        )
        out.append((text, {"enable_eplb": True}, "eplb_config"))
    return [emit.error("eplb_options", t, remedy=r, field=f"engine_args.{f}") for t, r, f in out]


@rule(
    "dcp_tp_divisible",
    severity="error",
    source=SRC_DCP,
    when=("decode_context_parallel_size",),
)
def dcp_tp_divisible(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Decode context parallel reuses the TP ranks: ``tensor_parallel_size`` must be divisible by
    ``decode_context_parallel_size`` (from 0.10); with prefill context parallel (from 0.26) DCP is 1, PCP or
    TP × PCP."""
    dcp, tp = ctx.args.decode_context_parallel_size, ctx.tp
    pcp = int(ctx.args.get("prefill_context_parallel_size", 1))
    if dcp <= 1 or not at_least(ctx, (0, 10)):
        return []
    if pcp > 1 and at_least(ctx, (0, 26)):
        valid = sorted({1, pcp, tp * pcp})
        if dcp in valid:
            return []
        text = (
            "When PCP is enabled, DCP must be disabled, span the PCP axis, or span the full TP x PCP axis. "
            f"Got TP={tp}, PCP={pcp}, DCP={dcp}; valid DCP sizes are {valid}."
        )
        return [
            emit.error(
                "dcp_tp_divisible",
                text,
                remedy={"decode_context_parallel_size": valid},
                field="engine_args.decode_context_parallel_size",
            )
        ]
    if tp % dcp == 0:
        return []
    return [
        emit.error(
            "dcp_tp_divisible",
            f"tp_size={tp} must be divisible by dcp_size={dcp}.",
            remedy={"decode_context_parallel_size": [d for d in range(1, tp + 1) if tp % d == 0]},
            field="engine_args.decode_context_parallel_size",
        )
    ]


SRC_DCP_COMM = (
    "vllm 0.24.0 vllm/config/parallel.py:509-512 (ParallelConfig._validate_parallel_config); "
    "service/data/vllm/checks/check_lines.json"
)


@rule("dcp_comm_backend", severity="error", source=SRC_DCP_COMM, when=("dcp_comm_backend",))
def dcp_comm_backend(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--dcp-comm-backend a2a`` exchanges the decode context parallel shards all-to-all: without decode context
    parallelism (DCP 1) the release refuses it."""
    if ctx.args.get("dcp_comm_backend") != "a2a" or ctx.args.decode_context_parallel_size > 1:
        return []
    if not vllm_checks(ctx, "dcp_a2a_needs_dcp"):
        return []
    dcp = [d for d in range(2, ctx.tp + 1) if ctx.tp % d == 0]
    return [
        emit.error(
            "dcp_comm_backend",
            "dcp_comm_backend='a2a' requires decode_context_parallel_size > 1. "
            f"(decode_context_parallel_size is {ctx.args.decode_context_parallel_size}.)",
            remedy={"drop": ["dcp_comm_backend"], **({"decode_context_parallel_size": dcp} if dcp else {})},
            field="engine_args.dcp_comm_backend",
        )
    ]


SRC_HC_SP = (
    "vllm 0.33.0 vllm/config/model.py:1546-1556 (verify_with_parallel_config); the model class implements "
    "SupportsHCSP (model_executor/models/interfaces.py:918-933; the generated registry); "
    "service/data/vllm/checks/check_lines.json"
)


@rule("hc_sp_options", severity="error", source=SRC_HC_SP, when=("enable_hc_sp",))
def hc_sp_options(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--enable-hc-sp`` with TP > 1 needs a model class that supports it and no pipeline parallelism."""
    if not lax_true(ctx.args.get("enable_hc_sp")) or ctx.tp <= 1 or not vllm_checks(ctx, "hc_sp_model_support"):
        return []
    arch = registry_arch(ctx)
    if arch is not None and arch.supports_hc_sp is False:
        text = f"--enable-hc-sp is not supported for this model ({arch.name} does not implement SupportsHCSP)."
        return [emit.error("hc_sp_options", text, remedy={"enable_hc_sp": False}, field="engine_args.enable_hc_sp")]
    if arch is not None and arch.supports_hc_sp and ctx.pp != 1:
        return [
            emit.error(
                "hc_sp_options",
                "--enable-hc-sp requires PP=1",
                remedy={"pipeline_parallel_size": 1, "enable_hc_sp": False},
                field="engine_args.pipeline_parallel_size",
            )
        ]
    return []


def uses_ray(ctx: LaunchContext) -> bool:
    """Workers run under Ray: ``--distributed-executor-backend ray``, or no backend with a Ray data-parallel
    backend on one node and more than one GPU in all (vllm 0.33.0 vllm/config/parallel.py:1054-1085); up to 0.10 also
    a world size beyond one node's GPUs (0.10.2 config/parallel.py:384-392)."""
    a = ctx.args
    backend = a.get("distributed_executor_backend")
    if backend is not None:
        return bool(backend == "ray")
    if vllm_checks(ctx, "ray_default_beyond_node") and a.world_size > ctx.gpus_per_node:
        return True
    many = a.world_size * a.data_parallel_size > 1
    return many and bool(a.get("data_parallel_backend") == "ray") and int(a.get("nnodes", 1)) <= 1


@rule(
    "nsight_requires_ray",
    severity="error",
    source=SRC_NSIGHT,
    when=("ray_workers_use_nsight",),
)
def nsight_requires_ray(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--ray-workers-use-nsight`` profiles Ray workers: the workers must run under Ray (every line)."""
    if not ctx.args.get("ray_workers_use_nsight") or not vllm_checks(ctx, "nsight_requires_ray") or uses_ray(ctx):
        return []
    return [
        emit.error(
            "nsight_requires_ray",
            "Unable to use nsight profiling unless workers run with Ray. (distributed_executor_backend is "
            f"{ctx.args.get('distributed_executor_backend') or 'not set: mp or uni'}.)",
            remedy={"distributed_executor_backend": "ray", "ray_workers_use_nsight": False},
            field="engine_args.ray_workers_use_nsight",
        )
    ]


SRC_NUMA = (
    "vllm 0.33.0 vllm/config/parallel.py:35, 484-521 (the entries' field validators), 556-561 (since 0.21.0 "
    "parallel.py:32, 374-409, 439-444, with the options)"
)
# vllm 0.33.0 vllm/config/parallel.py:35 (Python's re: \d is any Unicode digit, as there)
_NUMACTL_CPUSET = re.compile(r"^\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*$")


def _numa_cpus_problem(value: Any) -> str | None:
    """ParallelConfig._validate_numa_bind_cpus's message for the entries of ``--numa-bind-cpus``, else None."""
    entries = [value] if isinstance(value, str) else value
    if not isinstance(entries, list):
        return None
    if not entries:
        return "numa_bind_cpus must not be empty."
    for cpuset in entries:
        if not isinstance(cpuset, str):
            continue  # rendered as its text by Preflight: judged as the parser's value, not here
        if not cpuset:
            return "numa_bind_cpus entries must not be empty."
        if not _NUMACTL_CPUSET.fullmatch(cpuset):
            return "numa_bind_cpus entries must use numactl CPU list syntax, for example '0-3' or '0,2,4-7'."
        for part in cpuset.split(","):
            start, _, end = part.partition("-")
            if end and int(start) > int(end):
                return f"numa_bind_cpus ranges must be ascending, but got '{cpuset}'."
    return None


def _numa_nodes_problem(value: Any) -> str | None:
    """ParallelConfig._validate_numa_bind_nodes's message for ``--numa-bind-nodes``, else None."""
    if not isinstance(value, list):
        return None
    if not value:
        return "numa_bind_nodes must not be empty."
    if any(n is not None and n < 0 for n in map(lax_int, value)):
        return "numa_bind_nodes must contain non-negative integers."
    return None


@rule("numa_bind", severity="error", source=SRC_NUMA, when=("numa_bind_nodes", "numa_bind_cpus"))
def numa_bind(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--numa-bind-nodes`` / ``--numa-bind-cpus`` only say where to bind: they need ``--numa-bind`` (from 0.21);
    their entries must be non-negative node numbers and numactl CPU lists (``0-3``, ``0,2,4-7``, ranges ascending)."""
    given = ctx.args.given
    if ("numa_bind_nodes" not in given and "numa_bind_cpus" not in given) or not at_least(ctx, (0, 21)):
        return []
    a = ctx.args
    out = []
    for name, check in (("numa_bind_nodes", _numa_nodes_problem), ("numa_bind_cpus", _numa_cpus_problem)):
        problem = check(a.values.get(name))
        if problem:
            out.append(emit.error("numa_bind", f"{name}: Value error, {problem}", field=f"engine_args.{name}"))
    set_ = [n for n in ("numa_bind_nodes", "numa_bind_cpus") if a.values.get(n) is not None]
    if not set_ or a.get("numa_bind"):
        return out
    return out + [
        emit.error(
            "numa_bind",
            f"numa_bind_nodes and numa_bind_cpus require numa_bind=True. (--{set_[0].replace('_', '-')} is set, "
            "--numa-bind is not.)",
            remedy={"numa_bind": True},
            field=f"engine_args.{set_[0]}",
        )
    ]


SRC_UBATCH = (
    "vllm 0.33.0 vllm/config/vllm.py:2180-2204; vllm/config/parallel.py:644-650, 1178-1187 (--enable-dbo with a "
    "DeepEP all2all backend since 0.11.2 config/vllm.py:680-690, the backend read from VLLM_ALL2ALL_BACKEND when "
    "unset up to 0.13.0 parallel.py:493-500; --ubatch-size > 1 as well since 0.18.1 vllm.py:1127-1138; nixl_ep since "
    "0.24.0 vllm.py:1427-1442; ROCm's allgather_reducescatter in 0.33; the token thresholds since 0.30.0 "
    "parallel.py:1091-1100)"
)
UBATCH_BACKENDS = {
    (0, 11): ("deepep_low_latency", "deepep_high_throughput"),
    (0, 24): ("deepep_low_latency", "deepep_high_throughput", "nixl_ep"),
}


def _ubatch_backends(ctx: LaunchContext) -> tuple[str, ...]:
    """The all2all backends microbatching takes on the launch's platform (vllm.py:2181-2194: ROCm adds the
    allgather_reducescatter all2all in 0.33)."""
    backends = for_line(ctx, UBATCH_BACKENDS)
    if at_least(ctx, (0, 33)) and ctx.gpu.vendor.upper() == "AMD":
        backends += ("allgather_reducescatter",)
    return backends


def _ubatch_problems(ctx: LaunchContext, dbo: bool, ubatches: int) -> list[tuple[str, dict[str, Any], str]]:
    a = ctx.args
    out: list[tuple[str, dict[str, Any], str]] = []
    backend = a.values.get("all2all_backend") if "all2all_backend" in a.given else None
    if backend is None and at_least(ctx, (0, 18)):
        backend = "allgather_reducescatter"  # the default; up to 0.15 the node's VLLM_ALL2ALL_BACKEND may set it
    backends = _ubatch_backends(ctx)
    if isinstance(backend, str) and backend not in backends:
        where = " on this platform" if at_least(ctx, (0, 33)) else ""
        text = (
            f"Microbatching currently only supports the {', '.join(backends)} all2all backends{where}. {backend} is "
            f"not supported. To fix use one of {', '.join('--all2all-backend=' + b for b in backends)} and install "
            "the matching kernels."
        )
        out.append((text, {"all2all_backend": list(backends)}, "all2all_backend" if dbo else "ubatch_size"))
    thresholds = [whole(effective(ctx, n)) for n in ("dbo_decode_token_threshold", "dbo_prefill_token_threshold")]
    known = [t for t in thresholds if t is not None]  # a value of another type is the option's own type error
    if at_least(ctx, (0, 30)) and known and min(known) < ubatches:
        text = (
            "dbo_decode_token_threshold and dbo_prefill_token_threshold must be at least the number of microbatches "
            f"({ubatches})."
        )
        name = (
            "dbo_decode_token_threshold" if "dbo_decode_token_threshold" in a.given else "dbo_prefill_token_threshold"
        )
        out.append((text, {"dbo_decode_token_threshold": ubatches, "dbo_prefill_token_threshold": ubatches}, name))
    return out


@rule("microbatching", severity="error", source=SRC_UBATCH, when=("enable_dbo", "ubatch_size"))
def microbatching(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Microbatching (``--enable-dbo``, from 0.18 also ``--ubatch-size`` > 1) needs an all2all backend that
    overlaps communication: DeepEP (from 0.11), nixl_ep (from 0.24); and from 0.30 both DBO token thresholds at
    least the number of microbatches. Up to 0.15 an unset ``--all2all-backend`` came from the node's environment:
    only a given one is judged there."""
    given = ctx.args.given
    if "enable_dbo" not in given and "ubatch_size" not in given:
        return []
    dbo = bool(ctx.args.get("enable_dbo"))
    size = whole(ctx.args.get("ubatch_size")) or 0
    ubatched = dbo or (size > 1 and at_least(ctx, (0, 18)))
    if not ubatched or not at_least(ctx, (0, 11)):
        return []
    problems = _ubatch_problems(ctx, dbo, 2 if dbo else size)
    return [emit.error("microbatching", t, remedy=r, field=f"engine_args.{n}") for t, r, n in problems]


SRC_DCP_KV = (
    "vllm 0.33.0 vllm/config/model.py:1576-1607 (assertions since 0.11.2 config/model.py:1169-1191; these messages "
    "since 0.28.0 model.py:1387-1414); KV heads: transformers_utils/model_arch_config_convertor.py:152-157, 836-876; "
    "use_mla: config/model.py:2068-2082, convertor:294-322"
)
# Model types vLLM reads otherwise (vllm 0.33.0 transformers_utils/model_arch_config_convertor.py): MLA types whose
# use_mla turns the check off (convertor:297-321), and types with their own convertor (convertor:836-876), whose KV
# or attention head counts Preflight does not mirror. The check is skipped for them: a miss, never a false refusal.
DCP_SKIP_TYPES = frozenset(
    {
        "axk1", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_v4", "deepseek_v41", "dots3_note",
        "deepseek_mtp", "k3_dspark", "glm5_next", "glm5_next_text", "glm_moe_dsa", "glm4_moe_lite",
        "glm4_moe_lite_mtp", "kimi_k2", "kimi_linear", "longcat_flash", "pangu_ultra_moe", "pangu_ultra_moe_mtp",
        "bailing_hybrid", "bailing_hybrid_mtp", "bailing_hybrid_v3_mtp", "hy_v4", "hy_v4_mtp",
        "cohere_asr", "dbrx", "diffusion_gemma", "diffusion_gemma_text", "ernie_mtp", "falcon_mamba", "gemma4",
        "gemma4_mtp", "gemma4_text", "gemma4_unified", "gemma4_unified_text", "glm4_moe_mtp", "glm_ocr_mtp",
        "longcat_flash_mtp", "mamba", "mimo_mtp", "mimo_v2", "mimo_v2_flash", "mimo_v2_mtp", "mimo_v2_omni_mtp",
        "moss_audio", "nemotron-nas", "qwen3_5", "qwen3_5_mtp", "qwen3_omni_moe", "qwen3_next_mtp", "qwen4_exp_mtp",
        "step3p5_mtp", "timm_wrapper", "zamba2",
    }
)  # fmt: skip
DCP_KV_TEXT = {
    (0, 11): "tensor parallel size {tp} must be greater than total num kv heads {kv} when enable decode context "
    "parallel for GQA/MQA",
    (0, 28): "Decode context parallelism for GQA/MQA requires `--tensor-parallel-size` ({tp}) to be greater than the "
    "model's total number of KV heads ({kv}). Increase `--tensor-parallel-size` or set "
    "`--decode-context-parallel-size 1`.",
}
DCP_MAX_TEXT = {
    (0, 11): "decode context parallel size must less than or equal to (tensor parallel size {tp} // total num kv "
    "heads {kv}) = {most}, but got {dcp}",
    (0, 28): "`--decode-context-parallel-size` ({dcp}) exceeds the maximum supported value ({most}) for "
    "`--tensor-parallel-size` ({tp}) and {kv} model KV heads.",
}
DCP_Q_TEXT = {
    (0, 11): "Total number of q per kv attn heads ({q}) must be divisible by dcp world size when enable decode "
    "context parallel for GQA ({dcp}).",
    (0, 28): "The model's number of query heads per KV head ({q}) must be divisible by "
    "`--decode-context-parallel-size` ({dcp}) for GQA/MQA.",
}


def _dcp_kv_text(ctx: LaunchContext, dcp: int) -> str | None:
    """vLLM's refusal of DCP on a GQA/MQA model (model.py:1576-1607), or None."""
    tp, kv, heads = ctx.tp, ctx.facts.total_num_kv_heads, ctx.facts.num_attention_heads
    if tp <= kv:
        return for_line(ctx, DCP_KV_TEXT).format(tp=tp, kv=kv)
    most = tp // kv
    if dcp > most:
        return for_line(ctx, DCP_MAX_TEXT).format(tp=tp, kv=kv, most=most, dcp=dcp)
    if (heads // kv) % dcp:
        return for_line(ctx, DCP_Q_TEXT).format(q=heads // kv, dcp=dcp)
    return None


@rule("dcp_kv_heads", severity="error", source=SRC_DCP_KV, when=("decode_context_parallel_size",))
def dcp_kv_heads(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Decode context parallel on a model without MLA (GQA/MQA, from 0.11) splits the KV heads' replicas: TP must
    exceed the KV heads, DCP may not exceed TP // KV heads, and the query heads per KV head must be divisible by DCP.
    Judged where the TP split itself is valid (heads divisible by TP, TP divisible by DCP), as vLLM reaches it."""
    if "decode_context_parallel_size" not in ctx.args.given:
        return []
    dcp, f = ctx.args.decode_context_parallel_size, ctx.facts
    if dcp <= 1 or not at_least(ctx, (0, 11)) or f.is_mla or f.model_type in DCP_SKIP_TYPES:
        return []
    pcp = int(ctx.args.get("prefill_context_parallel_size", 1))
    split_ok = dcp in (pcp, ctx.tp * pcp) if pcp > 1 and at_least(ctx, (0, 26)) else ctx.tp % dcp == 0
    if f.total_num_kv_heads <= 0 or f.num_attention_heads % ctx.tp or not split_ok:
        return []  # no KV heads (Mamba: vLLM divides by zero), or refused before (tp_heads / dcp_tp_divisible)
    text = _dcp_kv_text(ctx, dcp)
    if text is None:
        return []
    ok = [d for d in range(1, ctx.tp + 1) if ctx.tp % d == 0 and (d == 1 or _dcp_kv_text(ctx, d) is None)]
    return [
        emit.error(
            "dcp_kv_heads",
            text,
            remedy={"decode_context_parallel_size": ok},
            field="engine_args.decode_context_parallel_size",
            num_key_value_heads=f.total_num_kv_heads,
        )
    ]
