"""Calibration: the constants the memory model fits on vLLM's start-up logs, and how each release accounts for
memory.

``CALIBRATION`` holds every fitted constant (each one a heuristic, not a vLLM constant), with the logs it was fitted
on (tests/cases/kv; ``bench/kv_accuracy.py`` measures the fit). ``Accounting`` says how the target release sizes
the pool, where accounting differed by version:

- V0 engine (before 0.8): KV tokens printed as ``blocks × block_size``; chunked prefill off by default, so the
  profile run covers ``max(max_model_len, 2048)`` tokens; DeepSeek MLA models before 0.7.1 cached full heads
  (K and V padded to 256) instead of the latent;
- CUDA-graph memory is subtracted from the budget only from v0.21.0 (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``
  default, vllm 0.33.0 vllm/envs.py:2219-2221); earlier versions captured graphs after sizing the pool;
- the hybrid (sliding-window) KV manager sizes sliding layers by their window from 0.10 (V1); before, as full layers;
- V1 printed the KV tokens as ``num_blocks // KV cache groups × block size`` before 0.21, ``int(concurrency ×
  max_model_len)`` from 0.21 (``kv_cache.printed_tokens``);
- models with Mamba-like layers ran on V0 before 0.10 (V1 refused them: vllm 0.9.2 engine/arg_utils.py:1396-1405),
  whose Mamba cache sat beside the KV pool.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TypedDict

from ..context import LaunchContext
from ..gpus import GIB
from ..multimodal import vision_tower
from ..versions import parse_version


class Calibration(TypedDict):
    driver_reserved_bytes: int
    non_torch_tp1_bytes: int
    rocm_hipblaslt_bytes: int
    activation_token_factor: float
    sampler_fp32_copies_v1: float
    sampler_fp32_copies_v0: float
    cuda_graph_per_layer_bytes: int
    cuda_graph_per_moe_layer_bytes: int
    cuda_graph_base_bytes: int


CALIBRATION: Calibration = {
    # nvidia-smi memory.total (the catalogue's figure) minus what torch.cuda.mem_get_info reports as total:
    # H100 SXM 79.65 → 79.1-79.22 GiB, L40S 44.99 → 44.42, T4 15.00 → 14.56 (printed totals in tests/cases/kv notes).
    "driver_reserved_bytes": int(0.5 * GIB),
    # Non-torch memory of one GPU without communication buffers (cuBLAS workspaces, CUDA context growth): printed
    # 0.01-0.28 GiB on one GPU — fitted on qwen25-15b-fp16-t4 (0.01), qwen25-7b-awq (0.06), qwen25-05b (0.08),
    # ui-tars-7b (0.28), llama32-11b-vision (0.16). At TP/PP > 1 the communication buffers are added from vLLM's and
    # NCCL's own sizes (``communication.communication_buffers``), not from a fitted constant.
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
V0_MIN_BATCHED_TOKENS = 2048
MAMBA_V1_FROM = (0, 10, 0)  # hybrid SSM models run on V1 (vllm 0.10.2 v1/kv_cache_interface.py:192-213 MambaSpec)
STATE_MIXERS = (
    "mamba2",
    "mamba",
    "gdn",
    "short_conv",
)  # layer_layout mixers holding a recurrent state  # V0: max_num_batched_tokens = max(max_model_len, 2048) without chunked prefill


def env_on(env: dict[str, str], name: str, default: bool) -> bool:
    """A boolean environment switch as vLLM and NCCL read these: anything but 0 / false / False is on."""
    value = env.get(name)
    return default if value is None else value.strip() not in ("0", "false", "False")


@dataclass(frozen=True)
class Accounting:
    """How the target vLLM version sizes the pool (see the module docstring)."""

    version: tuple[int, int, int]
    v1_engine: bool
    cuda_graphs_in_budget: bool
    mla_latent_cache: bool
    hybrid_sliding_window: bool
    tokens_by_groups: bool = False  # V1 before 0.21 printed num_blocks // groups × block size (kv_cache.printed_tokens)

    @classmethod
    def for_version(cls, version: str, env: dict[str, str] | None = None) -> Accounting:
        env = env or {}
        return _accounting(
            version, _tri(env.get("VLLM_USE_V1")), _tri(env.get("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"))
        )


def _tri(value: str | None) -> bool | None:
    """An environment switch as read (``env_on``), or None when it is not set (the version decides)."""
    return None if value is None else value.strip() not in ("0", "false", "False")


@lru_cache(maxsize=256)  # built per plan; the key is a version string and two switches, the value immutable
def _accounting(version: str, use_v1: bool | None, estimate_graphs: bool | None) -> Accounting:
    v = parse_version(version) or (0, 33, 0)
    v1 = v >= (0, 8, 0) if use_v1 is None else use_v1
    graphs = v >= (0, 21, 0) if estimate_graphs is None else estimate_graphs
    return Accounting(
        version=v,
        v1_engine=v1,
        cuda_graphs_in_budget=v1 and graphs,
        mla_latent_cache=v >= (0, 7, 1),
        hybrid_sliding_window=v1 and v >= (0, 10, 0),
        tokens_by_groups=v1 and v < (0, 21, 0),
    )


def accounting_for(ctx: LaunchContext, accounting_version: str | None) -> tuple[Accounting, list[str]]:
    """The accounting of ``ctx.version`` (or ``accounting_version``), and the note when the launch falls back to V0.

    An architecture marked SupportsV0Only (mllama, vllm 0.10.2 model_executor/models/mllama.py:1273-1274) makes the
    engine fall back to V0 unless VLLM_USE_V1 is set (vllm 0.8.5 engine/arg_utils.py:1402-1406, 1649-1658; 0.10.2
    :1479-1483); so does a model with Mamba-like layers before 0.10 (not V1-compatible: vllm 0.9.2
    engine/arg_utils.py:1396-1405). The V0 engine and mllama are gone from 0.11."""
    acct = Accounting.for_version(accounting_version or ctx.version, ctx.request.env)
    if not acct.v1_engine or acct.version >= V0_ONLY_FALLBACK_UNTIL or "VLLM_USE_V1" in ctx.request.env:
        return acct, []
    v0 = replace(
        acct, v1_engine=False, cuda_graphs_in_budget=False, hybrid_sliding_window=False, tokens_by_groups=False
    )
    if (tower := vision_tower(ctx.facts)) is not None and tower.encoder_decoder:
        return v0, ["encoder-decoder model (V0 only): vLLM falls back to the V0 engine"]
    if acct.version < MAMBA_V1_FROM and any(
        ctx.facts.layout.count_where(0, ctx.facts.num_hidden_layers, mixer=m) for m in STATE_MIXERS
    ):
        return v0, ["Mamba-like layers (V0 only before vLLM 0.10): vLLM falls back to the V0 engine"]
    return acct, []


def torch_total_bytes(ctx: LaunchContext) -> int:
    """What torch reports as the device total: the catalogue's nvidia-smi figure minus the driver-reserved part
    (CALIBRATION['driver_reserved_bytes']); a GPU described in the request is taken as given (its memory_bytes is
    what vLLM printed in the kv cases)."""
    g = ctx.gpu
    if g.memory_source == "request":
        return g.memory_bytes
    return g.memory_bytes - CALIBRATION["driver_reserved_bytes"]
