"""Quantization rules: the method named by ``--quantization``, the checkpoint's ``quantization_config`` (or
``hf_quant_config.json``) and the weight's ``quantization.txt`` tag must agree the way the target release reconciles
them: its own override mechanism (service/domain/quant_override.py; vllm 0.33.0 vllm/config/model.py:1383-1469),
then its method list (vllm/model_executor/layers/quantization/__init__.py:15-55) and, on unquantized checkpoints, its
config-file look-up (vllm/config/quantization.py:195-227; vllm/model_executor/model_loader/weight_utils.py:355-380)."""

from __future__ import annotations

from typing import Any

from ..context import LaunchContext
from ..findings import Finding
from ..quant_override import Verdict, override_facts, reconcile
from . import Emit, rule

SRC_UNKNOWN = "vllm 0.33.0 vllm/config/model.py:1464-1469; quantization/__init__.py:15-55"
SRC_MISMATCH = (
    "vllm 0.33.0 vllm/config/model.py:1383-1462 (every method's override_quantization_method, asked in the "
    "release's order: service/data/vllm/quant_overrides/<release>.json, service/domain/quant_override.py); no config: "
    "get_quant_config run per release (same files, no_config; 0.33.0 vllm/model_executor/model_loader/"
    "weight_utils.py:197-393); online fp8: weight_utils.py:355-363"
)


def checkpoint_quant_cfg(ctx: LaunchContext) -> dict[str, Any] | None:
    """The checkpoint's quantization config as _verify_quantization receives it: config.json's (or
    hf_quant_config.json's) dict with the normalised ``quant_method`` (vllm 0.33.0
    transformers_utils/model_arch_config_convertor.py:241-281)."""
    q = ctx.facts.quant
    return None if q is None else {**q.raw, "quant_method": q.method}


def user_value(ctx: LaunchContext) -> str | None:
    """The ``--quantization`` value the launch passes: the tag's method when the weights carry a tag (the deploy
    tooling passes it), else the request's."""
    return ctx.tag.method if ctx.tag else ctx.requested_quantization


def verdict(ctx: LaunchContext, value: str | None) -> Verdict:
    """What the target release does with the checkpoint's config and ``value`` as ``--quantization``."""
    mt = ctx.facts.raw_config.get("model_type")
    return reconcile(
        checkpoint_quant_cfg(ctx),
        value,
        model_type=mt if isinstance(mt, str) else None,
        gpu=ctx.gpu,
        line=ctx.line,
        env=ctx.request.env,
    )


def effective_quantization(ctx: LaunchContext) -> str | None:
    """The ``--quantization`` value to render: on a quantized checkpoint the method the release ends with for the
    given value (its override may replace it: ``awq`` on a ModelOpt FP8 checkpoint runs ``modelopt``); on an
    unquantized one the given online method (``fp8`` becomes ``fp8_per_tensor``); None lets vLLM read the
    checkpoint."""
    value = user_value(ctx)
    if value is None:
        return None
    if ctx.checkpoint_quant is None and value == "fp8":
        return "fp8_per_tensor"
    if ctx.checkpoint_quant is not None:
        v = verdict(ctx, value)
        if v.refusal is None and v.method in ctx.line.quant_methods:
            return v.method
    return value if value in ctx.line.quant_methods else None


