"""Quantization rules: the method named by ``--quantization``, the checkpoint's ``quantization_config`` (or
``hf_quant_config.json``) and the weight's ``quantization.txt`` tag must agree the way vLLM 0.33 reconciles them
(vllm 0.33.0 vllm/model_executor/layers/quantization/__init__.py:15-55; vllm/config/model.py:1383-1469;
vllm/config/quantization.py:195-227; vllm/model_executor/model_loader/weight_utils.py:355-380)."""

from __future__ import annotations

from ..context import LaunchContext
from ..findings import Finding
from . import Emit, rule

AWQ_FAMILY = {"awq", "awq_marlin", "auto_awq", "marlin"}
GPTQ_FAMILY = {"gptq", "gptq_marlin", "auto_gptq", "marlin"}
PRE_QUANTIZED_ONLY = {
    "awq",
    "awq_marlin",
    "auto_awq",
    "gptq",
    "gptq_marlin",
    "auto_gptq",
    "modelopt",
    "modelopt_fp4",
    "modelopt_mxfp8",
    "modelopt_mixed",
    "compressed-tensors",
    "fbgemm_fp8",
    "fp_quant",
    "quark",
    "moe_wna16",
    "mxfp4",
    "gpt_oss_mxfp4",
    "deepseek_v4_fp8",
    "inc",
    "torchao",
    "humming",
}
ONLINE = {
    "fp8_per_tensor",
    "fp8_per_block",
    "fp8_per_channel",
    "int8_per_channel_weight_only",
    "nvfp4_per_token",
    "mxfp8",
    "online",
    "experts_int8",
}

SRC_UNKNOWN = "vllm 0.33.0 vllm/config/model.py:1464-1469; quantization/__init__.py:15-55"
SRC_MISMATCH = (
    "vllm 0.33.0 vllm/config/model.py:1383-1462 (override table: auto_awq.py:263-286, "
    "auto_gptq.py:213-233, mxfp4.py:128-146); no config: vllm/model_executor/model_loader/"
    "weight_utils.py:375-380; online fp8: weight_utils.py:355-363"
)


# Checkpoint formats whose override claims the checkpoint whatever ``--quantization`` says: vLLM replaces the flag with
# the override's method before it checks that the method is known or matches (vllm 0.33.0 vllm/config/model.py:
# 1383-1462). gpt-oss MXFP4 (quantization/mxfp4.py:129-146), DeepSeek-V4 FP8 (vllm/models/deepseek_v41/
# quant_config.py:164-191), ModelOpt FP8 / NVFP4 / MXFP8 / mixed (quantization/modelopt.py:453-459, 776-782,
# 1236-1242, 1658-1664). The one exception: ``--quantization humming`` is probed first (model.py:1417-1419).
MODELOPT_METHODS = {"modelopt", "modelopt_fp4", "modelopt_mxfp8", "modelopt_mixed"}


def flag_overridden(ctx: LaunchContext) -> str | None:
    """The method a checkpoint override imposes whatever ``--quantization`` names, or None."""
    ckpt, mt = ctx.checkpoint_quant, ctx.facts.model_type
    if ctx.requested_quantization == "humming" or ckpt is None:
        return None
    if ckpt in ("mxfp4", "gpt_oss_mxfp4") and mt == "gpt_oss":
        return "gpt_oss_mxfp4"
    if ckpt in ("fp8", "deepseek_v4_fp8") and mt in ("deepseek_v4", "deepseek_v41"):
        return "deepseek_v4_fp8"
    return ckpt if ckpt in MODELOPT_METHODS else None


def canonical(method: str | None, ctx: LaunchContext) -> str | None:
    """The method vLLM ends up with for a checkpoint method / user value pair (None = unquantized)."""
    if method is None:
        return None
    if method in AWQ_FAMILY:
        return "auto_awq"
    if method in GPTQ_FAMILY:
        return "auto_gptq"
    if method in ("mxfp4", "gpt_oss_mxfp4") and ctx.facts.model_type == "gpt_oss":
        return "gpt_oss_mxfp4"
    return method


def compatible(ckpt: str, value: str, ctx: LaunchContext) -> bool:
    """Does ``value`` (a user flag or tag) agree with checkpoint method ``ckpt`` under 0.33's override table?"""
    if value == ckpt:
        return True
    if ckpt == "awq" and value in AWQ_FAMILY:
        return True
    if ckpt == "gptq" and value in GPTQ_FAMILY:
        return True
    if ckpt in ("awq", "gptq") and value == "moe_wna16" and ctx.facts.is_moe:
        return True
    if value != "humming" and flag_overridden(ctx):
        return True  # the override ignores the user's value (see flag_overridden)
    if value == "humming" and ctx.facts.model_type != "gpt_oss":
        return True
    return False


def effective_quantization(ctx: LaunchContext) -> str | None:
    """The ``--quantization`` value to render: the tag's method when the weights carry a tag, else the request's;
    online ``fp8`` on an unquantized checkpoint becomes ``fp8_per_tensor``; None lets vLLM read the checkpoint."""
    value = ctx.tag.method if ctx.tag else ctx.requested_quantization
    if value == "fp8" and ctx.checkpoint_quant is None:
        return "fp8_per_tensor"
    if value is not None and value not in ctx.line.quant_methods:
        return None
    return value


