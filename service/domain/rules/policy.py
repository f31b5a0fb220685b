"""The operators' policy (docs/operating.md) and gpu_memory_utilization's range. The operators' rules (those whose
source is an operating.md section) emit warnings in every environment; the policy profile the launch is judged under
(service/domain/policy_profile.py) decides per environment whether each refuses, warns or is off, and gives
``util_too_high`` its thresholds. ``util_range`` and ``chunked_prefill_disabled`` mirror vLLM itself: no profile
changes them."""

from __future__ import annotations

from ..context import LaunchContext
from ..findings import Finding
from ..model_facts import round_up
from ..policy_profile import RulePolicy, default_profile
from . import Emit, rule
from .gating import at_least, registry_arch, vllm_checks
from .parallel import valid_tp_sizes

PRODUCTION_UTIL_CAP = 0.90  # docs/operating.md §3
LONG_PROMPT = 2048  # docs/operating.md §6: chunked prefill on whenever prompts exceed ~2k tokens
SRC_RANGE = "vllm 0.33.0 vllm/config/cache.py:215-224 (Field(default=0.92, gt=0, le=1))"
SRC_UTIL = "docs/operating.md §3"
SRC_EAGER = "docs/operating.md §7"
SRC_PCIE = "docs/operating.md §2 (Interconnect)"
SRC_CHUNK = (
    "vllm 0.33.0 vllm/engine/arg_utils.py:3041-3063, 3074-3076; docs/operating.md §6; Mamba prefix caching: "
    "vllm/model_executor/models/config.py:750-777, 1223, 1246-1247; vllm/config/vllm.py:2766-2767; "
    "vllm/config/model.py:2040-2049, 2275-2279 (0.32.0 and older assert only in the 'align' Mamba cache mode)"
)
# the architectures vLLM 0.33 maps to MambaModelConfig (model_executor/models/config.py:1223, 1246-1247)
MAMBA_CONFIG_ARCHS = ("FalconMambaForCausalLM", "Mamba2ForCausalLM", "MambaForCausalLM")
SRC_LEN = "docs/operating.md §4"
NON_GENERATIVE_SUFFIXES = (
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForRewardModel",
    "EmbeddingModel",
    "ForEmbedding",
)


