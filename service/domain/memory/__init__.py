"""The memory model: the per-GPU budget vLLM sizes its KV-cache pool from, computed before launch.

One pool per GPU (docs/operating.md §1; vllm 0.33.0 vllm/v1/worker/gpu_worker.py:683-757,
vllm/utils/mem_utils.py:230-321)::

    usable        = torch-visible GPU memory × gpu_memory_utilization          (requested memory, worker/utils.py)
    KV pool       = usable − weights on this GPU − overhead
    overhead      = activation peak + non-torch memory (+ CUDA graphs, counted inside the budget since v0.21)
    num_blocks    = floor(KV pool / bytes_per_block)                           (kv_cache_planning.py:642-683)
    concurrency   = num_blocks / Σ_groups blocks of one max_model_len request  (kv_cache_utils.py:1061-1093)
    kv_tokens     = int(concurrency × max_model_len)                           (kv_cache_utils.py:1120-1128)

One module per term: ``weights`` (parameters, quantization, one GPU's share), ``kv_specs`` (each layer's KV cache
spec: attention, sliding window, a Mamba-like state per sequence; a hybrid model's block), ``kv_dsv4``
(DeepSeek-V4's packed caches), ``kv_cache`` (KV cache groups, blocks, capacity), ``activation`` (the profile run's peak), ``communication`` (NCCL and the rest of non-torch
memory), ``cuda_graphs``, ``calibration`` (the fitted constants and each release's accounting), ``stages`` (the
PP layer split); ``budget`` assembles them (``compute_budget``).

Every quantity is bytes per GPU unless its name says otherwise. Exact vLLM formulas (blocks, the fit check with the
null block, concurrency, the log line) follow vLLM 0.33.0; the overhead terms are estimates whose constants are
calibrated on the start-up logs in tests/cases/kv (``CALIBRATION``, ``bench/kv_accuracy.py``). Where accounting
differed by version the model follows ``ctx.version`` (``Accounting``).
"""

from ..gpus import MIB
from .activation import activation_peak
from .budget import Budget, compute_budget, format_gib
from .calibration import CALIBRATION, Accounting, torch_total_bytes
from .communication import NCCL_CONNECTION_BYTES, communication_buffers
from .kv_cache import (
    draft_layers,
    kv_bytes_per_token_layer,
    kv_dtype_bytes,
    longest_fitting,
    longest_full_attention_len,
    sliding_layers,
)
from .stages import biggest_stage, pp_partition, stage_layers
from .weights import QuantBytes, WeightEstimate, estimate_weights, quant_bytes

__all__ = [
    "Budget",
    "compute_budget",
    "estimate_weights",
    "format_gib",
    "CALIBRATION",
    "Accounting",
    "MIB",
    "NCCL_CONNECTION_BYTES",
    "QuantBytes",
    "WeightEstimate",
    "activation_peak",
    "biggest_stage",
    "communication_buffers",
    "draft_layers",
    "kv_bytes_per_token_layer",
    "kv_dtype_bytes",
    "longest_fitting",
    "longest_full_attention_len",
    "pp_partition",
    "quant_bytes",
    "sliding_layers",
    "stage_layers",
    "torch_total_bytes",
]
