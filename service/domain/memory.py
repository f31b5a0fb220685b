"""The memory model: the per-GPU budget vLLM sizes its KV-cache pool from, computed before launch.

One pool per GPU (docs/operating.md §1; ../shared/vllm-rules.md §6, §7)::

    usable        = torch-visible GPU memory × gpu_memory_utilization          (requested memory, worker/utils.py)
    KV pool       = usable − weights on this GPU − overhead
    overhead      = activation peak + non-torch memory (+ CUDA graphs, counted inside the budget since v0.21)
    num_blocks    = floor(KV pool / bytes_per_block)                           (kv_cache_planning.py:642-683)
    concurrency   = num_blocks / cdiv(max_model_len, block_size)               (kv_cache_utils.py:1061-1093)
    kv_tokens     = int(concurrency × max_model_len)                           (kv_cache_utils.py:1120-1128)

Every quantity is bytes per GPU unless its name says otherwise. Exact vLLM formulas (blocks, the fit check with the
null block, concurrency, the log line) follow vLLM 0.33.0; the overhead terms are estimates whose constants are
calibrated on the start-up logs in tests/cases/kv (see ``CALIBRATION`` below and ``bench/kv_accuracy.py``).

Where accounting differed by version the model follows ``ctx.version`` (see ``Accounting``):
- V0 engine (before 0.8): KV tokens printed as ``blocks × block_size``; chunked prefill off by default, so the
  profile run covers ``max(max_model_len, 2048)`` tokens; DeepSeek MLA models before 0.7.1 cached full heads
  (K and V padded to 256) instead of the latent;
- CUDA-graph memory is subtracted from the budget only from v0.21.0 (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``
  default, vllm-rules.md §6); earlier versions captured graphs after sizing the pool;
- the hybrid (sliding-window) KV manager sizes sliding layers by their window from 0.10 (V1); before, as full layers.
"""

from __future__ import annotations

import bisect
import functools
import math
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .context import LaunchContext
from .gpus import GIB, MIB
from .model_facts import MAX_LAYERS, ModelFacts, config_int, padded_vocab
from .multimodal import EncoderProfile, encoder_profile, vision_tower
from .versions import parse_version

# ---------------------------------------------------------------------------------------------------------------
# Calibrated constants (documented; every one is a heuristic, not a vLLM constant)
# ---------------------------------------------------------------------------------------------------------------
CALIBRATION = {
    # nvidia-smi memory.total (the catalogue's figure) minus what torch.cuda.mem_get_info reports as total:
    # H100 SXM 79.65 → 79.1-79.22 GiB, L40S 44.99 → 44.42, T4 15.00 → 14.56 (printed totals in tests/cases/kv notes).
    "driver_reserved_bytes": int(0.5 * GIB),
    # Non-torch memory of one GPU without communication buffers (cuBLAS workspaces, CUDA context growth): printed
    # 0.01-0.28 GiB on one GPU — fitted on qwen25-15b-fp16-t4 (0.01), qwen25-7b-awq (0.06), qwen25-05b (0.08),
    # ui-tars-7b (0.28), llama32-11b-vision (0.16). At TP/PP > 1 the communication buffers are added from vLLM's and
    # NCCL's own sizes (``communication_buffers``), not from a fitted constant.
    "non_torch_tp1_bytes": int(0.15 * GIB),
    # ROCm: hipBLASLt workspace; MI300X log 20,186 blocks vs 20,406 with hipBLASLt disabled = 220 × 8 MiB.
    "rocm_hipblaslt_bytes": int(1.72 * GIB),
    # Activation peak of the profile run: tokens × activation bytes × (widest per-token intermediates), plus the
    # dummy sampler run over min(max_num_seqs, tokens) rows of full-vocabulary fp32 logits. Copies of the fp32
    # logits live at the sampler's peak (logits, probs, sorted values, int64 indices): fitted on qwen25-7b-awq
    # (1.04 GiB at 2048 tokens / 256 seqs / 152k vocab) and qwen3-235b-fp8 (1.40 GiB); V0 sampled one copy
    # (qwen25-15b-fp16-t4: 2.02 GiB at 32768 tokens is almost all MLP).
    "activation_token_factor": 1.0,
    "sampler_fp32_copies_v1": 5.0,
    "sampler_fp32_copies_v0": 1.0,
    # CUDA-graph pool per decoder layer (piecewise + full graphs at vLLM's default capture sizes): printed
    # 0.48 GiB / 28 layers (qwen25-7b), 0.62 / 32 (granite MoE, 0.7.3), 3.45 / 94 (qwen3-235b MoE TP8).
    "cuda_graph_per_layer_bytes": int(0.017 * GIB),
    "cuda_graph_per_moe_layer_bytes": int(0.037 * GIB),
    "cuda_graph_base_bytes": int(0.0 * GIB),
}

