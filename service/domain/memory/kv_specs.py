"""The KV cache spec of every decoder layer, as vLLM builds it per layer (``get_kv_cache_spec``), grouped into the
buckets vLLM's planner groups (layers of equal spec), with the page (bytes of one block of one layer) each bucket
stores.

- attention: ``FullAttentionSpec`` / ``SlidingWindowSpec`` of ``block_size`` tokens × the per-token bytes
  (vllm 0.33.0 vllm/v1/kv_cache_interface.py:586-601, 901-955); MLA the latent (``MLAAttentionSpec``, :729-748);
- Mamba-like mixers (Mamba, Mamba2, Gated DeltaNet, short convolution): a ``MambaSpec`` whose page is the recurrent
  state of one sequence, independent of its length (kv_cache_interface.py:1094-1148; state shapes
  vllm/model_executor/layers/mamba/mamba_utils.py:171-284, dtypes :98-130);
- hybrid models (attention beside a state mixer): the attention block is raised until its page holds the state page,
  and the state page is padded to it (vllm 0.33.0 vllm/platforms/interface.py:940-1134), so every bucket has one
  page size and the planner groups them by count (kv_cache_planning.py:416-556).
"""

from __future__ import annotations

import math

from ..context import LaunchContext
from ..model_facts import MAX_HEAD_DIM, MAX_HEADS, MAX_WIDTH, ModelFacts, config_int
from .calibration import STATE_MIXERS, V0_DEFAULT_MAX_NUM_SEQS, Accounting
from .kv_cache import (
    DTYPE_BYTES,
    FULL,
    SLIDING,
    STATE,
    Bucket,
    KvLayout,
    cdiv,
    kv_bytes_per_token_layer,
    kv_dtype_bytes,
    sliding_layers,
)
from .kv_dsv4 import dsv4_layout

DSV4_MIXERS = ("dsv4", "dsv4_c4", "dsv4_c128")
ATTENTION_MIXERS = ("attention", "mla", *DSV4_MIXERS)
# models whose Mamba layers checkpoint every block under prefix caching ("all" mode, vllm 0.15-0.26) are the
# SupportsMambaPrefixCaching classes, which the generated registry names; for a class it could not read, the
# mixers: Mamba and Mamba2 (vllm 0.24.0 model_executor/models/{nemotron_h,jamba,mamba,mamba2,zamba2,
# granitemoehybrid,falcon_h1}.py); GDN and short convolution fall back to "align"
ALL_MODE_MIXERS = {"mamba", "mamba2"}
MIN_KERNEL_BLOCK = 16  # FlashAttention / FlashInfer / Triton: MultipleOf(16) (v1/attention/backends/triton_attn.py:339)
GDN_FLASHINFER_CHECKPOINT = 64  # vllm 0.33.0 v1/attention/backends/gdn_attn.py:34


def _dim(f: ModelFacts, keys: tuple[str, ...], default: int, hi: int) -> int:
    """The first of ``keys`` config.json sets (a positive integer at most ``hi``), else ``default``."""
    text = f.raw_text_config
    prefix = "model.config." + ("text_config." if text is not f.raw_config and f.raw_config else "")
    for k in keys:
        v = config_int(text.get(k), prefix + k, 0, hi)
        if v:
            return v
    return default


