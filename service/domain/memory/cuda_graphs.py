"""CUDA graphs: the memory their capture takes, counted inside the budget from v0.21 (``Accounting``;
vllm 0.33.0 vllm/envs.py:2219-2221, ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``) and removed by ``--enforce-eager``.
"""

from __future__ import annotations

from ..context import LaunchContext
from .calibration import CALIBRATION


def cuda_graph_bytes(ctx: LaunchContext, stage_layers: int, moe_fraction: float) -> int:
    """The CUDA-graph pool of one GPU (0 with ``--enforce-eager``): a fitted amount per decoder layer on its PP stage,
    MoE layers costing more (CALIBRATION)."""
    if ctx.args.enforce_eager:
        return 0
    per = (
        CALIBRATION["cuda_graph_per_layer_bytes"] * (1 - moe_fraction)
        + CALIBRATION["cuda_graph_per_moe_layer_bytes"] * moe_fraction
    )
    return int(CALIBRATION["cuda_graph_base_bytes"] + stage_layers * per)