@rule("quant_unknown", severity="error", source=SRC_UNKNOWN)
def quant_unknown(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--quantization`` must be one of the target version's methods; bitsandbytes and GGUF are plugins in 0.33.
    vLLM checks the value its override mechanism ends with (vllm 0.33.0 vllm/config/model.py:1464-1469 after
    :1427-1449), so a name an override replaces is not refused (``--quantization bitsandbytes`` on a ModelOpt FP8
    checkpoint runs ``modelopt`` in 0.33).

    vLLM: "Unknown quantization method: {q}. Must be one of {supported}."
    """
    out = []
    for label, value, asked in (
        ("--quantization", ctx.requested_quantization, ctx.requested_quantization),
        ("checkpoint quant_method", ctx.checkpoint_quant, user_value(ctx)),
    ):
        if value is None or value in ctx.line.quant_methods or _replaced(ctx, asked):
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


def _replaced(ctx: LaunchContext, value: str | None) -> bool:
    """Does an override of the target release claim the launch (so neither the checkpoint's method nor ``value``
    is what vLLM checks)?"""
    if ctx.checkpoint_quant is None:
        return False
    v = verdict(ctx, value)
    return v.claimed_by is not None and v.refusal is None


@rule("quant_mismatch", "quant_no_config", "quant_fp8_online_deprecated", severity="error", source=SRC_MISMATCH)
def quant_mismatch(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """The tag, the checkpoint's quant_method and ``--quantization`` must agree the way the target release
    reconciles them: it asks every method's ``override_quantization_method`` in its own order and the first claim
    replaces the value (0.33: ``awq``/``awq_marlin`` on an AWQ checkpoint run ``auto_awq``, any value on a ModelOpt
    FP8 checkpoint runs ``modelopt``, on gpt-oss MXFP4 ``gpt_oss_mxfp4``, ``moe_wna16`` claims 4/8-bit GPTQ and 4-bit
    AWQ, ``humming`` anything but gpt-oss MXFP4); without a claim a value that differs from the checkpoint's method
    is refused. A pre-quantized method on an unquantized checkpoint cannot load (``quant_no_config``); online
    ``fp8`` on one is deprecated (``fp8_per_tensor``).
    """
    ckpt, user = ctx.checkpoint_quant, ctx.requested_quantization
    tag = ctx.tag.method if ctx.tag else None
    if ckpt is None:
        return _unquantized_checkpoint(ctx, emit, tag, user)
    ckpt_source = ctx.facts.quant.source if ctx.facts.quant else "config.json"
    out = []
    if ctx.tag is not None and ctx.tag.method is None:
        out.append(
            emit.error(
                "quant_mismatch",
                f"quantization.txt says the weights are not quantized (none), but the checkpoint's config names "
                f"{ckpt} (from {ckpt_source}); vLLM loads them as {ckpt}.",
                remedy={"quantization_txt": ckpt},
                field="model.quantization_txt",
            )
        )
    asked: list[tuple[str, str | None, str]] = [
        (label, value, fld)
        for label, value, fld in (
            ("quantization.txt", tag, "model.quantization_txt"),
            ("`quantization` argument", user, "engine_args.quantization"),
        )
        if value is not None
    ] or [("checkpoint", None, "model.config.quantization_config")]
    for label, value, fld in asked:
        v = verdict(ctx, value)
        if v.refusal is None:
            continue
        if v.mismatch:
            message = (
                f"Quantization method specified in the model config ({ckpt}, from {ckpt_source}) "
                f"does not match the quantization method specified in the {label} ({value})."
            )
        else:  # an override's own refusal, or the release's guard on its overrides list
            asked_for = f"{label}: {value}; " if value is not None else ""
            message = f"{v.refusal} ({asked_for}vllm {ctx.line.newest} {v.at})"
        nearest = _accepted(ctx, tag, ckpt)
        out.append(
            emit.error("quant_mismatch", message, remedy={"quantization": nearest} if nearest else None, field=fld)
        )
    return out


def _accepted(ctx: LaunchContext, tag: str | None, ckpt: str) -> str | None:
    """The nearest value the release accepts: the tag's, else the checkpoint's own method, else what it runs with
    no value at all (None when it refuses the checkpoint whatever the value)."""
    for value in (tag, ckpt):
        if value is not None and verdict(ctx, value).refusal is None:
            return value
    return verdict(ctx, None).method


def _unquantized_checkpoint(ctx: LaunchContext, emit: Emit, tag: str | None, user: str | None) -> list[Finding]:
    """The tag and the flag on an unquantized checkpoint: they agree, name a method the release can build without
    a checkpoint config, and not fp8."""
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
        failure = _without_config(ctx, value)
        if failure is not None:
            out.append(emit.error("quant_no_config", failure, remedy={"quantization": "fp8_per_tensor"}, field=fld))
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


def _without_config(ctx: LaunchContext, value: str | None) -> str | None:
    """Why the release cannot build ``value`` for a checkpoint without a quantization config, or None: its
    get_quant_config, run on such a checkpoint by the generator (vllm 0.33.0 weight_utils.py:197-393), either finds
    no config file (AWQ, GPTQ, ModelOpt, INC, MoE WNA16, …) or cannot build the config class without one
    (compressed-tensors, quark, fbgemm_fp8, torchao). Not judged with ``--quantization-config`` (online arguments)."""
    facts = override_facts(ctx.line.newest)
    outcome = facts.no_config.get(value or "", "ok") if facts else "ok"
    if value is None or ctx.args.get("quantization_config") is not None:
        return None
    if "Cannot find the config file" not in outcome and "required positional argument" not in outcome:
        return None  # built, or failing for another reason (the generator runs it as on a CUDA GPU)
    if "Cannot find the config file" in outcome:
        return (
            f"Cannot find the config file for {value}: the checkpoint's config.json has no quantization_config (and no "
            f"hf_quant_config.json), so {value} weights cannot be loaded. Use the quantized checkpoint, or an online "
            f"method such as fp8_per_tensor."
        )
    return (
        f"vLLM {ctx.line.newest} cannot build {value} for a checkpoint without a quantization config ({outcome}). "
        f"Use the quantized checkpoint, or an online method such as fp8_per_tensor."
    )
