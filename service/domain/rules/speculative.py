"""Speculative decoding: the checks vLLM's SpeculativeConfig makes between its own fields and against the rest of the
launch (vllm 0.33.0 vllm/config/speculative.py:600-631, 1226-1327, 1704-1723, 1849-1870, 1939-2034;
vllm/engine/arg_utils.py:2100-2139; vllm/config/vllm.py:1734-1741). Each check applies from the oldest release line
whose source was read and makes it (gating.at_least); options a release lacks are refused by ``flag_unsupported``."""

from __future__ import annotations

from typing import Any

from ..context import LaunchContext
from ..findings import Finding
from . import Emit, rule
from .gating import at_least, effective, lax_int, lax_number, lax_true, vllm_checks, vllm_message, whole

SRC_FLAGS = "vllm 0.33.0 vllm/engine/arg_utils.py:2108-2121 (same in 0.24.0 arg_utils.py:1706-1719)"
SRC_TOKENS = (
    "vllm 0.33.0 vllm/config/speculative.py:1226-1295, 1939-1973 (no model: since 0.11.2 speculative.py:267; "
    "0.8.5-0.10.2 by the target's model type, 0.10.2 config/__init__.py:2047-2065; tokens missing or <= 0: since "
    "0.8.5 config.py:2546; the lines per check: service/data/vllm/checks/check_lines.json)"
)
SRC_NGRAM = "vllm 0.33.0 vllm/config/speculative.py:1297-1327 (since 0.8.5 vllm/config.py:2320-2338)"
SRC_DRAFT_TP = (
    "vllm 0.33.0 vllm/config/speculative.py:1672-1677, 1849-1870, 1939-1944 (draft TP since 0.8.5 "
    "config.py:2505-2514; 'tensor_parallel_size' key since 0.15.1 speculative.py:641-645)"
)
SRC_SAMPLING = (
    "vllm 0.33.0 vllm/config/speculative.py:600-631, 1975-2034 (synthetic since 0.21.0, heterogeneous vocab since "
    "0.26.0, FLy 0.33)"
)
SRC_METHOD_OPTS = "vllm 0.33.0 vllm/config/speculative.py:1704-1723 (since 0.30.0 speculative.py:1555-1575)"
SRC_METRICS = "vllm 0.33.0 vllm/config/vllm.py:1734-1741 (since 0.30.0 config/vllm.py:1515-1521)"

NGRAM_METHODS = ("ngram", "ngram_gpu")
# methods whose proposer needs no draft checkpoint: no draft model config, no draft TP (speculative.py:1297-1392)
NO_DRAFT = ("ngram", "ngram_gpu", "suffix", "custom_class", "extract_hidden_states")
# methods that never fill a missing model from the target (speculative.py:1251-1295): a model must be named
NEEDS_MODEL = (None, "draft_model", "eagle", "eagle3")
# up to 0.10 a missing draft model is the target itself for these model types (whatever the method), else refused
# unless the method is ngram: the union over 0.8.5 config.py:2293-2300, 0.9.2 :2601-2611, 0.10.2
# config/__init__.py:2047-2060 (a type only some of those lines fill is never refused)
DRAFT_FROM_TARGET_TYPES = frozenset({"deepseek_v3", "mimo", "ernie4_5_moe", "qwen3_next"})
SPEC_FLAGS = (("spec_method", "method"), ("spec_model", "model"), ("spec_tokens", "num_speculative_tokens"))


def speculative_config(ctx: LaunchContext) -> dict[str, Any] | None:
    """``--speculative-config`` with ``--spec-method/--spec-model/--spec-tokens`` merged in and its keys' dashes
    read as underscores, as vLLM builds it (arg_utils.py:2108-2128); None without speculation, or when config.json
    is a speculators checkpoint (its ``speculators_config`` builds the config: transformers_utils/config.py:826-850)."""
    if "speculators_config" in (ctx.request.model.config or {}):
        return None
    raw = ctx.args.get("speculative_config")
    cfg = {str(k).replace("-", "_"): v for k, v in raw.items()} if isinstance(raw, dict) else None
    for name, key in SPEC_FLAGS:
        value = ctx.args.get(name)
        if value is not None:
            cfg = cfg if cfg is not None else {}
            cfg.setdefault(key, value)
    return cfg


