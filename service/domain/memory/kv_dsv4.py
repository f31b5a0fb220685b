"""DeepSeek-V4's KV cache: several caches per decoder layer, packed side by side in each block (vllm 0.33.0,
NVIDIA's default path: FlashMLA sparse, or FlashInfer on SM12, both in the ``fp8_ds_mla`` layout,
vllm/models/deepseek_v4/attention.py:152; nvidia/model.py:537-568).

Every layer (``compress_ratios``: 4, 128, else sliding window only; the MTP layer sliding only, attention.py:236-241):

- its sliding-window cache: 64-token blocks of 584 B a token, window ``sliding_window``
  (v1/attention/backends/mla/sparse_swa.py:76-150; attention.py:349-356);
- ratio r > 1: the compressed latent, one 584 B state per r tokens in 256-token blocks (attention.py:860-881; 256 is
  the one kernel block the sparse-MLA and indexer backends take, models/deepseek_v4/sparse_mla.py:60-61,
  v1/attention/backends/mla/indexer.py:355-357), and its compressor's fp32 state of 2 · coff · head_dim (coff 2 at
  r = 4), a sliding window of coff · r tokens in blocks of 4 (r = 4) or 8 (compressor.py:138-192, 239-290);
- ratio 4 also the indexer: its key cache, a 132 B state (128 fp8 + 4 B scale) per 4 tokens in 256-token blocks
  (attention.py:1019-1037, 911-928), and its own compressor over the 128-wide index head.

Pages are padded to 576 B (``alignment``, kv_cache_interface.py:718-727). The planner buckets caches of one type and
block size, splits balanced buckets into groups of a common number of pattern repeats (``_approximate_gcd``) and
packs every group's pages into one block (kv_cache_planning.py:879-1041, 574-605).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..context import LaunchContext
from ..model_facts import MAX_HEAD_DIM, ModelFacts, config_int
from .kv_cache import FULL, SLIDING, Bucket, KvLayout, cdiv

ALIGN = 576  # fp8_ds_mla page alignment
STATE_BYTES = 584  # 448 B NoPE + 128 B RoPE + 8 B scale, one token (or one compressed state)
CACHE_BLOCK = 256
SWA_BLOCK = 64


def _pad(page: int) -> int:
    return cdiv(page, ALIGN) * ALIGN


@dataclass(frozen=True, slots=True)
class Packed:
    """One planner bucket: its cache kind, block and window, and per page size the layers of the model and of the
    sized stage holding a cache of that page."""

    kind: str
    block: int
    window: int | None
    total: dict[int, int]
    stage: dict[int, int]

    @property
    def balanced(self) -> bool:
        return len(set(self.total.values())) == 1

    @property
    def repeats(self) -> int:
        return max(self.total.values())


def approximate_gcd(values: list[int], lower: int) -> int:
    """The chunk in ``[lower, max(values)]`` that pads ``values`` up least (ties: the larger) — vLLM's brute force
    (kv_cache_planning.py:879-911); the values are layer counts (at most 10,000)."""
    best, best_pad = lower, None
    for d in range(max(1, lower), max(values) + 1):
        pad = sum((d - v % d) % d for v in values)
        if best_pad is None or pad <= best_pad:
            best, best_pad = d, pad
    return best


def group_buckets(packed: list[Packed]) -> tuple[tuple[Bucket, ...], tuple[int, ...]]:
    """``_get_packed_kv_cache_groups`` on layer counts (kv_cache_planning.py:958-1041): balanced buckets of several
    page sizes fix the least repeats a group holds; balanced buckets split into ``cdiv(repeats, chunk)`` groups of
    one page of each size per repeat; an unbalanced bucket is one group of all its layers."""
    floor = max((p.repeats for p in packed if p.balanced and len(p.total) > 1), default=0)
    chunk = approximate_gcd([p.repeats for p in packed if p.balanced], floor) if floor else None
    buckets, groups = [], []
    for p in packed:
        if p.balanced and chunk:
            stage = max(p.stage.values(), default=0)
            buckets.append(Bucket(p.kind, p.repeats, stage, sum(p.total.keys()), p.window, block=p.block))
            groups.append(cdiv(p.repeats, chunk))
        else:
            page = sum(size * n for size, n in p.stage.items())
            buckets.append(Bucket(p.kind, 1, 1 if page else 0, page, p.window, block=p.block))
            groups.append(1)
    return tuple(buckets), tuple(groups)


def _add(d: dict[int, int], page: int, n: int) -> None:
    if n:
        d[page] = d.get(page, 0) + n


def dsv4_buckets(f: ModelFacts, start: int, stage_n: int, n_draft: int) -> list[Packed]:
    """The four planner buckets: compressed and indexer caches (full-attention type, 256-token blocks), the
    sliding-window caches, the ratio-4 compressor states (window 8, block 4) and the ratio-128 ones (window 128,
    block 8)."""
    head = f.head_dim
    index = config_int(f.raw_text_config.get("index_head_dim"), "model.config.index_head_dim", 0, MAX_HEAD_DIM) or 128
    window = f.sliding_window or 128
    pages = {
        "c4": _pad(CACHE_BLOCK // 4 * STATE_BYTES),
        "c128": _pad(CACHE_BLOCK // 128 * STATE_BYTES),
        "idx": _pad(CACHE_BLOCK // 4 * (index + index // 128 * 4)),
        "swa": _pad(SWA_BLOCK * STATE_BYTES),
        "comp4": _pad(4 * 2 * 2 * head * 4),
        "comp128": _pad(8 * 2 * head * 4),
        "idxcomp": _pad(4 * 2 * 2 * index * 4),
    }
    out = []
    for kind, block, win, keys in (
        (FULL, CACHE_BLOCK, None, (("c4", 1), ("c128", 2), ("idx", 1))),
        (SLIDING, SWA_BLOCK, window, (("swa", 0),)),
        (SLIDING, 4, 8, (("comp4", 1), ("idxcomp", 1))),
        (SLIDING, 8, 128, (("comp128", 2),)),
    ):
        total: dict[int, int] = {}
        stage: dict[int, int] = {}
        for key, which in keys:
            _add(total, pages[key], _layers(f, 0, f.num_hidden_layers, which, n_draft))
            _add(stage, pages[key], _layers(f, start, start + stage_n, which, n_draft))
        if total:
            out.append(Packed(kind, block, win, total, stage))
    return out


def _layers(f: ModelFacts, lo: int, hi: int, which: int, n_draft: int) -> int:
    """Layers of ``[lo, hi)`` with a cache of this kind: 0 every layer (and the draft's), 1 ratio 4, 2 ratio 128."""
    c4, c128 = f.layout.count_where(lo, hi, mixer="dsv4_c4"), f.layout.count_where(lo, hi, mixer="dsv4_c128")
    if which == 0:
        return f.layout.count_where(lo, hi, mixer="dsv4") + c4 + c128 + n_draft
    return c4 if which == 1 else c128


def dsv4_layout(ctx: LaunchContext, start: int, stage_n: int, n_draft: int, tokens: int) -> KvLayout:
    """DeepSeek-V4's KV layout of the PP stage ``[start, start + stage_n)`` (module docstring). Its KV per token is
    the compressed caches' share of a block; everything else is per request."""
    packed = dsv4_buckets(ctx.facts, start, stage_n, n_draft)
    buckets, groups = group_buckets(packed)
    per_token = sum(b.stage * b.page // CACHE_BLOCK for b in buckets if b.kind == FULL)
    layers = stage_n + n_draft
    return KvLayout(buckets, per_token, CACHE_BLOCK, 1, tokens, groups=groups, layers=layers)
