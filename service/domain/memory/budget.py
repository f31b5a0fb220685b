"""The budget: the terms of this package assembled into one GPU's KV pool and what it holds.

usable     = ceil(torch-visible total × gpu_memory_utilization)
KV pool    = usable − weights − activation peak − non-torch − CUDA graphs (in the budget from v0.21)
             (or ``kv_cache_memory_bytes`` as given; ``mm_ipc_gpu_memory_gb`` reserved out of it)
num_blocks = floor(KV pool / bytes_per_block), or ``num_gpu_blocks_override``
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from ..context import LaunchContext
from ..gpus import GIB
from ..multimodal import EncoderProfile, encoder_profile
from .activation import profile_peak, profile_run
from .calibration import Accounting, accounting_for, torch_total_bytes
from .communication import non_torch_bytes
from .cuda_graphs import cuda_graph_bytes
from .kv_cache import DTYPE_BYTES, capacity, draft_layers, max_num_seqs_bound
from .kv_specs import kv_layout
from .stages import biggest_stage, stage_layers
from .weights import weights_on_gpu


def format_gib(b: float) -> float:
    """vLLM's ``format_gib``: ``round(b / 2**30, 2)`` (vllm/utils/mem_utils.py:30-31)."""
    return round(b / GIB, 2)


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
    kv_layers_per_gpu: int  # layers holding a KV cache spec on this GPU (attention, Mamba state)
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
    kv_state_bytes_per_seq: int = 0  # pool bytes a sequence's Mamba state takes, whatever its length
    kv_cache_groups: list[dict[str, Any]] = field(default_factory=list)  # vLLM's KV cache groups, per layer spec

    @property
    def overhead_bytes(self) -> int:
        return self.activation_peak_bytes + self.non_torch_bytes + self.cuda_graph_bytes

    @property
    def log_line(self) -> str:
        """vLLM's start-up line (kv_cache_utils.py:1147-1154)."""
        return (
            f"GPU KV cache size: {self.kv_cache_tokens:,} tokens, Maximum concurrency for "
            f"{self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x"
        )

    def as_dict(self) -> dict[str, Any]:
        names, getter = _budget_fields()
        d = dict(zip(names, getter(self)))  # flat values: no deep copy needed
        d["accounting"], d["assumptions"] = dict(self.accounting), list(self.assumptions)
        d["multimodal"] = dict(self.multimodal) if self.multimodal is not None else None
        d["kv_cache_groups"] = [dict(g) for g in self.kv_cache_groups]
        d["overhead_bytes"] = self.overhead_bytes
        d["overhead"] = {
            "activation_peak_bytes": self.activation_peak_bytes,
            "non_torch_bytes": self.non_torch_bytes,
            "cuda_graph_bytes": self.cuda_graph_bytes,
        }
        d["log_line"] = self.log_line
        d["gib"] = {
            k: round(v / GIB, 2)
            for k, v in (  # format_gib, inlined (eight calls per plan)
                ("gpu_memory", self.gpu_memory_bytes),
                ("usable", self.usable_bytes),
                ("weights_per_gpu", self.weights_bytes_per_gpu),
                ("overhead", self.overhead_bytes),
                ("activation_peak", self.activation_peak_bytes),
                ("non_torch", self.non_torch_bytes),
                ("cuda_graph", self.cuda_graph_bytes),
                ("kv_cache_per_gpu", self.kv_cache_bytes_per_gpu),
            )
        }
        d["max_concurrency"] = round(self.max_concurrency, 4)
        return d


@functools.lru_cache(maxsize=1)
def _budget_fields() -> tuple[tuple[str, ...], Callable[[Budget], tuple[Any, ...]]]:
    """The field names and one getter for all of them (a tuple, in field order)."""
    names = tuple(f.name for f in fields(Budget))
    return names, operator.attrgetter(*names)


