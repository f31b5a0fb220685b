"""Features that need a kind of model or platform: returning routed experts (MoE only), Mamba cache options
(vllm 0.33.0 vllm/config/vllm.py:1187-1232, 1595-1605, 3440-3478) and ROCm-only attention backends chosen on an
NVIDIA GPU (vllm/platforms/cuda.py:429-446); what a release's engine refuses outright (``feature_unsupported``: a
table per release range of EngineArgs._check_feature_supported and the 0.8-0.10 V1 oracle) and 0.13's failure on a
pooler config without a pooling type. Each check applies from the oldest release line read that makes it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..context import LaunchContext
from ..findings import Finding
from . import Emit, rule
from .gating import Line, at_least, effective, for_line, lax_true, registry_arch, vllm_checks, whole

SRC_ROUTED = "vllm 0.33.0 vllm/config/vllm.py:1187-1232 (same in 0.32.0 config/vllm.py:1135-1180)"
SRC_MAMBA = (
    "vllm 0.33.0 vllm/config/vllm.py:1595-1605, 3440-3478 (mamba_block_size since 0.11.2 config/vllm.py:1055-1067; "
    "stochastic rounding since 0.21.0 config/vllm.py:780-787; use_replayssm since 0.30.0 config/vllm.py:3210-3221; service/data/vllm/checks/check_lines.json)"
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
    # a watermark runs Model Runner V2 whatever the env says (vllm 0.33.0 config/vllm.py:740-746; 0.32.0 :712-718)
    if ctx.request.env.get("VLLM_USE_V2_MODEL_RUNNER") in OFF and a.get("watermark_config") is None:
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


def _returns_routed_experts(ctx: LaunchContext) -> bool:
    """Routed experts returned: the flag, or ``--aux-output-config`` asking for them (0.33 config/aux_output.py:22-24
    ``enabled``)."""
    aux = ctx.args.get("aux_output_config")
    asked = isinstance(aux, dict) and lax_true(aux.get("enable_return_routed_experts"))
    return bool(ctx.args.get("enable_return_routed_experts")) or asked


@rule(
    "routed_experts",
    severity="error",
    source=SRC_ROUTED,
    when=("enable_return_routed_experts", "aux_output_config"),
)
def routed_experts(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--enable-return-routed-experts`` (from 0.32; or ``--aux-output-config`` asking for routed experts) needs a
    MoE model, Model Runner V2, prefix caching, no pipeline parallelism and no context parallelism."""
    if not _returns_routed_experts(ctx) or not at_least(ctx, (0, 32)):
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
        if vllm_checks(ctx, "mamba_block_needs_prefix_caching"):
            text = "--mamba-block-size can only be set with --enable-prefix-caching"
            out.append((text, {"drop": ["mamba_block_size"]}, "mamba_block_size"))
    if (
        a.get("enable_mamba_cache_stochastic_rounding")
        and vllm_checks(ctx, "mamba_stochastic_rounding_float16")
        and not _ssm_dtype_float16(ctx)
    ):
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


