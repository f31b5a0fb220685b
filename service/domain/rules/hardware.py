"""Hardware rules: GPUs vLLM 0.33 cannot run on at all, and bfloat16 below compute capability 8.0
(the vllm 0.33.0 PyPI wheel: torch 2.14.0+cu130, kernels for sm_75 … sm_120; vllm/platforms/cuda.py:638-657)."""

from __future__ import annotations

from ..context import DTYPE_ALIASES, LaunchContext
from ..findings import Finding
from . import Emit, rule
from .gating import at_least

SRC_MIN = "vllm 0.33.0 PyPI wheel: built with torch 2.14.0+cu130, CUDA kernels for sm_75 … sm_120 only"
SRC_BF16 = "vllm 0.33.0 vllm/platforms/cuda.py:638-657 (gpu_worker.py:498); vllm/config/model.py:2447-2464"
MIN_CAPABILITY_033 = (7, 5)


@rule("gpu_min_capability", severity="error", source=SRC_MIN)
def gpu_min_capability(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """The vLLM 0.33 wheel is built for CUDA 13 with kernels for sm_75 … sm_120 only: an NVIDIA GPU below compute
    capability 7.5 (V100 7.0, P100 6.0) cannot run 0.33 at all. Checked for the 0.33 line only."""
    cc = ctx.gpu.compute_capability
    if cc is None or ctx.line.line != "0.33" or cc >= MIN_CAPABILITY_033:
        return []
    return [
        emit.error(
            "gpu_min_capability",
            f"{ctx.gpu.name} has compute capability {cc[0]}.{cc[1]}; the vLLM {ctx.version} wheel (CUDA 13, torch "
            f"2.14.0+cu130) ships kernels for sm_75 … sm_120 only, so it cannot run on this GPU. Use a GPU with compute "
            f"capability ≥ 7.5 or an older vLLM release.",
            remedy={"min_compute_capability": 75},
            field="hardware.gpu",
        )
    ]


@rule("bf16_capability", severity="error", source=SRC_BF16)
def bf16_capability(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """bfloat16 needs compute capability ≥ 8.0. An explicit ``--dtype bfloat16`` below that fails in the worker
    (error); with ``auto`` a bfloat16 checkpoint falls back to float16 (or float32 for gemma2/3 and glm4) with a
    warning in vLLM's log (info)."""
    cc = ctx.gpu.compute_capability
    if cc is None or cc >= (8, 0):
        return []
    requested = DTYPE_ALIASES.get(str(ctx.args.get("dtype", "auto")).lower(), "auto")
    if requested == "bfloat16":
        return [
            emit.error(
                "bf16_capability",
                f"Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your {ctx.gpu.name} GPU has "
                f"compute capability {cc[0]}.{cc[1]}. You can use float16 instead by explicitly setting the `dtype` flag "
                f"in CLI, for example: --dtype=half.",
                remedy={"dtype": "float16"},
                field="engine_args.dtype",
            )
        ]
    if requested == "auto" and ctx.facts.torch_dtype == "bfloat16":
        return [
            emit.info(
                "bf16_capability",
                f"Your device '{ctx.gpu.name}' (with compute capability {cc[0]}.{cc[1]}) doesn't support torch.bfloat16. "
                f"Falling back to torch.{ctx.dtype} for compatibility.",
                remedy={"dtype": ctx.dtype},
                field="engine_args.dtype",
            )
        ]
    return []


SRC_DEVICE_IDS = (
    "vllm 0.33.0 vllm/engine/arg_utils.py:1194-1201, 2141-2158; vllm/platforms/cuda.py:751-759; "
    "vllm/platforms/interface.py:266-275 (the same since 0.24.0 arg_utils.py:984-990, 1735-1752, with the option)"
)


def _device_ids(value: object) -> list[int | str]:
    """``--device-ids`` as vLLM's parser reads it (arg_utils.py:1196-1199): digits are integers, the rest strings."""
    parts = (part.strip() for part in str(value).split(","))
    return [int(p) if p.isdigit() else p for p in parts]


def _not_a_device(text: str) -> bool:
    """A string entry NVML cannot resolve: not an integer and not a GPU/MIG UUID (cuda.py:751-759 tries ``int``,
    then ``nvmlDeviceGetHandleByUUID``; without NVML only integers: interface.py:266-275)."""
    try:
        int(text)
        return False
    except ValueError:
        return not text.startswith(("GPU-", "MIG-"))


@rule("device_ids", severity="error", source=SRC_DEVICE_IDS, when=("device_ids",))
def device_ids(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--device-ids`` (from 0.24) names this node's GPUs: no duplicates, integer indices or UUIDs but not both,
    and each string a GPU UUID (``GPU-…``/``MIG-…``) on NVIDIA GPUs. Whether a UUID exists, and indices against the
    node's ``CUDA_VISIBLE_DEVICES``, only the node knows."""
    if "device_ids" not in ctx.args.given or not at_least(ctx, (0, 24)):
        return []
    value = ctx.args.values.get("device_ids")
    if value is None:
        return []
    ids = _device_ids(value)
    strings = [i for i in ids if isinstance(i, str)]
    text = None
    if len(set(ids)) != len(ids):
        text = f"--device-ids must not contain duplicates: {ids}"
    elif strings and len(strings) < len(ids):
        text = "--device-ids must not mix integer IDs and UUIDs"
    elif ctx.gpu.vendor.upper() == "NVIDIA" and any(_not_a_device(s) for s in strings):
        bad = next(s for s in strings if _not_a_device(s))
        text = (
            f"Non-integer device ID {bad!r} is not supported by cuda. (--device-ids takes GPU indices or GPU UUIDs "
            f"such as GPU-…; {bad!r} is neither.)"
        )
    if text is None:
        return []
    return [emit.error("device_ids", text, remedy={"drop": ["device_ids"]}, field="engine_args.device_ids")]