def _mamba2_state(f: ModelFacts, tp: int, spec: int) -> tuple[int, int]:
    """Conv and SSM state elements of one Mamba2 layer on one rank: conv ``(kernel − 1 + spec) × (I + 2·G'·N) / tp``
    with the groups ``G`` raised to TP when TP does not divide them, SSM ``heads / tp × head_dim × N``
    (mamba_utils.py:186-210, 261-270). ``I`` = heads × head_dim (Nemotron-H, nemotron_h.py:799) or
    ``mamba_expand × hidden`` (Granite-4, granitemoehybrid.py:634)."""
    heads = _dim(f, ("mamba_num_heads", "mamba_n_heads"), 0, MAX_HEADS)
    hdim = _dim(f, ("mamba_head_dim", "mamba_d_head"), 64, MAX_HEAD_DIM)
    inter = heads * hdim if "mamba_num_heads" in f.raw_text_config and heads else 0
    inter = inter or _dim(f, ("mamba_expand", "expand"), 2, 64) * f.hidden_size
    heads = heads or max(1, inter // hdim)
    state = _dim(f, ("ssm_state_size", "mamba_d_state"), 128, MAX_HEAD_DIM)
    kernel = _dim(f, ("conv_kernel", "mamba_d_conv"), 4, MAX_HEAD_DIM)
    groups = _dim(f, ("n_groups", "mamba_n_groups"), 1, MAX_HEADS)
    groups += 0 if groups % tp == 0 else tp - groups
    return (kernel - 1 + spec) * ((inter + 2 * groups * state) // tp), heads // tp * hdim * state


def _mamba1_state(f: ModelFacts, tp: int) -> tuple[int, int]:
    """Jamba's Mamba: conv ``(kernel − 1) × I / tp``, SSM ``I / tp × N`` with ``I = mamba_expand × hidden``
    (mamba_utils.py:171-184; jamba.py:470-483)."""
    inter = _dim(f, ("mamba_expand",), 2, 64) * f.hidden_size
    state = _dim(f, ("mamba_d_state", "state_size"), 16, MAX_HEAD_DIM)
    kernel = _dim(f, ("mamba_d_conv", "conv_kernel"), 4, MAX_HEAD_DIM)
    return (kernel - 1) * (inter // tp), inter // tp * state


def _gdn_state(f: ModelFacts, tp: int, spec: int) -> tuple[int, int]:
    """Gated DeltaNet: conv ``(kernel − 1 + spec) × (2·Hk·Dk + Hv·Dv) / tp``, recurrent ``Hv / tp × Dv × Dk``
    (mamba_utils.py:272-294; qwen3_next.py:893-912)."""
    nk = _dim(f, ("linear_num_key_heads",), 16, MAX_HEADS)
    nv = _dim(f, ("linear_num_value_heads",), 32, MAX_HEADS)
    dk = _dim(f, ("linear_key_head_dim",), 128, MAX_HEAD_DIM)
    dv = _dim(f, ("linear_value_head_dim",), 128, MAX_HEAD_DIM)
    kernel = _dim(f, ("linear_conv_kernel_dim",), 4, MAX_HEAD_DIM)
    return (kernel - 1 + spec) * ((2 * nk * dk + nv * dv) // tp), nv // tp * dv * dk


def _short_conv_state(f: ModelFacts, tp: int, spec: int) -> tuple[int, int]:
    """LFM2 short convolution: conv ``(L_cache − 1 + spec) × conv_dim / tp``, no SSM state (mamba_utils.py:249-259;
    lfm2.py:556-577)."""
    dim = _dim(f, ("conv_dim",), f.hidden_size, MAX_WIDTH)
    return (_dim(f, ("conv_L_cache",), 3, MAX_HEAD_DIM) - 1 + spec) * (dim // tp), 0


def state_page(f: ModelFacts, mixer: str, tp: int, spec: int, conv_bytes: int, ssm_bytes: int) -> int:
    """Bytes of one sequence's state in one layer of ``mixer`` on one rank: the ``MambaSpec`` page before padding
    (kv_cache_interface.py:1117-1130)."""
    if mixer == "mamba2":
        conv, ssm = _mamba2_state(f, tp, spec)
    elif mixer == "mamba":
        conv, ssm = _mamba1_state(f, tp)
    elif mixer == "gdn":
        conv, ssm = _gdn_state(f, tp, spec)
    else:
        conv, ssm = _short_conv_state(f, tp, spec)
    return conv * conv_bytes + ssm * ssm_bytes


def state_dtype_bytes(ctx: LaunchContext, acct: Accounting) -> tuple[int, int]:
    """Bytes per element of the conv and SSM states: ``mamba_cache_dtype`` (auto: the model dtype) and
    ``mamba_ssm_cache_dtype`` (auto: the conv dtype), except where vLLM sets the SSM dtype from the config:
    Nemotron-H ``mamba_ssm_cache_dtype`` (else float16 from 0.13, float32 from 0.20; vllm 0.33.0
    model_executor/models/config.py:812-839), Qwen3.5 ``mamba_ssm_dtype`` from 0.18 (config.py:953-977)
    (mamba_utils.py:98-111)."""
    conv = kv_dtype_bytes(str(ctx.args.get("mamba_cache_dtype") or "auto"), ctx.dtype)
    given = str(ctx.args.get("mamba_ssm_cache_dtype") or "auto").lower()
    text, archs = ctx.facts.raw_text_config, ctx.facts.architectures
    if given == "auto" and acct.version >= (0, 13, 0) and any(a.startswith("NemotronH") for a in archs):
        given = str(text.get("mamba_ssm_cache_dtype") or ("float32" if acct.version >= (0, 20, 0) else "float16"))
    elif given == "auto" and acct.version >= (0, 18, 0) and any(a.startswith("Qwen3_5") for a in archs):
        given = str(text.get("mamba_ssm_dtype") or "auto")
    return conv, (conv if given == "auto" else DTYPE_BYTES.get(given.lower(), conv))


def speculative_tokens(ctx: LaunchContext) -> int:
    """``speculative_config.num_speculative_tokens`` (0 without speculative decoding)."""
    spec = ctx.args.get("speculative_config")
    n = spec.get("num_speculative_tokens") if isinstance(spec, dict) else None
    return n if type(n) is int and 0 < n <= 64 else 0


def mamba_mode(ctx: LaunchContext, acct: Accounting, mixers: set[str], hybrid: bool) -> str:
    """vLLM's ``mamba_cache_mode``: ``none`` without prefix caching — on by default for hybrid models from 0.26
    (vllm 0.26.0 config/model.py:1895-1897; before, "still experimental"), off for attention-free ones; with it,
    0.11-0.13 cache the state per block (``all``, vllm 0.13.0 v1/kv_cache_interface.py:262-264), 0.15-0.26 ``all``
    where the model supports Mamba prefix caching else ``align`` (0.21-0.26: ``align`` with speculative decoding;
    vllm 0.24.0 model_executor/models/config.py:417-437), from 0.28 ``align`` (vllm 0.33.0 config.py:763-770)."""
    given = ctx.args.get("enable_prefix_caching")
    on = given if isinstance(given, bool) else hybrid and acct.version >= (0, 26, 0)
    if not on or acct.version < (0, 11, 0):
        return "none"
    if acct.version < (0, 15, 0):
        return "all"
    if acct.version >= (0, 28, 0) or (acct.version >= (0, 21, 0) and speculative_tokens(ctx)):
        return "align"
    supported = _mamba_prefix_caching_class(ctx)
    if supported is None:  # the registry could not read the class (or predates the fact): its mixers tell
        supported = mixers <= ALL_MODE_MIXERS
    return "all" if supported else "align"


def _mamba_prefix_caching_class(ctx: LaunchContext) -> bool | None:
    """Whether the release's model class implements SupportsMambaPrefixCaching (the generated registry)."""
    for name in ctx.facts.architectures:
        arch = ctx.line.architectures.get(name)
        if arch is not None:
            return arch.supports_mamba_prefix_caching
    return None


def gdn_checkpoints(ctx: LaunchContext, acct: Accounting) -> bool:
    """Gated DeltaNet exports prefill checkpoints in ``align`` mode when its prefill runs on FlashInfer: Hopper, or
    Blackwell with 128-wide key heads (CUDA 13 runtime assumed) — vllm 0.33.0
    model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:148-260, 685-700, 736-760."""
    cc = ctx.gpu.compute_capability
    if acct.version < (0, 33, 0) or cc is None or str(ctx.gpu.vendor).lower() != "nvidia":
        return False
    wide = _dim(ctx.facts, ("linear_key_head_dim",), 128, MAX_HEAD_DIM) == 128
    return cc == (9, 0) or (cc[0] in (10, 12) and wide)


def state_blocks(ctx: LaunchContext, acct: Accounting, mixer: str, mode: str) -> int:
    """Blocks a request holds in one state group: ``1 + spec`` (``none``), ``2 + spec`` plus a prefill checkpoint
    block where the layer exports one (``align``: Mamba2 from 0.32, mamba_mixer2.py:1108-1118; GDN on FlashInfer
    from 0.33), ``spec`` plus one per block of tokens (``all``) — kv_cache_interface.py:1135-1141 (vllm 0.33.0),
    0.24.0 :649-657; speculative blocks from 0.15, 0.24 in ``all`` mode."""
    spec = speculative_tokens(ctx) if acct.version >= (0, 15, 0) else 0
    if mode == "all":
        return spec if acct.version >= (0, 24, 0) else 0
    if mode == "none":
        return 1 + spec
    ckpt = (mixer == "mamba2" and acct.version >= (0, 32, 0)) or (mixer == "gdn" and gdn_checkpoints(ctx, acct))
    return 2 + spec + int(ckpt)


def hybrid_block(ctx: LaunchContext, acct: Accounting, attn1: int, state: int, mode: str, align: int) -> int:
    """The attention block of a hybrid model: the smallest multiple of the kernel alignment (``max(16, block_size)``;
    at least 128 for MLA from 0.28; times the prefill-checkpoint alignment in ``align`` mode) whose page holds the
    largest state page (vllm 0.33.0 vllm/platforms/interface.py:1069-1112); in ``all`` mode a multiple of the Mamba
    chunk size (vllm 0.24.0 platforms/interface.py:755-764)."""
    k = max(MIN_KERNEL_BLOCK, ctx.block_size)
    if ctx.facts.is_mla and acct.version >= (0, 28, 0):
        k = max(k, 128)
    if mode == "all":
        chunk = _dim(ctx.facts, ("mamba_chunk_size", "chunk_size"), 2048, 1 << 20)
        step = math.lcm(chunk, k)
        return max(ctx.block_size, step * cdiv(cdiv(state, attn1), step))
    k = math.lcm(k, align) if mode == "align" else k
    return max(ctx.block_size, k * cdiv(state, k * attn1))


def _count(f: ModelFacts, lo: int, hi: int, mixers: tuple[str, ...]) -> int:
    return f.layout.count_mixers(lo, hi, mixers)


def attention_buckets(
    ctx: LaunchContext, acct: Accounting, start: int, stage_n: int, n_draft: int, page: int
) -> list[Bucket]:
    """Full and sliding-window attention layers (a draft's layers are full attention). Sliding layers are a bucket of
    their own under the hybrid KV cache manager (V1 from 0.10, unless ``disable_hybrid_kv_cache_manager``), else
    full attention (kv_cache_planning.py:853-876)."""
    f, L = ctx.facts, ctx.facts.num_hidden_layers
    total, stage = _count(f, 0, L, ATTENTION_MIXERS), _count(f, start, start + stage_n, ATTENTION_MIXERS)
    hybrid = acct.hybrid_sliding_window and ctx.args.get("disable_hybrid_kv_cache_manager") is not True
    sw_total = min(total, sliding_layers(f, 0, L)) if hybrid else 0
    sw_stage = min(stage, sliding_layers(f, start, stage_n)) if hybrid else 0
    out = []
    if total - sw_total + n_draft:
        out.append(Bucket(FULL, total - sw_total + n_draft, stage - sw_stage + n_draft, page))
    if sw_total:
        out.append(Bucket(SLIDING, sw_total, sw_stage, page, window=f.sliding_window))
    return out


def v0_mamba_slots(ctx: LaunchContext) -> int:
    """Sequences V0's Mamba cache holds: ``max_num_seqs`` (V0's default 256), padded to a CUDA-graph batch size (1,
    2, 4, then multiples of 8) unless eager (vllm 0.7.3 model_executor/models/mamba_cache.py:31-39)."""
    n = max(1, int(ctx.args.get("max_num_seqs", V0_DEFAULT_MAX_NUM_SEQS)))
    if ctx.args.get("enforce_eager") is True or n <= 2:
        return n
    return 4 if n <= 4 else cdiv(n, 8) * 8


def kv_layout(ctx: LaunchContext, acct: Accounting, start: int, stage_n: int, n_draft: int, tokens: int) -> KvLayout:
    """The KV layout of the PP stage whose layers are ``[start, start + stage_n)`` (the pool is the minimum over the
    GPUs of the instance), plus the draft's layers: buckets of attention layers and of state layers; a hybrid
    model's block raised so its attention page holds the state page, the state page padded to it (module
    docstring). V0 kept the Mamba state beside the pool, for ``max_num_seqs`` sequences."""
    f, L, hi = ctx.facts, ctx.facts.num_hidden_layers, start + stage_n
    if _count(f, 0, L, DSV4_MIXERS) and acct.v1_engine:
        return dsv4_layout(ctx, start, stage_n, n_draft, tokens)
    attn1 = kv_bytes_per_token_layer(f, ctx.tp, kv_dtype_bytes(ctx.kv_cache_dtype, ctx.dtype), ctx.kv_cache_dtype, acct)
    per_token = (_count(f, start, hi, ATTENTION_MIXERS) + n_draft) * attn1
    dcp = ctx.args.decode_context_parallel_size
    present = f.layout.mixers
    states = {
        m: (f.layout.count_where(0, L, mixer=m), f.layout.count_where(start, hi, mixer=m))
        for m in STATE_MIXERS
        if m in present
    }
    if not states:
        buckets = attention_buckets(ctx, acct, start, stage_n, n_draft, ctx.block_size * attn1)
        return KvLayout(tuple(buckets), per_token, ctx.block_size, dcp, tokens)
    conv, ssm = state_dtype_bytes(ctx, acct)
    pages = {m: state_page(f, m, ctx.tp, speculative_tokens(ctx), conv, ssm) for m in states}
    if not acct.v1_engine:
        outside = v0_mamba_slots(ctx) * sum(pages[m] * s for m, (_, s) in states.items())
        buckets = attention_buckets(ctx, acct, start, stage_n, n_draft, ctx.block_size * attn1)
        return KvLayout(tuple(buckets), per_token, ctx.block_size, dcp, tokens, state_outside_bytes=outside)
    hybrid = _count(f, 0, L, ATTENTION_MIXERS) + n_draft > 0
    mode = mamba_mode(ctx, acct, set(states), hybrid)
    align = GDN_FLASHINFER_CHECKPOINT if "gdn" in states and mode == "align" and gdn_checkpoints(ctx, acct) else 1
    block = hybrid_block(ctx, acct, attn1, max(pages.values()), mode, align) if hybrid else ctx.block_size
    page = block * attn1 if hybrid else max(pages.values())
    buckets = attention_buckets(ctx, acct, start, stage_n, n_draft, page) + [
        Bucket(STATE, t, s, page, blocks=state_blocks(ctx, acct, m, mode)) for m, (t, s) in states.items()
    ]
    state_block = ctx.max_model_len if mode == "none" else block
    return KvLayout(tuple(buckets), per_token, block, dcp, tokens, mode == "all", state_block)
