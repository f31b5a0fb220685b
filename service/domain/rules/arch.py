"""Architecture rules: architectures vLLM 0.33 no longer has, custom config code without
``--trust-remote-code``, and pipeline parallel where vLLM refuses it (vllm 0.33.0
vllm/model_executor/models/registry.py:841-903, 1225-1252; vllm/transformers_utils/config.py:452-464;
vllm/config/model.py:1569-1576)."""

from __future__ import annotations

from ..context import LaunchContext
from ..findings import Finding
from . import Emit, rule

SRC_ARCH = (
    "vllm 0.33.0 vllm/model_executor/models/registry.py:841-903, 1225-1252 (service/data/vllm/<release>.json registry)"
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
    """The checkpoint's ``architectures`` must exist in the target release's model registry (generated from its
    registry.py): an architecture the release lists as removed fails with "was supported in vLLM until v{X}", one
    moved to an out-of-tree plugin needs that plugin. An architecture the registry does not name at all is a
    warning: vLLM then tries its Transformers backend, which works only if Transformers has the model."""
    out = []
    line = ctx.line
    archs = _archs(ctx)
    for arch in archs:
        if arch in line.architectures:
            continue
        if arch in line.previously_supported:
            until = line.previously_supported[arch]
            out.append(
                emit.error(
                    "arch_unsupported",
                    f"Model architecture {arch} was supported in vLLM until v{until}, and is not supported anymore "
                    f"(vLLM {ctx.version}). Serve it with vLLM ≤ {until} or use a successor checkpoint with a supported "
                    f"architecture.",
                    remedy={"vllm_version": until},
                    field="model.config.architectures",
                )
            )
        elif arch in line.out_of_tree:
            out.append(
                emit.error(
                    "arch_unsupported",
                    f"Model architecture {arch} is not supported in-tree anymore (vLLM {ctx.version}); install the plugin "
                    f"{line.out_of_tree[arch]}.",
                    remedy={"plugin": line.out_of_tree[arch]},
                    field="model.config.architectures",
                )
            )
        elif not any(a in line.architectures for a in archs):
            out.append(
                emit.warning(
                    "arch_unsupported",
                    f"Model architecture {arch} is not in vLLM {line.newest}'s model registry; vLLM falls back to its "
                    f"Transformers backend, which loads it only if the installed Transformers has the model (or with "
                    f"--trust-remote-code and the repository's code). Otherwise it fails with 'Model architectures "
                    f"{list(archs)} are not supported for now'.",
                    remedy=None,
                    field="model.config.architectures",
                )
            )
    return out


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
