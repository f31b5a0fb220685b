"""More parallelism rules: MLP and vocabulary splits, pipeline stages vs layers, expert parallel on dense models,
EPLB, external-LB data parallel and multi-node settings (vllm 0.33.0 vllm/model_executor/layers/linear.py:497,
502, 1708; vocab_parallel_embedding.py:286-306; vllm/distributed/utils.py:198-241; vllm/config/parallel.py:570-592,
1106-1114; vllm/engine/arg_utils.py:2390-2465)."""

from __future__ import annotations

from typing import Any

from ..context import LaunchContext
from ..findings import Finding
from ..memory import pp_partition
from ..model_facts import padded_vocab
from . import Emit, rule
from .parallel import tp_candidates
from .shapes import dense_mlp_present, moe_ranks, shared_expert_size

SRC_MLP = "vllm 0.33.0 vllm/model_executor/layers/linear.py:497, 502, 1708; fused_moe/config.py:1352"
SRC_VOCAB = "vllm 0.33.0 vllm/model_executor/layers/vocab_parallel_embedding.py:36, 95-97, 286-306"
SRC_PP_LAYERS = "vllm 0.33.0 vllm/distributed/utils.py:198-241"
SRC_EP = "vllm 0.33.0 vllm/config/model.py:1498-1503, 1566-1567; vllm/config/parallel.py:570-592"
SRC_DP_EXT = "vllm 0.33.0 vllm/engine/arg_utils.py:2456-2465"
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


@rule("dp_external_dense", severity="error", source=SRC_DP_EXT)
def dp_external_dense(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """External-load-balancer data parallel (``--data-parallel-rank`` / ``--data-parallel-external-lb``) is for MoE
    models only."""
    a = ctx.args
    if ctx.facts.is_moe or (a.get("data_parallel_rank") is None and not a.get("data_parallel_external_lb")):
        return []
    return [
        emit.error(
            "dp_external_dense",
            "Non-MoE models do not support external data parallel mode. For external load balancing, launch independent "
            "vLLM instances without --data-parallel-* arguments.",
            remedy={"drop": ["data_parallel_rank", "data_parallel_external_lb"]},
            field="engine_args.data_parallel_rank",
        )
    ]


@rule("nnodes", severity="error", source=SRC_NNODES)
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
