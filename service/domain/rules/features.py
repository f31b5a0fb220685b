"""Features that need a kind of model or platform: returning routed experts (MoE only), Mamba cache options
(vllm 0.33.0 vllm/config/vllm.py:1187-1232, 1595-1605, 3440-3478) and ROCm-only attention backends chosen on an
NVIDIA GPU (vllm/platforms/cuda.py:429-446). Each check applies from the oldest release line read that makes it."""

from __future__ import annotations

from typing import Any

from ..context import LaunchContext
from ..findings import Finding
from . import Emit, rule
from .gating import at_least, effective, registry_arch, whole

SRC_ROUTED = "vllm 0.33.0 vllm/config/vllm.py:1187-1232 (same in 0.32.0 config/vllm.py:1135-1180)"
SRC_MAMBA = (
    "vllm 0.33.0 vllm/config/vllm.py:1595-1605, 3440-3478 (mamba_block_size since 0.11.2 config/vllm.py:1055-1067; "
    "stochastic rounding since 0.21.0 config/vllm.py:780-787; use_replayssm since 0.30.0 config/vllm.py:3210-3221)"
)
SRC_ROCM = (
    "vllm 0.33.0 vllm/platforms/cuda.py:429-446; v1/attention/backend.py:328-368; "
    "v1/attention/backends/rocm_segmented_attn.py:41-46, 140-141 (also 0.32.0); rocm_octave_attn.py:119-126"
)
# ROCm backends whose own checks refuse any non-ROCm platform, with the reason vLLM lists
ROCM_ONLY = {
    "ROCM_SEGMENTED_ATTN": ((0, 32), "ROCM_SEGMENTED_ATTN requires AMD RDNA GPUs on ROCm"),
    "ROCM_OCTAVE": ((0, 33), "compute capability not supported"),
}
OFF = ("0", "false", "False")


def _routed_problems(ctx: LaunchContext) -> list[tuple[str, dict[str, Any], str]]:
    """What the AuxOutput connector behind ``--enable-return-routed-experts`` refuses (vllm.py:1196-1230)."""
    a = ctx.args
    out: list[tuple[str, dict[str, Any], str]] = []
    if ctx.request.env.get("VLLM_USE_V2_MODEL_RUNNER") in OFF:
        text = "AuxOutput Connector requires Model Runner V2; set VLLM_USE_V2_MODEL_RUNNER=1."
        out.append((text, {"env": {"VLLM_USE_V2_MODEL_RUNNER": "1"}}, "env.VLLM_USE_V2_MODEL_RUNNER"))
    if not ctx.facts.is_moe:
        name = ctx.request.model.name or "this model"
        text = f"AuxOutput Connector only supports MoE models. ({name} has no experts.)"
        out.append((text, {"enable_return_routed_experts": False}, "engine_args.enable_return_routed_experts"))
    if a.get("enable_prefix_caching") is False:
        text = "AuxOutput Connector requires prefix caching."
        out.append((text, {"enable_prefix_caching": True}, "engine_args.enable_prefix_caching"))
    if ctx.pp > 1:
        text = "--enable-return-routed-experts is incompatible with pipeline parallelism (PP > 1)."
        out.append((text, {"pipeline_parallel_size": 1}, "engine_args.pipeline_parallel_size"))
    pcp = int(a.get("prefill_context_parallel_size", 1))
    if a.decode_context_parallel_size > 1 or pcp > 1:
        text = "--enable-return-routed-experts is incompatible with context parallelism (DCP/PCP > 1)."
        remedy = {"decode_context_parallel_size": 1, "prefill_context_parallel_size": 1}
        out.append((text, remedy, "engine_args.decode_context_parallel_size"))
    return out


