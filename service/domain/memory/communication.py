"""Communication buffers and the rest of non-torch memory: NCCL communicators, vLLM's custom all-reduce,
symmetric-memory and NVLink SHARP buffers at TP/PP/DP > 1, cuBLAS workspaces and the CUDA context on every GPU.
vLLM counts them in ``total_consumed`` after its profile run (vllm 0.33.0 vllm/v1/worker/gpu_worker.py:683-757).
"""

from __future__ import annotations

from ..context import LaunchContext
from ..gpus import GIB, MIB
from .calibration import CALIBRATION, Accounting, env_on

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
CUSTOM_ALL_REDUCE_MAX_SIZES = {
    (9, 0): {2: 64 * MIB, 4: 32 * MIB, 6: MIB // 2, 8: MIB // 4},
    (10, 0): {2: 2 * MIB, 4: 2 * MIB, 6: MIB, 8: MIB},
}
SYMM_MEM_ALL_REDUCE_MAX_SIZES = {
    (9, 0): {2: 64 * MIB, 4: 32 * MIB, 6: 64 * MIB, 8: 64 * MIB},
    (10, 0): {2: 8 * MIB, 4: 32 * MIB, 6: 128 * MIB, 8: 128 * MIB},
}
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
    symm = False
    if tp > 1 and cc is not None and nodes == 1 and acct.version >= (0, 11, 0):
        if env_on(env, "VLLM_ALLREDUCE_USE_SYMM_MEM", True):
            size = SYMM_MEM_ALL_REDUCE_MAX_SIZES.get(cc, {}).get(tp)
            if size:
                symm = True
                total += size
                parts.append(f"symmetric-memory all-reduce buffer {size // MIB} MiB")
    if (
        tp in CUSTOM_AR_WORLD_SIZES
        and cc is not None
        and nodes == 1
        and not a.get("disable_custom_all_reduce", False)
        and (tp == 2 or link == "nvlink")
    ):
        max_size = CUSTOM_AR_MAX_SIZE
        if symm:
            max_size = min(max_size, CUSTOM_ALL_REDUCE_MAX_SIZES.get(cc, {}).get(tp, max_size))
        ipc = max(max_size, *CUSTOM_AR_GATHER_SCATTER) if acct.version >= (0, 11, 0) else max_size
        car = max_size + ipc + CUSTOM_AR_RANK_DATA
        total += car
        parts.append(f"custom all-reduce {car / MIB:.1f} MiB")
    if tp > 2 and cc is not None and cc >= (9, 0) and link == "nvlink" and env_on(env, "NCCL_NVLS_ENABLE", True):
        heads = min(tp, ctx.gpus_per_node)  # one NVLS head per GPU of the NVSwitch domain (a node)
        nvls = (NVLS_PER_RANK_BYTES if acct.version >= (0, 9, 0) else NVLS_PER_RANK_BYTES_NCCL_221) * heads * tp_comms
        total += nvls
        parts.append(f"NCCL NVLS {nvls / GIB:.2f} GiB (nvlsTotalSize for {heads} heads × {tp_comms} communicator(s))")
    return int(total), parts


def non_torch_bytes(ctx: LaunchContext, acct: Accounting) -> tuple[int, int, list[str]]:
    """``(non-torch bytes, of which communication buffers, notes)`` per GPU: the fitted one-GPU figure, the
    communication buffers, and hipBLASLt's workspace on ROCm (CALIBRATION)."""
    comm, parts = communication_buffers(ctx, acct)
    notes = ["communication buffers: " + "; ".join(parts)] if parts else []
    non_torch = CALIBRATION["non_torch_tp1_bytes"] + comm
    if ctx.gpu.compute_capability is None:  # AMD
        non_torch += CALIBRATION["rocm_hipblaslt_bytes"]
    return non_torch, comm, notes
