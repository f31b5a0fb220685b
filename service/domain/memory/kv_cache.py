"""The KV cache: bytes per token on one GPU, blocks, and what one request needs (vllm 0.33.0
vllm/v1/kv_cache_interface.py:586-601, 643-648, 918-955; vllm/v1/core/kv_cache_planning.py:642-683, 1461-1605)::

    bytes_per_block = block_size × Σ_{layers on this PP stage} bytes per token and layer
    num_blocks      = floor(KV pool / bytes_per_block)
    concurrency     = num_blocks / cdiv(max_model_len, block_size)           (kv_cache_utils.py:1061-1093)
    kv_tokens       = int(concurrency × max_model_len)                       (kv_cache_utils.py:1120-1128)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..context import LaunchContext
from ..model_facts import MAX_LAYERS, ModelFacts, config_int
from .calibration import Accounting
from .stages import multiples

FP8_KV = {"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# MLA-specific packed KV dtypes, bytes per token per layer (vllm 0.33.0 vllm/v1/kv_cache_interface.py:743;
# model_executor/layers/attention/mla_attention.py:1386)
MLA_PACKED_KV = {"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def kv_dtype_bytes(kv_cache_dtype: str, model_dtype: str) -> int:
    """Bytes per KV element: ``auto`` follows the model dtype (2 for bf16/fp16, 4 for fp32); fp8* = 1
    (vllm 0.33.0 vllm/utils/torch_utils.py:40-66)."""
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
        return multiples(start, stop, 2)
    if mt.startswith("gemma3"):
        pat = int(text.get("sliding_window_pattern") or 6)
        return (stop - start) - multiples(start + 1, stop + 1, pat)
    return stop - start


def kv_bytes_per_token_layer(
    facts: ModelFacts, tp: int, dtype_bytes: int, kv_cache_dtype: str, acct: Accounting
) -> int:
    """One layer, one token, one TP rank: ``2 × max(1, kv // tp) × head_dim × dtype_bytes`` (vllm 0.33.0
    vllm/v1/kv_cache_interface.py:586-601; vllm/config/model.py:1663-1683); MLA ``(kv_lora_rank + qk_rope_head_dim)
    × dtype_bytes``, not divided by TP (656 B for fp8_ds_mla; mla_attention.py:1371-1387); before vLLM 0.7.1
    DeepSeek MLA models cached full heads with K and V padded to 256 (tests/cases/kv dsv2-lite)."""
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


@dataclass(slots=True)  # built per plan: slots, and not frozen (a frozen __init__ calls object.__setattr__ per field)
class KvLayout:
    """The KV cache of one GPU: bytes per token over its layers (the PP stage with the most layers, plus a
    speculative draft's), the block, and how the hybrid manager sizes sliding-window layers."""

    per_token: int
    layers: int
    sliding: int  # sliding-window layers among ``layers``
    block: int
    bytes_per_block: int
    dcp: int  # decode context parallel size: divides the tokens a rank holds
    window: int | None
    hybrid: bool  # the hybrid manager holds only the window of a sliding layer
    tokens: int  # tokens in flight per step (the profile run's max_num_batched_tokens)

    def blocks_per_request(self, length: int) -> float:
        """Blocks one request of ``length`` tokens needs, averaged over the layers: full attention
        ``cdiv(cdiv(length, dcp), block)``; a sliding layer under the hybrid manager
        ``cdiv(min(window − 1 + tokens in flight, length), block) + 1`` (kv_cache_interface.py:918-955)."""
        full_blocks = cdiv(cdiv(length, self.dcp), self.block)
        if not self.hybrid:
            return full_blocks
        win = self.window or length
        sliding = min(cdiv(min(win - 1 + self.tokens, length), self.block) + 1, full_blocks) if self.sliding else 0
        return float(self.sliding * sliding + (self.layers - self.sliding) * full_blocks) / max(1, self.layers)


def kv_layout(ctx: LaunchContext, acct: Accounting, start: int, stage_n: int, n_draft: int, tokens: int) -> KvLayout:
    """The KV layout of the PP stage whose layers are ``[start, start + stage_n)`` (the pool is the minimum over the
    GPUs of the instance), plus the draft's layers (full attention)."""
    per_layer = kv_bytes_per_token_layer(
        ctx.facts, ctx.tp, kv_dtype_bytes(ctx.kv_cache_dtype, ctx.dtype), ctx.kv_cache_dtype, acct
    )
    layers = stage_n + n_draft
    per_token = per_layer * layers
    block = ctx.block_size
    return KvLayout(
        per_token=per_token,
        layers=layers,
        sliding=sliding_layers(ctx.facts, start, stage_n),
        block=block,
        bytes_per_block=block * per_token,
        dcp=ctx.args.decode_context_parallel_size,
        window=ctx.facts.sliding_window,
        hybrid=acct.hybrid_sliding_window,
        tokens=tokens,
    )


def longest_fitting(fits: Callable[[int], bool], hi: int) -> int:
    """The largest length in 1..hi for which ``fits`` holds (monotone), else 0: vLLM's binary search
    (vllm 0.33.0 vllm/v1/core/kv_cache_planning.py:66-87)."""
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


@dataclass(slots=True)  # built per plan: slots, and not frozen (a frozen __init__ calls object.__setattr__ per field)
class Capacity:
    """What a pool of ``num_blocks`` blocks holds at ``max_model_len``: vLLM's concurrency and token figures, the
    fit check with the null block and the longest length that fits."""

    concurrency: float
    kv_tokens: int
    needed_bytes: int
    fits: bool
    estimated_max_model_len: int


def capacity(kv: KvLayout, pool: int, num_blocks: int, max_model_len: int, hi: int, v1_engine: bool) -> Capacity:
    """Concurrency and the KV tokens vLLM prints (V1: ``int(concurrency × max_model_len)``; V0: ``num_blocks ×
    block_size``); the fit check with the null block (kv_cache_planning.py:1533-1557); the estimated max model len:
    vLLM's binary search over the same formula (kv_cache_planning.py:66-87), a closed form with full attention only
    (blocks per request ceil(ceil(len / dcp) / block))."""
    per_req_blocks = kv.blocks_per_request(max_model_len)
    concurrency = num_blocks / per_req_blocks if per_req_blocks else 0.0
    kv_tokens = int(concurrency * max_model_len) if v1_engine else num_blocks * kv.block
    needed = int(math.ceil(per_req_blocks)) * kv.bytes_per_block
    avail_fit = pool - kv.bytes_per_block
    fits = num_blocks > 0 and avail_fit >= needed

    def fits_len(length: int) -> bool:
        return avail_fit >= int(math.ceil(kv.blocks_per_request(length))) * kv.bytes_per_block

    if kv.hybrid and kv.sliding:
        est_len = longest_fitting(fits_len, hi)
    else:
        est_len = longest_full_attention_len(avail_fit, kv.bytes_per_block, kv.block, kv.dcp, hi)
    return Capacity(concurrency, kv_tokens, needed, fits, est_len)


def max_num_seqs_bound(kv: KvLayout, num_blocks: int, seq_len: int) -> int | None:
    """docs/operating.md §5: ``pool / (KV per token × average sequence length)``, counted in blocks per request at
    that length (sliding-window layers count only their window)."""
    bpr = kv.blocks_per_request(seq_len) if seq_len else 0
    return int(num_blocks // bpr) if bpr else None