V0_DEFAULT_MAX_NUM_SEQS = 256  # V0 SchedulerConfig default
V0_ONLY_FALLBACK_UNTIL = (0, 11, 0)  # V1 default from 0.8; V0-only models fell back to V0 until V0 left in 0.11
V0_MIN_BATCHED_TOKENS = 2048  # V0: max_num_batched_tokens = max(max_model_len, 2048) without chunked prefill
FP8_KV = {"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# MLA-specific packed KV dtypes, bytes per token per layer (vllm-rules.md §7.1; kv_cache_interface.py:743)
MLA_PACKED_KV = {"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}


def format_gib(b: float) -> float:
    """vLLM's ``format_gib``: ``round(b / 2**30, 2)`` (vllm/utils/mem_utils.py:30-31)."""
    return round(b / GIB, 2)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------------------------------------------
# Version-dependent accounting
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Accounting:
    """How the target vLLM version sizes the pool (see the module docstring)."""

    version: tuple[int, int, int]
    v1_engine: bool
    cuda_graphs_in_budget: bool
    mla_latent_cache: bool
    hybrid_sliding_window: bool

    @classmethod
    def for_version(cls, version: str, env: dict[str, str] | None = None) -> "Accounting":
        v = parse_version(version) or (0, 33, 0)
        env = env or {}
        use_v1 = env.get("VLLM_USE_V1")
        v1 = v >= (0, 8, 0) if use_v1 is None else use_v1.strip() not in ("0", "false", "False")
        est = env.get("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS")
        graphs = (v >= (0, 21, 0)) if est is None else est.strip() not in ("0", "false", "False")
        return cls(
            version=v,
            v1_engine=v1,
            cuda_graphs_in_budget=v1 and graphs,
            mla_latent_cache=v >= (0, 7, 1),
            hybrid_sliding_window=v1 and v >= (0, 10, 0),
        )


# ---------------------------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QuantBytes:
    """Bytes per parameter for each class of weight (scales and zero points included)."""

    attention: float
    dense_mlp: float
    experts: float
    embedding: float
    label: str


def _ignored(raw: dict) -> list[str]:
    out: list[str] = []
    for key in ("ignore", "modules_to_not_convert", "exclude_modules", "ignored_layers"):
        v = raw.get(key)
        if isinstance(v, list):
            out += [str(x) for x in v]
    q = raw.get("quantization")
    if isinstance(q, dict) and isinstance(q.get("exclude_modules"), list):
        out += [str(x) for x in q["exclude_modules"]]
    return out


def quant_bytes(facts: ModelFacts, requested: str | None, act_bytes: float) -> QuantBytes:
    """Bytes per parameter by weight class for the checkpoint's quantization (or an online method).

    Formats (weights + per-group scales/zeros): fp8 = 1 B (block/channel scales < 0.1 %); int4 grouped (AWQ, GPTQ,
    compressed-tensors WNA16) = 0.5 + (2 B scale + 0.5 B zero) / group; int8 = 1 + 2/group; MXFP4 = 0.5 + 1/32;
    NVFP4 = 0.5 + 1/16; bitsandbytes nf4 = 0.5 + 4/64. Embeddings, lm_head, norms and routers stay in the activation
    dtype. Modules named in ``ignore`` / ``modules_to_not_convert`` (attention, shared experts, dense MLP) stay too.
    """
    q = facts.quant
    unq = float(act_bytes)
    method = q.method if q else None
    if method is None and requested:
        # online quantization of an unquantized checkpoint (vllm-rules.md §2.4)
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
    if method is None:
        return QuantBytes(unq, unq, unq, unq, f"unquantized ({unq:g} B/param)")
    bits = q.bits
    group = q.group_size if q.group_size and q.group_size > 0 else None
    if method in ("fp8", "fbgemm_fp8", "modelopt", "modelopt_mxfp8", "mxfp8", "deepseek_v4_fp8", "ptpc_fp8"):
        b = 1.0
    elif method in ("mxfp4", "gpt_oss_mxfp4"):
        b = 0.5 + 1 / 32
    elif method in ("modelopt_fp4", "nvfp4"):
        b = 0.5 + 1 / 16
    elif method == "bitsandbytes":
        b = 0.5 + 4 / 64 if (bits or 4) == 4 and not q.raw.get("load_in_8bit") else 1.0 + 4 / 64
    elif method in ("awq", "gptq", "auto_awq", "auto_gptq", "awq_marlin", "gptq_marlin", "moe_wna16",
                    "compressed-tensors", "quark", "inc", "torchao", "humming", "gguf"):
        nb = bits or (8 if method == "compressed-tensors" else 4)
        per = nb / 8
        if group:
            per += (2 + (0 if q.sym else nb / 8)) / group
        b = per
    elif method == "experts_int8":
        return QuantBytes(unq, unq, 1.0, unq, "experts int8")
    else:
        b = unq
    ign = " ".join(_ignored(q.raw)).lower()
    attn = unq if ("attn" in ign or method in ("mxfp4", "gpt_oss_mxfp4")) else b
    dense_ignored = any("mlp" in s and "proj" in s and "expert" not in s for s in ign.split())
    dense = unq if dense_ignored and facts.is_moe else b
    shared_unq = "shared_expert" in ign
    label = f"{method}: {b:.4g} B/param" + ("; attention unquantized" if attn == unq and b != unq else "")
    qb = QuantBytes(attn, dense, b, unq, label)
    if shared_unq:
        object.__setattr__(qb, "label", label + "; shared experts unquantized")
    return qb


def _topk(text: dict) -> int:
    for k in ("num_experts_per_tok", "experts_per_token", "moe_topk", "num_experts_per_token", "top_k"):
        v = text.get(k)
        if isinstance(v, int) and v > 0:
            return v
    return 2


def pp_partition(layers: int, pp: int) -> list[int]:
    """vLLM's layer split over PP stages: ``L // pp`` each, the remainder added to stages -2, -3, ... (never the last)
    (vllm 0.33.0 vllm/distributed/utils.py:198-241; vllm-rules.md §1.3). Builds a list of ``pp`` entries: for
    reports only; the budget uses ``stage_layers`` / ``biggest_stage`` (O(1))."""
    base, rem = divmod(layers, pp)
    parts = [base] * pp
    for i in range(rem):
        parts[-(i + 2) if pp > 1 else 0] += 1
    return parts


def stage_layers(layers: int, pp: int, s: int) -> tuple[int, int]:
    """``(first layer, layer count)`` of stage ``s`` under ``pp_partition`` — a closed form: the ``rem`` stages
    ``pp-1-rem … pp-2`` hold ``base + 1`` layers, the others ``base``."""
    base, rem = divmod(layers, pp)
    if pp == 1:
        return 0, layers
    first_big = pp - 1 - rem
    start = s * base + max(0, min(s, pp - 1) - first_big)
    return start, base + (1 if first_big <= s < pp - 1 else 0)


def biggest_stage(layers: int, pp: int) -> int:
    """The first stage holding the most layers (``max(range(pp), key=parts)`` without building ``parts``)."""
    rem = layers % pp
    return pp - 1 - rem if rem and pp > 1 else 0


def _multiples(lo: int, hi: int, step: int) -> int:
    """How many ``i`` in ``[lo, hi)`` are multiples of ``step`` (lo, hi ≥ 0)."""
    if hi <= lo:
        return 0
    return (hi + step - 1) // step - (lo + step - 1) // step


@dataclass(frozen=True)
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
        return max(0, _multiples(lo - self.moe_offset, hi - self.moe_offset, self.moe_step)
                   - (bisect.bisect_left(self.mlp_only, hi)
                                                             - bisect.bisect_left(self.mlp_only, lo)))

    def range_bytes(self, lo: int, n: int) -> int:
        moe = self.moe_in(lo, lo + n)
        return moe * self.moe_layer_rank + (n - moe) * self.dense_layer_rank

    @property
    def max_layer_rank(self) -> int:
        return max(self.moe_layer_rank if self.moe_layers else 0,
                   self.dense_layer_rank if self.moe_layers < self.num_layers else 0)

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


def estimate_weights(facts: ModelFacts, tp: int, dp: int, ep: bool, act_bytes: float,
                     requested_quant: str | None) -> WeightEstimate:
    """Parameter counts from config.json, bytes per parameter by quantization, one TP rank's share.

    Mirrors how vLLM shards the model (vllm-rules.md §1): vocabulary padded to 64 and split over TP
    (vocab_parallel_embedding.py), Q/O split over TP, K/V heads ``max(1, kv // tp)`` per rank (replicated when
    TP > KV heads), dense MLP split over TP, MoE experts split over TP×DP (EP or flattened TP, fused_moe/config.py),
    routers and MLA down-projections (``q_a_proj``, ``kv_a_proj_with_mqa``) replicated on every rank. Layers are
    counted per kind (dense / MoE), in closed form.
    """
    text = facts.raw_text_config
    H = facts.hidden_size
    L = facts.num_hidden_layers
    qb = quant_bytes(facts, requested_quant, act_bytes)
    vocab = padded_vocab(facts.vocab_size or 32000)
    embed = vocab * H
    embed_rank_b = embed * qb.embedding / tp
    lm_head_rank_b = 0.0 if facts.tie_word_embeddings else embed * qb.embedding / tp
    total_params = embed * (1 if facts.tie_word_embeddings else 2)
    total_bytes = embed * qb.embedding * (1 if facts.tie_word_embeddings else 2)

    # attention
    nh, hd = facts.num_attention_heads, facts.head_dim
    if facts.is_mla:
        rope, nope = facts.qk_rope_head_dim or 64, facts.qk_nope_head_dim or 128
        vdim, kvr, qr = facts.v_head_dim or 128, facts.kv_lora_rank or 512, facts.q_lora_rank
        qk = nope + rope
        repl = H * (kvr + rope) + ((H * qr) if qr else 0)  # ReplicatedLinear on every rank
        split = (qr * nh * qk if qr else H * nh * qk) + kvr * nh * (nope + vdim) + nh * vdim * H
        attn_params = repl + split
        attn_rank = repl * qb.attention + split * qb.attention / tp
    else:
        kv = facts.total_num_kv_heads
        kv_rank = max(1, kv // tp)
        q_o = 2 * H * nh * hd
        k_v = 2 * H * kv * hd
        attn_params = q_o + k_v
        attn_rank = q_o * qb.attention / tp + 2 * H * kv_rank * hd * qb.attention
    norms = 2 * H * act_bytes
    # MLP of a dense layer
    inter = facts.intermediate_size or 4 * H
    dense_params = facts.mlp_matrices * H * inter
    dense_rank = int(attn_rank + dense_params * qb.dense_mlp / tp + norms)
    dense_bytes = attn_params * qb.attention + dense_params * qb.dense_mlp + norms
    n_exp = facts.num_experts
    moe_rank, moe_params, moe_bytes = 0, 0, 0.0
    first_dense, step, mlp_only, offset = 0, 1, (), 0
    moe_layers = 0
    if n_exp:
        moe_i = facts.moe_intermediate_size or inter
        shared_i = facts.shared_expert_intermediate_size or (facts.n_shared_experts * moe_i)
        experts_params = n_exp * 3 * H * moe_i
        shared_params = 3 * H * shared_i
        router = H * n_exp
        first_dense = facts.first_k_dense_replace
        step = text.get("decoder_sparse_step") or text.get("moe_layer_freq") or 1
        step = step if isinstance(step, int) and step > 0 else 1
        # Llama 4: layer i is MoE iff (i + 1) % interleave_moe_layer_step == 0 (i = step-1, 2·step-1, …); its dense
        # layers use intermediate_size_mlp and every MoE layer has one shared expert of intermediate_size
        # (vllm 0.33.0 vllm/model_executor/models/llama4.py:100-113, 340-353)
        interleave = text.get("interleave_moe_layer_step")
        if isinstance(interleave, int) and not isinstance(interleave, bool) and interleave > 0:
            step, offset, first_dense = interleave, interleave - 1, interleave - 1
            mlp_i = text.get("intermediate_size_mlp")
            if isinstance(mlp_i, int) and not isinstance(mlp_i, bool) and 0 < mlp_i <= 1 << 22:
                dense_params = 3 * H * mlp_i
                dense_rank = int(attn_rank + dense_params * qb.dense_mlp / tp + norms)
                dense_bytes = attn_params * qb.attention + dense_params * qb.dense_mlp + norms
            if not facts.shared_expert_intermediate_size and not facts.n_shared_experts:
                shared_params = 3 * H * moe_i
        # layers of the MoE pattern that mlp_only_layers forces dense (model_facts checks the list: ints in range)
        mlp_only = tuple(sorted({int(i) for i in (text.get("mlp_only_layers") or [])
                                 if first_dense <= i < L and (i - offset) % step == 0}))
        moe_layers = max(0, _multiples(first_dense - offset, L - offset, step) - len(mlp_only))
        moe_rank = int(attn_rank + experts_params * qb.experts / (tp * dp) + shared_params * qb.dense_mlp / tp
                       + router * act_bytes + norms)
        moe_params = experts_params + shared_params + router
        moe_bytes = (attn_params * qb.attention + experts_params * qb.experts + shared_params * qb.dense_mlp
                     + router * act_bytes + norms)
    dense_layers = L - moe_layers
    total_params += (dense_layers * (attn_params + dense_params + 2 * H)
                     + moe_layers * (attn_params + moe_params + 2 * H))
    total_bytes += dense_layers * dense_bytes + moe_layers * moe_bytes
    return WeightEstimate(
        total_params=int(total_params),
        total_bytes=int(total_bytes),
        embed_rank=int(embed_rank_b),
        lm_head_rank=int(lm_head_rank_b),
        num_layers=L,
        dense_layer_rank=dense_rank,
        moe_layer_rank=moe_rank,
        quant=qb.label,
        moe_layers=moe_layers,
        first_dense=first_dense,
        moe_step=step,
        moe_offset=offset,
        mlp_only=mlp_only,
        has_experts=bool(n_exp),
    )


# ---------------------------------------------------------------------------------------------------------------
# KV cache per token
# ---------------------------------------------------------------------------------------------------------------
def kv_dtype_bytes(kv_cache_dtype: str, model_dtype: str) -> int:
    """Bytes per KV element: ``auto`` follows the model dtype (2 for bf16/fp16, 4 for fp32); fp8* = 1
    (vllm-rules.md §7.1)."""
    k = (kv_cache_dtype or "auto").lower()
    if k in FP8_KV or k.startswith("fp8"):
        return 1
    if k in ("bfloat16", "float16", "half"):
        return 2
    if k in ("float32", "float"):
        return 4
    return DTYPE_BYTES.get(model_dtype, 2)


def sliding_layers(facts: ModelFacts, start: int, n: int) -> int:
    """How many of the decoder layers ``[start, start + n)`` are sliding-window layers: ``layer_types`` when
    config.json gives it (one entry per layer); Gemma-2 alternates (even layers sliding); Gemma-3
    ``sliding_window_pattern`` (5 of 6 sliding); otherwise every layer is sliding when ``sliding_window`` is set and
    not switched off (``use_sliding_window: false``), else none. Closed forms: no work per layer."""
    text = facts.raw_text_config
    L = facts.num_hidden_layers
    stop = min(start + n, L)
    if stop <= start:
        return 0
    lt = text.get("layer_types")
    if isinstance(lt, list) and len(lt) == L:
        return sum(1 for t in lt[start:stop] if "sliding" in str(t))
    if not facts.sliding_window or text.get("use_sliding_window") is False:
        return 0
    mt = facts.model_type or ""
    if mt == "gemma2":
        return _multiples(start, stop, 2)
    if mt.startswith("gemma3"):
        pat = int(text.get("sliding_window_pattern") or 6)
        return (stop - start) - _multiples(start + 1, stop + 1, pat)
    return stop - start


def kv_bytes_per_token_layer(facts: ModelFacts, tp: int, dtype_bytes: int, kv_cache_dtype: str,
                             acct: Accounting) -> int:
    """One layer, one token, one TP rank (vllm-rules.md §7.1): ``2 × max(1, kv // tp) × head_dim × dtype_bytes``;
    MLA ``(kv_lora_rank + qk_rope_head_dim) × dtype_bytes``, not divided by TP (656 B for fp8_ds_mla); before
    vLLM 0.7.1 DeepSeek MLA models cached full heads with K and V padded to 256 (tests/cases/kv dsv2-lite)."""
    if facts.is_mla:
        if not acct.mla_latent_cache:
            return 2 * max(1, facts.num_attention_heads // tp) * 256 * dtype_bytes
        if kv_cache_dtype in MLA_PACKED_KV:
            return MLA_PACKED_KV[kv_cache_dtype]
        return ((facts.kv_lora_rank or 512) + (facts.qk_rope_head_dim or 64)) * dtype_bytes
    return 2 * max(1, facts.total_num_kv_heads // tp) * facts.head_dim * dtype_bytes


def draft_layers(ctx: LaunchContext) -> tuple[int, str]:
    """Extra attention layers that speculative decoding adds to the KV cache (draft shares the pool).

    ``mtp`` / ``deepseek_mtp`` / ``*_mtp``: ``num_speculative_tokens``-independent, the checkpoint's
    ``num_nextn_predict_layers`` (default 1); ``eagle`` / ``eagle3``: one layer with the target's geometry;
    ``ngram`` / ``suffix``: none; a separate draft model: ``draft_num_layers`` from speculative_config when given,
    else one layer (its config is not in the request: an estimate).
    """
    spec = ctx.args.get("speculative_config")
    if not isinstance(spec, dict):
        return 0, ""
    method = str(spec.get("method") or "").lower()
    if method in ("ngram", "suffix", "ngram_gpu"):
        return 0, method
    if "mtp" in method:
        n = ctx.facts.raw_text_config.get("num_nextn_predict_layers") or 1
        return int(n), method
    if method.startswith("eagle"):
        return 1, method
    key = "draft_num_layers" if spec.get("draft_num_layers") is not None else "num_hidden_layers"
    n = config_int(spec.get(key), f"engine_args.speculative_config.{key}", 0, MAX_LAYERS) or 1
    return n, method or "draft_model"


# ---------------------------------------------------------------------------------------------------------------
# The budget
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class Budget:
    """The per-GPU memory budget (bytes) and the KV capacity it implies. ``as_dict()`` is the API's ``budget``."""

    gpu_memory_bytes: int  # torch-visible total of one GPU
    gpu_memory_utilization: float
    usable_bytes: int  # ceil(total × util), vLLM's requested memory
    weights_bytes_per_gpu: int
    weights_source: str
    activation_peak_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int  # counted in the budget (0 when eager or before v0.21)
    cuda_graph_outside_budget_bytes: int
    kv_cache_bytes_per_gpu: int  # the pool (≥ 0)
    kv_bytes_per_token_per_gpu: int
    kv_layers_per_gpu: int
    block_size: int
    bytes_per_block: int
    num_gpu_blocks: int
    kv_cache_tokens: int
    max_model_len: int
    max_concurrency: float
    max_num_seqs_bound: int | None
    max_num_seqs_bound_seq_len: int
    estimated_max_model_len: int
    fits_max_model_len: bool
    needed_bytes_max_model_len: int
    profiled_tokens: int
    pool_raw_bytes: int  # usable − weights − overhead (may be negative)
    accounting: dict[str, Any] = field(default_factory=dict)
    assumptions: list[str] = field(default_factory=list)
    weights_estimated_total_bytes: int = 0
    weights_params: int = 0
    vision_weights_bytes: int = 0  # the vision tower's share of weights_bytes_per_gpu
    encoder_peak_bytes: int = 0  # the multimodal encoder's profile peak (part of activation_peak_bytes when larger)
    encoder_output_bytes: int = 0  # encoder outputs held in the encoder cache during the text profile run
    communication_bytes: int = 0  # NCCL / custom all-reduce / symmetric-memory / NVLS buffers (part of non_torch)
    multimodal: dict[str, Any] | None = None

    @property
    def overhead_bytes(self) -> int:
        return self.activation_peak_bytes + self.non_torch_bytes + self.cuda_graph_bytes

    @property
    def log_line(self) -> str:
        """vLLM's start-up line (kv_cache_utils.py:1147-1154)."""
        return (f"GPU KV cache size: {self.kv_cache_tokens:,} tokens, Maximum concurrency for "
                f"{self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x")

    def as_dict(self) -> dict[str, Any]:
        d = {name: getattr(self, name) for name in _budget_fields()}  # flat values: no deep copy needed
        d["accounting"], d["assumptions"] = dict(self.accounting), list(self.assumptions)
        d["multimodal"] = dict(self.multimodal) if self.multimodal is not None else None
        d["overhead_bytes"] = self.overhead_bytes
        d["overhead"] = {
            "activation_peak_bytes": self.activation_peak_bytes,
            "non_torch_bytes": self.non_torch_bytes,
            "cuda_graph_bytes": self.cuda_graph_bytes,
        }
        d["log_line"] = self.log_line
        d["gib"] = {k: format_gib(v) for k, v in (
            ("gpu_memory", self.gpu_memory_bytes), ("usable", self.usable_bytes),
            ("weights_per_gpu", self.weights_bytes_per_gpu), ("overhead", self.overhead_bytes),
            ("activation_peak", self.activation_peak_bytes), ("non_torch", self.non_torch_bytes),
            ("cuda_graph", self.cuda_graph_bytes), ("kv_cache_per_gpu", self.kv_cache_bytes_per_gpu))}
        d["max_concurrency"] = round(self.max_concurrency, 4)
        return d


@functools.lru_cache(maxsize=1)
def _budget_fields() -> tuple[str, ...]:
    return tuple(f.name for f in fields(Budget))


def torch_total_bytes(ctx: LaunchContext) -> int:
    """What torch reports as the device total: the catalogue's nvidia-smi figure minus the driver-reserved part
    (CALIBRATION['driver_reserved_bytes']); a GPU described in the request is taken as given (its memory_bytes is
    what vLLM printed in the kv cases)."""
    g = ctx.gpu
    if g.memory_source == "request":
        return g.memory_bytes
    return g.memory_bytes - CALIBRATION["driver_reserved_bytes"]


def activation_peak(ctx: LaunchContext, tokens: int, num_seqs: int, act_bytes: int, acct: Accounting) -> int:
    """Activation peak of the profile run (gpu_model_runner ``profile_run``; vllm-rules.md §6 transient headroom).

    Forward pass over ``tokens`` tokens: per token the widest live intermediates — QKV, the MLP's gate/up output and
    its activation (dense: 3 × intermediate / TP, 2 × for a two-matrix MLP; MoE: top-k × 3 × expert width / (TP×DP)) and two hidden states —
    in the activation dtype; does not shrink with TP for the hidden states. Then the dummy sampler over
    ``min(max_num_seqs, tokens)`` rows of full-vocabulary fp32 logits (V1: ``sampler_fp32_copies_v1`` live copies;
    V0: one).
    """
    f = ctx.facts
    tp = ctx.tp
    H = f.hidden_size
    if f.is_moe:
        moe_i = f.moe_intermediate_size or f.intermediate_size or 4 * H
        width = _topk(f.raw_text_config) * 3 * moe_i / max(1, tp if not ctx.args.enable_expert_parallel else 1)
        if f.shared_expert_intermediate_size or f.n_shared_experts:
            width = max(width, 3 * (f.shared_expert_intermediate_size or f.n_shared_experts * moe_i) / tp)
    else:
        width = f.mlp_matrices * (f.intermediate_size or 4 * H) / tp  # gate_up out + act out, or up out + act out
    qkv = (f.num_attention_heads + 2 * f.total_num_kv_heads) * f.head_dim / tp
    per_token = (2 * H + max(width, qkv)) * act_bytes * CALIBRATION["activation_token_factor"]
    rows = min(num_seqs, tokens)
    copies = CALIBRATION["sampler_fp32_copies_v1"] if acct.v1_engine else CALIBRATION["sampler_fp32_copies_v0"]
    sampler = rows * (f.vocab_size or 32000) * 4 * copies
    return int(tokens * per_token + sampler)


# ---------------------------------------------------------------------------------------------------------------
# Communication buffers (non-torch memory at TP/PP > 1)
# ---------------------------------------------------------------------------------------------------------------
# vLLM's custom all-reduce (vllm 0.33.0 vllm/distributed/device_communicators/custom_all_reduce.py:117-330): world
# sizes 2, 4, 6, 8, 16 on one node, all GPUs NVLink-connected unless the world is 2 (PCIe P2P); per rank a metadata
# buffer ``meta_size() + max_size`` (max_size 8 MiB, capped by CUSTOM_ALL_REDUCE_MAX_SIZES when symmetric memory is
# on), an IPC buffer ``max(max_size, 2 MiB all-gather, 16 MiB reduce-scatter)`` and ``rank_data`` 8 MiB. Before the
# all-gather/reduce-scatter paths the IPC buffer was max_size (8 MiB).
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8, 16)
CUSTOM_AR_MAX_SIZE = 8 * MIB
CUSTOM_AR_RANK_DATA = 8 * MIB
CUSTOM_AR_GATHER_SCATTER = (2 * MIB, 16 * MIB)
# vllm 0.33.0 vllm/distributed/device_communicators/all_reduce_utils.py:31-75
CUSTOM_ALL_REDUCE_MAX_SIZES = {(9, 0): {2: 64 * MIB, 4: 32 * MIB, 6: MIB // 2, 8: MIB // 4},
                               (10, 0): {2: 2 * MIB, 4: 2 * MIB, 6: MIB, 8: MIB}}
SYMM_MEM_ALL_REDUCE_MAX_SIZES = {(9, 0): {2: 64 * MIB, 4: 32 * MIB, 6: 64 * MIB, 8: 64 * MIB},
                                 (10, 0): {2: 8 * MIB, 4: 32 * MIB, 6: 128 * MIB, 8: 128 * MIB}}
# NCCL's default buffers per connection (NCCL src/include/device.h / comm.h): SIMPLE NCCL_BUFFSIZE 4 MiB, LL
# 8 lines × 512 threads × 8 steps × 16 B = 512 KiB, LL128 120 × 640 × 8 × 8 B = 4,915,200 B — 9.19 MiB a connection,
# the figure NCCL's proxy pins per connection. Each rank receives on one connection per ring channel.
NCCL_CONNECTION_BYTES = 4 * MIB + 512 * 1024 + 4_915_200
# Ring channels NCCL builds (topology-dependent): NVSwitch/NVLink nodes 16 (NCCL printed "16 coll channels" on
# 8 × H800, NVIDIA/nccl#892; the NVLS line of vllm-project/vllm#9699 implies 24 on H100/H200), PCIe 2 (an
# assumption, not a printed figure: NCCL's two rings over PCIe; consistent with the 0.21 GiB non-torch that
# qwen3-235b-2507-fp8-8xl40s-tp8-ep printed on 8 × L40S — 0.15 + 2 communicators × 2 × 9.19 MiB = 0.19 GiB).
NCCL_CHANNELS = {"nvlink": 16, "pcie": 2, None: 2}
# NVLink SHARP (Hopper and later on NVSwitch, only for more than 2 ranks): each GPU backs nvlsTotalSize =
# nvlsPerRankSize × nHeads (NCCL src/transport/nvls.cc ncclNvlsBufferSetup). NCCL 2.21 (torch ≤ 2.6, vLLM < 0.9)
# printed "nHeads 8 buffSize 4194304 memSize 2097152 nvlsPerRankSize 301989888 nvlsTotalSize 2415919104"
# (24 channels × 2 × (4 MiB + 2 MiB), vllm-project/vllm#9699); later NCCL sizes the buffer by NCCL_NVLS_CHUNKSIZE
# (128 KiB × 8 steps) and printed "nHeads 8 nvlsRanks 8 buffSize 1048576 nvlsPerRankSize 33554432
# nvlsTotalSize 268435456" (16 channels × 2 × 1 MiB).
NVLS_PER_RANK_BYTES_NCCL_221 = 24 * 2 * (4 * MIB + 2 * MIB)
NVLS_PER_RANK_BYTES = 16 * 2 * MIB


def communication_buffers(ctx: LaunchContext, acct: Accounting) -> tuple[int, list[str]]:
    """Non-torch bytes per GPU for the process groups of this launch (0 on one GPU) and what they are made of.

    One NCCL communicator (vLLM's PyNcclCommunicator, cuda_communicator.py:106-112) per model-parallel group of more
    than one rank: TP, PP, DP, DCP, and for MoE models the expert group of DP × TP ranks, created with or without
    --enable-expert-parallel (parallel_state.py:2324-2357); the world group has none (use_device_communicator=False).
    Custom all-reduce and symmetric-memory buffers belong to the TP group only (cuda_communicator.py:56-66); NVLS
    when NCCL enables it (Hopper+ NVLink nodes, TP > 2, unless ``NCCL_NVLS_ENABLE=0``). AMD GPUs: NCCL (RCCL) rings
    only. Not modelled: FlashInfer's all-reduce fusion workspace (created lazily on the TP group when flashinfer is
    installed; FI_ALLREDUCE_FUSION_MAX_SIZE_MB caps its tensors at 0.5-64 MB by capability and TP).
    """
    a = ctx.args
    tp, pp, dp = ctx.tp, ctx.pp, a.data_parallel_size
    parts: list[str] = []
    if tp * pp * dp == 1:
        return 0, parts
    link = ctx.interconnect if ctx.interconnect in ("nvlink", "pcie") else None
    nodes = ctx.nodes
    dcp = a.decode_context_parallel_size
    # V0 also broadcast every step's inputs over the TP group's torch device group (broadcast_tensor_dict), whose
    # NCCL communicator then exists next to PyNccl's: two sets of rings and NVLS buffers — the ~5 GiB of blocks that
    # NCCL_NVLS_ENABLE=0 gave back on 8 × H200 (vllm-project/vllm#9699) is two 2.25 GiB NVLS buffers
    tp_comms = 2 if tp > 1 and not acct.v1_engine else int(tp > 1)
    comms = tp_comms + (pp > 1) + (dp > 1) + (dcp > 1) + (ctx.facts.is_moe and tp * dp > 1)
    channels = NCCL_CHANNELS[link]
    nccl = comms * channels * NCCL_CONNECTION_BYTES
    parts.append(f"NCCL: {comms} communicator(s) × {channels} ring channels × 9.19 MiB")
    total = nccl
    cc = ctx.gpu.compute_capability
    env = ctx.request.env
    nvidia = cc is not None
    symm = False
    if tp > 1 and nvidia and nodes == 1 and acct.version >= (0, 11, 0):
        if env.get("VLLM_ALLREDUCE_USE_SYMM_MEM", "1").strip() not in ("0", "false", "False"):
            size = SYMM_MEM_ALL_REDUCE_MAX_SIZES.get(cc, {}).get(tp)
            if size:
                symm = True
                total += size
                parts.append(f"symmetric-memory all-reduce buffer {size // MIB} MiB")
    if (tp in CUSTOM_AR_WORLD_SIZES and nvidia and nodes == 1 and not a.get("disable_custom_all_reduce", False)
            and (tp == 2 or link == "nvlink")):
        max_size = CUSTOM_AR_MAX_SIZE
        if symm:
            max_size = min(max_size, CUSTOM_ALL_REDUCE_MAX_SIZES.get(cc, {}).get(tp, max_size))
        ipc = max(max_size, *CUSTOM_AR_GATHER_SCATTER) if acct.version >= (0, 11, 0) else max_size
        car = max_size + ipc + CUSTOM_AR_RANK_DATA
        total += car
        parts.append(f"custom all-reduce {car / MIB:.1f} MiB")
    if (tp > 2 and nvidia and cc >= (9, 0) and link == "nvlink"
            and env.get("NCCL_NVLS_ENABLE", "1").strip() not in ("0", "false", "False")):
        heads = min(tp, ctx.gpus_per_node)  # one NVLS head per GPU of the NVSwitch domain (a node)
        nvls = (NVLS_PER_RANK_BYTES if acct.version >= (0, 9, 0) else NVLS_PER_RANK_BYTES_NCCL_221) * heads * tp_comms
        total += nvls
        parts.append(f"NCCL NVLS {nvls / GIB:.2f} GiB (nvlsTotalSize for {heads} heads × {tp_comms} communicator(s))")
    return int(total), parts


def _block_size(ctx: LaunchContext) -> int:
    """16 unless the user sets it or the MLA backend needs another: FlashInfer-MLA on SM100 → 32 (first MLA
    choice there); FlashAttn-MLA on SM90 stays 16 (vllm-rules.md §7.2)."""
    given = ctx.args.get("block_size") if "block_size" in ctx.args.given else None
    if given is not None:  # an explicit null is vLLM's default (chosen by the backend)
        return int(given)
    cc = ctx.gpu.compute_capability
    if ctx.facts.is_mla and cc is not None and cc >= (10, 0):
        return 32
    return 16


def longest_fitting(fits: Any, hi: int) -> int:
    """The largest length in 1..hi for which ``fits`` holds (monotone), else 0: vLLM's binary search
    (kv_cache_planning.py:66-87, as cited at the top of this module)."""
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def longest_full_attention_len(avail: int, bytes_per_block: int, block: int, dcp: int, hi: int) -> int:
    """``longest_fitting`` for full attention, where a request of ``length`` tokens needs
    ceil(ceil(length / dcp) / block) blocks of ``bytes_per_block``: the largest length with at most
    avail // bytes_per_block blocks, capped at ``hi``."""
    if bytes_per_block <= 0:  # nothing per block (attention-free): every length fits a non-negative pool
        return max(0, hi) if avail >= 0 else 0
    return max(0, min(hi, (avail // bytes_per_block) * block * dcp))


def compute_budget(ctx: LaunchContext, *, accounting_version: str | None = None) -> Budget:
    """The per-GPU budget of one instance, for ``ctx.version`` (or ``accounting_version``: the version that
    printed a figure, used by the calibration benchmark). Pure function of the context."""
    acct = Accounting.for_version(accounting_version or ctx.version, ctx.request.env)
    a = ctx.args
    f = ctx.facts
    tp, pp = ctx.tp, ctx.pp
    dp = a.data_parallel_size
    dcp = a.decode_context_parallel_size
    assumptions: list[str] = []
    if (acct.v1_engine and acct.version < V0_ONLY_FALLBACK_UNTIL and "VLLM_USE_V1" not in ctx.request.env
            and (tower := vision_tower(f)) is not None and tower.encoder_decoder):
        # an architecture marked SupportsV0Only (mllama, vllm 0.10.2 model_executor/models/mllama.py:1273-1274) makes
        # the engine fall back to V0 unless VLLM_USE_V1 is set (vllm 0.8.5 engine/arg_utils.py:1402-1406, 1649-1658;
        # 0.10.2 :1479-1483); the V0 engine and mllama are gone from 0.11
        acct = replace(acct, v1_engine=False, cuda_graphs_in_budget=False, hybrid_sliding_window=False)
        assumptions.append("encoder-decoder model (V0 only): vLLM falls back to the V0 engine")

    act_bytes = DTYPE_BYTES.get(ctx.dtype, 2)
    total = torch_total_bytes(ctx)
    util = ctx.gpu_memory_utilization
    usable = math.ceil(total * util)

    # --- scheduler values as the version profiles them ---
    mml = ctx.max_model_len
    if acct.v1_engine:
        tokens = ctx.max_num_batched_tokens
        num_seqs = ctx.max_num_seqs
        chunked = ctx.enable_chunked_prefill
    else:
        chunked = bool(a.get("enable_chunked_prefill", False))
        num_seqs = int(a.get("max_num_seqs", V0_DEFAULT_MAX_NUM_SEQS))
        user_mnbt = a.get("max_num_batched_tokens")
        tokens = int(user_mnbt) if user_mnbt is not None else (
            ctx.max_num_batched_tokens if chunked else max(mml, V0_MIN_BATCHED_TOKENS))

    # --- the vision tower and the multimodal profile (multimodal.py) ---
    mm: EncoderProfile | None = encoder_profile(
        f, a, v1_engine=acct.v1_engine, tp=tp, act_bytes=act_bytes, weight_bytes=act_bytes, max_model_len=mml,
        max_num_batched_tokens=tokens, max_num_seqs=num_seqs, chunked_prefill=chunked,
        preprocessor=ctx.request.model.preprocessor_config, version=acct.version)
    vision_w = mm.vision_weights_bytes if mm else 0

    # --- weights ---
    est = estimate_weights(f, tp, dp, a.enable_expert_parallel, act_bytes, ctx.requested_quantization)
    weights = est.max_stage_bytes(pp) + vision_w
    source = f"estimated from config.json ({est.quant})" + (" + vision tower" if vision_w else "")
    if ctx.request.model.weights_bytes:
        vision_total = mm.vision_weights_bytes * (1 if a.get("mm_encoder_tp_mode") == "data" else tp) if mm else 0
        scale = ctx.request.model.weights_bytes / max(1, est.total_bytes + vision_total)
        weights = int(weights * scale)
        source = "manifest weights_bytes, split like the estimate"
    n_draft, draft_method = draft_layers(ctx)
    if n_draft and draft_method not in ("ngram", "suffix"):
        weights += int(n_draft * est.max_layer_rank)
        assumptions.append(f"speculative decoding ({draft_method}) adds {n_draft} draft layer(s) of weights and KV")
    offload = int(float(a.get("cpu_offload_gb", 0)) * GIB)
    if offload:
        weights = max(0, weights - offload)

    # --- overhead ---
    skip_profile = a.get("kv_cache_memory_bytes") is not None
    text_seqs = mm.text_num_seqs if mm and mm.text_num_seqs else num_seqs
    if mm and mm.text_tokens:
        tokens = mm.text_tokens
    activation = activation_peak(ctx, tokens, text_seqs, act_bytes, acct)
    if mm and mm.modality:
        # the encoder's own peak, or the text forward with the encoder outputs held in the encoder cache
        activation = max(mm.encoder_peak_bytes, activation + mm.encoder_output_bytes)
        assumptions.extend(mm.notes)
    elif mm and mm.skipped:
        assumptions.append(mm.skipped)
    comm, comm_parts = communication_buffers(ctx, acct)
    if comm_parts:
        assumptions.append("communication buffers: " + "; ".join(comm_parts))
    non_torch = CALIBRATION["non_torch_tp1_bytes"] + comm
    if ctx.gpu.compute_capability is None:  # AMD
        non_torch += CALIBRATION["rocm_hipblaslt_bytes"]
    biggest = biggest_stage(f.num_hidden_layers, pp)
    start, L_rank = stage_layers(f.num_hidden_layers, pp, biggest)
    moe_frac = est.moe_layers / max(1, f.num_hidden_layers)
    graph = 0
    if not a.enforce_eager:
        per = (CALIBRATION["cuda_graph_per_layer_bytes"] * (1 - moe_frac)
               + CALIBRATION["cuda_graph_per_moe_layer_bytes"] * moe_frac)
        graph = int(CALIBRATION["cuda_graph_base_bytes"] + L_rank * per)
    graph_in = graph if acct.cuda_graphs_in_budget else 0

    # --- KV per token on this GPU ---
    dbytes = kv_dtype_bytes(ctx.kv_cache_dtype, ctx.dtype)
    per_layer = kv_bytes_per_token_layer(f, tp, dbytes, ctx.kv_cache_dtype, acct)
    # layers on the PP stage with the most layers (the pool is the minimum over the GPUs of the instance), plus the
    # draft's (full attention)
    n_layers = L_rank + n_draft
    n_sliding = sliding_layers(f, start, L_rank)
    kv_per_token = per_layer * n_layers
    block = _block_size(ctx)
    bytes_per_block = block * kv_per_token

    # --- pool ---
    if skip_profile:
        pool_raw = int(a.get("kv_cache_memory_bytes"))
        activation = non_torch = graph_in = 0
        assumptions.append("kv_cache_memory_bytes given: profiling skipped, gpu_memory_utilization ignored")
    else:
        pool_raw = usable - weights - activation - non_torch - graph_in
        ipc = float(a.get("mm_ipc_gpu_memory_gb") or 0) if mm else 0.0
        if ipc > 0:
            # frontend multimodal frame buffers reserved out of the pool (vllm 0.33.0
            # vllm/multimodal/gpu_ipc_memory.py:155-240, called at gpu_worker.py:816)
            pool_raw -= int(ipc * GIB)
            assumptions.append(f"mm_ipc_gpu_memory_gb reserves {ipc:g} GiB of the KV pool")
    pool = max(0, pool_raw)
    num_blocks = pool // bytes_per_block if bytes_per_block else 0
    if a.get("num_gpu_blocks_override") is not None:
        num_blocks = int(a.get("num_gpu_blocks_override"))
        pool = num_blocks * bytes_per_block
        assumptions.append("num_gpu_blocks_override forces the block count")

    # per-request blocks (sliding layers hold only their window when the hybrid manager is active)
    def blocks_per_request(length: int) -> float:
        full_blocks = cdiv(cdiv(length, dcp), block)
        if not acct.hybrid_sliding_window:
            return full_blocks
        win = f.sliding_window or length
        sliding = min(cdiv(min(win - 1 + tokens, length), block) + 1, full_blocks) if n_sliding else 0
        return float(n_sliding * sliding + (n_layers - n_sliding) * full_blocks) / max(1, n_layers)

    per_req_blocks = blocks_per_request(mml)
    concurrency = num_blocks / per_req_blocks if per_req_blocks else 0.0
    if acct.v1_engine:
        kv_tokens = int(concurrency * mml)
    else:
        kv_tokens = num_blocks * block
    # fit check with the null block (kv_cache_planning.py:1533-1557)
    needed = int(math.ceil(per_req_blocks)) * bytes_per_block
    avail_fit = pool - bytes_per_block
    fits = num_blocks > 0 and avail_fit >= needed

    def fits_len(length: int) -> bool:
        return avail_fit >= int(math.ceil(blocks_per_request(length))) * bytes_per_block

    # estimated max model len: binary search over the same formula (kv_cache_planning.py:66-87); with full
    # attention only, blocks per request are ceil(ceil(len / dcp) / block), so the answer has a closed form
    hi = max(mml, f.derived_max_model_len)
    if acct.hybrid_sliding_window and n_sliding:
        est_len = longest_fitting(fits_len, hi)
    else:
        est_len = longest_full_attention_len(avail_fit, bytes_per_block, block, dcp, hi)

    # max_num_seqs bound (docs/operating.md §5): pool / (KV per token × average sequence length)
    wl = ctx.request.workload
    seq_len = wl.avg_seq_len if wl and wl.avg_seq_len else mml
    if not (wl and wl.avg_seq_len):
        assumptions.append("no workload.avg_seq_len: max_num_seqs_bound uses max_model_len (worst case)")
    # blocks per request at that length (equals pool / (KV per token × length) for full attention, rounded to
    # blocks; sliding-window layers count only their window)
    bpr = blocks_per_request(seq_len) if seq_len else 0
    bound = int(num_blocks // bpr) if bpr else None

    return Budget(
        gpu_memory_bytes=total,
        gpu_memory_utilization=util,
        usable_bytes=usable,
        weights_bytes_per_gpu=int(weights),
        weights_source=source,
        activation_peak_bytes=int(activation),
        non_torch_bytes=int(non_torch),
        cuda_graph_bytes=int(graph_in),
        cuda_graph_outside_budget_bytes=int(graph - graph_in),
        kv_cache_bytes_per_gpu=int(pool),
        kv_bytes_per_token_per_gpu=int(kv_per_token),
        kv_layers_per_gpu=n_layers,
        block_size=block,
        bytes_per_block=int(bytes_per_block),
        num_gpu_blocks=int(num_blocks),
        kv_cache_tokens=int(kv_tokens),
        max_model_len=mml,
        max_concurrency=concurrency,
        max_num_seqs_bound=bound,
        max_num_seqs_bound_seq_len=seq_len,
        estimated_max_model_len=est_len,
        fits_max_model_len=fits,
        needed_bytes_max_model_len=int(needed),
        profiled_tokens=int(tokens),
        pool_raw_bytes=int(pool_raw),
        accounting={
            "vllm_version": "%d.%d.%d" % acct.version,
            "engine": "v1" if acct.v1_engine else "v0",
            "cuda_graphs_in_budget": acct.cuda_graphs_in_budget,
            "mla_latent_cache": acct.mla_latent_cache,
            "hybrid_sliding_window": acct.hybrid_sliding_window,
            "tokens_formula": "int(max_concurrency × max_model_len)" if acct.v1_engine else "num_blocks × block_size",
        },
        assumptions=assumptions,
        weights_estimated_total_bytes=est.total_bytes,
        weights_params=est.total_params,
        vision_weights_bytes=int(vision_w),
        encoder_peak_bytes=int(mm.encoder_peak_bytes) if mm else 0,
        encoder_output_bytes=int(mm.encoder_output_bytes) if mm else 0,
        communication_bytes=int(comm) if not skip_profile else 0,
        multimodal={k: v for k, v in mm.as_dict().items() if k != "notes"} if mm else None,
    )


__all__ = ["Budget", "compute_budget", "estimate_weights", "format_gib", "CALIBRATION", "Accounting", "MIB"]