@rule("routed_experts", severity="error", source=SRC_ROUTED)
def routed_experts(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--enable-return-routed-experts`` (from 0.32) needs a MoE model, Model Runner V2, prefix caching, no
    pipeline parallelism and no context parallelism."""
    if not ctx.args.get("enable_return_routed_experts") or not at_least(ctx, (0, 32)):
        return []
    return [emit.error("routed_experts", t, remedy=r, field=f) for t, r, f in _routed_problems(ctx)]


def _ssm_dtype_float16(ctx: LaunchContext) -> bool:
    """The SSM cache dtype is float16: set so, or ``auto`` where config.json asks for float16 (NemotronH reads it:
    model_executor/models/config.py:818-838)."""
    dtype = ctx.args.get("mamba_ssm_cache_dtype") or "auto"
    return dtype == "float16" or (
        dtype == "auto" and (ctx.request.model.config or {}).get("mamba_ssm_cache_dtype") == "float16"
    )


def _mamba_problems(ctx: LaunchContext) -> list[tuple[str, dict[str, Any], str]]:
    a = ctx.args
    out: list[tuple[str, dict[str, Any], str]] = []
    block = whole(a.get("mamba_block_size"))
    if block is not None and block != ctx.max_model_len and a.get("enable_prefix_caching") is False:
        if at_least(ctx, (0, 11)):
            text = "--mamba-block-size can only be set with --enable-prefix-caching"
            out.append((text, {"drop": ["mamba_block_size"]}, "mamba_block_size"))
    if a.get("enable_mamba_cache_stochastic_rounding") and at_least(ctx, (0, 21)) and not _ssm_dtype_float16(ctx):
        text = (
            "Stochastic rounding for Mamba cache requires the SSM cache to be float16. Please set it explicitly, by "
            "specifying `--mamba-ssm-cache-dtype float16`, or disable stochastic rounding by not specifying "
            "`--enable-mamba-cache-stochastic-rounding`."
        )
        out.append((text, {"mamba_ssm_cache_dtype": "float16"}, "enable_mamba_cache_stochastic_rounding"))
    arch = registry_arch(ctx)
    if a.get("use_replayssm") and at_least(ctx, (0, 30)) and arch and not (arch.hybrid or arch.attention_free):
        text = f"--use-replayssm is not supported for architecture {arch.name!r}"
        out.append((text, {"use_replayssm": False}, "use_replayssm"))
    return out


@rule("mamba_options", severity="error", source=SRC_MAMBA)
def mamba_options(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Mamba cache options vLLM refuses in combination: ``--mamba-block-size`` with prefix caching disabled (from
    0.11); stochastic rounding of the Mamba cache without a float16 SSM cache (from 0.21); ``--use-replayssm`` on a
    model without recurrent layers (from 0.30). Other Mamba options on a pure Transformer are ignored by vLLM."""
    return [emit.error("mamba_options", t, remedy=r, field=f"engine_args.{n}") for t, r, n in _mamba_problems(ctx)]


@rule("attention_backend_platform", severity="error", source=SRC_ROCM)
def attention_backend_platform(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """An ``--attention-backend`` whose own checks accept only ROCm (ROCM_SEGMENTED_ATTN from 0.32, ROCM_OCTAVE
    0.33) chosen on an NVIDIA GPU: the selected backend is validated first and refused."""
    name = str(ctx.args.get("attention_backend") or "").upper()
    found = ROCM_ONLY.get(name)
    if found is None or ctx.gpu.vendor.upper() != "NVIDIA" or not at_least(ctx, found[0]):
        return []
    return [
        emit.error(
            "attention_backend_platform",
            f"Selected backend AttentionBackendEnum.{name} is not valid for this configuration. Reason: "
            f"['{found[1]}'] ({ctx.gpu.name} is an NVIDIA GPU; {name} runs on ROCm only).",
            remedy={"attention_backend": None},
            field="engine_args.attention_backend",
        )
    ]


SRC_SSU = (
    "vllm 0.33.0 vllm/config/mamba.py:66-82 (validate_ssu_algorithm, called by engine/arg_utils.py:2770-2786 with the "
    "backend --mamba-backend sets; since 0.28.0 config/mamba.py:66-82, engine/arg_utils.py:2400-2415)"
)
SRC_REPLAY = (
    "vllm 0.33.0 vllm/config/vllm.py:1304-1334 (_verify_sampling_replay_config, from VllmConfig.__post_init__ :1569; "
    "since 0.28.0 config/vllm.py:1027-1050)"
)


@rule("mamba_ssu_algorithm", severity="error", source=SRC_SSU)
def mamba_ssu_algorithm(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--mamba-ssu-algorithm`` (from 0.28) needs ``--mamba-backend flashinfer``: the Mamba config refuses an
    algorithm with any other backend, on every model."""
    if "mamba_ssu_algorithm" not in ctx.args.given or not at_least(ctx, (0, 28)):
        return []
    backend = effective(ctx, "mamba_backend")
    if ctx.args.get("mamba_ssu_algorithm") is None or not isinstance(backend, str) or backend.upper() == "FLASHINFER":
        return []
    return [
        emit.error(
            "mamba_ssu_algorithm",
            "Mamba SSU algorithm selection is only supported with the FlashInfer backend. Please set "
            "`--mamba-backend flashinfer`, or omit `--mamba-ssu-algorithm`.",
            remedy={"mamba_backend": "flashinfer"},
            field="engine_args.mamba_ssu_algorithm",
        )
    ]


@rule("sampling_replay_logprobs", severity="error", source=SRC_REPLAY)
def sampling_replay_logprobs(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--return-sampling-mask`` (from 0.28) needs ``--logprobs-mode processed_logprobs`` (vLLM's checks before
    this one refuse other launches with the mask, never one that passes it)."""
    if "return_sampling_mask" not in ctx.args.given or not at_least(ctx, (0, 28)):
        return []
    if not ctx.args.get("return_sampling_mask") or effective(ctx, "logprobs_mode") == "processed_logprobs":
        return []
    return [
        emit.error(
            "sampling_replay_logprobs",
            "sampling distribution replay requires logprobs_mode='processed_logprobs' so that returned logprobs are "
            "normalized over the same nucleus as the sampling mask",
            remedy={"logprobs_mode": "processed_logprobs"},
            field="engine_args.return_sampling_mask",
        )
    ]
