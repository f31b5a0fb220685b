"""Context-length rules: ``max_model_len`` against the maximum vLLM derives from config.json
(vllm 0.33.0 vllm/config/model.py:2579-2683; model_arch_config_convertor.py:374-407)."""

from __future__ import annotations

from ..context import LaunchContext
from ..findings import Finding
from . import Emit, rule

SRC = "vllm 0.33.0 vllm/config/model.py:2657-2683; model_arch_config_convertor.py:374-407"
ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"


def _env_true(ctx: LaunchContext, name: str) -> bool:
    return str(ctx.request.env.get(name, "")).strip().lower() in ("1", "true")


@rule("max_len_vs_positions", severity="error", source=SRC)
def max_len_vs_positions(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``max_model_len`` must not exceed the derived maximum (smallest length key, ``model_max_length`` override,
    rope scaling only for scaling types; YaRN no longer rescales since PR #56446) unless
    ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1`` is set (then a warning). A value ≤ ``model_max_length`` is tolerated; a
    config.json without any length key takes the user's value unchecked.
    """
    f = ctx.facts
    if "max_model_len" not in ctx.args.given or ctx.max_model_len_auto:
        return []
    mml, derived = ctx.max_model_len, f.derived_max_model_len
    if f.max_len_key == "default":
        return []  # no length key in config.json: vLLM uses the user's value as-is (model.py:2579-2596)
    if mml <= derived or (f.model_max_length and mml <= f.model_max_length):
        return []
    msg = (
        f"User-specified max_model_len ({mml}) is greater than the derived max_model_len "
        f"({f.max_len_key}={derived} or model_max_length={f.model_max_length} in model's config.json)."
    )
    if f.rope_type == "yarn" and f.rope_factor:
        msg += (
            f" The config declares YaRN (factor {f.rope_factor}); since vLLM PR #56446 YaRN no longer extends the "
            f"derived length: set --hf-overrides '{{\"max_position_embeddings\": {mml}}}' if the model was "
            f"trained for it."
        )
    remedy = {"max_model_len": derived, "env": {ENV: "1"}}
    if _env_true(ctx, ENV):
        return [
            emit.warning(
                "max_len_vs_positions",
                msg + f" {ENV}=1 is set: positions beyond {derived} may give NaN "
                "(RoPE) or out-of-bounds errors (absolute positions).",
                remedy=remedy,
                field="engine_args.max_model_len",
            )
        ]
    return [
        emit.error(
            "max_len_vs_positions",
            msg + f" To allow overriding this maximum, set the env var {ENV}=1.",
            remedy=remedy,
            field="engine_args.max_model_len",
            derived_max_model_len=derived,
        )
    ]
