"""Architecture rules: architectures vLLM 0.33 no longer has, custom config code without
``--trust-remote-code``, and pipeline parallel where vLLM refuses it (../shared/vllm-rules.md §1.3, §10)."""

from __future__ import annotations

from ..context import LaunchContext
from . import error, rule, warning

SRC_ARCH = "vllm 0.33.0 vllm/model_executor/models/registry.py:841-903, 1225-1252"
SRC_TRUST = "vllm 0.33.0 vllm/transformers_utils/config.py:452-464"
SRC_PP = "vllm 0.33.0 vllm/config/model.py:1569-1576; vllm/engine/arg_utils.py:2920-2937; vllm/config/vllm.py:1665-1679"

# Architecture -> last vLLM version that supported it (registry.py:841-895, as listed in vllm-rules.md §10)
REMOVED_ARCHS = {
    "MPTForCausalLM": "0.28.0",
    "ArcticForCausalLM": "0.28.0",
    "GritLM": "0.28.0",
    "QWenLMHeadModel": "0.23.0",
    "BaichuanForCausalLM": "0.23.0",
    "MiniMaxText01ForCausalLM": "0.23.0",
    "InternLMForCausalLM": "0.23.0",
    "MllamaForConditionalGeneration": "0.10.2",
}
# Moved to an out-of-tree plugin (registry.py:897-903)
PLUGIN_ARCHS = {
    "BartForConditionalGeneration": "https://github.com/vllm-project/bart-plugin",
    "MBartForConditionalGeneration": "https://github.com/vllm-project/bart-plugin",
    "Florence2ForConditionalGeneration": "https://github.com/vllm-project/bart-plugin",
}
# Model types Transformers (or vLLM's own config registry) loads without remote code; the families of the test
# fixtures and the common serving families. A config with ``auto_map`` and a model_type outside this set most
# likely needs the repository's configuration code.
BUILTIN_MODEL_TYPES = {
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen2_vl", "qwen2_5_vl", "qwen3_vl",
    "qwen3_vl_moe", "qwen3_next", "phi", "phi3", "phimoe", "falcon", "gemma", "gemma2", "gemma3", "gemma3_text",
    "deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "kimi_vl", "gpt_oss", "gpt2", "gpt_neox",
    "gptj", "opt", "bloom", "starcoder2", "cohere", "cohere2", "olmo", "olmo2", "olmoe", "granite", "granitemoe",
    "glm", "glm4", "glm4_moe", "internvl", "llava", "llava_next",
    "mllama", "idefics3", "pixtral", "mistral3", "llama4", "jamba", "mamba", "mamba2", "nemotron", "exaone",
    "stablelm", "dbrx", "mpt",
}


@rule("arch_unsupported", severity="error", source=SRC_ARCH)
def arch_unsupported(ctx: LaunchContext):
    """The checkpoint's ``architectures`` must still exist in vLLM 0.33: architectures removed from the registry
    (Baichuan, Qwen v1, Mllama, MPT, Arctic, GritLM, MiniMaxText01, InternLM v1) fail with "was supported in vLLM
    until v{X}"; Bart / MBart / Florence2 need the bart plugin.
    """
    out = []
    for arch in ctx.facts.architectures or tuple(ctx.request.model.config.get("architectures") or ()):
        if arch in REMOVED_ARCHS:
            until = REMOVED_ARCHS[arch]
            out.append(error(
                "arch_unsupported",
                f"Model architecture {arch} was supported in vLLM until v{until}, and is not supported anymore. "
                f"Serve it with vLLM ≤ {until} or use a successor checkpoint with a supported architecture.",
                remedy={"vllm_version": until}, source=SRC_ARCH, field="model.config.architectures",
            ))
        elif arch in PLUGIN_ARCHS:
            out.append(error(
                "arch_unsupported",
                f"Model architecture {arch} moved out of vLLM core; install the plugin {PLUGIN_ARCHS[arch]}.",
                remedy={"plugin": PLUGIN_ARCHS[arch]}, source=SRC_ARCH, field="model.config.architectures",
            ))
    return out


@rule("trust_remote_code", severity="warning", source=SRC_TRUST)
def trust_remote_code(ctx: LaunchContext):
    """A config.json that ships its own configuration code (``auto_map``) for a model type Transformers does not
    know needs ``--trust-remote-code``; without it vLLM fails with "Failed to load the model config...". Preflight
    cannot resolve every model type offline, so this is a warning for model types outside its list of built-in
    ones."""
    cfg = ctx.request.model.config or {}
    auto_map = cfg.get("auto_map") or (ctx.facts.raw_text_config.get("auto_map") if ctx.facts.raw_text_config is not cfg else None)
    if ctx.args.trust_remote_code or not isinstance(auto_map, dict) or "AutoConfig" not in auto_map:
        return []
    mtype = cfg.get("model_type")
    if mtype in BUILTIN_MODEL_TYPES:
        return []
    return [warning(
        "trust_remote_code",
        f"config.json maps AutoConfig to repository code ({auto_map['AutoConfig']}) for model_type {mtype!r}, which "
        f"Preflight does not know as a built-in Transformers/vLLM type. Without --trust-remote-code vLLM fails with "
        f"'Failed to load the model config. If the model is a custom model not yet available in the HuggingFace "
        f"transformers library, consider setting `trust_remote_code=True` in LLM or using the `--trust-remote-code` "
        f"flag in the CLI.'",
        remedy={"trust_remote_code": True}, source=SRC_TRUST, field="engine_args.trust_remote_code",
    )]


@rule("pp_supported", severity="error", source=SRC_PP)
def pp_supported(ctx: LaunchContext):
    """Pipeline parallel needs the ``mp``, ``ray`` or ``external_launcher`` executor (``uni`` is refused) and is
    incompatible with an explicit ``--async-scheduling``. (Per-architecture ``SupportsPP`` is not catalogued here;
    removed architectures are reported by arch_unsupported.)"""
    if ctx.pp <= 1:
        return []
    out = []
    backend = ctx.args.get("distributed_executor_backend")
    if backend is not None and backend not in ("mp", "ray", "external_launcher"):
        feature = ("Pipeline Parallelism without Ray distributed executor or multiprocessing executor or external "
                   "launcher")
        out.append(error(
            "pp_supported",
            f"{feature} is not supported. We recommend to remove {feature} from your config. "
            f"(--distributed-executor-backend {backend} with pipeline_parallel_size={ctx.pp})",
            remedy={"distributed_executor_backend": "mp"}, source=SRC_PP,
            field="engine_args.distributed_executor_backend",
        ))
    if ctx.args.get("async_scheduling") is True:
        out.append(error(
            "pp_supported",
            "Async scheduling is not supported by the V1 model runner with pipeline parallelism.",
            remedy={"async_scheduling": False}, source=SRC_PP, field="engine_args.async_scheduling",
        ))
    return out
