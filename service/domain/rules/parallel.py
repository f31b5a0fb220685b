"""Parallelism rules: tensor/pipeline/expert parallel sizes against the model and the hardware
(vllm 0.33.0 vllm/config/model.py:1557-1564; vllm/model_executor/layers/linear.py:1065-1071;
vllm/config/parallel.py:1054-1077)."""

from __future__ import annotations

from ..context import LaunchContext
from ..findings import Finding
from ..model_facts import divisors, kv_heads_ok
from . import Emit, rule
from .gating import whole


def valid_tp_sizes(ctx: LaunchContext, limit: int | None = None) -> list[int]:
    """TP sizes up to ``limit`` (default: GPUs per node × nodes) that pass both head rules."""
    top = limit or ctx.total_gpus
    f = ctx.facts
    # a valid TP divides the head count: its divisors (O(sqrt(heads))), not every size up to ``top``
    return [t for t in divisors(f.num_attention_heads, top) if kv_heads_ok(f.total_num_kv_heads, t, f.is_mla)]


def tp_candidates(ctx: LaunchContext) -> list[int]:
    """The TP sizes a remedy may offer: those passing both head rules, up to the hardware's GPUs (or the requested
    TP, when a request asks for more than it has)."""
    return valid_tp_sizes(ctx, max(ctx.total_gpus, ctx.tp))


SRC_HEADS = (
    "vllm 0.33.0 vllm/config/model.py:1557-1564 (text model); vllm/distributed/utils.py:51-55 (divide: "
    "vision tower), models/intern_vit.py (replicated fallback)"
)
REPLICATED_FALLBACK_TOWERS = {"intern_vit_6b", "intern_vit", "internvit"}


