"""Nearest launches that pass: for a rejected request, small changes to ``engine_args`` that vLLM 0.33 would
accept, each confirmed by re-running the validator.

Candidates, nearest first: the machine-readable ``remedy`` of each error finding (e.g. the valid TP sizes, ``dtype
float16``, ``--allow-deprecated-quantization``), then generic moves (other valid TP sizes, expert parallel for MoE
models, float16, dropping flags the version no longer accepts). Where one change is not enough, a second change is
tried on top of the nearest single ones (remedies of the errors that remain). A patch maps engine-argument names to
new values; ``None`` means "remove this argument".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .engine_args import resolve_name
from .errors import DomainError
from .findings import Severity
from .request import LaunchRequest
from .versions import Option, VersionLine

if TYPE_CHECKING:  # validate imports this module
    from .policy_profile import Profile
    from .validate import ValidationResult

MAX_RESULTS = 3
MAX_VALIDATIONS = 80
# remedy keys that are not engine arguments (hardware, checkpoint, plugin, env advice)
NON_ARG_KEYS = {"env", "min_compute_capability", "plugin", "max_gpus", "vllm_version", "checkpoint", "drop"}


def _apply(args: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(args)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def _by_dest(args: dict[str, Any], line: VersionLine) -> dict[str, Any]:
    """``engine_args`` keyed by dest (``-tp`` or an abbreviation such as ``tensor-parallel`` included), so that a
    patch replaces the request's own spelling instead of adding a second one (refused as given twice)."""
    return {resolve_name(k, line): v for k, v in args.items()}


def _rank(current: Any, value: Any) -> tuple[Any, ...]:
    if isinstance(current, (int, float)) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return (abs(value - current), -value)
    return (0, 0)


def _remedy_patches(result: ValidationResult, flags: dict[str, Option]) -> list[dict[str, Any]]:
    """Single-change patches from the error findings' remedies, nearest values first."""
    ctx = result.context
    current = _by_dest(ctx.request.engine_args, ctx.line) if ctx is not None else {}
    out: list[dict[str, Any]] = []
    for f in result.findings:
        if f.severity is not Severity.ERROR or not f.remedy:
            continue
        for key, value in f.remedy.items():
            if key == "drop" and isinstance(value, list):
                out.append({k: None for k in value})
                continue
            if key in NON_ARG_KEYS or key not in flags or value is None:
                continue
            if isinstance(value, list):
                cur = current.get(key, 1 if key.endswith("_size") else None)
                for v in sorted((v for v in value if v != cur), key=lambda v: _rank(cur, v)):
                    out.append({key: v})
            elif value != current.get(key):
                out.append({key: value})
    return out


def _generic_patches(result: ValidationResult) -> list[dict[str, Any]]:
    ctx = result.context
    if ctx is None:
        return []
    out: list[dict[str, Any]] = []
    from .rules.parallel import valid_tp_sizes

    tp = ctx.tp
    for t in sorted((t for t in valid_tp_sizes(ctx) if t != tp), key=lambda t: (abs(t - tp), -t)):
        out.append({"tensor_parallel_size": t})
    if ctx.facts.is_moe and not ctx.args.enable_expert_parallel:
        out.append({"enable_expert_parallel": True})
    if ctx.dtype != "float16":
        out.append({"dtype": "float16"})
    removed = [k for k in ctx.args.unsupported if k in ctx.line.removed]
    bools = list(ctx.args.bool_with_value) + list(ctx.args.bad_keys)
    if removed or bools:
        out.append({k: None for k in removed + bools})
    return out


def _unique(patches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen, out = set(), []
    for p in patches:
        key = tuple(sorted((k, repr(v)) for k, v in p.items()))
        if key not in seen and p:
            seen.add(key)
            out.append(p)
    return out


def nearest_alternatives(
    request: LaunchRequest, result: ValidationResult, *, policy: Profile | None = None
) -> list[dict[str, Any]]:
    """Up to three ``engine_args`` patches, nearest first, whose launch is not rejected (verdict accept or warn).

    ``result`` is the ValidationResult of ``request``; an accepted or warned request gets ``[]``. Each candidate is
    re-validated under the same policy profile; patches that raise DomainError (e.g. a value out of range) are
    skipped.
    """
    from .validate import validate

    if result.verdict != "reject" or result.context is None:
        return []
    flags = result.context.line.flags
    base_args = _by_dest(request.engine_args, result.context.line)
    budget = [MAX_VALIDATIONS]

    def run(patch: dict[str, Any]) -> ValidationResult | None:
        if budget[0] <= 0:
            return None
        budget[0] -= 1
        req = request.model_copy(update={"engine_args": _apply(base_args, patch)})
        try:
            return validate(req, alternatives=False, policy=policy)
        except DomainError:
            return None

    singles = _unique(_remedy_patches(result, flags) + _generic_patches(result))
    found: list[dict[str, Any]] = []
    partial: list[tuple[int, dict[str, Any], ValidationResult]] = []
    errors_before = len(result.errors)
    rules_before = {f.rule for f in result.errors}
    for patch in singles:
        if len(found) >= MAX_RESULTS:
            return found
        r = run(patch)
        if r is None:
            continue
        if r.verdict != "reject":
            found.append(patch)
        elif len(r.errors) < errors_before or (
            len(r.errors) == errors_before and {f.rule for f in r.errors} != rules_before
        ):
            partial.append((len(r.errors), patch, r))
    # two changes: the nearest partial fixes, completed with the remedies of what is left
    partial.sort(key=lambda x: x[0])
    for _, first, r in partial[:4]:
        for second in _unique(_remedy_patches(r, flags) + _generic_patches(r)):
            if len(found) >= MAX_RESULTS:
                return found
            if set(second) & set(first):
                continue
            patch = {**first, **second}
            if patch in found:
                continue
            r2 = run(patch)
            if r2 is not None and r2.verdict != "reject":
                found.append(patch)
    return found[:MAX_RESULTS]