def method_of(cfg: dict[str, Any]) -> str | None:
    """The method vLLM settles on before building a draft: ``ngram`` for the model "ngram", ``mtp`` for every
    ``*_mtp`` alias (speculative.py:1235-1250, 1297-1298); None when neither names one."""
    method, model = cfg.get("method"), cfg.get("model")
    if method is None and model in ("ngram", "[ngram]"):
        return "ngram"
    if not isinstance(method, str):
        return None
    if method == "[ngram]":
        return "ngram"
    return "mtp" if method.endswith("_mtp") else method


def _mtp_layers(ctx: LaunchContext) -> int:
    cfg = ctx.request.model.config or {}
    nested = cfg.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else cfg
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        n = whole(text.get(key)) or whole(cfg.get(key))
        if n and n > 0:
            return n
    return 0


@rule("spec_flag_conflict", severity="error", source=SRC_FLAGS, when=("speculative_config",))
def spec_flag_conflict(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--spec-method``, ``--spec-model`` and ``--spec-tokens`` may not repeat a key ``--speculative-config``
    already sets ("... are mutually exclusive")."""
    raw = ctx.args.get("speculative_config")
    if not isinstance(raw, dict):
        return []
    keys = {str(k).replace("-", "_") for k in raw}
    out = []
    for name, key in SPEC_FLAGS:
        if ctx.args.get(name) is not None and key in keys:
            flag = "--" + name.replace("_", "-")
            out.append(
                emit.error(
                    "spec_flag_conflict",
                    f"{flag} and --speculative-config['{key}'] are mutually exclusive",
                    remedy={"drop": [name]},
                    field=f"engine_args.{name}",
                )
            )
    return out


_NO_MODEL_CHECK = ("spec_tokens_without_model", "spec_tokens_without_model_by_type")


def _refuses_no_model(ctx: LaunchContext) -> bool:
    """The line refuses num_speculative_tokens without a draft model for a method in NEEDS_MODEL: from 0.11 always,
    0.8-0.10 unless the target's model type lends its own weights as the draft."""
    if vllm_checks(ctx, "spec_tokens_without_model"):
        return True
    if not vllm_checks(ctx, "spec_tokens_without_model_by_type"):
        return False
    text = (ctx.request.model.config or {}).get("text_config")
    types = {ctx.facts.model_type, text.get("model_type") if isinstance(text, dict) else None}
    return not types & DRAFT_FROM_TARGET_TYPES


@rule(
    "spec_model_missing",
    "spec_tokens_invalid",
    severity="error",
    source=SRC_TOKENS,
    when=("speculative_config", "spec_method", "spec_model", "spec_tokens"),
)
def spec_tokens(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``num_speculative_tokens`` without a draft ``model`` needs a method that brings its own proposer (ngram, mtp,
    suffix, …): with no method, ``draft_model``, ``eagle`` or ``eagle3`` vLLM refuses (from 0.11; 0.8-0.10 unless the
    target's model type lends itself as the draft). Without a model,
    ``num_speculative_tokens`` is required (from 0.8; suffix decoding excepted), and it must be above zero."""
    cfg = speculative_config(ctx)
    if cfg is None or not at_least(ctx, (0, 8)):
        return []
    method, model, tokens = method_of(cfg), cfg.get("model"), cfg.get("num_speculative_tokens")
    suggest = {"method": "mtp"} if _mtp_layers(ctx) else {"method": "ngram"}
    field = "engine_args.speculative_config"
    if model is None and tokens is not None and method in NEEDS_MODEL and _refuses_no_model(ctx):
        return [
            emit.error(
                "spec_model_missing",
                f"{vllm_message(ctx, _NO_MODEL_CHECK[0]) or vllm_message(ctx, _NO_MODEL_CHECK[1])} (speculative method "
                f"{method or 'draft_model (the default)'}; give speculative_config.model, or a method with its own "
                f"proposer such as {suggest['method']!r}.)",
                remedy={"speculative_config": {**cfg, **suggest}},
                field=field,
            )
        ]
    if model is None and tokens is None and method != "suffix":
        layers = _mtp_layers(ctx) if method == "mtp" else 0
        return [
            emit.error(
                "spec_tokens_invalid",
                "num_speculative_tokens must be provided with speculative model unless the draft model config "
                "contains an n_predict parameter.",
                remedy={"speculative_config": {**cfg, "num_speculative_tokens": layers or 1}},
                field=field,
            )
        ]
    n = lax_int(tokens)
    if n is not None and n <= 0:
        return [
            emit.error(
                "spec_tokens_invalid",
                f"Expected num_speculative_tokens to be greater than zero ({n}).",
                remedy={"speculative_config": {**cfg, "num_speculative_tokens": 1}},
                field=field,
            )
        ]
    return []


@rule(
    "spec_prompt_lookup",
    severity="error",
    source=SRC_NGRAM,
    when=("speculative_config", "spec_method", "spec_model", "spec_tokens"),
)
def spec_prompt_lookup(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """The n-gram proposer's window: ``prompt_lookup_min`` and ``prompt_lookup_max`` (one given stands for both,
    neither means 5) must be at least 1 and min ≤ max."""
    cfg = speculative_config(ctx)
    if cfg is None or method_of(cfg) not in NGRAM_METHODS or not at_least(ctx, (0, 8)):
        return []
    lo, hi = lax_int(cfg.get("prompt_lookup_min")), lax_int(cfg.get("prompt_lookup_max"))
    if (cfg.get("prompt_lookup_min") is not None and lo is None) or (
        cfg.get("prompt_lookup_max") is not None and hi is None
    ):
        return []  # not integers: pydantic's own type check says so
    lo = hi if lo is None else lo
    hi = lo if hi is None else hi
    if lo is None or hi is None:
        return []
    field = "engine_args.speculative_config"
    for name, value in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
        if value < 1:
            return [
                emit.error(
                    "spec_prompt_lookup",
                    f"{name}={value} must be > 0",
                    remedy={"speculative_config": {**cfg, name: 1}},
                    field=field,
                )
            ]
    if lo > hi:
        return [
            emit.error(
                "spec_prompt_lookup",
                f"prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}",
                remedy={"speculative_config": {**cfg, "prompt_lookup_min": hi}},
                field=field,
            )
        ]
    return []


def _builds_draft(cfg: dict[str, Any]) -> bool:
    """A draft model config is built (and its TP checked): a named draft checkpoint, or mtp taking the target's."""
    method, model = method_of(cfg), cfg.get("model")
    if method in NO_DRAFT:
        return False
    if isinstance(model, str):
        # a dotted name without '/' is a custom proposer class, not a checkpoint (speculative.py:1215-1240)
        return "/" in model or "." not in model
    return method == "mtp" and cfg.get("num_speculative_tokens") is not None


@rule(
    "spec_draft_tp",
    severity="error",
    source=SRC_DRAFT_TP,
    when=("speculative_config", "spec_method", "spec_model", "spec_tokens"),
)
def spec_draft_tp(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """A draft model runs at TP 1 or at the target's TP: ``draft_tensor_parallel_size`` must be one of the two.
    ``tensor_parallel_size`` is not a key of ``--speculative-config`` (from 0.15)."""
    cfg = speculative_config(ctx)
    if cfg is None or not at_least(ctx, (0, 8)):
        return []
    field = "engine_args.speculative_config"
    if cfg.get("tensor_parallel_size") is not None and at_least(ctx, (0, 15)):
        fixed = {k: v for k, v in cfg.items() if k != "tensor_parallel_size"}
        return [
            emit.error(
                "spec_draft_tp",
                "'tensor_parallel_size' is not a valid argument in the speculative_config. Please pass "
                "'draft_tensor_parallel_size' instead.",
                remedy={"speculative_config": {**fixed, "draft_tensor_parallel_size": cfg["tensor_parallel_size"]}},
                field=field,
            )
        ]
    draft_tp = lax_int(cfg.get("draft_tensor_parallel_size"))
    if draft_tp is None or draft_tp in (1, ctx.tp) or not _builds_draft(cfg):
        return []
    return [
        emit.error(
            "spec_draft_tp",
            f"speculative_draft_tensor_parallel_size={draft_tp} cannot be other value than 1 or target model "
            f"tensor_parallel_size (tensor_parallel_size={ctx.tp}).",
            remedy={"speculative_config": {**cfg, "draft_tensor_parallel_size": sorted({1, ctx.tp})}},
            field=field,
        )
    ]


def _without(cfg: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in cfg.items() if k not in keys}


def _rates_problem(rates: list[Any], n: int, cfg: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """Per-position rates: ``n`` of them, each in [0, 1], non-increasing (speculative.py:612-626)."""
    shown = rates if len(rates) <= 16 else [*rates[:16], "…"]  # vLLM prints them all; a message stays short
    values = [lax_number(r) for r in rates]
    if len(values) != n:
        return f"synthetic_acceptance_rates must have length {n}, got {shown}.", {
            **cfg,
            "synthetic_acceptance_rates": [1.0] * n,
        }
    known = [v for v in values if v is not None]
    if len(known) != n:
        return None  # not numbers: pydantic's own type check says so
    if not all(0.0 <= v <= 1.0 for v in known):
        clamped = [min(max(v, 0.0), 1.0) for v in known]
        return f"synthetic_acceptance_rates entries must be in [0, 1], got {shown}.", {
            **cfg,
            "synthetic_acceptance_rates": clamped,
        }
    if any(known[i] > known[i - 1] for i in range(1, n)):
        return f"synthetic_acceptance_rates must be non-increasing, got {shown}.", {
            **cfg,
            "synthetic_acceptance_rates": sorted(known, reverse=True),
        }
    return None


def _synthetic_problem(cfg: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """vLLM's message and a config that passes, for synthetic rejection sampling (speculative.py:600-631,
    1975-1990): rates or a mean length only with ``rejection_sample_method: synthetic``, and then exactly one."""
    rates, length = cfg.get("synthetic_acceptance_rates"), cfg.get("synthetic_acceptance_length")
    if cfg.get("rejection_sample_method") != "synthetic":
        if rates is None and length is None:
            return None
        return (
            "synthetic_acceptance_rates / synthetic_acceptance_length are only valid with "
            "rejection_sample_method='synthetic'.",
            _without(cfg, "synthetic_acceptance_rates", "synthetic_acceptance_length"),
        )
    if (rates is None) == (length is None):
        return (
            "rejection_sample_method='synthetic' requires exactly one of synthetic_acceptance_rates or "
            "synthetic_acceptance_length.",
            {**_without(cfg, "synthetic_acceptance_rates"), "synthetic_acceptance_length": 1.0},
        )
    n = lax_int(cfg.get("num_speculative_tokens"))
    if n is None or n <= 0:
        return None  # the count comes from the draft's n_predict, or is refused by spec_tokens
    if isinstance(rates, list):
        return _rates_problem(rates, n, cfg)  # the option's JSON is at most 64 KiB
    value = lax_number(length)
    if value is not None and not 1.0 <= value <= n + 1:
        return (
            f"synthetic_acceptance_length must be in [1, {n + 1}], got {length}.",
            {**cfg, "synthetic_acceptance_length": min(max(value, 1.0), float(n + 1))},
        )
    return None


def _fly_problem(cfg: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """FLy verification needs two or more speculative tokens and a window below their count (0.33
    speculative.py:2016-2034)."""
    n = lax_int(cfg.get("num_speculative_tokens"))
    if cfg.get("rejection_sample_method") != "fly" or n is None:
        return None
    if method_of(cfg) == "extract_hidden_states":
        return (
            "FLy is not compatible with method='extract_hidden_states', which does not perform speculative decoding.",
            {**cfg, "rejection_sample_method": "standard"},
        )
    if n < 2:
        return "FLy requires num_speculative_tokens to be at least 2.", {**cfg, "num_speculative_tokens": 2}
    window = lax_int(cfg.get("fly_window_size"))
    if window is not None and window >= n:
        return (
            "FLy requires fly_window_size to be smaller than num_speculative_tokens.",
            {**cfg, "fly_window_size": n - 1},
        )
    return None


def _vocab_problem(cfg: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """A heterogeneous draft vocabulary: only the draft_model method, greedy draft sampling and full draft logits
    (speculative.py:1995-2013). Only an explicitly named other method is judged: vLLM may detect eagle from the
    draft's name, which Preflight cannot see."""
    if not lax_true(cfg.get("use_heterogeneous_vocab")):
        return None
    method = method_of(cfg)
    if method is not None and method != "draft_model":
        return (
            "use_heterogeneous_vocab only works with method='draft_model'",
            _without(cfg, "use_heterogeneous_vocab"),
        )
    if cfg.get("draft_sample_method", "greedy") != "greedy":
        return (
            "use_heterogeneous_vocab currently only supports greedy draft sampling. Set "
            "draft_sample_method='greedy' (the default) or omit it.",
            {**cfg, "draft_sample_method": "greedy"},
        )
    if lax_true(cfg.get("use_local_argmax_reduction")):
        return (
            "use_heterogeneous_vocab is not compatible with use_local_argmax_reduction because token-level "
            "intersection requires the full draft logits.",
            {**cfg, "use_local_argmax_reduction": False},
        )
    return None


@rule(
    "spec_sampling",
    severity="error",
    source=SRC_SAMPLING,
    when=("speculative_config", "spec_method", "spec_model", "spec_tokens"),
)
def spec_sampling(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Rejection-sampling and drafting options that constrain each other: synthetic acceptance rates (from 0.21),
    a heterogeneous draft vocabulary (from 0.26), FLy verification (0.33)."""
    cfg = speculative_config(ctx)
    if cfg is None:
        return []
    checks = ((0, 21), _synthetic_problem), ((0, 26), _vocab_problem), ((0, 33), _fly_problem)
    for line, check in checks:
        found = check(cfg) if at_least(ctx, line) else None
        if found:
            message, fixed = found
            return [
                emit.error(
                    "spec_sampling",
                    message,
                    remedy={"speculative_config": fixed},
                    field="engine_args.speculative_config",
                )
            ]
    return []


@rule(
    "spec_method_option",
    severity="error",
    source=SRC_METHOD_OPTS,
    when=("speculative_config", "spec_method", "spec_model", "spec_tokens"),
)
def spec_method_option(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """Options that belong to one method (from 0.30): ``index_share_for_mtp_iteration`` only with mtp, and adaptive
    verification (outside dspark) never with ``use_local_argmax_reduction``."""
    cfg = speculative_config(ctx)
    if cfg is None or not at_least(ctx, (0, 30)):
        return []
    method = method_of(cfg)
    field = "engine_args.speculative_config"
    # with a draft model and no method vLLM detects the method from the draft's config (mtp among them): not judged
    detected = method is None and cfg.get("model") is not None
    if cfg.get("index_share_for_mtp_iteration") is not None and method != "mtp" and not detected:
        return [
            emit.error(
                "spec_method_option",
                f"index_share_for_mtp_iteration is only supported with method='mtp' (method is "
                f"{(method or 'draft_model')[:64]!r}).",
                remedy={"speculative_config": _without(cfg, "index_share_for_mtp_iteration")},
                field=field,
            )
        ]
    if (
        method != "dspark"
        and lax_true(cfg.get("enable_adaptive_verification"))
        and lax_true(cfg.get("use_local_argmax_reduction"))
    ):
        return [
            emit.error(
                "spec_method_option",
                "Adaptive verification estimates per-position acceptance from the draft logits, which "
                "use_local_argmax_reduction never materializes. Disable one of them.",
                remedy={"speculative_config": {**cfg, "use_local_argmax_reduction": False}},
                field=field,
            )
        ]
    return []


@rule("spec_metrics_without_spec", severity="error", source=SRC_METRICS)
def spec_metrics_without_spec(ctx: LaunchContext, emit: Emit) -> list[Finding]:
    """``--per-request-spec-decode-metrics summary|detailed`` needs speculative decoding (from 0.30)."""
    value = effective(ctx, "per_request_spec_decode_metrics")
    if value in (None, "none") or not at_least(ctx, (0, 30)) or speculative_config(ctx) is not None:
        return []
    if "speculators_config" in (ctx.request.model.config or {}):
        return []  # a speculators checkpoint brings its own speculative config
    return [
        emit.error(
            "spec_metrics_without_spec",
            "--per-request-spec-decode-metrics requires speculative decoding to be enabled (via --speculative-config).",
            remedy={"per_request_spec_decode_metrics": "none"},
            field="engine_args.per_request_spec_decode_metrics",
        )
    ]
