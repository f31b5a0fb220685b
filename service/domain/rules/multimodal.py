"""Multimodal rules: what vLLM 0.33 checks when it sizes the encoder budget of a multimodal model
(service/domain/multimodal.py computes the item with the most tokens as vLLM's processing info does)."""

from __future__ import annotations

from ..config_values import judge
from ..context import LaunchContext
from ..findings import Finding
from ..multimodal import V1_DEFAULT_LIMIT, _limits, limit_problems, max_items, size_problems, vision_tower
from . import Emit, rule
from .gating import at_least, effective, registry_arch, vllm_checks

SRC_LIMITS = (
    "vllm 0.33.0 vllm/config/multimodal.py:211-236, 471-495 (limit_per_prompt and its dummy options), 430 "
    "(video_pruning_rate, built only for a multimodal model: config/model.py:831-881; since 0.11.2 "
    "multimodal.py:142, model.py:675-697)"
)
# vllm 0.33.0 vllm/config/multimodal.py:430: Field(default=None, ge=0.0, lt=1.0), in every line since 0.11.2
VIDEO_PRUNING_RATE = {"type": "float", "null": True, "ge": 0.0, "lt": 1.0}


@rule(
    "mm_limits_invalid",
    severity="error",
    source=SRC_LIMITS,
    when=("limit_mm_per_prompt", "mm_processor_kwargs", "video_pruning_rate"),
)
def mm_limits_invalid(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--limit-mm-per-prompt`` is validated by vLLM's MultiModalConfig at start-up (counts ≥ 0, sizes > 0, only the
    modality's own options), and the image size fields Preflight's memory profile reads from
    ``--mm-processor-kwargs`` must be positive integers (the processor divides by them); ``--video-pruning-rate``
    must lie in [0, 1) where vLLM builds a MultiModalConfig (a multimodal architecture; others ignore it)."""
    out = _video_pruning_rate(ctx, emit)
    for problem in limit_problems(ctx.args.get("limit_mm_per_prompt")):
        out.append(
            emit.error(
                "mm_limits_invalid",
                f"--limit-mm-per-prompt: {problem}",
                field="engine_args.limit_mm_per_prompt",
                remedy={"limit_mm_per_prompt": None},
            )
        )
    for problem in size_problems(ctx.args.get("mm_processor_kwargs"), "mm_processor_kwargs"):
        out.append(
            emit.error(
                "mm_limits_invalid",
                f"--mm-processor-kwargs: {problem}",
                field="engine_args.mm_processor_kwargs",
                remedy={"mm_processor_kwargs": None},
            )
        )
    return out[:8]


def _video_pruning_rate(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    value = ctx.args.values.get("video_pruning_rate")
    arch = registry_arch(ctx)
    if value is None or arch is None or not arch.multimodal or not at_least(ctx, (0, 11)):
        return []
    if ctx.args.get("model_impl") not in (None, "auto", "vllm"):  # another implementation: another registry entry
        return []
    found = judge(value, VIDEO_PRUNING_RATE)
    if found is None:
        return []
    return [
        emit.error(
            "mm_limits_invalid",
            f"--video-pruning-rate {value!r}: MultiModalConfig video_pruning_rate: {found[0]} (vLLM builds it for "
            f"{arch.name}, a multimodal model).",
            field="engine_args.video_pruning_rate",
            remedy={"video_pruning_rate": None},
        )
    ]


SRC_CHUNKED_MM = "vllm 0.33.0 vllm/v1/core/encoder_cache_manager.py:360-371 (compute_mm_encoder_budget)"


@rule(
    "mm_item_exceeds_batched_tokens",
    severity="error",
    source=SRC_CHUNKED_MM,
    when=("disable_chunked_mm_input",),
)
def mm_item_exceeds_batched_tokens(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """With ``--disable-chunked-mm-input`` a multimodal item is never split across steps, so its largest item (the
    image or video with the most features, by the checkpoint's processor limits) must fit max_num_batched_tokens;
    vLLM raises at engine start otherwise."""
    if not ctx.args.get("disable_chunked_mm_input", False):
        return []
    tower = vision_tower(ctx.facts)
    if tower is None:
        return []
    items, _ = max_items(
        tower, ctx.facts, ctx.max_model_len, ctx.request.model.preprocessor_config, ctx.args.get("mm_processor_kwargs")
    )
    limits = _limits(ctx.args.get("limit_mm_per_prompt"), V1_DEFAULT_LIMIT)
    active = [it.tokens for m, it in items.items() if limits.get(m, V1_DEFAULT_LIMIT) > 0]
    if not active or max(active) <= ctx.max_num_batched_tokens:
        return []
    t, mnbt = max(active), ctx.max_num_batched_tokens
    return [
        emit.error(
            "mm_item_exceeds_batched_tokens",
            f"Chunked MM input disabled but max_tokens_per_mm_item ({t}) is larger than max_num_batched_tokens ({mnbt}). "
            "Please increase max_num_batched_tokens.",
            remedy={"max_num_batched_tokens": t, "disable_chunked_mm_input": False},
            field="engine_args.max_num_batched_tokens",
            max_tokens_per_mm_item=t,
        )
    ]


SRC_MM_CACHE = (
    "vllm 0.24.0 vllm/config/multimodal.py:245-256 (MultiModalConfig._validate_multimodal_config; built only for a "
    "multimodal model); service/data/vllm/checks/check_lines.json"
)


@rule("mm_cache_options", severity="error", source=SRC_MM_CACHE, when=("mm_shm_cache_max_object_size_mb",))
def mm_cache_options(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--mm-shm-cache-max-object-size-mb`` set away from its default on a multimodal model is refused unless the
    processor cache is the shared-memory one (``--mm-processor-cache-type shm``)."""
    given = ctx.args.get("mm_shm_cache_max_object_size_mb")
    opt = ctx.line.options.get("mm_shm_cache_max_object_size_mb")
    if given is None or opt is None or given == opt.default or not vllm_checks(ctx, "mm_shm_object_size_needs_shm"):
        return []
    arch = registry_arch(ctx)
    if arch is None or not arch.multimodal or effective(ctx, "mm_processor_cache_type") == "shm":
        return []
    return [
        emit.error(
            "mm_cache_options",
            "'mm_shm_cache_max_object_size_mb' should only be set when 'mm_processor_cache_type' is 'shm'. "
            f"(--mm-processor-cache-type is {effective(ctx, 'mm_processor_cache_type')!r}.)",
            remedy={"mm_processor_cache_type": "shm", "drop": ["mm_shm_cache_max_object_size_mb"]},
            field="engine_args.mm_shm_cache_max_object_size_mb",
        )
    ]