@dataclass(slots=True)  # built per plan: slots, and not frozen (a frozen __init__ calls object.__setattr__ per field)
class Pool:
    """The KV pool of one GPU: the raw remainder (may be negative), the pool, its blocks and what shaped them."""

    raw: int
    bytes: int
    num_blocks: int
    profiling_skipped: bool
    notes: tuple[str, ...]


def kv_pool(ctx: LaunchContext, multimodal: bool, remainder: int, bytes_per_block: int) -> Pool:
    """The pool from the budget's ``remainder`` (usable less weights and overhead); ``kv_cache_memory_bytes``
    replaces it and skips profiling (vllm 0.33.0 vllm/v1/worker/gpu_worker.py:656-681); the frontend's multimodal
    frame buffers come out of it (vllm/multimodal/gpu_ipc_memory.py:155-240, called at gpu_worker.py:816);
    ``num_gpu_blocks_override`` forces the block count (kv_cache_planning.py:242-248)."""
    a = ctx.args
    notes: list[str] = []
    given = a.get("kv_cache_memory_bytes")
    if given is not None:
        raw = int(given)
        notes.append("kv_cache_memory_bytes given: profiling skipped, gpu_memory_utilization ignored")
    else:
        raw = remainder
        ipc = float(a.get("mm_ipc_gpu_memory_gb") or 0) if multimodal else 0.0
        if ipc > 0:
            raw -= int(ipc * GIB)
            notes.append(f"mm_ipc_gpu_memory_gb reserves {ipc:g} GiB of the KV pool")
    pool = max(0, raw)
    num_blocks = pool // bytes_per_block if bytes_per_block else 0
    if a.get("num_gpu_blocks_override") is not None:
        num_blocks = int(a.get("num_gpu_blocks_override"))
        pool = num_blocks * bytes_per_block
        notes.append("num_gpu_blocks_override forces the block count")
    return Pool(raw, pool, num_blocks, given is not None, tuple(notes))


def _encoder_fields(mm: EncoderProfile | None) -> dict[str, Any]:
    """The budget's multimodal fields (zero / None for a text-only model)."""
    if mm is None:
        return {"vision_weights_bytes": 0, "encoder_peak_bytes": 0, "encoder_output_bytes": 0, "multimodal": None}
    return {
        "vision_weights_bytes": int(mm.vision_weights_bytes),
        "encoder_peak_bytes": int(mm.encoder_peak_bytes),
        "encoder_output_bytes": int(mm.encoder_output_bytes),
        "multimodal": {k: v for k, v in mm.as_dict().items() if k != "notes"},
    }


