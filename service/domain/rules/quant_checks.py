"""Quantization vs hardware and dtype: minimum compute capability, supported activation dtypes, deprecated
methods, GPTQ/AWQ bits / symmetry / desc_act / group size, and FP8 on GPUs without FP8 compute
(vllm 0.33.0 vllm/config/vllm.py:916-943; vllm/config/model.py:1472-1485, which also refuses a deprecated method
read from the checkpoint; vllm/model_executor/layers/quantization/utils/marlin_utils.py:37, 66-67, 143-149;
utils/gptq_utils.py:29-49; utils/marlin_utils_fp8.py:108-113; online/fp8.py:416-424)."""

from __future__ import annotations

from ..context import LaunchContext
from ..findings import Finding
from . import Emit, rule
from .quantization import user_value, verdict

ONLINE_SHORTHANDS = {
    "fp8_per_tensor",
    "fp8_per_block",
    "fp8_per_channel",
    "int8_per_channel_weight_only",
    "nvfp4_per_token",
    "online",
}
# The release's own get_min_capability / get_supported_act_dtypes constants come from the generated catalogue
# (VersionLine.quant_details). These tables cover only what the catalogue cannot read as a constant (methods whose
# class computes it at run time, online shorthands, the checkpoint mxfp8 alias) and one deliberate override:
# GPTQ is effectively 75 because vLLM verifies the Marlin kernel (vllm 0.33.0
# quantization/auto_gptq.py:178-183, 316-320; utils/marlin_utils.py:66-67).
CAPABILITY_OVERRIDES = {"auto_gptq": 75, "gptq": 75, "gptq_marlin": 75}
MIN_CAPABILITY = {
    "auto_awq": 75,
    "auto_gptq": 75,
    "fp8": 75,
    "deepseek_v4_fp8": 75,  # an Fp8Config subclass (vllm 0.33.0 models/deepseek_v41/quant_config.py:37; fp8.py:146-147)
    "modelopt": 80,
    "modelopt_fp4": 75,
    "modelopt_mxfp8": 80,
    "mxfp8_ckpt": 80,
    "modelopt_mixed": 75,
    "mxfp4": 80,
    "gpt_oss_mxfp4": 80,
    "fbgemm_fp8": 80,
    "fp_quant": 100,
    "experts_int8": 80,
    "moe_wna16": 70,
    "torchao": 75,
    "quark": 70,
    "inc": 60,
    "humming": 75,
    **{m: 75 for m in ONLINE_SHORTHANDS},  # online mxfp8: 80, from the catalogue
}
BF16_FP16 = ("bfloat16", "float16")
ACT_DTYPES = {
    "auto_awq": BF16_FP16,
    "auto_gptq": BF16_FP16,
    "fp8": BF16_FP16,
    "deepseek_v4_fp8": BF16_FP16,  # Fp8Config's (fp8.py:142-143)
    "compressed-tensors": ("float32", *BF16_FP16),
    "modelopt": BF16_FP16,
    "modelopt_fp4": BF16_FP16,
    "modelopt_mxfp8": ("bfloat16",),
    "mxfp8_ckpt": ("bfloat16",),
    "modelopt_mixed": BF16_FP16,
    "mxfp4": ("bfloat16",),
    "gpt_oss_mxfp4": ("bfloat16",),
    "fbgemm_fp8": BF16_FP16,
    "fp_quant": ("bfloat16",),
    "experts_int8": BF16_FP16,
    "moe_wna16": BF16_FP16,
    "torchao": ("float32", *BF16_FP16),
    "quark": BF16_FP16,
    "inc": BF16_FP16,
    "humming": BF16_FP16,
    **{m: BF16_FP16 for m in ONLINE_SHORTHANDS},  # online mxfp8: bfloat16 only, from the catalogue
}
TORCH_NAMES = {"half": "float16", "float": "float32", "float8_e4m3fn": "float8_e4m3fn"}


def min_capability(method: str, ctx: LaunchContext) -> int | None:
    if method in CAPABILITY_OVERRIDES:
        return CAPABILITY_OVERRIDES[method]
    return ctx.line.quant_details.get(method, {}).get("min_capability", MIN_CAPABILITY.get(method))


