"""Parameters and bytes of one decoder layer of each kind (``layer_layout.LayerKind``): the whole layer and one
tensor-parallel rank's share, following how vLLM 0.33 builds and shards each module.

Sharding (vllm 0.33.0 vllm/model_executor/layers/linear.py:497, 502, 1065-1071, 1708): column- and row-parallel
linears split over TP; ``ReplicatedLinear`` / ``disable_tp=True`` layers are whole on every rank; QKV replicates KV
heads when TP > KV heads; MoE experts split over TP × DP (fused_moe/config.py:1106-1114), shared experts over TP,
routers replicated. Biases, norms inside mixers and per-head scalars are counted where they are more than a
rounding error; scales of quantized weights are in the bytes per parameter (``QuantBytes``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..model_facts import ModelFacts

FP32 = 4.0


@dataclass(slots=True)
class Cost:
    """Parameters, bytes of the whole module, bytes on one TP rank."""

    params: int = 0
    total: float = 0.0
    rank: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.params + other.params, self.total + other.total, self.rank + other.rank)


def part(params: int, bpp: float, split: int = 1) -> Cost:
    """``params`` weights of ``bpp`` bytes each, split evenly over ``split`` ranks (1 = replicated)."""
    return Cost(params, params * bpp, params * bpp / split)


@dataclass(frozen=True, slots=True)
class Widths:
    """Bytes per parameter of each class of weight, as ``QuantBytes`` gives them, plus the activation dtype."""

    attention: float
    dense_mlp: float
    experts: float
    act: float


def _int(t: dict[str, Any], *keys: str, default: int = 0) -> int:
    for k in keys:
        v = t.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return default


def attention(f: ModelFacts, tp: int, w: Widths) -> Cost:
    """GQA/MHA (sliding or full: the same weights): Q/O split over TP, K/V heads ``max(1, kv // tp)`` per rank
    (QKVParallelLinear replicates KV heads when TP > KV heads, linear.py:1065-1071); ``attn_output_gate`` doubles
    the query heads of the fused projection (Qwen3-Next / Qwen3.5: qwen3_next.py:315-322)."""
    H, nh, hd, kv = f.hidden_size, f.num_attention_heads, f.head_dim, f.total_num_kv_heads
    q_o = (3 if f.raw_text_config.get("attn_output_gate") is True else 2) * H * nh * hd
    kv_params = 2 * H * kv * hd
    return part(q_o, w.attention, tp) + Cost(
        kv_params, kv_params * w.attention, 2 * H * max(1, kv // tp) * hd * w.attention
    )


def mla(f: ModelFacts, tp: int, w: Widths) -> Cost:
    """DeepSeek MLA: the down-projections ``q_a_proj`` and ``kv_a_proj_with_mqa`` are ReplicatedLinear on every
    rank; ``q_b_proj`` / ``q_proj``, ``kv_b_proj`` and ``o_proj`` split over TP (deepseek_v2.py MLA attention)."""
    H, nh = f.hidden_size, f.num_attention_heads
    rope, nope = f.qk_rope_head_dim or 64, f.qk_nope_head_dim or 128
    vdim, kvr, qr = f.v_head_dim or 128, f.kv_lora_rank or 512, f.q_lora_rank
    qk = nope + rope
    repl = H * (kvr + rope) + (H * qr if qr else 0)
    split = (qr * nh * qk if qr else H * nh * qk) + kvr * nh * (nope + vdim) + nh * vdim * H
    return part(repl, w.attention) + part(split, w.attention, tp)


def dsv4(f: ModelFacts, mixer: str, tp: int, w: Widths) -> Cost:
    """DeepSeek-V4 attention (vllm 0.33.0 vllm/models/deepseek_v4/attention.py:252-330): ``fused_wqa_wkv``
    replicated; ``wq_b``, grouped ``wo_a`` and ``wo_b`` split over TP; compressed layers add the compressor
    (unquantized, replicated: compressor.py:262-280), ratio-4 layers the indexer (replicated ``wq_b`` and
    ``weights_proj``, attention.py:989-1003, and its own compressor); every layer holds the fp32 hyper-connection
    mixes (nvidia/model.py:617-665)."""
    t, H, nh, hd = f.raw_text_config, f.hidden_size, f.num_attention_heads, f.head_dim
    qr, orank = _int(t, "q_lora_rank", default=1536), _int(t, "o_lora_rank", default=1024)
    groups, m = _int(t, "o_groups", default=1), _int(t, "hc_mult", default=1)
    cost = part(H * (qr + hd), w.attention) + part(qr * nh * hd + nh * hd * orank + groups * orank * H, w.attention, tp)
    cost += part(2 * (2 + m) * m * m * H, FP32)
    if mixer == "dsv4_c128":
        cost += part(2 * H * hd, w.act)
    elif mixer == "dsv4_c4":
        ih, ihd = _int(t, "index_n_heads", default=64), _int(t, "index_head_dim", default=128)
        cost += part(2 * H * 2 * hd + H * ih + 2 * H * 2 * ihd, w.act) + part(qr * ih * ihd, w.attention)
    return cost


def mamba2(f: ModelFacts, tp: int, w: Widths) -> Cost:
    """MambaMixer2 (vllm 0.33.0 layers/mamba/mamba_mixer2.py:330-510): ``in_proj`` H → (z, x, B, C, dt) and
    ``out_proj`` split over TP; groups that TP does not divide are replicated up to TP (mamba_utils.py:261-269);
    conv1d, A, D, dt_bias and the gated norm split with the heads."""
    t, H = f.raw_text_config, f.hidden_size
    heads, hdim = _int(t, "mamba_num_heads", "mamba_n_heads"), _int(t, "mamba_head_dim", "mamba_d_head")
    inter = heads * hdim or _int(t, "mamba_expand", "expand", default=2) * H
    heads = heads or max(1, inter // 64)
    state, kernel = (
        _int(t, "ssm_state_size", "mamba_d_state", default=128),
        _int(t, "conv_kernel", "mamba_d_conv", default=4),
    )
    groups = _int(t, "n_groups", "mamba_n_groups", default=1)
    groups_rank = groups if groups % tp == 0 else groups + tp - groups
    conv, conv_rank = inter + 2 * groups * state, inter + 2 * groups_rank * state
    proj, proj_rank = H * (inter + conv + heads) + inter * H, H * (inter + conv_rank + heads) + inter * H
    small, small_rank = conv * (kernel + 1) + 3 * heads + inter, conv_rank * (kernel + 1) + 3 * heads + inter
    return Cost(proj + small, proj * w.attention + small * w.act, (proj_rank * w.attention + small_rank * w.act) / tp)


def mamba(f: ModelFacts, tp: int, w: Widths) -> Cost:
    """MambaMixer (Jamba; vllm 0.33.0 layers/mamba/mamba_mixer.py): in_proj H → 2I, x_proj I → dt_rank + 2·state,
    dt_proj, out_proj, conv1d, A and D, all split over TP."""
    t, H = f.raw_text_config, f.hidden_size
    inter = _int(t, "mamba_expand", default=2) * H
    state, kernel = _int(t, "mamba_d_state", default=16), _int(t, "mamba_d_conv", default=4)
    dt_rank = _int(t, "mamba_dt_rank", default=-(-H // 16))
    proj = H * 2 * inter + inter * (dt_rank + 2 * state) + dt_rank * inter + inter * H
    small = inter * (kernel + 1) + inter * state + 2 * inter
    return part(proj, w.attention, tp) + part(small, w.act, tp)


def gdn(f: ModelFacts, tp: int, w: Widths) -> Cost:
    """Gated DeltaNet (Qwen3-Next / Qwen3.5; vllm 0.33.0 layers/mamba/gdn/qwen_gdn_linear_attn.py:544-680):
    ``in_proj_qkvz`` H → 2K + 2V, ``in_proj_ba`` H → 2·v_heads, conv1d over 2K + V, ``out_proj`` V → H; all
    split over TP."""
    t, H = f.raw_text_config, f.hidden_size
    nk, nv = _int(t, "linear_num_key_heads", default=16), _int(t, "linear_num_value_heads", default=32)
    dk, dv = _int(t, "linear_key_head_dim", default=128), _int(t, "linear_value_head_dim", default=128)
    kernel = _int(t, "linear_conv_kernel_dim", default=4)
    k, v = nk * dk, nv * dv
    proj = H * (2 * k + 2 * v) + H * 2 * nv + v * H
    return part(proj, w.attention, tp) + part((2 * k + v) * kernel + 2 * nv, w.act, tp) + part(dv, w.act)


def short_conv(f: ModelFacts, tp: int, w: Widths) -> Cost:
    """LFM2 short convolution (vllm 0.33.0 layers/mamba/short_conv.py:54-81): in_proj H → 3H, out_proj H → H,
    a depthwise conv of ``conv_L_cache`` taps; split over TP."""
    H = f.hidden_size
    return part(4 * H * H, w.attention, tp) + part(H * _int(f.raw_text_config, "conv_L_cache", default=3), w.act, tp)


def mixer_cost(f: ModelFacts, mixer: str, tp: int, w: Widths) -> Cost:
    if mixer == "attention":
        return attention(f, tp, w)
    if mixer == "mla":
        return mla(f, tp, w)
    if mixer.startswith("dsv4"):
        return dsv4(f, mixer, tp, w)
    return {"mamba2": mamba2, "mamba": mamba, "gdn": gdn, "short_conv": short_conv}.get(mixer, _none)(f, tp, w)


def _none(f: ModelFacts, tp: int, w: Widths) -> Cost:
    return Cost()


def dense_width(f: ModelFacts) -> int:
    """The dense MLP's intermediate size: Llama 4 ``intermediate_size_mlp`` (llama4.py:340-353), else
    ``intermediate_size`` (4 × hidden when absent)."""
    t = f.raw_text_config
    if t.get("interleave_moe_layer_step"):
        return _int(t, "intermediate_size_mlp", default=f.intermediate_size or 4 * f.hidden_size)
    return f.intermediate_size or 4 * f.hidden_size


def shared_width(f: ModelFacts, moe_i: int) -> int:
    """The shared experts' intermediate size: Qwen ``shared_expert_intermediate_size``; Nemotron-H
    ``moe_shared_expert_intermediate_size × n_shared_experts`` (nemotron_h.py:178-193); DeepSeek
    ``n_shared_experts × moe_intermediate_size``; Llama 4 one shared expert of the expert width
    (llama4.py:100-113); else none."""
    t = f.raw_text_config
    if f.shared_expert_intermediate_size:
        return f.shared_expert_intermediate_size
    nemotron = _int(t, "moe_shared_expert_intermediate_size")
    if nemotron:
        return nemotron * max(1, f.n_shared_experts)
    if f.n_shared_experts:
        return f.n_shared_experts * moe_i
    return moe_i if t.get("interleave_moe_layer_step") else 0


def moe(f: ModelFacts, tp: int, dp: int, w: Widths) -> Cost:
    """Routed experts over TP × DP, shared experts over TP, the router replicated; Nemotron-H latent MoE runs the
    experts in ``moe_latent_size`` behind two replicated projections (nemotron_h.py:195-227)."""
    H, n, m = f.hidden_size, f.num_experts, f.mlp_matrices
    moe_i = f.moe_intermediate_size or f.intermediate_size or 4 * H
    latent = _int(f.raw_text_config, "moe_latent_size")
    experts = part(n * m * (latent or H) * moe_i, w.experts, tp * dp)
    shared = part(m * H * shared_width(f, moe_i), w.dense_mlp, tp)
    return experts + shared + part(H * n + 2 * H * latent, w.act)


def mlp_cost(f: ModelFacts, mlp: str, tp: int, dp: int, w: Widths) -> Cost:
    if mlp == "moe":
        return moe(f, tp, dp, w)
    if mlp == "dense":
        return part(f.mlp_matrices * f.hidden_size * dense_width(f), w.dense_mlp, tp)
    return Cost()
