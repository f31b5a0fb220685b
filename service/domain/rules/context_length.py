"""Context-length rules: ``max_model_len`` against the maximum the target release derives from config.json, and the
rope scaling a release cannot read (service/domain/max_len.py: the derivation of each release, with its sources)."""

from __future__ import annotations

from ..context import LaunchContext
from ..findings import Finding
from . import Emit, rule

SRC = (
    "vllm 0.33.0 vllm/config/model.py:2545-2683, model_arch_config_convertor.py:374-407; "
    "0.28.0 vllm/config/model.py:2383-2413; 0.10.2 vllm/config/__init__.py:2797-2945; 0.8.5 vllm/config.py:2977-3110; "
    "0.7.3 vllm/config.py:2453-2580, envs.py:445-448 (each line's site: service/domain/max_len.py SITES)"
)
ROPE_SRC = (
    "vllm 0.8.5 vllm/config.py:403-407, 455-457, 3054 (overrides set after patch_rope_scaling; rope_scaling['rope_type']"
    "); 0.13.0 vllm/transformers_utils/config.py:306-376, vllm/config/model.py:438-474, 2129-2137; "
    "vllm-project/vllm#10293"
)
ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"


def _env_true(ctx: LaunchContext, name: str) -> bool:
    return str(ctx.request.env.get(name, "")).strip().lower() in ("1", "true")


def _hints(ctx: LaunchContext, mml: int) -> str:
    """Why the derived length is what it is, for the cases that surprise: a rope factor applied (how), YaRN that no
    longer extends it (0.30+), an overridden rope key the release does not read."""
    ml = ctx.facts.max_len
    if ml is None:
        return ""
    out = f" {ml.how()}" if ml.how() else ""
    if ml.rope_type == "yarn" and ml.factor is None and not ml.yarn_scales:
        out += (
            f" The config declares YaRN (factor {ml.rope_factor:g}); from vLLM 0.30 (PR #56446) YaRN no longer "
            f"extends the derived length: set --hf-overrides '{{\"max_position_embeddings\": {mml}}}' if the model "
            f"was trained for it."
            if ml.rope_factor
            else ""
        )
    for key in ml.ignored:
        other = "rope_parameters" if key == "rope_scaling" else "rope_scaling"
        out += (
            f" vLLM {ctx.line.newest} does not derive the length from the overridden {key}: it reads {other} "
            f"({ml.site}); override {other} instead."
        )
    return out


@rule("max_len_vs_positions", severity="error", source=SRC, when=("max_model_len",))
def max_len_vs_positions(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``max_model_len`` must not exceed the maximum the target release derives (smallest length key, then
    ``model_max_length`` from 0.8, then the rope factor of a scaling rope type — YaRN from its
    ``original_max_position_embeddings`` up to 0.29, not at all from 0.30; ``--rope-scaling`` / ``--hf-overrides``
    applied where the release applies them) unless ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1`` is set (then a warning). A
    value ≤ ``model_max_length`` is tolerated; a config.json without any length key takes the user's value unchecked.
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
        + _hints(ctx, mml)
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


@rule("rope_scaling_unreadable", severity="error", source=ROPE_SRC)
def rope_scaling_unreadable(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """The rope dict the target release reads must be one it can read: ``rope_type`` present where the release reads
    it unnormalised (an ``--hf-overrides`` / ``--rope-scaling`` object is set after the loader turned ``type`` into
    ``rope_type``, up to 0.9 and from 0.11; a config.json dict without either key before Transformers 5), and YaRN
    with ``original_max_position_embeddings`` where the release starts the length from it (up to 0.29). Otherwise
    vLLM fails at start-up with KeyError / ValueError."""
    ml = ctx.facts.max_len
    if ml is None or not ml.problems:
        return []
    field, remedy = ml.rope_field, None
    if ml.rope_as_given:
        option = "rope_scaling" if "rope_scaling" in ctx.args.given and "rope_scaling" in ctx.line.options else None
        field = f"engine_args.{option or 'hf_overrides'}"
        given = ctx.args.values.get(option or "hf_overrides")
        given = given if option else (given or {}).get(ml.rope_key)
        if isinstance(given, dict) and "rope_type" not in given and isinstance(given.get("type"), str):
            fixed = {"rope_type": given["type"], **{k: v for k, v in given.items() if k != "type"}}
            remedy = {option: fixed} if option else {"hf_overrides": {ml.rope_key: fixed}}
    tail = {
        True: ". Give original_max_position_embeddings (the length the model was pretrained with).",
        False: '. Give "rope_type" (not only the legacy "type").',
    }
    return [
        emit.error(
            "rope_scaling_unreadable",
            problem + tail["without original_max_position_embeddings" in problem],
            remedy=remedy,
            field=field,
        )
        for problem in ml.problems
    ]
