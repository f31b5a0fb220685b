"""The KV cache: bytes per token on one GPU, blocks, and what one request needs (vllm 0.33.0
vllm/v1/kv_cache_interface.py:586-601, 643-648, 918-955, 1094-1148; vllm/v1/core/kv_cache_planning.py:416-556,
574-683, 1253-1285, 1461-1605)::

    buckets         = the layers of one KV cache spec (full attention, sliding window, Mamba state; kv_specs.py)
    groups          = each bucket split into groups of equal layer count (group_counts)
    bytes_per_block = one page of every layer of the widest group on this GPU
    num_blocks      = floor(KV pool / bytes_per_block)
    concurrency     = num_blocks / Σ_groups blocks one max_model_len request takes    (kv_cache_utils.py:1061-1093)
    kv_tokens       = int(concurrency × max_model_len)                                 (kv_cache_utils.py:1120-1128)

A model of one spec (full attention everywhere) is one group of all its layers: bytes_per_block = block_size ×
Σ bytes per token and layer, and a request takes cdiv(max_model_len, block_size) blocks.
"""

from __future__ import annotations

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


FULL, SLIDING, STATE = "full", "sliding", "state"


@dataclass(frozen=True, slots=True)
class Bucket:
    """Layers of one KV cache spec (vLLM buckets equal specs, kv_cache_planning.py:484-507): how many in the model
    (they set the group size), how many on the sized PP stage, the page (bytes of one block of one layer); a sliding
    layer's window; a state layer's blocks per request."""

    kind: str
    total: int
    stage: int
    page: int
    window: int | None = None
    blocks: int = 0
    block: int = 0  # tokens per block when not the layout's (DeepSeek-V4's caches)


def group_counts(buckets: tuple[Bucket, ...]) -> tuple[int, ...]:
    """KV cache groups per bucket: one bucket is one group; otherwise groups of ``min`` layers of a bucket, or
    ``max`` when the largest bucket is under 1.5 × the smallest, each bucket split into ``cdiv(layers, size)`` groups
    (padding the last) — vllm 0.33.0 vllm/v1/core/kv_cache_planning.py:516-556."""
    sizes = [b.total for b in buckets]
    if len(sizes) <= 1:
        return (1,) * len(sizes)
    size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    return tuple(cdiv(n, size) for n in sizes)


@dataclass(slots=True)  # built per plan: slots, and not frozen (a frozen __init__ calls object.__setattr__ per field)
class KvLayout:
    """The KV cache of one GPU: its buckets of layers and the KV cache groups vLLM makes of them, the attention block,
    and what a request of some length takes (``blocks_per_request``). A group's layers are ``layers[i::groups]`` of
    a bucket (kv_cache_planning.py:555), so a PP stage holding ``m`` of a bucket's layers has at most
    ``cdiv(m, groups)`` of them in one group; a block is one page of every layer of the widest group
    (kv_cache_planning.py:574-590)."""

    buckets: tuple[Bucket, ...]
    per_token: int  # bytes per token of this GPU's attention layers (the part that grows with length)
    block: int
    dcp: int  # decode context parallel size: divides the tokens a rank holds
    tokens: int  # tokens in flight per step (the profile run's max_num_batched_tokens)
    state_grows: bool = False  # Mamba "all" mode: a state block per ``block`` tokens (vllm 0.15-0.26)
    state_block: int = 0  # a state group's block size in tokens (max_model_len without prefix caching)
    state_outside_bytes: int = 0  # V0: the Mamba cache, allocated beside the pool for max_num_seqs sequences
    groups: tuple[int, ...] = ()  # given when vLLM packs the buckets otherwise (DeepSeek-V4)
    layers: int = 0  # layers holding a KV cache on this GPU (default: the buckets' layers)
    bytes_per_block: int = 0

    def __post_init__(self) -> None:
        self.groups = self.groups or group_counts(self.buckets)
        self.layers = self.layers or sum(b.stage for b in self.buckets)
        self.bytes_per_block = max(
            (cdiv(b.stage, g) * b.page for b, g in zip(self.buckets, self.groups, strict=True)), default=0
        )

    @property
    def num_groups(self) -> int:
        return sum(self.groups)

    @property
    def min_block(self) -> int:
        """The smallest block size of the groups (printed tokens before vLLM 0.21)."""
        sizes = [self.state_block or self.block if b.kind == STATE else self.block for b in self.buckets]
        return min(sizes, default=self.block)

    @property
    def all_full(self) -> bool:
        return all(b.kind == FULL for b in self.buckets)

    def bucket_blocks(self, b: Bucket, length: int) -> int:
        """Blocks one request of ``length`` tokens takes in one group of bucket ``b`` (``max_memory_usage_bytes`` /
        page): full attention ``cdiv(cdiv(length, dcp), block)`` (kv_cache_interface.py:643-648); sliding
        ``cdiv(min(window − 1 + tokens in flight, length), block) + 1`` (:918-955); a Mamba state its fixed blocks,
        plus one per block of tokens in "all" mode (:1135-1141)."""
        block = b.block or self.block
        if b.kind == FULL:
            return cdiv(cdiv(length, self.dcp), block)
        if b.kind == SLIDING:
            return cdiv(min((b.window or length) - 1 + self.tokens, length), block) + 1
        return b.blocks + (cdiv(length, block) if self.state_grows else 0)

    def blocks_per_request(self, length: int) -> int:
        """Blocks of the shared pool one request of ``length`` tokens takes: the sum over the KV cache groups
        (vllm 0.33.0 vllm/v1/core/kv_cache_utils.py:1061-1093; kv_cache_planning.py:1253-1285)."""
        return sum(g * self.bucket_blocks(b, length) for b, g in zip(self.buckets, self.groups, strict=True))

    @property
    def state_bytes_per_seq(self) -> int:
        """Pool bytes one sequence's Mamba state takes whatever its length (its fixed blocks in the state groups)."""
        fixed = sum(g * b.blocks for b, g in zip(self.buckets, self.groups, strict=True) if b.kind == STATE)
        return fixed * self.bytes_per_block

    def as_groups(self) -> list[dict[str, int | str | None]]:
        """The KV cache groups, one entry per bucket (for the API's budget)."""
        return [
            {
                "kind": b.kind,
                "layers": b.total,
                "layers_on_gpu": b.stage,
                "groups": g,
                "page_bytes": b.page,
                "window": b.window,
            }
            for b, g in zip(self.buckets, self.groups, strict=True)
        ]


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


