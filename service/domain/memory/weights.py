"""Weights: parameters from config.json, bytes per parameter by quantization, and one GPU's share.

vLLM shards the model over TP ranks (vllm 0.33.0 vllm/model_executor/layers/linear.py:497, 502, 1065-1071, 1708;
vocab_parallel_embedding.py:95-97, 286-306) and MoE experts over TP × DP ranks (fused_moe/config.py:1106-1114);
the pool is sized on the heaviest GPU, the PP stage with the most weight (``stages.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..context import LaunchContext
from ..gpus import GIB
from ..layer_layout import DSV4_TYPES, LayerKind, LayerLayout
from ..model_facts import ModelFacts, QuantConfig, padded_vocab
from ..multimodal import EncoderProfile
from ..rank_weights import RankWeights
from .layer_costs import Cost, Widths, mixer_cost, mlp_cost, part
from .stages import biggest_stage, stage_layers


@dataclass(slots=True)  # built per plan: slots, and not frozen (a frozen __init__ calls object.__setattr__ per field)
class QuantBytes:
    """Bytes per parameter for each class of weight (scales and zero points included)."""

    attention: float
    dense_mlp: float
    experts: float
    embedding: float
    label: str


def _ignored(raw: dict[str, object]) -> list[str]:
    out: list[str] = []
    for key in ("ignore", "modules_to_not_convert", "exclude_modules", "ignored_layers"):
        v = raw.get(key)
        if isinstance(v, list):
            out += [str(x) for x in v]
    q = raw.get("quantization")
    if isinstance(q, dict) and isinstance(q.get("exclude_modules"), list):
        out += [str(x) for x in q["exclude_modules"]]
    return out


def _online_quant_bytes(requested: str, unq: float) -> QuantBytes:
    """Online quantization of an unquantized checkpoint (the shorthands of vllm 0.33.0
    vllm/config/quantization.py:195-227)."""
    r = requested.lower()
    if r in ("fp8", "fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "mxfp8", "modelopt_mxfp8"):
        return QuantBytes(1.0, 1.0, 1.0, unq, f"online {r}: 1 B/param")
    if r in ("int8_per_channel_weight_only", "experts_int8"):
        return QuantBytes(unq, unq, 1.0, unq, f"online {r}: experts 1 B/param")
    if r in ("mxfp4",):
        return QuantBytes(0.5 + 1 / 32, 0.5 + 1 / 32, 0.5 + 1 / 32, unq, "online mxfp4")
    if r == "nvfp4_per_token":
        return QuantBytes(unq, unq, 0.5 + 1 / 16, unq, "online nvfp4 (MoE)")
    if r == "bitsandbytes":
        return QuantBytes(0.5 + 4 / 64, 0.5 + 4 / 64, 0.5 + 4 / 64, unq, "bitsandbytes nf4 (in-flight)")
    return QuantBytes(unq, unq, unq, unq, f"unquantized ({unq:g} B/param)")


def quant_bytes(facts: ModelFacts, requested: str | None, act_bytes: float) -> QuantBytes:
    """Bytes per parameter by weight class for the checkpoint's quantization (or an online method).

    Formats (weights + per-group scales/zeros): fp8 = 1 B (block/channel scales < 0.1 %); int4 grouped (AWQ, GPTQ,
    compressed-tensors WNA16) = 0.5 + (2 B scale + 0.5 B zero) / group; int8 = 1 + 2/group; MXFP4 = 0.5 + 1/32;
    NVFP4 = 0.5 + 1/16; bitsandbytes nf4 = 0.5 + 4/64. Embeddings, lm_head, norms and routers stay in the activation
    dtype. Modules named in ``ignore`` / ``modules_to_not_convert`` (attention, shared experts, dense MLP) stay too.
    """
    q = facts.quant
    unq = float(act_bytes)
    if q is None:
        if requested:
            return _online_quant_bytes(requested, unq)
        return QuantBytes(unq, unq, unq, unq, f"unquantized ({unq:g} B/param)")
    method = q.method
    if method == "experts_int8":
        return QuantBytes(unq, unq, 1.0, unq, "experts int8")
    b = _method_bytes(q, unq)
    experts = b
    if facts.model_type in DSV4_TYPES and method in ("fp8", "deepseek_v4_fp8"):
        # FP8 blocks for every linear, routed experts per ``expert_dtype`` (default fp4 = MXFP4): vllm 0.33.0
        # vllm/models/deepseek_v41/quant_config.py:37-93, the class quantization/__init__.py:120-128 registers
        if facts.raw_text_config.get("expert_dtype", "fp4") == "fp4":
            experts = MXFP4
    ign = " ".join(_ignored(q.raw)).lower()
    attn = unq if ("attn" in ign or method in ("mxfp4", "gpt_oss_mxfp4")) else b
    dense_ignored = any("mlp" in s and "proj" in s and "expert" not in s for s in ign.split())
    dense = unq if dense_ignored and facts.is_moe else b
    label = f"{method}: {b:.4g} B/param" + ("; attention unquantized" if attn == unq and b != unq else "")
    if experts != b:
        label += f"; experts {experts:.4g} B/param"
    if "shared_expert" in ign:
        label += "; shared experts unquantized"
    return QuantBytes(attn, dense, experts, unq, label)


GROUPED_INT = {
    "awq",
    "gptq",
    "auto_awq",
    "auto_gptq",
    "awq_marlin",
    "gptq_marlin",
    "moe_wna16",
    "compressed-tensors",
    "quark",
    "inc",
    "torchao",
    "humming",
    "gguf",
}
MXFP4 = 0.5 + 1 / 32
PACKED_ZEROS = {"awq", "gptq", "auto_awq", "auto_gptq", "awq_marlin", "gptq_marlin", "moe_wna16"}


def _method_bytes(q: QuantConfig, unq: float) -> float:
    """Bytes per quantized parameter of a checkpoint method (the formats of ``quant_bytes``)."""
    method = q.method
    if method in ("fp8", "fbgemm_fp8", "modelopt", "modelopt_mxfp8", "mxfp8", "deepseek_v4_fp8", "ptpc_fp8"):
        return 1.0
    if method in ("mxfp4", "gpt_oss_mxfp4"):
        return MXFP4
    if method in ("modelopt_fp4", "nvfp4"):
        return 0.5 + 1 / 16
    if method == "bitsandbytes":
        return 0.5 + 4 / 64 if (q.bits or 4) == 4 and not q.raw.get("load_in_8bit") else 1.0 + 4 / 64
    if method in GROUPED_INT:
        nb = q.bits or (8 if method == "compressed-tensors" else 4)
        group = q.group_size if q.group_size and q.group_size > 0 else None
        # GPTQ and AWQ packs hold ``qzeros`` whatever their symmetry (vllm 0.33.0 quantization/auto_gptq.py:389-395,
        # 410-428; auto_awq.py:850-862); compressed-tensors stores zero points only when asymmetric
        zeros = 0 if q.sym and method not in PACKED_ZEROS else nb / 8
        return nb / 8 + ((2 + zeros) / group if group else 0.0)
    return unq


@dataclass(slots=True)  # built per plan: slots, and not frozen (a frozen __init__ calls object.__setattr__ per field)
class WeightEstimate:
    """Parameters and bytes. ``kind_rank[k]`` is one TP rank's bytes of a decoder layer of kind
    ``layout.kinds[k]``; which layers are of which kind is the model's ``layout`` (runs, counted per range in
    O(log) — no work per layer). ``checkpoint_bytes`` adds the next-n (MTP) layers a checkpoint ships and vLLM
    loads only for speculative decoding."""

    total_params: int
    total_bytes: int
    embed_rank: int
    lm_head_rank: int
    num_layers: int
    quant: str
    moe_layers: int
    layout: LayerLayout
    kind_rank: tuple[int, ...]
    checkpoint_bytes: int = 0

    def moe_in(self, lo: int, hi: int) -> int:
        """MoE layers among layers ``[lo, hi)``."""
        return self.layout.count_where(lo, hi, mlp="moe")

    def range_bytes(self, lo: int, n: int) -> int:
        return sum(c * r for c, r in zip(self.layout.counts(lo, lo + n), self.kind_rank, strict=True))

    @property
    def max_layer_rank(self) -> int:
        return max(self.kind_rank, default=0)

    def stage_weight(self, pp: int, s: int) -> int:
        start, n = stage_layers(self.num_layers, pp, s)
        b = self.range_bytes(start, n)
        if s == 0:
            b += self.embed_rank
        if s == pp - 1 and (pp > 1 or self.lm_head_rank):
            b += self.lm_head_rank
        return b

    def max_stage_bytes(self, pp: int) -> int:
        """The heaviest PP stage. One kind of layer: one of three stages (the first, the last, the first of the
        bigger ones); otherwise every stage holding layers — at most ``min(pp, L)`` of them, each counted in O(log)."""
        L = self.num_layers
        base, rem = divmod(L, pp)
        candidates = {0, pp - 1, biggest_stage(L, pp)}
        if len(self.layout.kinds) > 1:
            candidates.update(range(pp) if base else range(pp - 1 - rem, pp - 1))
        return max(self.stage_weight(pp, s) for s in candidates)


def _widths(qb: QuantBytes, act_bytes: float) -> Widths:
    return Widths(qb.attention, qb.dense_mlp, qb.experts, float(act_bytes))


def layer_cost(facts: ModelFacts, kind: LayerKind, tp: int, dp: int, w: Widths) -> Cost:
    """One decoder layer of ``kind``: its mixer, its MLP and the norm before each (activation dtype)."""
    norms = facts.hidden_size * ((kind.mixer != "none") + (kind.mlp != "none"))
    return mixer_cost(facts, kind.mixer, tp, w) + mlp_cost(facts, kind.mlp, tp, dp, w) + part(norms, w.act)


def next_n_layers(facts: ModelFacts) -> int:
    """MTP / next-n layers the checkpoint ships beyond ``num_hidden_layers`` (DeepSeek, GLM, MiMo
    ``num_nextn_predict_layers``; Qwen3-Next ``mtp_num_hidden_layers``); vLLM builds them only as a speculative
    draft (vllm 0.33.0 vllm/model_executor/models/deepseek_mtp.py)."""
    t = facts.raw_text_config
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        v = t.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and 0 < v <= facts.num_hidden_layers:
            return v
    return 0


def estimate_weights(
    facts: ModelFacts, tp: int, dp: int, ep: bool, act_bytes: float, requested_quant: str | None
) -> WeightEstimate:
    """Parameter counts from config.json, bytes per parameter by quantization, one TP rank's share.

    Every decoder layer is costed by its kind (``layer_layout``: mixer × MLP, ``layer_costs``); the vocabulary is
    padded to 64 and split over TP (vocab_parallel_embedding.py:95-97), the LM head likewise unless tied. An MTP
    layer is costed as the last decoder layer plus its ``eh_proj`` (2H × H) for ``checkpoint_bytes``.
    """
    H, L = facts.hidden_size, facts.num_hidden_layers
    qb = quant_bytes(facts, requested_quant, act_bytes)
    w = _widths(qb, act_bytes)
    layout = facts.layout
    costs = [layer_cost(facts, k, tp, dp, w) for k in layout.kinds]
    counts = layout.counts(0, L)
    embed = padded_vocab(facts.vocab_size or 32000) * H
    copies = 1 if facts.tie_word_embeddings else 2
    body = Cost(
        sum(c.params * n for c, n in zip(costs, counts, strict=True)),
        sum(c.total * n for c, n in zip(costs, counts, strict=True)),
    )
    total_bytes = embed * qb.embedding * copies + body.total
    mtp = next_n_layers(facts)
    last = costs[layout.run_kind[-1]] if layout.run_kind else Cost()
    mtp_bytes = mtp * (last.total + 2 * H * H * qb.attention)
    return WeightEstimate(
        total_params=int(embed * copies + body.params),
        total_bytes=int(total_bytes),
        embed_rank=int(embed * qb.embedding / tp),
        lm_head_rank=int(0.0 if facts.tie_word_embeddings else embed * qb.embedding / tp),
        num_layers=L,
        quant=qb.label,
        moe_layers=layout.count_where(0, L, mlp="moe"),
        layout=layout,
        kind_rank=tuple(int(c.rank) for c in costs),
        checkpoint_bytes=int(total_bytes + mtp_bytes),
    )


@dataclass(slots=True)  # built per plan: slots, and not frozen (a frozen __init__ calls object.__setattr__ per field)
class GpuWeights:
    """The weights on the heaviest GPU of the instance (bytes), where the figure comes from, and notes."""

    estimate: WeightEstimate
    bytes: int
    source: str
    vision_bytes: int
    notes: tuple[str, ...]


def tensor_weights(ctx: LaunchContext) -> int | None:
    """The heaviest PP stage's bytes on one GPU from the checkpoint's own tensors (``rank_weights``), or None
    where they do not describe what vLLM loads: no record, a checkpoint saved per rank, an online quantization
    (``--quantization`` on an unquantized checkpoint: vLLM converts at load), or a record that does not hold
    every decoder layer (tensors named in a way the record does not recognise: the estimate is used instead)."""
    ranks = ctx.request.model.tensor_ranks
    facts = ctx.facts
    if ranks is None or ctx.request.model.checkpoint.layout != "merged":
        return None
    if facts.quant is None and ctx.requested_quantization:
        return None
    L = facts.num_hidden_layers
    if len(ranks.layers) < L or not all(sum(layer) for layer in ranks.layers[:L]):
        return None
    rw = RankWeights.from_dict(ranks.model_dump())
    return rw.max_stage_bytes(L, ctx.tp, ctx.args.data_parallel_size, facts.total_num_kv_heads, ctx.pp)


def weights_on_gpu(
    ctx: LaunchContext, mm: EncoderProfile | None, act_bytes: float, n_draft: int, draft_method: str
) -> GpuWeights:
    """The heaviest PP stage's share — from the checkpoint's tensors when the request carries them
    (``tensor_weights``), else estimated and scaled to the manifest's ``weights_bytes`` when given — plus the
    vision tower; plus the speculative draft's layers, less ``cpu_offload_gb`` (vllm 0.33.0 vllm/config/offload.py)."""
    a = ctx.args
    est = estimate_weights(
        ctx.facts, ctx.tp, a.data_parallel_size, a.enable_expert_parallel, act_bytes, ctx.requested_quantization
    )
    vision_w = mm.vision_weights_bytes if mm else 0
    exact = tensor_weights(ctx)
    weights = (est.max_stage_bytes(ctx.pp) if exact is None else exact) + vision_w
    source = (
        f"estimated from config.json ({est.quant})"
        if exact is None
        else "checkpoint tensors, split as vLLM shards them"
    ) + (" + vision tower (estimated)" if vision_w else "")
    if exact is None and ctx.request.model.weights_bytes:
        vision_total = mm.vision_weights_bytes * (1 if a.get("mm_encoder_tp_mode") == "data" else ctx.tp) if mm else 0
        scale = ctx.request.model.weights_bytes / max(1, est.checkpoint_bytes + vision_total)
        weights = int(weights * scale)
        source = "manifest weights_bytes, split like the estimate"
    notes: list[str] = []
    if n_draft and draft_method not in ("ngram", "suffix"):
        weights += int(n_draft * est.max_layer_rank)
        notes.append(f"speculative decoding ({draft_method}) adds {n_draft} draft layer(s) of weights and KV")
    offload = int(float(a.get("cpu_offload_gb", 0)) * GIB)
    if offload:
        weights = max(0, weights - offload)
    return GpuWeights(est, weights, source, vision_w, tuple(notes))