def act_dtypes(method: str, ctx: LaunchContext) -> tuple[str, ...] | None:
    names = ctx.line.quant_details.get(method, {}).get("act_dtypes")
    if names:
        return tuple(dict.fromkeys(TORCH_NAMES.get(n, n) for n in names))
    return ACT_DTYPES.get(method)


FP8_METHODS = {"fp8", "deepseek_v4_fp8", "fbgemm_fp8", "modelopt", "fp8_per_tensor", "fp8_per_block"}
MARLIN_GROUP_SIZES = (-1, 32, 64, 128)

SRC_CAP = "vllm 0.33.0 vllm/config/vllm.py:916-936; quantization/*.py get_min_capability; marlin_utils.py:66-67"
SRC_DTYPE = "vllm 0.33.0 vllm/config/vllm.py:937-943; quantization/*.py get_supported_act_dtypes"
SRC_DEPRECATED = "vllm 0.33.0 vllm/config/model.py:1472-1485; quantization/__init__.py:52-55"
SRC_BITS = (
    "vllm 0.33.0 vllm/model_executor/layers/quantization/auto_gptq.py:98-102, 152-155; auto_awq.py:204-211; "
    "utils/gptq_utils.py:29-49; utils/marlin_utils.py:37, 143-149"
)
SRC_FP8_WO = (
    "vllm 0.33.0 vllm/model_executor/layers/quantization/utils/marlin_utils_fp8.py:108-113; "
    "online/fp8.py:416-424; platforms/cuda.py:587-588"
)


def resolved_method(ctx: LaunchContext) -> str | None:
    """The quantization method the target release runs with: on a quantized checkpoint what its override mechanism
    ends with for the launch's value (rules/quantization.py verdict: 0.33 runs ``auto_awq`` for an AWQ checkpoint,
    ``gpt_oss_mxfp4`` for gpt-oss MXFP4, ``moe_wna16`` when asked on AWQ/GPTQ; 0.10 ``awq_marlin`` where Marlin
    runs) — and where it refuses the value, what it runs without one; else the tag's or the flag's online method
    (online ``fp8`` → ``fp8_per_tensor``). Unknown names → None (quant_unknown reports them). A checkpoint ``mxfp8``
    no override claims is reported as ``mxfp8_ckpt`` to keep it apart from the online shorthand."""
    user = user_value(ctx)
    ckpt = ctx.checkpoint_quant
    if ckpt is not None:
        v = verdict(ctx, user)
        method = v.method if v.refusal is None else verdict(ctx, None).method
        if method == "mxfp8" and ckpt == "mxfp8":
            return "mxfp8_ckpt"
        return method if method in ctx.line.quant_methods else None
    if user is None or user not in ctx.line.quant_methods:
        return None
    return "fp8_per_tensor" if user == "fp8" else user


def _ct_scheme(ctx: LaunchContext) -> tuple[str, int]:
    """A compressed-tensors checkpoint's first weight scheme and its minimum capability (each scheme's
    get_min_capability: vllm 0.33.0 quantization/compressed_tensors/compressed_tensors.py:392-415, 876-917)."""
    raw = ctx.facts.quant.raw if ctx.facts.quant else {}
    for grp in (raw.get("config_groups") or {}).values():
        if not isinstance(grp, dict):
            continue
        w = grp.get("weights") or {}
        a = grp.get("input_activations") or {}
        wt, wb = w.get("type"), w.get("num_bits")
        at, ab = a.get("type"), a.get("num_bits")
        if wt == "float" and wb == 8:
            return ("W8A8-FP8" if at == "float" and ab == 8 else "W8A16-FP8"), 75
        if wt == "float" and wb == 4:
            return ("MXFP4", 80) if w.get("group_size") == 32 else ("NVFP4", 75)
        if wt == "int" and wb == 4 and at == "float" and ab == 8:
            return "W4A8-FP8", 90
        if wt == "int" and at == "int" and ab == 8:
            return ("W8A8-INT8", 75) if wb == 8 else ("wNa8o8", 70)
        if wt == "int":
            return "WNA16", 75
    return "unknown", 70