def printed_tokens(kv: KvLayout, num_blocks: int, concurrency: float, max_model_len: int, acct: Accounting) -> int:
    """The "GPU KV cache size: N tokens" vLLM prints: V0 ``num_blocks × block_size``; V1 before 0.21
    ``num_blocks // groups × smallest group block size`` (× DCP) (vllm 0.20.0 vllm/v1/core/kv_cache_utils.py:
    1689-1703; 0.10.2 :856, :1022-1026); from 0.21 ``int(concurrency × max_model_len)`` (vllm 0.33.0
    kv_cache_utils.py:1120-1128)."""
    if not acct.v1_engine:
        return num_blocks * kv.block
    if acct.tokens_by_groups:
        return num_blocks // max(1, kv.num_groups) * kv.min_block * kv.dcp
    return int(concurrency * max_model_len)


def capacity(kv: KvLayout, pool: int, num_blocks: int, max_model_len: int, hi: int, acct: Accounting) -> Capacity:
    """Concurrency ``num_blocks / blocks per request`` and the KV tokens vLLM prints (``printed_tokens``); the fit
    check with the null block (kv_cache_planning.py:1533-1557); the estimated max model len: vLLM's binary search
    over the same formula (kv_cache_planning.py:1288-1334), a closed form with full attention only."""
    per_req_blocks = kv.blocks_per_request(max_model_len)
    concurrency = num_blocks / per_req_blocks if per_req_blocks else 0.0
    kv_tokens = printed_tokens(kv, num_blocks, concurrency, max_model_len, acct)
    needed = per_req_blocks * kv.bytes_per_block
    avail_fit = pool - kv.bytes_per_block
    fits = num_blocks > 0 and avail_fit >= needed

    def fits_len(length: int) -> bool:
        return avail_fit >= kv.blocks_per_request(length) * kv.bytes_per_block

    if kv.all_full:
        est_len = longest_full_attention_len(avail_fit, kv.bytes_per_block, kv.block, kv.dcp, hi)
    else:
        est_len = longest_fitting(fits_len, hi)
    return Capacity(concurrency, kv_tokens, needed, fits, est_len)


def max_num_seqs_bound(kv: KvLayout, num_blocks: int, seq_len: int) -> int | None:
    """docs/operating.md §5: ``pool / (KV per token × average sequence length)``, counted in blocks per request at
    that length (sliding-window layers count only their window, a Mamba state its blocks whatever the length)."""
    bpr = kv.blocks_per_request(seq_len) if seq_len else 0
    return int(num_blocks // bpr) if bpr else None
