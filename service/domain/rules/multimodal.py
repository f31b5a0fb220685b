"""Multimodal rules: what vLLM 0.33 checks when it sizes the encoder budget of a multimodal model
(service/domain/multimodal.py computes the item with the most tokens as vLLM's processing info does)."""

from __future__ import annotations

from ..context import LaunchContext
from ..multimodal import V1_DEFAULT_LIMIT, _limits, max_items, vision_tower
from . import error, rule

SRC_CHUNKED_MM = "vllm 0.33.0 vllm/v1/core/encoder_cache_manager.py:360-371 (compute_mm_encoder_budget)"


@rule("mm_item_exceeds_batched_tokens", severity="error", source=SRC_CHUNKED_MM)
def mm_item_exceeds_batched_tokens(ctx: LaunchContext):
    """With ``--disable-chunked-mm-input`` a multimodal item is never split across steps, so its largest item (the
    image or video with the most features, by the checkpoint's processor limits) must fit max_num_batched_tokens;
    vLLM raises at engine start otherwise."""
    if not ctx.args.get("disable_chunked_mm_input", False):
        return []
    tower = vision_tower(ctx.facts)
    if tower is None:
        return []
    items, _ = max_items(tower, ctx.facts, ctx.max_model_len, ctx.request.model.preprocessor_config,
                         ctx.args.get("mm_processor_kwargs"))
    limits = _limits(ctx.args.get("limit_mm_per_prompt"), V1_DEFAULT_LIMIT)
    active = [it.tokens for m, it in items.items() if limits.get(m, V1_DEFAULT_LIMIT) > 0]
    if not active or max(active) <= ctx.max_num_batched_tokens:
        return []
    t, mnbt = max(active), ctx.max_num_batched_tokens
    return [error(
        "mm_item_exceeds_batched_tokens",
        f"Chunked MM input disabled but max_tokens_per_mm_item ({t}) is larger than max_num_batched_tokens ({mnbt}). "
        "Please increase max_num_batched_tokens.",
        remedy={"max_num_batched_tokens": t, "disable_chunked_mm_input": False},
        source=SRC_CHUNKED_MM, field="engine_args.max_num_batched_tokens", max_tokens_per_mm_item=t,
    )]