@rule("util_range", severity="error", source=SRC_RANGE)
def util_range(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``gpu_memory_utilization`` must lie in (0, 1]; vLLM's CacheConfig refuses anything else (pydantic)."""
    u = ctx.gpu_memory_utilization
    if 0 < u <= 1:
        return []
    bound = "greater than 0 [type=greater_than" if u <= 0 else "less than or equal to 1 [type=less_than_equal"
    return [
        emit.error(
            "util_range",
            f"1 validation error for CacheConfig\ngpu_memory_utilization\n  Input should be {bound}, input_value={u}] "
            f"— gpu_memory_utilization is a fraction of each GPU's total memory in (0, 1].",
            remedy={"gpu_memory_utilization": PRODUCTION_UTIL_CAP},
            field="engine_args.gpu_memory_utilization",
        )
    ]


def rule_policy(ctx: LaunchContext, code: str) -> RulePolicy:
    """The policy the launch is judged under for ``code`` (the validator sets ``ctx.policy``; the shipped profile
    when a context was built without one)."""
    return ctx.policy.get(code) or default_profile().rules_for(ctx.environment)[code]


@rule("util_too_high", severity="warning", source=SRC_UTIL)
def util_too_high(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """gpu_memory_utilization (vLLM 0.33's default 0.92 included) above the profile's ``warn_above`` leaves too little
    for bursts of long requests and fragmentation: 0.85-0.90 on real traffic, 0.95 and above in load tests only. The
    shipped profile refuses production launches above 0.95 and warns above 0.90; benchmark launches warn above 0.95."""
    u = ctx.gpu_memory_utilization
    policy = rule_policy(ctx, "util_too_high")
    cap = policy.warn_above if policy.warn_above is not None else PRODUCTION_UTIL_CAP
    if policy.action == "off" or not cap < u <= 1:
        return []
    origin = "set" if "gpu_memory_utilization" in ctx.args.given else f"vLLM {ctx.line.newest}'s default, not set"
    refused = policy.action == "enforce" and policy.refuse_above is not None and u > policy.refuse_above
    limit = (
        f"above {policy.refuse_above:.2f}, which the {ctx.environment} policy refuses"
        if refused and policy.refuse_above is not None
        else f"above the {ctx.environment} cap {cap:.2f}"
    )
    return [
        emit.warning(
            "util_too_high",
            f"gpu_memory_utilization {u:g} ({origin}) is {limit}: steady state is 0.85-0.90, 0.95 and above belongs "
            f"to load tests, and higher values trade headroom for preemption churn.",
            remedy={"gpu_memory_utilization": min(cap, PRODUCTION_UTIL_CAP)},
            field="engine_args.gpu_memory_utilization",
            value=u,
        )
    ]


@rule("enforce_eager_production", severity="warning", source=SRC_EAGER, when=("enforce_eager",))
def enforce_eager_production(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--enforce-eager`` disables CUDA graphs and costs 10-20 % throughput; it is for debugging (the shipped
    profile refuses it in production and warns in benchmark)."""
    if not ctx.args.enforce_eager:
        return []
    return [
        emit.warning(
            "enforce_eager_production",
            f"enforce_eager in {ctx.environment}: CUDA graphs off costs 10-20 % throughput (1200 vs 1450 tok/s measured); use it "
            "only to debug a graph-replay failure.",
            remedy={"enforce_eager": False},
            field="engine_args.enforce_eager",
        )
    ]


def pcie_only(ctx: LaunchContext) -> bool:
    """The GPUs talk over PCIe: stated by the request, or an NVIDIA GPU model without NVLink when not stated."""
    if ctx.interconnect is not None:
        return ctx.interconnect == "pcie"
    return ctx.gpu.vendor == "NVIDIA" and ctx.gpu.nvlink is False


@rule("pcie_tp", severity="warning", source=SRC_PCIE)
def pcie_tp(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Tensor parallel over PCIe without NVLink pays an all-reduce per layer over the slow link; a
    smaller TP (with data-parallel replicas) often serves more. Confirm NVLink before sharding across the node."""
    if ctx.tp <= 1 or not pcie_only(ctx):
        return []
    smaller = valid_tp_sizes(ctx, ctx.tp - 1)
    return [
        emit.warning(
            "pcie_tp",
            f"tensor_parallel_size={ctx.tp} over PCIe ({ctx.gpu.name}, no NVLink): every layer all-reduces across the "
            f"PCIe link, and large TP there can be slower than smaller TP. Prefer the smallest TP whose weights fit "
            f"(candidates {smaller}) and serve more replicas with the remaining GPUs.",
            remedy={"tensor_parallel_size": smaller},
            field="engine_args.tensor_parallel_size",
        )
    ]


def generative(ctx: LaunchContext) -> bool:
    cfg = ctx.request.model.config or {}
    if cfg.get("is_encoder_decoder"):
        return False
    return not any(a.endswith(NON_GENERATIVE_SUFFIXES) for a in ctx.facts.architectures)


def mamba_prefix_caching(ctx: LaunchContext) -> bool:
    """Prefix caching over Mamba state: a hybrid model (attention and Mamba / linear-attention layers; a
    ``layer_types`` of attention only is not hybrid: config/model.py:2040-2049) with prefix caching on, which is
    vLLM's default for a generative hybrid model (config/model.py:2275-2279), or a pure Mamba model with
    ``--enable-prefix-caching`` (off by default for attention-free models)."""
    arch, explicit = registry_arch(ctx), ctx.args.get("enable_prefix_caching")
    if arch is None or explicit is False:
        return False
    if arch.name in MAMBA_CONFIG_ARCHS or arch.attention_free:
        return explicit is True and arch.name in MAMBA_CONFIG_ARCHS
    layer_types = (ctx.request.model.config or {}).get("layer_types")
    attention_only = isinstance(layer_types, list) and all(t in ("attention", "full_attention") for t in layer_types)
    return arch.hybrid and not attention_only and (explicit is True or generative(ctx))


def mamba_align_mode(ctx: LaunchContext) -> bool:
    """Prefix caching over Mamba state in the ``align`` cache mode, on a release whose assert names that mode
    (vllm 0.24.0 model_executor/models/config.py:417-441; 0.28.0 :602-624): prefix caching on — set, or from 0.26
    by default for a hybrid model (0.24 config/model.py:1831-1836 leaves it off, "still experimental") — and the
    mode ``align``: set so; or left unset (``none``) and, up to 0.26, picked because the model class does not
    implement SupportsMambaPrefixCaching (from 0.28 always); or ``all`` on a class without that support; 0.32
    asserts in every mode. Where the registry could not read the class, only an explicit ``align`` is judged."""
    if not vllm_checks(ctx, "mamba_align_needs_chunked_prefill") or not mamba_prefix_caching(ctx):
        return False
    if ctx.args.get("enable_prefix_caching") is not True and not at_least(ctx, (0, 26)):
        return False
    if at_least(ctx, (0, 32)):  # 0.32 asserts whatever the mode (0.32.0 model_executor/models/config.py:685-696)
        return True
    mode = ctx.args.get("mamba_cache_mode") or "none"
    arch = registry_arch(ctx)
    unsupported = arch is not None and arch.supports_mamba_prefix_caching is False
    if mode == "none":
        return at_least(ctx, (0, 28)) or unsupported
    return mode == "align" or (mode == "all" and unsupported)


@rule(
    "chunked_prefill_disabled",
    "mamba_prefix_caching_chunked_prefill",
    severity="error",
    source=SRC_CHUNK,
    when=("enable_chunked_prefill",),
)
def chunked_prefill_disabled(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Chunked prefill explicitly disabled on a generative model: vLLM warns that it does not officially support
    this, and with long prompts (workload P99 above ~2k tokens, or no workload and max_model_len above 2k) every
    long prefill blocks all decodes (docs/operating.md §6). With prefix caching over Mamba state (a hybrid model,
    where prefix caching is on by default) vLLM 0.33 refuses to start (``mamba_prefix_caching_chunked_prefill``)."""
    if ctx.args.get("enable_chunked_prefill") is not False:
        return []
    if at_least(ctx, (0, 33)) and mamba_prefix_caching(ctx):
        on = "set" if ctx.args.get("enable_prefix_caching") is True else "on by default for a hybrid model"
        return [
            emit.error(
                "mamba_prefix_caching_chunked_prefill",
                f"AssertionError: Chunked prefill is required for Mamba prefix caching. (prefix caching is {on}; "
                f"enable chunked prefill, or disable prefix caching with --no-enable-prefix-caching.)",
                remedy={"enable_chunked_prefill": True, "enable_prefix_caching": False},
                field="engine_args.enable_chunked_prefill",
            )
        ]
    if mamba_align_mode(ctx):
        arch = registry_arch(ctx)
        return [
            emit.error(
                "mamba_prefix_caching_chunked_prefill",
                "AssertionError: Chunked prefill is required for mamba cache mode 'align'. (prefix caching is on "
                f"for this {'hybrid' if arch is not None and arch.hybrid else 'Mamba'} model; enable "
                "chunked prefill, or disable prefix caching with --no-enable-prefix-caching.)",
                remedy={"enable_chunked_prefill": True, "enable_prefix_caching": False},
                field="engine_args.enable_chunked_prefill",
            )
        ]
    if not generative(ctx):
        return []
    wl = ctx.request.workload
    p99 = wl.p99_seq_len if wl else None
    long_prompts = (p99 or ctx.max_model_len) > LONG_PROMPT
    why = ""
    if long_prompts:
        basis = f"workload P99 {p99} tokens" if p99 else f"max_model_len {ctx.max_model_len}"
        why = (
            f" With prompts this long ({basis}) a single prefill blocks every decode and TTFT P99 goes to seconds; "
            f"the guide keeps chunked prefill on whenever prompts exceed ~2k tokens."
        )
    return [
        emit.warning(
            "chunked_prefill_disabled",
            "This model does not officially support disabling chunked prefill. Disabling this manually may cause the "
            "engine to crash or produce incorrect outputs." + why,
            remedy={"enable_chunked_prefill": True},
            field="engine_args.enable_chunked_prefill",
        )
    ]


MAX_MODEL_LEN_MULTIPLE = 1024  # docs/operating.md §4: "peak ≈ 6k → 8192"


def p99_with_headroom(p99_seq_len: int) -> int:
    """``ceil(P99 × 1.2)`` in integers (no float rounding at a multiple's edge)."""
    return -(-p99_seq_len * 6 // 5)


def recommended_max_model_len(p99_seq_len: int, derived_max_model_len: int) -> int:
    """docs/operating.md §4: ``min(ceil(P99 × 1.2) rounded up to a multiple of 1024, the model's maximum)`` — the
    value the recommender fills and the one ``max_model_len_oversized`` measures against (one rounding for both)."""
    return min(round_up(p99_with_headroom(p99_seq_len), MAX_MODEL_LEN_MULTIPLE), derived_max_model_len)


@rule("max_model_len_oversized", "max_model_len_below_workload", severity="warning", source=SRC_LEN)
def max_model_len_oversized(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """With a workload: max_model_len should be min(P99 × 1.2 rounded up to a multiple of 1024, model
    maximum), the value the recommender fills — larger multiplies the KV cost per request and cuts concurrency
    (``max_model_len_oversized``); below the P99 it truncates long requests (``max_model_len_below_workload``)."""
    wl = ctx.request.workload
    if wl is None or not wl.p99_seq_len:
        return []
    p99 = wl.p99_seq_len
    rec = recommended_max_model_len(p99, ctx.facts.derived_max_model_len)
    mml = ctx.max_model_len
    if mml > rec:
        return [
            emit.warning(
                "max_model_len_oversized",
                f"max_model_len {mml} is far above the workload's P99 ({p99} tokens): the guide sets min(P99 × 1.2 rounded "
                f"up to a multiple of 1024, model maximum) = {rec}. Every request may claim {mml / rec:.1f}× the KV cache "
                f"it needs, cutting concurrency.",
                remedy={"max_model_len": rec},
                field="engine_args.max_model_len",
            )
        ]
    if mml < p99:
        return [
            emit.warning(
                "max_model_len_below_workload",
                f"max_model_len {mml} is below the workload's P99 ({p99} tokens): long requests will be refused or "
                f"truncated. The guide sets min(P99 × 1.2 rounded up to a multiple of 1024, model maximum) = {rec}.",
                remedy={"max_model_len": rec},
                field="engine_args.max_model_len",
            )
        ]
    return []
