"""LoRA limits: what LoRAConfig accepts and what create_engine_config checks around it (vllm 0.33.0
vllm/config/lora.py:27-45, 119-127; vllm/engine/arg_utils.py:2685-2724). LoRAConfig is only built with
``--enable-lora``. Each check applies from the oldest release line read that makes it; the message is that line's."""

from __future__ import annotations

from typing import Any

from ..context import LaunchContext
from ..findings import Finding
from ..versions import parse_version
from . import Emit, rule
from .gating import at_least, for_line, lax_int, registry_arch, whole
from .speculative import speculative_config

SRC_LORA = (
    "vllm 0.33.0 vllm/config/lora.py:36, 119-127; vllm/engine/arg_utils.py:2704-2706 (since 0.6.6 vllm/config.py:2025-2045; "
    "max_lora_rank and lora_extra_vocab_size from fixed lists until 0.10.2 vllm/config/lora.py:102-113)"
)
SRC_LORA_MM = "vllm 0.33.0 vllm/engine/arg_utils.py:2685-2689 (since 0.10.2 arg_utils.py:1374-1377)"
SRC_LORA_SPEC = "vllm 0.33.0 vllm/engine/arg_utils.py:2711-2724 (since 0.11.2 arg_utils.py:1690-1703)"

MAX_LORAS = {
    (0, 6): "max_loras ({n}) must be >= 1.",
    (0, 11): "1 validation error for LoRAConfig\nmax_loras\n  Input should be greater than or equal to 1 "
    "[type=greater_than_equal, input_value={n}, input_type=int]",
}
CPU_LORAS = {
    (0, 6): "max_cpu_loras ({c}) must be >= max_loras ({m})",
    (0, 15): "max_cpu_loras ({c}) must be >= max_loras ({m}).",
}


def _fixed_lists(ctx: LaunchContext) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Before 0.11 LoRAConfig took the rank and extra vocabulary from fixed lists (0.6.6 config.py:2028-2029;
    0.8.5 config.py:2677-2678); a 0.8.x request is read with the 0.7 line's options, so its own version decides."""
    if (parse_version(ctx.version) or (0, 0, 0))[:2] >= (0, 8):
        return (8, 16, 32, 64, 128, 256, 320, 512), (256, 512)
    return (8, 16, 32, 64, 128, 256), (0, 256, 512)


def _nearest(value: int, allowed: tuple[int, ...]) -> int:
    return min(allowed, key=lambda a: (abs(a - value), a))


def lora_problems(ctx: LaunchContext) -> list[tuple[str, dict[str, Any], str]]:
    """(message, remedy, option) for every LoRAConfig limit the launch breaks."""
    a, out = ctx.args, []
    loras = whole(a.get("max_loras"))
    if loras is not None and loras < 1:
        out.append((for_line(ctx, MAX_LORAS).format(n=loras), {"max_loras": 1}, "max_loras"))
    cpu, m = whole(a.get("max_cpu_loras")), loras if loras is not None else 1
    if cpu is not None and 0 < cpu < m:  # vLLM passes a non-positive value on as unset (arg_utils.py:2704-2706)
        out.append((for_line(ctx, CPU_LORAS).format(c=cpu, m=m), {"max_cpu_loras": m}, "max_cpu_loras"))
    if at_least(ctx, (0, 11)):
        return out  # the rank is a parser choice from 0.11 (flag_unsupported); the extra vocabulary went in 0.12
    ranks, vocab = _fixed_lists(ctx)
    rank, extra = whole(a.get("max_lora_rank")), whole(a.get("lora_extra_vocab_size"))
    if rank is not None and rank not in ranks:
        text = f"max_lora_rank ({rank}) must be one of {ranks}."
        out.append((text, {"max_lora_rank": _nearest(rank, ranks)}, "max_lora_rank"))
    if extra is not None and extra not in vocab:
        text = f"lora_extra_vocab_size ({extra}) must be one of {vocab}."
        out.append((text, {"lora_extra_vocab_size": _nearest(extra, vocab)}, "lora_extra_vocab_size"))
    return out


