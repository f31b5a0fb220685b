"""Weights: parameters from config.json, bytes per parameter by quantization, and one GPU's share.

vLLM shards the model over TP ranks (vllm 0.33.0 vllm/model_executor/layers/linear.py:497, 502, 1065-1071, 1708;
vocab_parallel_embedding.py:95-97, 286-306) and MoE experts over TP × DP ranks (fused_moe/config.py:1106-1114);
the pool is sized on the heaviest GPU, the PP stage with the most weight (``stages.py``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from ..context import LaunchContext
from ..gpus import GIB
from ..model_facts import ModelFacts, padded_vocab
from ..multimodal import EncoderProfile
from .stages import biggest_stage, multiples, stage_layers


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
    group = q.group_size if q.group_size and q.group_size > 0 else None
    if method in ("fp8", "fbgemm_fp8", "modelopt", "modelopt_mxfp8", "mxfp8", "deepseek_v4_fp8", "ptpc_fp8"):
        b = 1.0
    elif method in ("mxfp4", "gpt_oss_mxfp4"):
        b = 0.5 + 1 / 32
    elif method in ("modelopt_fp4", "nvfp4"):
        b = 0.5 + 1 / 16
    elif method == "bitsandbytes":
        b = 0.5 + 4 / 64 if (q.bits or 4) == 4 and not q.raw.get("load_in_8bit") else 1.0 + 4 / 64
    elif method in (
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
    ):
        nb = q.bits or (8 if method == "compressed-tensors" else 4)
        b = nb / 8
        if group:
            b += (2 + (0 if q.sym else nb / 8)) / group
    elif method == "experts_int8":
        return QuantBytes(unq, unq, 1.0, unq, "experts int8")
    else:
        b = unq
    ign = " ".join(_ignored(q.raw)).lower()
    attn = unq if ("attn" in ign or method in ("mxfp4", "gpt_oss_mxfp4")) else b
    dense_ignored = any("mlp" in s and "proj" in s and "expert" not in s for s in ign.split())
    dense = unq if dense_ignored and facts.is_moe else b
    label = f"{method}: {b:.4g} B/param" + ("; attention unquantized" if attn == unq and b != unq else "")
    if "shared_expert" in ign:
        label += "; shared experts unquantized"
    return QuantBytes(attn, dense, b, unq, label)


@dataclass(slots=True)  # built per plan: slots, and not frozen (a frozen __init__ calls object.__setattr__ per field)
class WeightEstimate:
    """Parameters and bytes. ``dense_layer_rank`` / ``moe_layer_rank`` are one TP rank's bytes of a decoder layer of
    each kind; which layers are MoE is given by ``first_dense`` (layers before it are dense), ``moe_step`` (every
    step-th layer) and ``mlp_only`` (sorted MoE-pattern layers forced dense) — per-kind counts, never a per-layer
    list, so the work does not grow with the layer count."""

    total_params: int
    total_bytes: int
    embed_rank: int
    lm_head_rank: int
    num_layers: int
    dense_layer_rank: int
    moe_layer_rank: int
    quant: str
    moe_layers: int
    first_dense: int = 0
    moe_step: int = 1
    mlp_only: tuple[int, ...] = ()
    moe_offset: int = 0  # MoE layers are i ≡ moe_offset (mod moe_step): Llama 4 interleaving puts them at step-1
    has_experts: bool = False

    def moe_in(self, lo: int, hi: int) -> int:
        """MoE layers among layers ``[lo, hi)``."""
        if not self.has_experts:
            return 0
        lo, hi = max(lo, self.first_dense), min(hi, self.num_layers)
        return max(
            0,
            multiples(lo - self.moe_offset, hi - self.moe_offset, self.moe_step)
            - (bisect.bisect_left(self.mlp_only, hi) - bisect.bisect_left(self.mlp_only, lo)),
        )

    def range_bytes(self, lo: int, n: int) -> int:
        moe = self.moe_in(lo, lo + n)
        return moe * self.moe_layer_rank + (n - moe) * self.dense_layer_rank

    @property
    def max_layer_rank(self) -> int:
        return max(
            self.moe_layer_rank if self.moe_layers else 0,
            self.dense_layer_rank if self.moe_layers < self.num_layers else 0,
        )

    def stage_weight(self, pp: int, s: int) -> int:
        start, n = stage_layers(self.num_layers, pp, s)
        b = self.range_bytes(start, n)
        if s == 0:
            b += self.embed_rank
        if s == pp - 1 and (pp > 1 or self.lm_head_rank):
            b += self.lm_head_rank
        return b

    def max_stage_bytes(self, pp: int) -> int:
        """The heaviest PP stage. Uniform layers: one of three stages (the first, the last, the first of the
        bigger ones); otherwise every stage holding layers — at most ``min(pp, L)`` of them, each counted in O(log)."""
        L = self.num_layers
        base, rem = divmod(L, pp)
        candidates = {0, pp - 1, biggest_stage(L, pp)}
        if 0 < self.moe_layers < L:
            candidates.update(range(pp) if base else range(pp - 1 - rem, pp - 1))
        return max(self.stage_weight(pp, s) for s in candidates)


def _attention(facts: ModelFacts, tp: int, qb: QuantBytes) -> tuple[int, float]:
    """(parameters, one TP rank's bytes) of one attention block: Q/O split over TP, K/V heads ``max(1, kv // tp)``
    per rank (replicated when TP > KV heads); MLA's down-projections (``q_a_proj``, ``kv_a_proj_with_mqa``) are
    replicated on every rank."""
    H, nh, hd = facts.hidden_size, facts.num_attention_heads, facts.head_dim
    if facts.is_mla:
        rope, nope = facts.qk_rope_head_dim or 64, facts.qk_nope_head_dim or 128
        vdim, kvr, qr = facts.v_head_dim or 128, facts.kv_lora_rank or 512, facts.q_lora_rank
        qk = nope + rope
        repl = H * (kvr + rope) + ((H * qr) if qr else 0)  # ReplicatedLinear on every rank
        split = (qr * nh * qk if qr else H * nh * qk) + kvr * nh * (nope + vdim) + nh * vdim * H
        return repl + split, repl * qb.attention + split * qb.attention / tp
    kv = facts.total_num_kv_heads
    q_o = 2 * H * nh * hd
    return q_o + 2 * H * kv * hd, q_o * qb.attention / tp + 2 * H * max(1, kv // tp) * hd * qb.attention


@dataclass(frozen=True)
class _MoePattern:
    """Which decoder layers are MoE: from ``first_dense`` on, every ``step``-th (at ``offset``), less ``mlp_only``."""

    first_dense: int
    step: int
    offset: int
    mlp_only: tuple[int, ...]
    layers: int
    interleaved: bool  # Llama 4
    dense_width: int | None  # Llama 4's dense layers: intermediate_size_mlp


def _moe_pattern(facts: ModelFacts) -> _MoePattern:
    """Llama 4: layer i is MoE iff (i + 1) % interleave_moe_layer_step == 0 (i = step-1, 2·step-1, …); its dense
    layers use intermediate_size_mlp and every MoE layer has one shared expert of intermediate_size
    (vllm 0.33.0 vllm/model_executor/models/llama4.py:100-113, 340-353)."""
    text, L = facts.raw_text_config, facts.num_hidden_layers
    first_dense = facts.first_k_dense_replace
    step = text.get("decoder_sparse_step") or text.get("moe_layer_freq") or 1
    step = step if isinstance(step, int) and step > 0 else 1
    offset, interleaved, dense_width = 0, False, None
    interleave = text.get("interleave_moe_layer_step")
    if isinstance(interleave, int) and not isinstance(interleave, bool) and interleave > 0:
        step, offset, first_dense, interleaved = interleave, interleave - 1, interleave - 1, True
        mlp_i = text.get("intermediate_size_mlp")
        if isinstance(mlp_i, int) and not isinstance(mlp_i, bool) and 0 < mlp_i <= 1 << 22:
            dense_width = mlp_i
    # layers of the MoE pattern that mlp_only_layers forces dense (model_facts checks the list: ints in range)
    mlp_only = tuple(
        sorted(
            {int(i) for i in (text.get("mlp_only_layers") or []) if first_dense <= i < L and (i - offset) % step == 0}
        )
    )
    layers = max(0, multiples(first_dense - offset, L - offset, step) - len(mlp_only))
    return _MoePattern(first_dense, step, offset, mlp_only, layers, interleaved, dense_width)


def _moe_layer(
    facts: ModelFacts,
    pattern: _MoePattern,
    attn: tuple[int, float],
    norms: float,
    qb: QuantBytes,
    tp: int,
    dp: int,
    act_bytes: float,
) -> tuple[int, int, float]:
    """(one TP rank's bytes, parameters, bytes) of one MoE layer: experts split over TP × DP, shared experts over
    TP, the router replicated."""
    attn_params, attn_rank = attn
    H, n_exp = facts.hidden_size, facts.num_experts
    moe_i = facts.moe_intermediate_size or facts.intermediate_size or 4 * H
    shared_i = facts.shared_expert_intermediate_size or (facts.n_shared_experts * moe_i)
    experts_params = n_exp * 3 * H * moe_i
    shared_params = 3 * H * shared_i
    if pattern.interleaved and not facts.shared_expert_intermediate_size and not facts.n_shared_experts:
        shared_params = 3 * H * moe_i
    router = H * n_exp
    rank = int(
        attn_rank
        + experts_params * qb.experts / (tp * dp)
        + shared_params * qb.dense_mlp / tp
        + router * act_bytes
        + norms
    )
    total = (
        attn_params * qb.attention
        + experts_params * qb.experts
        + shared_params * qb.dense_mlp
        + router * act_bytes
        + norms
    )
    return rank, experts_params + shared_params + router, total


def estimate_weights(
    facts: ModelFacts, tp: int, dp: int, ep: bool, act_bytes: float, requested_quant: str | None
) -> WeightEstimate:
    """Parameter counts from config.json, bytes per parameter by quantization, one TP rank's share.

    Mirrors how vLLM shards the model: vocabulary padded to 64 and split over TP (vocab_parallel_embedding.py),
    attention as ``_attention`` says, dense MLP split over TP, MoE experts split over TP×DP (EP or flattened TP,
    fused_moe/config.py), routers replicated on every rank. Layers are counted per kind (dense / MoE), in closed
    form.
    """
    H, L = facts.hidden_size, facts.num_hidden_layers
    qb = quant_bytes(facts, requested_quant, act_bytes)
    embed = padded_vocab(facts.vocab_size or 32000) * H
    copies = 1 if facts.tie_word_embeddings else 2
    attn_params, attn_rank = _attention(facts, tp, qb)
    norms = 2 * H * act_bytes
    pattern = _moe_pattern(facts) if facts.num_experts else None
    width = pattern.dense_width if pattern and pattern.dense_width else None
    dense_params = 3 * H * width if width else facts.mlp_matrices * H * (facts.intermediate_size or 4 * H)
    dense_rank = int(attn_rank + dense_params * qb.dense_mlp / tp + norms)
    dense_bytes = attn_params * qb.attention + dense_params * qb.dense_mlp + norms
    moe_rank, moe_params, moe_bytes = (
        _moe_layer(facts, pattern, (attn_params, attn_rank), norms, qb, tp, dp, act_bytes) if pattern else (0, 0, 0.0)
    )
    moe_layers = pattern.layers if pattern else 0
    dense_layers = L - moe_layers
    total_params = embed * copies + (
        dense_layers * (attn_params + dense_params + 2 * H) + moe_layers * (attn_params + moe_params + 2 * H)
    )
    total_bytes = embed * qb.embedding * copies + (dense_layers * dense_bytes + moe_layers * moe_bytes)
    return WeightEstimate(
        total_params=int(total_params),
        total_bytes=int(total_bytes),
        embed_rank=int(embed * qb.embedding / tp),
        lm_head_rank=int(0.0 if facts.tie_word_embeddings else embed * qb.embedding / tp),
        num_layers=L,
        dense_layer_rank=dense_rank,
        moe_layer_rank=moe_rank,
        quant=qb.label,
        moe_layers=moe_layers,
        first_dense=pattern.first_dense if pattern else 0,
        moe_step=pattern.step if pattern else 1,
        moe_offset=pattern.offset if pattern else 0,
        mlp_only=pattern.mlp_only if pattern else (),
        has_experts=bool(facts.num_experts),
    )


@dataclass(slots=True)  # built per plan: slots, and not frozen (a frozen __init__ calls object.__setattr__ per field)
class GpuWeights:
    """The weights on the heaviest GPU of the instance (bytes), where the figure comes from, and notes."""

    estimate: WeightEstimate
    bytes: int
    source: str
    vision_bytes: int
    notes: tuple[str, ...]


def weights_on_gpu(
    ctx: LaunchContext, mm: EncoderProfile | None, act_bytes: float, n_draft: int, draft_method: str
) -> GpuWeights:
    """The heaviest PP stage's share plus the vision tower; scaled to the manifest's ``weights_bytes`` when given;
    plus the speculative draft's layers, less ``cpu_offload_gb`` (vllm 0.33.0 vllm/config/offload.py)."""
    a = ctx.args
    est = estimate_weights(
        ctx.facts, ctx.tp, a.data_parallel_size, a.enable_expert_parallel, act_bytes, ctx.requested_quantization
    )
    vision_w = mm.vision_weights_bytes if mm else 0
    weights = est.max_stage_bytes(ctx.pp) + vision_w
    source = f"estimated from config.json ({est.quant})" + (" + vision tower" if vision_w else "")
    if ctx.request.model.weights_bytes:
        vision_total = mm.vision_weights_bytes * (1 if a.get("mm_encoder_tp_mode") == "data" else ctx.tp) if mm else 0
        scale = ctx.request.model.weights_bytes / max(1, est.total_bytes + vision_total)
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
