"""Architecture rules: architectures the target release does not resolve (service/domain/arch_resolution.py,
per release), custom config code without ``--trust-remote-code``, and pipeline parallel where vLLM refuses it
(vllm 0.33.0 vllm/model_executor/models/registry.py:1221-1418; vllm/transformers_utils/config.py:452-464;
vllm/config/model.py:1569-1576)."""

from __future__ import annotations

from ..arch_resolution import judge
from ..context import LaunchContext
from ..findings import Finding
from . import Emit, rule

SRC_ARCH = (
    "vllm 0.33.0 vllm/model_executor/models/registry.py:1221-1418, vllm/config/model.py:705-741, 2340-2380; "
    "0.10.2 registry.py:504-677; 0.9.2 vllm/model_executor/model_loader/utils.py:169-238; 0.7.3 "
    "model_loader/utils.py:33-117; 0.6.6 registry.py:374-421 (service/data/vllm/<release>.json registry, "
    "service/data/vllm/transformers/)"
)
SRC_TRUST = "vllm 0.33.0 vllm/transformers_utils/config.py:452-464"
SRC_PP = "vllm 0.33.0 vllm/config/model.py:1569-1576; vllm/engine/arg_utils.py:2920-2937; vllm/config/vllm.py:1665-1679"

# Model types Transformers (or vLLM's own config registry) loads without remote code; the families of the test
# fixtures and the common serving families. A config with ``auto_map`` and a model_type outside this set most
# likely needs the repository's configuration code.
BUILTIN_MODEL_TYPES = {
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "qwen3_vl_moe",
    "qwen3_next",
    "phi",
    "phi3",
    "phimoe",
    "falcon",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "deepseek_v2",
    "deepseek_v3",
    "deepseek_v32",
    "kimi_k2",
    "kimi_vl",
    "gpt_oss",
    "gpt2",
    "gpt_neox",
    "gptj",
    "opt",
    "bloom",
    "starcoder2",
    "cohere",
    "cohere2",
    "olmo",
    "olmo2",
    "olmoe",
    "granite",
    "granitemoe",
    "glm",
    "glm4",
    "glm4_moe",
    "internvl",
    "llava",
    "llava_next",
    "mllama",
    "idefics3",
    "pixtral",
    "mistral3",
    "llama4",
    "jamba",
    "mamba",
    "mamba2",
    "nemotron",
    "exaone",
    "stablelm",
    "dbrx",
    "mpt",
}


def _archs(ctx: LaunchContext) -> tuple[str, ...]:
    return ctx.facts.architectures or tuple(str(a) for a in (ctx.request.model.config or {}).get("architectures") or ())


@rule("arch_unsupported", severity="error", source=SRC_ARCH)
def arch_unsupported(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """The checkpoint's ``architectures`` as the target release resolves them (service/domain/arch_resolution.py):
    its model registry, then its Transformers backend (a class of the Transformers releases it allows, or the
    repository's ``auto_map`` class), then its suffix rewrite with an adapter. An error where the release refuses
    (removed, moved to a plugin, or nothing resolves it, with vLLM's message and the nearest registered names); a
    warning where the outcome depends on the installed Transformers or on the repository's code; info where the
    Transformers backend or an adapter takes it."""
    impl = ctx.args.get("model_impl")
    out = judge(
        _archs(ctx),
        ctx.line,
        impl if isinstance(impl, str) else "auto",
        ctx.args.trust_remote_code,
        (ctx.request.model.config or {}).get("auto_map"),
    )
    if out is None:
        return []
    build = {"error": emit.error, "warning": emit.warning, "info": emit.info}[out.severity]
    return [build("arch_unsupported", out.message, remedy=out.remedy, field=out.field)]


@rule("trust_remote_code", severity="warning", source=SRC_TRUST)
def trust_remote_code(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """A config.json that ships its own configuration code (``auto_map``) for a model type Transformers does not
    know needs ``--trust-remote-code``; without it vLLM fails with "Failed to load the model config...". Preflight
    cannot resolve every model type offline, so this is a warning for model types outside its list of built-in
    ones."""
    cfg = ctx.request.model.config or {}
    auto_map = cfg.get("auto_map") or (
        ctx.facts.raw_text_config.get("auto_map") if ctx.facts.raw_text_config is not cfg else None
    )
    if ctx.args.trust_remote_code or not isinstance(auto_map, dict) or "AutoConfig" not in auto_map:
        return []
    mtype = cfg.get("model_type")
    if mtype in BUILTIN_MODEL_TYPES:
        return []
    return [
        emit.warning(
            "trust_remote_code",
            f"config.json maps AutoConfig to repository code ({auto_map['AutoConfig']}) for model_type {mtype!r}, which "
            f"Preflight does not know as a built-in Transformers/vLLM type. Without --trust-remote-code vLLM fails with "
            f"'Failed to load the model config. If the model is a custom model not yet available in the HuggingFace "
            f"transformers library, consider setting `trust_remote_code=True` in LLM or using the `--trust-remote-code` "
            f"flag in the CLI.'",
            remedy={"trust_remote_code": True},
            field="engine_args.trust_remote_code",
        )
    ]


@rule("pp_supported", severity="error", source=SRC_PP)
def pp_supported(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Pipeline parallel needs an architecture whose class implements ``SupportsPP`` (from the release's registry;
    an architecture whose class could not be read is not refused), the ``mp``, ``ray`` or ``external_launcher``
    executor (``uni`` is refused), and no explicit ``--async-scheduling``."""
    if ctx.pp <= 1:
        return []
    out = []
    known = [ctx.line.architectures[a] for a in _archs(ctx) if a in ctx.line.architectures]
    if known and all(a.supports_pp is False for a in known):
        out.append(
            emit.error(
                "pp_supported",
                f"Pipeline parallelism is not supported for this model ({known[0].name}). Supported models implement the "
                f"`SupportsPP` interface. (pipeline_parallel_size={ctx.pp}; vLLM {ctx.line.newest}'s registry)",
                remedy={"pipeline_parallel_size": 1},
                field="engine_args.pipeline_parallel_size",
            )
        )
    backend = ctx.args.get("distributed_executor_backend")
    if backend is not None and backend not in ("mp", "ray", "external_launcher"):
        feature = (
            "Pipeline Parallelism without Ray distributed executor or multiprocessing executor or external launcher"
        )
        out.append(
            emit.error(
                "pp_supported",
                f"{feature} is not supported. We recommend to remove {feature} from your config. "
                f"(--distributed-executor-backend {backend} with pipeline_parallel_size={ctx.pp})",
                remedy={"distributed_executor_backend": "mp"},
                field="engine_args.distributed_executor_backend",
            )
        )
    # 0.33 runs pipeline parallelism with async scheduling on Model Runner V2, its default on CUDA (vllm 0.33.0
    # vllm/config/vllm.py:731-767); only the V1 runner refuses the pair (vllm.py:1651-1680)
    if ctx.args.get("async_scheduling") is True and ctx.line.release < (0, 33, 0):
        out.append(
            emit.error(
                "pp_supported",
                "Async scheduling is not supported by the V1 model runner with pipeline parallelism.",
                remedy={"async_scheduling": False},
                field="engine_args.async_scheduling",
            )
        )
    return out