def compute_budget(ctx: LaunchContext, *, accounting_version: str | None = None) -> Budget:
    """The per-GPU budget of one instance, for ``ctx.version`` (or ``accounting_version``: the version that
    printed a figure, used by the calibration benchmark). Pure function of the context; each term comes from its
    module of this package."""
    acct, assumptions = accounting_for(ctx, accounting_version)
    f, mml = ctx.facts, ctx.max_model_len
    act_bytes = DTYPE_BYTES.get(ctx.dtype, 2)
    total = torch_total_bytes(ctx)
    usable = math.ceil(total * ctx.gpu_memory_utilization)
    run = profile_run(ctx, acct)
    mm = encoder_profile(
        f,
        ctx.args,
        v1_engine=acct.v1_engine,
        tp=ctx.tp,
        act_bytes=act_bytes,
        weight_bytes=act_bytes,
        max_model_len=mml,
        max_num_batched_tokens=run.tokens,
        max_num_seqs=run.num_seqs,
        chunked_prefill=run.chunked,
        preprocessor=ctx.request.model.preprocessor_config,
        version=acct.version,
    )
    n_draft, draft_method = draft_layers(ctx)
    weights = weights_on_gpu(ctx, mm, act_bytes, n_draft, draft_method)
    assumptions += weights.notes
    tokens, activation, notes = profile_peak(ctx, run, mm, act_bytes, acct)
    assumptions += notes
    non_torch, comm, notes = non_torch_bytes(ctx, acct)
    assumptions += notes
    start, stage_n = stage_layers(f.num_hidden_layers, ctx.pp, biggest_stage(f.num_hidden_layers, ctx.pp))
    graph = cuda_graph_bytes(ctx, stage_n, weights.estimate.moe_layers / max(1, f.num_hidden_layers))
    graph_in = graph if acct.cuda_graphs_in_budget else 0
    kv = kv_layout(ctx, acct, start, stage_n, n_draft, tokens)
    remainder = usable - weights.bytes - activation - non_torch - graph_in - kv.state_outside_bytes
    pool = kv_pool(ctx, mm is not None, remainder, kv.bytes_per_block)
    assumptions += pool.notes
    if pool.profiling_skipped:
        activation = non_torch = graph_in = comm = 0
    cap = capacity(kv, pool.bytes, pool.num_blocks, mml, max(mml, f.derived_max_model_len), acct)
    wl = ctx.request.workload
    seq_len = wl.avg_seq_len if wl and wl.avg_seq_len else mml
    if not (wl and wl.avg_seq_len):
        assumptions.append("no workload.avg_seq_len: max_num_seqs_bound uses max_model_len (worst case)")
    return Budget(
        gpu_memory_bytes=total,
        gpu_memory_utilization=ctx.gpu_memory_utilization,
        usable_bytes=usable,
        weights_bytes_per_gpu=int(weights.bytes),
        weights_source=weights.source,
        activation_peak_bytes=int(activation),
        non_torch_bytes=int(non_torch),
        cuda_graph_bytes=int(graph_in),
        cuda_graph_outside_budget_bytes=int(graph - graph_in),
        kv_cache_bytes_per_gpu=int(pool.bytes),
        kv_bytes_per_token_per_gpu=int(kv.per_token),
        kv_layers_per_gpu=kv.layers,
        kv_state_bytes_per_seq=int(kv.state_bytes_per_seq),
        kv_cache_groups=kv.as_groups(),
        block_size=kv.block,
        bytes_per_block=int(kv.bytes_per_block),
        num_gpu_blocks=int(pool.num_blocks),
        kv_cache_tokens=int(cap.kv_tokens),
        max_model_len=mml,
        max_concurrency=cap.concurrency,
        max_num_seqs_bound=max_num_seqs_bound(kv, pool.num_blocks, seq_len),
        max_num_seqs_bound_seq_len=seq_len,
        estimated_max_model_len=cap.estimated_max_model_len,
        fits_max_model_len=cap.fits,
        needed_bytes_max_model_len=int(cap.needed_bytes),
        profiled_tokens=int(tokens),
        pool_raw_bytes=int(pool.raw),
        accounting=accounting_dict(acct),
        assumptions=assumptions,
        weights_estimated_total_bytes=weights.estimate.total_bytes,
        weights_params=weights.estimate.total_params,
        communication_bytes=int(comm),
        **_encoder_fields(mm),
    )


def accounting_dict(acct: Accounting) -> dict[str, Any]:
    """The budget's ``accounting``: which release's rules sized it."""
    return {
        "vllm_version": "{}.{}.{}".format(*acct.version),
        "engine": "v1" if acct.v1_engine else "v0",
        "cuda_graphs_in_budget": acct.cuda_graphs_in_budget,
        "mla_latent_cache": acct.mla_latent_cache,
        "hybrid_sliding_window": acct.hybrid_sliding_window,
        "tokens_formula": tokens_formula(acct),
    }


def tokens_formula(acct: Accounting) -> str:
    """How the release printed its KV tokens (``kv_cache.printed_tokens``)."""
    if not acct.v1_engine:
        return "num_blocks × block_size"
    if acct.tokens_by_groups:
        return "num_blocks // kv_cache_groups × block_size"
    return "int(max_concurrency × max_model_len)"
