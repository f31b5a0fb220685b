"""Per-rank shapes of the text model's tensor-parallel linear layers (no rules here; quant_alignment and
parallel_extras read it).

Column-parallel layers split their output N over the TP ranks, row-parallel layers split their input K
(vllm 0.33.0 vllm/model_executor/layers/linear.py:497, 502, 1065-1071, 1708). MoE expert weights split over
TP × DP ranks without expert parallel and are not split with it (fused_moe/config.py:1106-1114, 1198-1232).
Layer names follow vLLM's module prefixes (``model.layers.N.self_attn.o_proj``) so checkpoint ignore lists
(``modules_to_not_convert``, compressed-tensors ``ignore``) can be matched against them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..context import LaunchContext
from ..linear_shapes import CheckpointLinear, ModuleShapes, checkpoint_linears
from ..model_facts import ModelFacts, kv_heads_ok

SHAPES_TENSORS = "checkpoint tensors"
SHAPES_CONFIG = "config.json"


@dataclass(frozen=True)
class Linear:
    """One linear layer as one TP rank holds it.

    ``kind``: ``column`` (output split) or ``row`` (input split); ``full_in``/``full_out`` are the unsplit sizes;
    ``parts_out`` the per-rank output partitions (QKV: q, k, v; gate_up: gate, up); ``in_rank`` the per-rank input;
    ``moe`` marks routed-expert weights; ``ranks`` is how many ways the layer is split (TP, or TP × DP for
    experts without EP, 1 with EP); ``exact`` is False when the split is not whole (a divisibility rule reports it).
    """

    name: str
    kind: str
    full_in: int
    full_out: int
    in_rank: int
    parts_out: tuple[int, ...]
    ranks: int
    moe: bool = False
    exact: bool = True
    # from a checkpoint's tensors (``checkpoint_layers``): the tensor that shows the widths and its scale tensor
    tensor: str | None = None
    shape: tuple[int, ...] | None = None
    scale: str | None = None
    scale_shape: tuple[int, ...] | None = None
    group_size: int | None = None  # the module's quant group from its scales (-1: one group)
    quantized: str | None = None  # the module's scheme from its tensors (tensor_format): gptq, awq, fp8, none, …
    block: bool = False  # FP8 scales per block

    @property
    def merged(self) -> bool:
        """QKV or gate/up: several output partitions (linear.py:500-504)."""
        return self.kind == "column" and len(self.parts_out) > 1

    def shown(self) -> str:
        """The layer for a message: its tensor and shape (and its scale's) when read from the checkpoint."""
        if self.tensor is None:
            return self.name
        scale = f", {self.scale.rsplit('.', 1)[-1]} {list(self.scale_shape or ())}" if self.scale else ""
        return f"{self.tensor} {list(self.shape or ())}{scale}"


def _split(n: int, ranks: int) -> tuple[int, bool]:
    return n // ranks, n % ranks == 0


def dense_mlp_present(f: ModelFacts) -> bool:
    """Does the text model have dense (non-expert) MLP layers? All layers of a dense model; DeepSeek-style
    ``first_k_dense_replace``; Qwen-MoE ``mlp_only_layers`` / ``decoder_sparse_step`` > 1; a ``moe_layer_freq``
    list with dense entries. Mixtral / gpt-oss / Qwen3-MoE without those keys: none."""
    if not f.is_moe:
        return True
    t = f.raw_text_config
    if f.first_k_dense_replace > 0:
        return True
    if t.get("mlp_only_layers"):
        return True
    step = t.get("decoder_sparse_step")
    if isinstance(step, int) and step > 1:
        return True
    freq = t.get("moe_layer_freq")
    if isinstance(freq, list) and any(not x for x in freq):
        return True
    return False


def shared_expert_size(f: ModelFacts) -> int | None:
    """Intermediate width of the shared expert MLP (a plain TP-sharded MLP): Qwen-MoE
    ``shared_expert_intermediate_size``; DeepSeek-style ``n_shared_experts × moe_intermediate_size``."""
    if not f.is_moe:
        return None
    if f.shared_expert_intermediate_size:
        return f.shared_expert_intermediate_size
    if f.n_shared_experts and f.moe_intermediate_size:
        return f.n_shared_experts * f.moe_intermediate_size
    return None


def moe_ranks(ctx: LaunchContext) -> int:
    """How many ways routed-expert weights are split: TP × DP without EP, 1 (experts whole) with EP active."""
    a = ctx.args
    flat = a.tensor_parallel_size * a.data_parallel_size
    if a.enable_expert_parallel and flat > 1:
        return 1
    return flat


def linear_layers(ctx: LaunchContext, tp: int | None = None) -> list[Linear]:
    """The distinct TP-sharded linear layer shapes of the text model at ``tp`` (default: the request's TP)."""
    f = ctx.facts
    tp = tp or ctx.tp
    hidden = f.hidden_size
    out: list[Linear] = []
    attn = "model.layers.0.self_attn"
    if f.is_mla:
        heads = f.num_attention_heads
        nope, rope = f.qk_nope_head_dim or 0, f.qk_rope_head_dim or 0
        v = f.v_head_dim or 0
        q_in = f.q_lora_rank or hidden
        hq, ok = _split(heads, tp)
        if nope + rope:
            out.append(
                Linear(
                    f"{attn}.q_b_proj" if f.q_lora_rank else f"{attn}.q_proj",
                    "column",
                    q_in,
                    heads * (nope + rope),
                    q_in,
                    (hq * (nope + rope),),
                    tp,
                    exact=ok,
                )
            )
        if f.kv_lora_rank and nope + v:
            out.append(
                Linear(
                    f"{attn}.kv_b_proj",
                    "column",
                    f.kv_lora_rank,
                    heads * (nope + v),
                    f.kv_lora_rank,
                    (hq * (nope + v),),
                    tp,
                    exact=ok,
                )
            )
        if v:
            out.append(Linear(f"{attn}.o_proj", "row", heads * v, hidden, hq * v, (hidden,), tp, exact=ok))
    else:
        heads, kv, hd = f.num_attention_heads, f.total_num_kv_heads, f.head_dim
        hq, ok_q = _split(heads, tp)
        kv_rank = max(1, kv // tp)
        ok_kv = kv_heads_ok(kv, tp, False)
        out.append(
            Linear(
                f"{attn}.qkv_proj",
                "column",
                hidden,
                (heads + 2 * kv) * hd,
                hidden,
                (hq * hd, kv_rank * hd, kv_rank * hd),
                tp,
                exact=ok_q and ok_kv,
            )
        )
        out.append(Linear(f"{attn}.o_proj", "row", heads * hd, hidden, hq * hd, (hidden,), tp, exact=ok_q))

    def mlp(prefix: str, inter: int, ranks: int, moe: bool = False) -> None:
        per, ok = _split(inter, ranks)
        out.append(Linear(f"{prefix}.gate_up_proj", "column", hidden, 2 * inter, hidden, (per, per), ranks, moe, ok))
        out.append(Linear(f"{prefix}.down_proj", "row", inter, hidden, per, (hidden,), ranks, moe, ok))

    if f.intermediate_size and dense_mlp_present(f):
        mlp("model.layers.0.mlp", f.intermediate_size, tp)
    shared = shared_expert_size(f)
    if shared:
        name = "shared_expert" if f.shared_expert_intermediate_size else "shared_experts"
        mlp(f"model.layers.{max(f.first_k_dense_replace, 0)}.mlp.{name}", shared, tp)
    if f.is_moe and f.moe_intermediate_size:
        ranks = moe_ranks(ctx) if tp == ctx.tp else tp * ctx.args.data_parallel_size
        mlp(f"model.layers.{max(f.first_k_dense_replace, 0)}.mlp.experts.0", f.moe_intermediate_size, ranks, moe=True)
    return out


def ignored(name: str, patterns: list[str] | None, mode: str) -> bool:
    """Is layer ``name`` excluded from quantization? ``mode`` ``substring`` (AWQ/GPTQ ``modules_to_not_convert``,
    FP8 ``ignored_layers``) or ``ct`` (compressed-tensors ``ignore``: exact name or ``re:`` regex, re.match)."""
    for p in patterns or ():
        if not isinstance(p, str):
            continue
        if mode == "ct":
            if p.startswith("re:"):
                try:
                    if re.match(p[3:], name):
                        return True
                except re.error:
                    continue
            elif p == name or name.endswith("." + p):
                return True
        elif p and p in name:
            return True
    return False


def checkpoint_entries(ctx: LaunchContext) -> list[CheckpointLinear] | None:
    """The checkpoint's own linear layouts when the request carries them (a manifest's ``tensors.linears``) for a
    merged checkpoint and they name modules of known partitioning; None otherwise (config.json is read instead)."""
    key = "checkpoint_linears"
    if key not in ctx.notes:
        m = ctx.request.model
        found = None
        if m.tensor_linears is not None and m.checkpoint.layout == "merged":
            entries = [ModuleShapes.from_dict(x.model_dump()) for x in m.tensor_linears]
            found = checkpoint_linears(entries, mla=ctx.facts.is_mla) or None
        ctx.notes[key] = found
    return ctx.notes[key]  # type: ignore[no-any-return]


def shapes_source(ctx: LaunchContext) -> str:
    """Where the alignment rules read the layers' sizes: the checkpoint's tensors or config.json."""
    return SHAPES_TENSORS if checkpoint_entries(ctx) is not None else SHAPES_CONFIG


def _from_tensors(c: CheckpointLinear, tp: int, moe_split: int, kv_heads: int) -> Linear | None:
    """One checkpoint module as a rank holds it at ``tp`` (``moe_split``: how many ways experts split)."""
    if c.kind == "replicated":
        return None
    ranks = moe_split if c.expert else tp
    if c.kind == "row":
        in_rank, ok = _split(c.full_in, ranks)
        kind, parts_out = "row", (c.full_out,)  # type: tuple[str, tuple[int, ...]]
    else:
        in_rank, kind = c.full_in, "column"
        if c.leaf in ("k_proj", "v_proj") and not c.expert and kv_heads:
            # KV heads split over TP, or replicated when TP exceeds them (linear.py:1065-1071)
            per, ok = _split(c.full_out, min(ranks, kv_heads))
            ok = ok and kv_heads_ok(kv_heads, ranks, False)
        else:
            per, ok = _split(c.full_out, ranks)
        # a merged layer's parts (QKV, gate/up) are checkpoint modules of their own: two parts mark it merged
        parts_out = (per, per) if c.kind == "merged" else (per,)
    s = c.scheme
    return Linear(
        c.module.first,
        kind,
        c.full_in,
        c.full_out,
        in_rank,
        parts_out,
        ranks,
        c.expert,
        ok,
        tensor=c.tensor,
        shape=c.shape,
        scale=c.scale,
        scale_shape=c.scale_shape,
        group_size=s.group_size if s is not None else None,
        quantized=s.scheme if s is not None else None,
        block=s is not None and s.granularity == "block",
    )


def checkpoint_layers(ctx: LaunchContext, tp: int | None = None) -> list[Linear] | None:
    """``linear_layers`` from the checkpoint's tensors: every recorded layout of known partitioning at ``tp``; None
    when the request carries none."""
    entries = checkpoint_entries(ctx)
    if entries is None:
        return None
    tp = tp or ctx.tp
    split = moe_ranks(ctx) if tp == ctx.tp else tp * ctx.args.data_parallel_size
    out = [_from_tensors(c, tp, split, ctx.facts.total_num_kv_heads) for c in entries]
    return [x for x in out if x is not None]