@rule("lora_limits", severity="error", source=SRC_LORA, when=("enable_lora",))
def lora_limits(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """With ``--enable-lora``: ``max_loras`` at least 1; a positive ``max_cpu_loras`` at least ``max_loras``; before
    0.11 ``max_lora_rank`` and ``lora_extra_vocab_size`` from vLLM's fixed lists (from 0.11 the parser's choices
    check the rank)."""
    if not ctx.args.get("enable_lora"):
        return []
    return [emit.error("lora_limits", t, remedy=r, field=f"engine_args.{n}") for t, r, n in lora_problems(ctx)]


@rule(
    "lora_mm_non_multimodal",
    severity="error",
    source=SRC_LORA_MM,
    when=("default_mm_loras",),
)
def lora_mm_non_multimodal(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--default-mm-loras`` names LoRAs per input modality: the model must be multimodal (from 0.10)."""
    arch = registry_arch(ctx)
    if not ctx.args.get("default_mm_loras") or arch is None or arch.multimodal or not at_least(ctx, (0, 10)):
        return []
    return [
        emit.error(
            "lora_mm_non_multimodal",
            f"Default modality-specific LoRA(s) were provided for a non multimodal model ({arch.name}).",
            remedy={"drop": ["default_mm_loras"]},
            field="engine_args.default_mm_loras",
        )
    ]


@rule("lora_spec_batched_tokens", severity="error", source=SRC_LORA_SPEC, when=("enable_lora",))
def lora_spec_batched_tokens(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """LoRA with speculative decoding: a step schedules up to max_num_seqs × (num_speculative_tokens + 1) tokens,
    so ``max_num_batched_tokens`` must hold that many (from 0.11). Judged when max_num_batched_tokens is set: vLLM's
    own default depends on settings Preflight does not model (performance mode, batched-DP MoE)."""
    cfg = speculative_config(ctx)
    k = lax_int(cfg.get("num_speculative_tokens")) if cfg else None
    if not ctx.args.get("enable_lora") or k is None or k <= 0 or not at_least(ctx, (0, 11)):
        return []
    if "max_num_batched_tokens" not in ctx.args.given:
        return []
    mnbt, mns = ctx.max_num_batched_tokens, ctx.max_num_seqs
    if mnbt >= mns * (k + 1):
        return []
    fewer = mnbt // mns - 1
    return [
        emit.error(
            "lora_spec_batched_tokens",
            f"Consider increasing max_num_batched_tokens or decreasing num_speculative_tokens "
            f"(max_num_batched_tokens {mnbt} < max_num_seqs {mns} × (num_speculative_tokens {k} + 1) = {mns * (k + 1)}).",
            remedy={
                "max_num_batched_tokens": mns * (k + 1),
                **({"speculative_config": {**(cfg or {}), "num_speculative_tokens": fewer}} if fewer >= 1 else {}),
            },
            field="engine_args.max_num_batched_tokens",
        )
    ]


SRC_LORA_MODEL = (
    "vllm 0.33.0 vllm/config/lora.py:147-155 (LoRAConfig.verify_with_model_config; before 0.33 the worker refuses "
    "at load: 0.32.0 v1/worker/lora_model_runner_mixin.py:49-50, 0.10.2 :39-40, 0.6.6 worker/model_runner.py:1103); "
    "interfaces: vllm/model_executor/models/interfaces.py:760-795; per architecture: service/data/vllm/<release>.json "
    "registry supports_lora"
)


@rule("lora_unsupported_model", severity="error", source=SRC_LORA_MODEL, when=("enable_lora",))
def lora_unsupported_model(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--enable-lora`` on an architecture whose class does not implement ``SupportsLoRA`` (from the release's
    registry). Not judged where the class could not be read, for a speculative drafter, or where ``--model-impl``
    asks for another implementation than vLLM's own."""
    if "enable_lora" not in ctx.args.given or not ctx.args.get("enable_lora"):
        return []
    if str(ctx.args.get("model_impl") or "auto").lower() not in ("auto", "vllm"):
        return []
    arch = registry_arch(ctx)
    if arch is None or arch.supports_lora is not False or arch.draft_only:
        return []
    text = for_line(
        ctx,
        {
            (0, 6): f"{arch.name} does not support LoRA yet.",
            (0, 33): f"LoRA is not supported for {arch.name} ({ctx.request.model.name or 'the model'}). Supported "
            "models implement the `SupportsLoRA` interface. Run this model without `enable_lora`.",
        },
    )
    return [emit.error("lora_unsupported_model", text, remedy={"enable_lora": False}, field="engine_args.enable_lora")]