@rule(
    "mamba_options",
    severity="error",
    source=SRC_MAMBA,
    when=("mamba_block_size", "enable_mamba_cache_stochastic_rounding", "use_replayssm"),
)
def mamba_options(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Mamba cache options vLLM refuses in combination: ``--mamba-block-size`` with prefix caching disabled (from
    0.11); stochastic rounding of the Mamba cache without a float16 SSM cache (from 0.21); ``--use-replayssm`` on a
    model without recurrent layers (from 0.30). Other Mamba options on a pure Transformer are ignored by vLLM."""
    return [emit.error("mamba_options", t, remedy=r, field=f"engine_args.{n}") for t, r, n in _mamba_problems(ctx)]


@rule(
    "attention_backend_platform",
    severity="error",
    source=SRC_ROCM,
    when=("attention_backend",),
)
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


SRC_SHARDED = (
    "vllm 0.33.0 vllm/config/vllm.py:3182-3221 (since 0.30.0 config/vllm.py:2944-2998, with the option; adaptive "
    "verification a blocker up to 0.32.0 config/vllm.py:3057-3071; service/data/vllm/checks/check_lines.json)"
)


def _seqs_doubled(ctx: LaunchContext) -> bool:
    """``--performance-mode throughput`` doubles a default max_num_seqs (vllm 0.33.0 arg_utils.py:3183-3189), which
    Preflight's derived value does not: not judged against it then."""
    return "max_num_seqs" not in ctx.args.given and ctx.args.get("performance_mode") == "throughput"


def _sharding_blockers(ctx: LaunchContext) -> list[str]:
    """The reasons ``_validate_batch_sharded_sampling`` lists (vllm.py:3187-3213)."""
    out = []
    if ctx.tp <= 1:
        out.append("tensor_parallel_size is 1, so there is nothing to shard")
    elif ctx.max_num_seqs < ctx.tp and not _seqs_doubled(ctx):
        out.append(f"max_num_seqs ({ctx.max_num_seqs}) is below tensor_parallel_size ({ctx.tp})")
    logprobs = whole(effective(ctx, "max_logprobs"))
    if logprobs is not None and logprobs < 0:
        out.append("max_logprobs is -1, allowing vocab-size logprob requests")
    if ctx.args.get("return_sampling_mask"):
        out.append("return_sampling_mask is set and the batch-sharded gather does not forward sampling masks")
    spec = ctx.args.get("speculative_config")
    adaptive = isinstance(spec, dict) and lax_true(spec.get("enable_adaptive_verification"))
    if adaptive and not at_least(ctx, (0, 33)):
        out.append(
            "it does not yet work with adaptive verification, which decides the per-request logits counts on the "
            "GPU, where the CPU-side shard plan cannot see them"
        )
    return out


@rule("batch_sharded_sampling", severity="error", source=SRC_SHARDED, when=("enable_batch_sharded_sampling",))
def batch_sharded_sampling(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--enable-batch-sharded-sampling`` (from 0.30) shards sampling over the TP ranks: it needs TP > 1,
    max_num_seqs at least TP, ``--max-logprobs`` not -1, no ``--return-sampling-mask`` and, up to 0.32, no adaptive
    verification."""
    if "enable_batch_sharded_sampling" not in ctx.args.given:
        return []
    if not ctx.args.get("enable_batch_sharded_sampling") or not vllm_checks(ctx, "batch_sharded_sampling"):
        return []
    blockers = _sharding_blockers(ctx)
    if not blockers:
        return []
    return [
        emit.error(
            "batch_sharded_sampling",
            "Batch-sharded sampling was explicitly enabled via the --enable-batch-sharded-sampling flag, but is not "
            f"supported in this configuration for the following reason(s): {'; '.join(blockers)}.",
            remedy={"enable_batch_sharded_sampling": False},
            field="engine_args.enable_batch_sharded_sampling",
        )
    ]


SRC_OFFLOAD = "vllm 0.33.0 vllm/config/offload.py:98-113 (the same since 0.18.1 offload.py:98-113, with the options)"


@rule(
    "offload_options",
    severity="error",
    source=SRC_OFFLOAD,
    when=("offload_backend", "offload_group_size", "offload_num_in_group", "offload_prefetch_step"),
)
def offload_options(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Prefetch weight offloading (``--offload-backend prefetch`` or ``--offload-group-size`` > 0, from 0.18)
    offloads ``--offload-num-in-group`` layers of each group: at most the group size, and prefetches at least one
    layer ahead (``--offload-prefetch-step`` ≥ 1)."""
    names = ("offload_backend", "offload_group_size", "offload_num_in_group", "offload_prefetch_step")
    if not any(n in ctx.args.given for n in names) or not at_least(ctx, (0, 18)):
        return []
    group, num = whole(effective(ctx, "offload_group_size")), whole(effective(ctx, "offload_num_in_group"))
    step = whole(effective(ctx, "offload_prefetch_step"))
    if group is None or not (effective(ctx, "offload_backend") == "prefetch" or group > 0):
        return []
    out = []
    if num is not None and num > group:
        out.append(
            emit.error(
                "offload_options",
                f"offload_num_in_group ({num}) must be <= offload_group_size ({group})",
                remedy={"offload_num_in_group": max(1, group), "offload_group_size": max(num, group)},
                field="engine_args.offload_num_in_group" if group else "engine_args.offload_group_size",
            )
        )
    elif step is not None and step < 1:
        out.append(
            emit.error(
                "offload_options",
                f"offload_prefetch_step ({step}) must be >= 1 when prefetch offloading is enabled "
                "(offload_group_size > 0)",
                remedy={"offload_prefetch_step": 1},
                field="engine_args.offload_prefetch_step",
            )
        )
    return out


SRC_MODEL_SPECIFIC = (
    "vllm 0.33.0 vllm/config/kernel.py:150, 185-191, 231-242, 452-458 (since 0.30.0 kernel.py:153-158, 178-198 with "
    "flashinfer_moe_ep_mega_cutedsl as well; one backend since 0.32.0 kernel.py:230-241); vllm/config/engram.py:16-20, "
    "68-83; vllm/config/vllm.py:1485-1489 (since 0.30.0 engram.py:70-84, vllm.py:1243-1249)"
)
DSV4_ARCHITECTURES = frozenset({"DeepseekV4ForCausalLM", "DeepSeekV4MTPModel", "DeepseekV41ForCausalLM"})
DSV4_BACKENDS = {
    (0, 30): ("flashinfer_moe_ep_mega_deep_gemm", "flashinfer_moe_ep_mega_cutedsl"),
    (0, 32): ("flashinfer_moe_ep_mega_deep_gemm",),
}
# architecture -> the text-config field naming its n-gram layers (engram.py:16-20; the same in 0.30 and 0.32)
NGRAM_LAYER_FIELDS = {
    "DeepseekV41ForCausalLM": "engram_layer_ids",
    "Qwen4ExpForCausalLM": "ple_layer_ids",
    "Qwen4ExpForConditionalGeneration": "ple_layer_ids",
}


def _has_ngram_layers(ctx: LaunchContext) -> bool:
    """Some architecture of the model has Engram n-gram layer ids in its config (engram.py:23-30)."""
    config = ctx.request.model.config or {}
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for arch in ctx.facts.architectures:
        field = NGRAM_LAYER_FIELDS.get(arch)
        if field is not None and (config.get(field) or (text or {}).get(field)):
            return True
    return False


@rule("model_specific_option", severity="error", source=SRC_MODEL_SPECIFIC, when=("moe_backend", "engram_config"))
def model_specific_option(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Options made for one family of models: ``--moe-backend flashinfer_moe_ep_mega_deep_gemm`` runs DeepSeek-V4
    experts only (from 0.30); ``--engram-config`` needs a model with Engram n-gram embedding layers (from 0.30)."""
    given = ctx.args.given
    if "moe_backend" not in given and "engram_config" not in given:
        return []
    if not at_least(ctx, (0, 30)):
        return []
    out = []
    backend = ctx.args.get("moe_backend")
    if backend in for_line(ctx, DSV4_BACKENDS) and not DSV4_ARCHITECTURES & set(ctx.facts.architectures):
        out.append(
            emit.error(
                "model_specific_option",
                f"moe_backend={backend!r} is only supported for DeepSeek-V4 models ({sorted(DSV4_ARCHITECTURES)}), "
                f"but the model is {list(ctx.facts.architectures)}.",
                remedy={"moe_backend": "auto"},
                field="engine_args.moe_backend",
            )
        )
    overridden = "hf_overrides" in given  # overrides may add the layer ids: not judged
    if ctx.args.get("engram_config") is not None and not overridden and not _has_ngram_layers(ctx):
        out.append(
            emit.error(
                "model_specific_option",
                "EngramConfig requires a model with supported Engram embeddings and non-empty n-gram layer ids.",
                remedy={"drop": ["engram_config"]},
                field="engine_args.engram_config",
            )
        )
    return out


SRC_SSU = (
    "vllm 0.33.0 vllm/config/mamba.py:66-82 (validate_ssu_algorithm, called by engine/arg_utils.py:2770-2786 with the "
    "backend --mamba-backend sets; since 0.28.0 config/mamba.py:66-82, engine/arg_utils.py:2400-2415; service/data/vllm/checks/check_lines.json)"
)
SRC_REPLAY = (
    "vllm 0.33.0 vllm/config/vllm.py:1304-1334 (_verify_sampling_replay_config, from VllmConfig.__post_init__ :1569; "
    "since 0.28.0 config/vllm.py:1027-1050; service/data/vllm/checks/check_lines.json)"
)


@rule("mamba_ssu_algorithm", severity="error", source=SRC_SSU, when=("mamba_ssu_algorithm",))
def mamba_ssu_algorithm(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--mamba-ssu-algorithm`` (from 0.28) needs ``--mamba-backend flashinfer``: the Mamba config refuses an
    algorithm with any other backend, on every model."""
    if "mamba_ssu_algorithm" not in ctx.args.given or not vllm_checks(ctx, "mamba_ssu_needs_flashinfer"):
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


@rule("sampling_replay_logprobs", severity="error", source=SRC_REPLAY, when=("return_sampling_mask",))
def sampling_replay_logprobs(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--return-sampling-mask`` (from 0.28) needs ``--logprobs-mode processed_logprobs`` (vLLM's checks before
    this one refuse other launches with the mask, never one that passes it)."""
    if "return_sampling_mask" not in ctx.args.given or not vllm_checks(ctx, "sampling_replay_logprobs"):
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


# --- Features a release's engine refuses outright -------------------------------------------------------------------
# 0.11 onward ``EngineArgs._check_feature_supported`` raises NotImplementedError through ``_raise_unsupported_error``
# ("X is not supported. We recommend to remove X from your config."); 0.8-0.10 ``_is_v1_supported_oracle`` raises
# "VLLM_USE_V1=1 is not supported with X." only when VLLM_USE_V1=1 is set, and falls back to the V0 engine otherwise
# (``_raise_or_fallback``). Its pipeline-parallel executor row is judged by pp_supported (arch.py).
SRC_UNSUPPORTED = (
    "vllm 0.13.0 vllm/engine/arg_utils.py:1722-1766, 2018-2023 (_check_feature_supported: 0.11.2 :1792-1835; 0.15.1 "
    ":1777-1805; 0.18.1-0.26.0 Concurrent Partial Prefill only, e.g. 0.26.0 :2403-2411); _is_v1_supported_oracle: "
    "0.8.5 :1292-1430, 1649-1657; 0.9.2 :1306-1465, 1726-1734; 0.10.2 :1431-1500, 1792-1800"
)
# a value vLLM compares with the release's default; None when Preflight cannot read it as vLLM would (not judged)
Probe = Callable[[LaunchContext], bool]


def _set(name: str) -> Probe:
    """The option differs from ``None`` (``--logits-processor-pattern``, ``--preemption-mode``): '' and 'None' parse
    to None (engine_args.py), so any value left is a difference."""
    return lambda ctx: ctx.args.get(name) is not None


def _differs(name: str, default: Any) -> Probe:
    """The option is given a number other than the SchedulerConfig default vLLM compares with (the parser default
    is that same class attribute: e.g. 0.13.0 arg_utils.py:438-439 ``= SchedulerConfig.max_num_partial_prefills``)."""

    def probe(ctx: LaunchContext) -> bool:
        value = ctx.args.get(name)
        number = whole(value) if not isinstance(value, float) else value
        return name in ctx.args.given and number is not None and number != default

    return probe


def _true(name: str) -> Probe:
    return lambda ctx: ctx.args.get(name) is True


def _partial_prefill(ctx: LaunchContext) -> bool:
    """``max_num_partial_prefills`` or ``max_long_partial_prefills`` other than SchedulerConfig's 1 (the default in
    every release that has them: 0.8.5 config.py:1844-1848, 0.10.2 config/scheduler.py:54-58, 0.13.0 :64-68, 0.26.0
    :70-74)."""
    return _differs("max_num_partial_prefills", 1)(ctx) or _differs("max_long_partial_prefills", 1)(ctx)


def _spec_method(ctx: LaunchContext) -> Any:
    """The ``method`` key of ``--speculative-config`` as given (vLLM reads the dict before building the config)."""
    from .speculative import speculative_config

    cfg = speculative_config(ctx)
    return cfg.get("method") if cfg is not None else None


def _spec_v1_unsupported(ctx: LaunchContext) -> bool:
    """0.8/0.9: V1 runs ngram, eagle, eagle3 (0.9: also medusa and deepseek_mtp) speculation; any other method (no
    method: a draft model unless the model is "ngram") is refused (0.8.5 arg_utils.py:1426-1441, 0.9.2 :1426-1444)."""
    from .speculative import speculative_config

    cfg = speculative_config(ctx)
    if cfg is None:
        return False
    method = cfg.get("method")
    ok = ("ngram", "[ngram]", "eagle", "eagle3") + (("medusa", "deepseek_mtp") if at_least(ctx, (0, 9)) else ())
    return method not in ok if method else cfg.get("model") not in ("ngram", "[ngram]")


@dataclass(frozen=True)
class Gate:
    feature: str  # vLLM's feature_name, as its message prints it
    options: tuple[str, ...]  # what the remedy drops
    lines: tuple[Line, Line]  # the first and last release line that check it
    probe: Probe


# _check_feature_supported, 0.11 onward: refused whatever the environment (rows in the order vLLM checks them)
CHECKED = (
    # 0.11.2 arg_utils.py:1794-1795, 0.13.0 :1724-1725, 0.15.1 :1779-1780; gone in 0.18.1 with the option
    Gate(
        "--logits-processor-pattern",
        ("logits_processor_pattern",),
        ((0, 11), (0, 15)),
        _set("logits_processor_pattern"),
    ),
    # 0.11.2 :1797-1803, 0.13.0 :1727-1733, 0.15.1 :1782-1788, 0.18.1 :1953-1959, 0.21.0 :2191-2197,
    # 0.24.0 :2349-2355, 0.26.0 :2405-2411; gone in 0.28.0 with the options
    Gate(
        "Concurrent Partial Prefill",
        ("max_num_partial_prefills", "max_long_partial_prefills"),
        ((0, 11), (0, 26)),
        _partial_prefill,
    ),
)
# _is_v1_supported_oracle, 0.8-0.10: refused only with VLLM_USE_V1=1 (rows in the order vLLM checks them)
ORACLE = (
    # 0.8.5 :1298-1303 (tensorizer too), 0.9.2 :1312-1316, 0.10.2 :1437-1441
    Gate(
        "--load_format sharded_state",
        ("load_format",),
        ((0, 8), (0, 10)),
        lambda c: c.args.get("load_format") == "sharded_state",
    ),
    Gate(
        "--load_format tensorizer",
        ("load_format",),
        ((0, 8), (0, 8)),
        lambda c: c.args.get("load_format") == "tensorizer",
    ),
    # 0.8.5 :1305-1309, 0.9.2 :1318-1322, 0.10.2 :1443-1447
    Gate(
        "--logits-processor-pattern", ("logits_processor_pattern",), ((0, 8), (0, 10)), _set("logits_processor_pattern")
    ),
    # 0.8.5 :1311-1314, 0.9.2 :1324-1327, 0.10.2 :1449-1452 (SchedulerConfig.preemption_mode = None)
    Gate("--preemption-mode", ("preemption_mode",), ((0, 8), (0, 10)), _set("preemption_mode")),
    # 0.8.5 :1316-1320, 0.9.2 :1329-1333, 0.10.2 :1454-1458 (EngineArgs default False)
    Gate(
        "--disable-async-output-proc",
        ("disable_async_output_proc",),
        ((0, 8), (0, 10)),
        _true("disable_async_output_proc"),
    ),
    # 0.8.5 :1322-1325 (SchedulerConfig.policy = "fcfs")
    Gate(
        "--scheduling-policy",
        ("scheduling_policy",),
        ((0, 8), (0, 8)),
        lambda c: c.args.get("scheduling_policy") not in (None, "fcfs"),
    ),
    # 0.8.5 :1327-1330, 0.9.2 :1335-1338 (SchedulerConfig.num_scheduler_steps = 1)
    Gate("--num-scheduler-steps", ("num_scheduler_steps",), ((0, 8), (0, 9)), _differs("num_scheduler_steps", 1)),
    # 0.8.5 :1332-1335, 0.9.2 :1340-1343, 0.10.2 :1460-1463 (SchedulerConfig.delay_factor = 0.0)
    Gate(
        "--scheduler-delay-factor",
        ("scheduler_delay_factor",),
        ((0, 8), (0, 10)),
        _differs("scheduler_delay_factor", 0.0),
    ),
    # 0.8.5 :1376-1379, 0.9.2 :1385-1388
    Gate("--enable-prompt-adapter", ("enable_prompt_adapter",), ((0, 8), (0, 9)), _true("enable_prompt_adapter")),
    # 0.9.2 :1391-1394, 0.10.2 :1474-1477
    Gate("--enable-prompt-embeds", ("enable_prompt_embeds",), ((0, 9), (0, 10)), _true("enable_prompt_embeds")),
    # 0.8.5 :1409-1415, 0.9.2 :1408-1414, 0.10.2 :1486-1492
    Gate(
        "Concurrent Partial Prefill",
        ("max_num_partial_prefills", "max_long_partial_prefills"),
        ((0, 8), (0, 10)),
        _partial_prefill,
    ),
    # 0.8.5 :1418-1421, 0.9.2 :1417-1420
    Gate(
        "--otlp-traces-endpoint",
        ("otlp_traces_endpoint", "collect_detailed_traces"),
        ((0, 8), (0, 9)),
        lambda c: bool(c.args.get("otlp_traces_endpoint") or c.args.get("collect_detailed_traces")),
    ),
    Gate("Speculative Decoding", ("speculative_config",), ((0, 8), (0, 9)), _spec_v1_unsupported),
)
GATED_OPTIONS = tuple(sorted({n for g in CHECKED + ORACLE for n in g.options} | {"speculative_config"}))
DRAFT_MODEL_TEXT = {
    (0, 10): (
        "Speculative decoding with draft model is not supported yet. Please consider using other speculative "
        "decoding methods such as ngram, medusa, eagle, or deepseek_mtp."
    ),
    (0, 11): (
        "Draft model speculative decoding is not supported yet. Please consider using other speculative decoding "
        "methods such as ngram, medusa, eagle, or mtp."
    ),
}
# 0.10.2 classes that are SupportsV0Only (model_executor/models/bart.py:801, 1220; motif.py:326): the oracle falls
# back to V0 for them before it reaches the draft_model check. The other V0-only classes are multimodal (Mllama,
# Donut, Florence2) or hybrid (Phi4Flash): excluded by their registry facts.
V0_ONLY_TEXT = frozenset(
    {"BartModel", "BartForConditionalGeneration", "MBartForConditionalGeneration", "MotifForCausalLM"}
)


def _use_v1(ctx: LaunchContext) -> bool | None:
    """VLLM_USE_V1 as 0.8-0.10 read it (``bool(int(...))``, envs.py: 0.10.2 :745-746): None when unset or not an
    integer (vLLM fails on the latter before any feature check)."""
    raw = ctx.request.env.get("VLLM_USE_V1")
    try:
        return None if raw is None else bool(int(raw.strip()))
    except ValueError:
        return None


def _in_lines(ctx: LaunchContext, gate: Gate) -> bool:
    return at_least(ctx, gate.lines[0]) and ctx.line.release[:2] <= gate.lines[1]


def _draft_model_reached(ctx: LaunchContext, fallback: bool) -> bool:
    """0.10's oracle raises for ``method: draft_model`` (arg_utils.py:1495-1500) only when no earlier row has sent
    the launch to V0: none of the option rows, an ``auto`` KV cache dtype (the platform's fp8 support is not judged:
    :1465-1471), and a model the release runs on V1 (:1480-1483; the registry's facts, else not judged)."""
    if not fallback:  # VLLM_USE_V1=1: every earlier row raises too, so the launch is refused either way
        return True
    if effective(ctx, "kv_cache_dtype") not in (None, "auto"):
        return False
    arch = registry_arch(ctx)
    if arch is None or arch.multimodal or arch.hybrid or arch.attention_free or arch.name in V0_ONLY_TEXT:
        return False
    return not any(_in_lines(ctx, g) and g.probe(ctx) for g in ORACLE)


POOLING_TASKS = frozenset({"embed", "embedding", "classify", "score", "reward"})


def v1_forces_chunked_prefill(ctx: LaunchContext) -> bool:
    """0.8-0.10: the V1 engine turns chunked prefill on whatever ``--enable-chunked-prefill`` says — every launch in
    0.8 (vllm 0.8.5 vllm/engine/arg_utils.py:1568-1569), every launch but a pooling one in 0.9 and 0.10 (0.9.2
    :1575-1579, 0.10.2 :1620-1623). V1 unless VLLM_USE_V1=0 or an oracle row sends the launch to V0 (ORACLE above);
    a launch whose engine is not told apart is taken as V1, the default."""
    if not at_least(ctx, (0, 8)) or ctx.line.release[:2] > (0, 10) or _use_v1(ctx) is False:
        return False
    if _use_v1(ctx) is None and any(_in_lines(ctx, g) and g.probe(ctx) for g in ORACLE):
        return False  # the oracle falls back to V0, which honours the flag
    if ctx.line.release[:2] == (0, 8):
        return True
    arch = registry_arch(ctx)
    pooling = effective(ctx, "runner") == "pooling" or effective(ctx, "task") in POOLING_TASKS
    return not (pooling or (arch is not None and arch.pooling_only))


def _runs_v0(ctx: LaunchContext) -> bool:
    """The launch runs on the V0 engine: every release before 0.8 unless VLLM_USE_V1=1; 0.8-0.10 with VLLM_USE_V1=0,
    or unset when an oracle row sends it there (a launch whose engine is not told apart is taken as V1)."""
    use_v1 = _use_v1(ctx)
    if not at_least(ctx, (0, 8)):
        return use_v1 is not True
    if ctx.line.release[:2] > (0, 10):
        return False
    return use_v1 is False or (use_v1 is None and any(_in_lines(ctx, g) and g.probe(ctx) for g in ORACLE))


def chunked_prefill_enabled(ctx: LaunchContext) -> bool:
    """Whether the release runs the launch with chunked prefill. From 0.11: the flag (default on). 0.8-0.10 on V1:
    on (``v1_forces_chunked_prefill``). On V0: the flag when given. Left out on V0, vLLM decides by context length
    (vllm 0.10.2 vllm/engine/arg_utils.py:1566-1596 ``_set_default_args_v0``: off up to 32K), yet a real 0.7.3 start
    with max_num_batched_tokens 2048 below max_model_len 4096 (tests/cases/kv granite-30-3b-a800m-l40s-v073) shows
    that path is not the whole story: taken as on, so no launch that starts is refused."""
    given = ctx.args.get("enable_chunked_prefill")
    if not _runs_v0(ctx):
        return v1_forces_chunked_prefill(ctx) or bool(True if given is None else given)
    return True if given is None else bool(given)


def _unsupported(ctx: LaunchContext) -> list[tuple[str, tuple[str, ...]]]:
    """(vLLM's message, the options to drop) for each feature the target release refuses."""
    if at_least(ctx, (0, 11)):
        out = [
            (f"{g.feature} is not supported. We recommend to remove {g.feature} from your config.", g.options)
            for g in CHECKED
            if _in_lines(ctx, g) and g.probe(ctx)
        ]
        # 0.11.2 arg_utils.py:1805-1818, 0.13.0 :1735-1749 (gone in 0.15.1, which runs draft models)
        if ctx.line.release[:2] <= (0, 13) and _spec_method(ctx) == "draft_model":
            out.append((for_line(ctx, DRAFT_MODEL_TEXT), ("speculative_config",)))
        return out
    if not at_least(ctx, (0, 8)):
        return []
    use_v1 = _use_v1(ctx)
    out = []
    if use_v1:
        out = [
            (f"VLLM_USE_V1=1 is not supported with {g.feature}.", g.options)
            for g in ORACLE
            if _in_lines(ctx, g) and g.probe(ctx)
        ]
    reached = use_v1 is not False and ctx.line.release[:2] == (0, 10) and _spec_method(ctx) == "draft_model"
    if reached and _draft_model_reached(ctx, fallback=not use_v1):
        out.append((for_line(ctx, DRAFT_MODEL_TEXT), ("speculative_config",)))
    return out


@rule("feature_unsupported", severity="error", source=SRC_UNSUPPORTED, when=GATED_OPTIONS)
def feature_unsupported(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Options a release's engine refuses outright: ``--logits-processor-pattern`` (0.11-0.15), concurrent partial
    prefill (``max_num_partial_prefills`` / ``max_long_partial_prefills`` other than 1, 0.11-0.26) and the
    ``draft_model`` speculative method (0.10-0.13, in 0.10 unless the V0 engine takes the launch); in 0.8-0.10 with
    ``VLLM_USE_V1=1``, every option the V1 oracle refuses (preemption mode, scheduler delay factor, ...)."""
    out = []
    for text, options in _unsupported(ctx):
        given = [n for n in options if n in ctx.args.given] or list(options)
        remedy: dict[str, Any] = {n: effective_default(ctx, n) for n in given if effective_default(ctx, n) is not None}
        dropped = [n for n in given if effective_default(ctx, n) is None]
        if dropped:
            remedy["drop"] = dropped
        out.append(emit.error("feature_unsupported", text, remedy=remedy, field=f"engine_args.{given[0]}"))
    return out


def effective_default(ctx: LaunchContext, name: str) -> Any:
    """The release's parser default for ``name``, the value vLLM compares with: setting it lifts the refusal."""
    opt = ctx.line.options.get(name)
    return opt.default if opt is not None else None


SRC_POOLER = (
    "vllm 0.13.0 vllm/config/model.py:516-530 (the pooling type is filled in for the pooling runner only), "
    "1664-1681, 1683-1694 (attn_type, is_chunked_prefill_supported: pooler_config.pooling_type.lower()); "
    "engine/arg_utils.py:1337, 1851-1855 (read for every launch); 0.11.2 and 0.15.1 do not read it so"
)


def _generates(ctx: LaunchContext) -> bool:
    """The model runs on the generate runner with a decoder attention type: ``--runner generate`` or ``auto``, every
    architecture a ``*ForCausalLM`` class the registry knows as generative, no ``--convert``, a causal, not hybrid,
    not attention-free model (an encoder-decoder or encoder-only model takes another branch: model.py:1664-1681)."""
    runner, convert = effective(ctx, "runner"), effective(ctx, "convert")
    if convert not in (None, "auto", "none") or runner not in ("generate", "auto"):
        return False
    arch = registry_arch(ctx)
    if arch is None or not arch.generate or arch.pooling_only or arch.hybrid or arch.attention_free:
        return False
    if (ctx.request.model.config or {}).get("is_causal") is False:
        return False
    return all(a.endswith("ForCausalLM") for a in ctx.facts.architectures)


@rule("pooler_config_generate", severity="error", source=SRC_POOLER, when=("pooler_config",))
def pooler_config_generate(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """0.13 only: ``--pooler-config`` without a ``pooling_type`` on a generative model fails with an AttributeError:
    vLLM fills the pooling type in for pooling models only, then reads it for every model given a pooler config."""
    cfg = ctx.args.get("pooler_config")
    if ctx.line.release[:2] != (0, 13) or not isinstance(cfg, dict) or cfg.get("pooling_type") is not None:
        return []
    if not _generates(ctx):
        return []
    return [
        emit.error(
            "pooler_config_generate",
            "'NoneType' object has no attribute 'lower' (vLLM 0.13 reads pooler_config.pooling_type, which it fills "
            "in for pooling models only; this model runs on the generate runner).",
            remedy={"drop": ["pooler_config"]},
            field="engine_args.pooler_config",
        )
    ]


SRC_KV_OFFLOAD = (
    "vllm 0.13.0 vllm/config/vllm.py:470-487 (VllmConfig._post_init_kv_transfer_config; also 0.11.2 "
    "config/vllm.py:299-316); service/data/vllm/checks/check_lines.json"
)


@rule("kv_offloading_options", severity="error", source=SRC_KV_OFFLOAD, when=("kv_offloading_backend",))
def kv_offloading_options(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--kv-offloading-backend`` without ``--kv-offloading-size``: the releases that build the offloading
    connector from the two refuse the backend alone."""
    a = ctx.args
    if a.get("kv_offloading_backend") is None or a.get("kv_offloading_size") is not None:
        return []
    if not vllm_checks(ctx, "kv_offloading_needs_size"):
        return []
    return [
        emit.error(
            "kv_offloading_options",
            "You must set kv_offloading_size when kv_offloading_backend is set.",
            remedy={"drop": ["kv_offloading_backend"]},
            field="engine_args.kv_offloading_size",
        )
    ]


SRC_KDA = "vllm 0.33.0 vllm/engine/arg_utils.py:2868-2880; service/data/vllm/checks/check_lines.json"


@rule("kda_prefill_backend", severity="error", source=SRC_KDA, when=("kda_prefill_backend",))
def kda_prefill_backend(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--kda-prefill-backend fused`` runs on ROCm only: refused on an NVIDIA GPU."""
    if ctx.args.get("kda_prefill_backend") != "fused" or str(ctx.gpu.vendor).lower() != "nvidia":
        return []
    if not vllm_checks(ctx, "kda_fused_rocm_only"):
        return []
    return [
        emit.error(
            "kda_prefill_backend",
            f"--kda-prefill-backend=fused is only available on ROCm. ({ctx.gpu.name} is an NVIDIA GPU.)",
            remedy={"drop": ["kda_prefill_backend"]},
            field="engine_args.kda_prefill_backend",
        )
    ]