@rule("quant_unknown", severity="error", source=SRC_UNKNOWN)
def quant_unknown(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--quantization`` must be one of the target version's methods; bitsandbytes and GGUF are plugins in 0.33.
    A checkpoint whose override ignores the flag (gpt-oss MXFP4, DeepSeek-V4 FP8, ModelOpt: ``flag_overridden``)
    replaces it before this check, so any flag loads there.

    vLLM: "Unknown quantization method: {q}. Must be one of {supported}."
    """
    out = []
    flag = None if flag_overridden(ctx) else ctx.requested_quantization
    for label, value in (
        ("--quantization", flag),
        ("checkpoint quant_method", ctx.checkpoint_quant),
    ):
        if value is None or value in ctx.line.quant_methods:
            continue
        plugin = ctx.line.plugin_only.get(value)
        extra = (
            f" {value} is not in vLLM core since the {plugin[0]} line (generated catalogues): it needs {plugin[1]}."
            if plugin
            else ""
        )
        out.append(
            emit.error(
                "quant_unknown",
                f"Unknown quantization method: {value} ({label}). Must be one of {list(ctx.line.quant_methods)}.{extra}",
                remedy={"quantization": list(ctx.line.quant_methods), "plugin": plugin[1] if plugin else None},
                field="engine_args.quantization" if label.startswith("--") else "model.config.quantization_config",
            )
        )
    return out


@rule("quant_mismatch", "quant_no_config", "quant_fp8_online_deprecated", severity="error", source=SRC_MISMATCH)
def quant_mismatch(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """The tag, the checkpoint's quant_method and ``--quantization`` must agree after vLLM's override table.

    awq ↔ {awq, awq_marlin, auto_awq, marlin}; gptq ↔ {gptq, gptq_marlin, auto_gptq, marlin}; AWQ/GPTQ MoE ↔
    moe_wna16; gpt-oss mxfp4 ignores the flag; anything else must be equal. A pre-quantized method on an unquantized
    checkpoint cannot load (``quant_no_config``); online ``fp8`` on one is deprecated (``fp8_per_tensor``).
    """
    ckpt, user = ctx.checkpoint_quant, ctx.requested_quantization
    tag = ctx.tag.method if ctx.tag else None
    ckpt_source = ctx.facts.quant.source if ctx.facts.quant else "config.json"
    out = []
    if flag_overridden(ctx):
        user = None  # vLLM replaces the flag with the override's method (flag_overridden)
    if user is not None and user not in ctx.line.quant_methods:
        # unknown method: quant_unknown reports it; still a mismatch when the checkpoint names another method
        if ckpt is not None and user != ckpt:
            out.append(
                emit.error(
                    "quant_mismatch",
                    f"Quantization method specified in the model config ({ckpt}) does not match the quantization method "
                    f"specified in the `quantization` argument ({user}).",
                    remedy={"quantization": ckpt},
                    field="engine_args.quantization",
                )
            )
        return out
    if ckpt is not None and ctx.tag is not None and ctx.tag.method is None:
        out.append(
            emit.error(
                "quant_mismatch",
                f"quantization.txt says the weights are not quantized (none), but the checkpoint's config names "
                f"{ckpt} (from {ckpt_source}); vLLM loads them as {ckpt}.",
                remedy={"quantization_txt": ckpt},
                field="model.quantization_txt",
            )
        )
    if ckpt is not None:
        for label, value, fld in (
            ("quantization.txt", tag, "model.quantization_txt"),
            ("`quantization` argument", user, "engine_args.quantization"),
        ):
            if value is not None and not compatible(ckpt, value, ctx):
                out.append(
                    emit.error(
                        "quant_mismatch",
                        f"Quantization method specified in the model config ({ckpt}, from {ckpt_source}) "
                        f"does not match the quantization method specified in the {label} ({value}).",
                        remedy={"quantization": tag if (tag and compatible(ckpt, tag, ctx)) else ckpt},
                        field=fld,
                    )
                )
        return out
    # unquantized checkpoint
    out.extend(_unquantized_checkpoint(emit, tag, user))
    return out


def _unquantized_checkpoint(emit: Emit, tag: str | None, user: str | None) -> list[Finding]:
    """The tag and the flag on an unquantized checkpoint: they agree, name no pre-quantized method, and not fp8."""
    out = []
    if tag is not None and user is not None and tag != user and not (tag == "fp8" and user == "fp8_per_tensor"):
        out.append(
            emit.error(
                "quant_mismatch",
                f"quantization.txt names {tag} but the `quantization` argument is {user}; the tag decides.",
                remedy={"quantization": tag},
                field="engine_args.quantization",
            )
        )
    for value, fld in ((tag, "model.quantization_txt"), (user, "engine_args.quantization")):
        if value in PRE_QUANTIZED_ONLY:
            out.append(
                emit.error(
                    "quant_no_config",
                    f"Cannot find the config file for {value}: the checkpoint's config.json has no quantization_config "
                    f"(and no hf_quant_config.json), so {value} weights cannot be loaded. Use the quantized checkpoint, or "
                    f"an online method such as fp8_per_tensor.",
                    remedy={"quantization": "fp8_per_tensor"},
                    field=fld,
                )
            )
            break
    if "fp8" in (tag, user):
        out.append(
            emit.warning(
                "quant_fp8_online_deprecated",
                "--quantization fp8 is deprecated for online quantization; use --quantization fp8_per_tensor instead "
                "(Preflight renders fp8_per_tensor).",
                remedy={"quantization": "fp8_per_tensor"},
                field="engine_args.quantization",
            )
        )
    return out