def is_fp8_weights(ctx: LaunchContext, method: str | None) -> bool:
    """FP8 weights: an FP8 checkpoint (fp8, fbgemm_fp8, ModelOpt FP8, compressed-tensors float 8-bit) or online
    fp8_per_tensor / fp8_per_block."""
    if method in FP8_METHODS:
        return True
    return method == "compressed-tensors" and _ct_scheme(ctx)[0].endswith("FP8") and "W4A8" not in _ct_scheme(ctx)[0]


@rule("quant_gpu_capability", severity="error", source=SRC_CAP)
def quant_gpu_capability(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """The GPU's compute capability must reach the quantization method's minimum (its get_min_capability:
    AWQ/GPTQ 75, FP8 75, ModelOpt FP8 80, MXFP4 / gpt-oss 80, fbgemm_fp8 80, fp_quant 100, compressed-tensors per
    scheme).

    vLLM: "The quantization method {q} is not supported for the current GPU. Minimum capability: {min}. Current
    capability: {cc}."
    """
    method = resolved_method(ctx)
    cc = ctx.gpu.capability_int
    if method is None or cc is None:
        return []
    if method == "compressed-tensors":
        scheme, need = _ct_scheme(ctx)
        if cc >= need:
            return []
        return [
            emit.error(
                "quant_gpu_capability",
                f"Quantization scheme is not supported for the current GPU. Min capability: {need}. Current capability: "
                f"{cc}. (compressed-tensors {scheme} on {ctx.gpu.name})",
                remedy={"min_compute_capability": need},
                field="hardware.gpu",
            )
        ]
    least = min_capability(method, ctx)
    if least is None or cc >= least:
        return []
    shown = "mxfp8" if method == "mxfp8_ckpt" else method
    return [
        emit.error(
            "quant_gpu_capability",
            f"The quantization method {shown} is not supported for the current GPU. Minimum capability: {least}. "
            f"Current capability: {cc}. ({ctx.gpu.name})",
            remedy={"min_compute_capability": least},
            field="hardware.gpu",
        )
    ]


@rule("quant_dtype", severity="error", source=SRC_DTYPE)
def quant_dtype(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """The effective model dtype must be one of the quantization method's activation dtypes (e.g. gpt-oss MXFP4
    and ModelOpt MXFP8 are bfloat16-only; AWQ, GPTQ and FP8 refuse float32).

    vLLM: "{dtype} is not supported for quantization method {q}. Supported dtypes: [...]"
    """
    method = resolved_method(ctx)
    allowed = act_dtypes(method, ctx) if method else None
    if not allowed or ctx.dtype in allowed:
        return []
    shown = "mxfp8" if method == "mxfp8_ckpt" else method
    torch_list = "[" + ", ".join(f"torch.{d}" for d in allowed) + "]"
    return [
        emit.error(
            "quant_dtype",
            f"torch.{ctx.dtype} is not supported for quantization method {shown}. Supported dtypes: {torch_list}",
            remedy={"dtype": allowed[0]},
            field="engine_args.dtype",
        )
    ]


@rule("quant_deprecated", severity="error", source=SRC_DEPRECATED)
def quant_deprecated(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Methods the release marks deprecated (DEPRECATED_QUANTIZATION_METHODS in its catalogue; 0.33: fbgemm_fp8,
    fp_quant) — whether named by ``--quantization`` or read from the
    checkpoint's config (e.g. Meta's Llama-3.1-405B-Instruct-FP8) — need ``--allow-deprecated-quantization``.
    """
    if ctx.args.get("allow_deprecated_quantization"):
        return []
    method = ctx.checkpoint_quant or (ctx.tag.method if ctx.tag else ctx.requested_quantization)
    if method not in ctx.line.deprecated_quant:
        return []
    return [
        emit.error(
            "quant_deprecated",
            f"('The quantization method %s is deprecated and will be removed in future versions of vLLM. To bypass, set "
            f"`--allow-deprecated-quantization`.', '{method}')",
            remedy={"allow_deprecated_quantization": True},
            field="engine_args.allow_deprecated_quantization",
        )
    ]


@rule("quant_bits", severity="error", source=SRC_BITS)
def quant_bits(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """GPTQ must be (4 or 8 bits, symmetric), without group activation ordering (``desc_act`` with a group size)
    and with a Marlin group size (-1, 32, 64, 128); AWQ must be 4-bit (8-bit only through the Marlin backend); an
    AWQ group size Marlin cannot take falls back to the slow AWQ kernel (warning)."""
    q = ctx.facts.quant
    method = resolved_method(ctx)
    if q is None or method not in ("auto_gptq", "auto_awq"):
        return []
    out = []
    g = q.group_size if q.group_size is not None else -1
    if method == "auto_gptq":
        bits, sym = q.bits if q.bits is not None else 4, q.sym if q.sym is not None else True
        if (bits, sym) not in ((4, True), (8, True)):
            out.append(
                emit.error(
                    "quant_bits",
                    f"Unsupported quantization config: bits={bits}, sym={sym} (GPTQ needs 4 or 8 bits, symmetric).",
                    remedy=None,
                    field="model.config.quantization_config",
                )
            )
        if q.desc_act and g != -1:
            out.append(
                emit.error(
                    "quant_bits",
                    "GPTQ group activation ordering (desc_act=True) is no longer supported. Use a checkpoint with static "
                    f"activation ordering or desc_act=False. (desc_act=true with group_size={g})",
                    remedy={"checkpoint": {"desc_act": False}},
                    field="model.config.quantization_config",
                )
            )
        if g not in MARLIN_GROUP_SIZES:
            out.append(
                emit.error(
                    "quant_bits",
                    f"Marlin does not support group_size = {g}. Only group_sizes = [-1, 32, 64, 128] are supported.",
                    remedy=None,
                    field="model.config.quantization_config",
                )
            )
    else:
        bits = q.bits if q.bits is not None else 4
        if bits != 4:
            out.append(
                emit.error(
                    "quant_bits",
                    f"Unsupported num_bits = {bits}. Supported: [4]. For 8-bit AWQ, use Marlin backend by "
                    "setting backend='awq:marlin' or backend='marlin'.",
                    remedy=None,
                    field="model.config.quantization_config",
                )
            )
        if g not in MARLIN_GROUP_SIZES:
            out.append(
                emit.warning(
                    "quant_bits",
                    f"AWQ group_size {g} is not one Marlin supports ([-1, 32, 64, 128]): vLLM falls back to "
                    "the unoptimized AWQ kernels.",
                    remedy=None,
                    field="model.config.quantization_config",
                )
            )
    return out


@rule("fp8_weight_only", severity="error", source=SRC_FP8_WO)
def fp8_weight_only(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """FP8 weights on a GPU without FP8 compute (compute capability 7.5–8.8) load as Marlin weight-only W8A16:
    memory savings, no FP8 speed-up (warning). Online ``fp8_per_channel`` needs FP8 W8A8 kernels (SM89+) and fails
    below (error)."""
    method = resolved_method(ctx)
    cc = ctx.gpu.capability_int
    if cc is None or cc >= 89 or cc < 75:
        return []
    if method == "fp8_per_channel":
        return [
            emit.error(
                "fp8_weight_only",
                "FP8 PTPC online quant requires a kernel that honors per-token activation quantization; MarlinFP8 is "
                f"W8A16 weight-only. Requires SM89+ for Cutlass FP8 or ROCm MI3xx for rowwise scaled_mm. ({ctx.gpu.name}: "
                f"capability {cc})",
                remedy={"quantization": "fp8_per_tensor"},
                field="engine_args.quantization",
            )
        ]
    if not is_fp8_weights(ctx, method):
        return []
    return [
        emit.warning(
            "fp8_weight_only",
            "Your GPU does not have native support for FP8 computation but FP8 quantization is being used. Weight-only "
            "FP8 compression will be used leveraging the Marlin kernel. This may degrade performance for compute-heavy "
            f"workloads. ({ctx.gpu.name}: capability {cc}; FP8 compute needs 8.9+)",
            remedy=None,
            field="hardware.gpu",
        )
    ]