@rule("tp_heads_divisible", severity="error", source=SRC_HEADS)
def tp_heads_divisible(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Attention heads must be divisible by tensor_parallel_size: the text model's, and a multimodal model's vision
    tower's (it is TP-sharded too; InternViT towers fall back to replicated attention instead of failing and are
    exempt).

    vLLM: "Total number of attention heads ({heads}) must be divisible by tensor parallel size ({tp})."
    """
    return [f for f in (_text_heads(ctx, emit), _vision_heads(ctx, emit)) if f is not None]


def _text_heads(ctx: LaunchContext, emit: Emit) -> Finding | None:
    heads, tp = ctx.facts.num_attention_heads, ctx.tp
    if heads % tp == 0:
        return None
    valid = valid_tp_sizes(ctx)
    return emit.error(
        "tp_heads_divisible",
        f"Total number of attention heads ({heads}) must be divisible by tensor parallel size ({tp}). "
        f"Valid tensor_parallel_size on {ctx.total_gpus} GPU(s): {valid}.",
        remedy={"tensor_parallel_size": valid},
        field="engine_args.tensor_parallel_size",
        num_attention_heads=heads,
    )


def _vision_heads(ctx: LaunchContext, emit: Emit) -> Finding | None:
    vis = ctx.facts.vision
    tp = ctx.tp
    if vis is None or not vis.num_attention_heads or tp == 1:
        return None
    if (vis.model_type or "").lower() in REPLICATED_FALLBACK_TOWERS:
        return None
    heads = vis.num_attention_heads
    if heads % tp == 0:
        return None
    ok = [t for t in tp_candidates(ctx) if heads % t == 0]
    return emit.error(
        "tp_heads_divisible",
        f"{heads} is not divisible by {tp}: the vision tower ({vis.model_type or 'vision_config'}) has {heads} "
        f"attention heads, which tensor_parallel_size={tp} cannot split. Valid tensor_parallel_size: {ok}.",
        remedy={"tensor_parallel_size": ok},
        field="engine_args.tensor_parallel_size",
        vision_heads=heads,
    )


SRC_KV = (
    "vllm 0.33.0 vllm/model_executor/layers/linear.py:1065-1071; models/llama.py:145-155; replication: "
    "vllm/config/model.py:1663-1683"
)


@rule("tp_kv_heads", "tp_kv_replication", severity="error", source=SRC_KV)
def tp_kv_heads(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """KV heads must be divisible by TP (TP ≤ KV heads) or divide it (TP > KV heads, each KV head replicated).

    The worker otherwise fails in QKVParallelLinear with a bare ``AssertionError``. When TP > KV heads the launch
    works but KV heads are replicated, so the KV cache per GPU stops shrinking (``tp_kv_replication`` warning).
    MLA models keep one latent KV head on every rank and are exempt.
    """
    f, tp = ctx.facts, ctx.tp
    if f.is_mla:
        return []
    kv = f.total_num_kv_heads
    if not kv_heads_ok(kv, tp, False):
        valid = valid_tp_sizes(ctx)
        relation = "divisible by" if tp <= kv else "a divisor of"
        return [
            emit.error(
                "tp_kv_heads",
                f"{kv} KV heads must be {relation} tensor_parallel_size {tp} "
                f"({kv} % {tp} = {kv % tp}, {tp} % {kv} = {tp % kv}); the worker would fail with an AssertionError. "
                f"Valid tensor_parallel_size on {ctx.total_gpus} GPU(s): {valid}.",
                remedy={"tensor_parallel_size": valid},
                field="engine_args.tensor_parallel_size",
                num_key_value_heads=kv,
            )
        ]
    if tp > kv:
        return [
            emit.warning(
                "tp_kv_replication",
                f"tensor_parallel_size {tp} > {kv} KV heads: each KV head is replicated {tp // kv}x, so KV cache per GPU "
                f"no longer shrinks beyond TP={kv}.",
                remedy={"tensor_parallel_size": [t for t in valid_tp_sizes(ctx) if t <= kv][-1:] or None},
                field="engine_args.tensor_parallel_size",
                replicas=tp // kv,
            )
        ]
    return []


SRC_WORLD = "vllm 0.33.0 vllm/config/parallel.py:1054-1077; v1/worker/gpu_worker.py:486-489"


@rule("world_size_exceeds_gpus", severity="error", source=SRC_WORLD)
def world_size_exceeds_gpus(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """World size (TP × PP) × data_parallel_size must fit the GPUs: per node when one node, across nodes when
    several nodes are configured (Ray backend or ``--nnodes``); in the data-parallel multi-node form
    (``--data-parallel-size-local`` below ``data_parallel_size``) each node's local ranks × TP × PP."""
    a = ctx.args
    # a rank's world is PP × TP × PCP (vllm 0.33.0 vllm/config/parallel.py:964-968; PCP since 0.13.0 parallel.py:504-508)
    pcp = max(1, whole(a.get("prefill_context_parallel_size")) or 1)
    world = a.world_size * pcp * a.data_parallel_size
    dp_local = a.get("data_parallel_size_local")
    if ctx.nodes > 1 and dp_local is not None and dp_local < a.data_parallel_size:
        # the data-parallel multi-node form: each node runs dp_local of the DP ranks, each TP × PP GPUs
        # (vllm 0.33.0 vllm/engine/arg_utils.py:2486-2510; v1/worker/gpu_worker.py:486-489)
        world = a.world_size * pcp * dp_local
        capacity, where = ctx.gpus_per_node, f"each node ({ctx.gpus_per_node} GPUs; DP local {dp_local})"
    elif ctx.nodes > 1:
        multi = a.get("distributed_executor_backend") in ("ray", "external_launcher") or int(a.get("nnodes", 1)) > 1
        capacity = ctx.total_gpus if multi else ctx.gpus_per_node
        where = f"{ctx.nodes} nodes × {ctx.gpus_per_node} GPUs" if multi else f"one node ({ctx.gpus_per_node} GPUs; "
        if not multi:
            where += "multi-node needs --distributed-executor-backend ray or --nnodes)"
    else:
        capacity, where = ctx.gpus_per_node, f"this node ({ctx.gpus_per_node} GPUs)"
    if world <= capacity:
        return []
    valid = [t for t in valid_tp_sizes(ctx, capacity) if t * a.pipeline_parallel_size * pcp <= capacity]
    with_pcp = f" × PCP {pcp}" if pcp > 1 else ""
    return [
        emit.error(
            "world_size_exceeds_gpus",
            f"World size ({world} = TP {a.tensor_parallel_size} × PP {a.pipeline_parallel_size}{with_pcp} × DP "
            f"{a.data_parallel_size}) is larger than the number of available GPUs ({capacity}) in {where}.",
            remedy={"tensor_parallel_size": valid, "max_gpus": capacity},
            field="engine_args.tensor_parallel_size",
        )
    ]


SRC_SHARDED = "vllm 0.33.0 vllm/model_executor/model_loader/sharded_state_loader.py:190-252; docs/operating.md §2"


@rule("ckpt_tp_mismatch", severity="error", source=SRC_SHARDED)
def ckpt_tp_mismatch(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """A pre-sharded checkpoint (saved per rank at one TP × PP) must be loaded at exactly that TP and PP.

    vLLM has no explicit check: a larger TP fails on missing files, a smaller TP loads silently wrong weights.
    """
    ck = ctx.request.model.checkpoint
    if ck.layout != "tp_sharded":
        return []
    saved_tp, saved_pp = ck.tensor_parallel_size or 1, ck.pipeline_parallel_size or 1
    if (saved_tp, saved_pp) == (ctx.tp, ctx.pp):
        return []
    consequence = (
        "ranks without shard files fail to load"
        if ctx.tp > saved_tp
        else ("each rank would load a smaller tensor into a larger parameter: silently wrong weights")
    )
    return [
        emit.error(
            "ckpt_tp_mismatch",
            f"Checkpoint is pre-sharded for tensor_parallel_size={saved_tp}, pipeline_parallel_size={saved_pp} but the "
            f"launch asks for TP={ctx.tp}, PP={ctx.pp}: {consequence}. Launch at the checkpoint's TP/PP or re-merge it.",
            remedy={"tensor_parallel_size": saved_tp, "pipeline_parallel_size": saved_pp},
            field="engine_args.tensor_parallel_size",
        )
    ]
