"""Quantized variants: when a launch does not fit its nodes, the registered manifests of the same model (same
architecture and geometry) in a quantized format that would fit them, each judged as the plan would be."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..api.schemas import LaunchTarget
from ..db.models import Manifest, Node
from ..domain.engine_args import dest_of
from ..domain.errors import DomainError
from ..domain.policy_profile import Profile
from ..domain.validate import validate
from ..domain.versions import resolve_version
from ..errors import ApiError
from .plan_layout import launch_request

FIT_RULES = ("weights_fit", "kv_pool_empty", "kv_cache_fits_max_len")  # the rejections more memory would cure
GEOMETRY = (
    "architectures",
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)
SCANNED = 500  # newest manifests looked at
QUANT_ARGS = ("quantization", "q", "dtype", "kv_cache_dtype")  # the variant's own format decides these


def geometry(config: dict[str, Any]) -> tuple:
    inner = config.get("text_config")
    if not isinstance(inner, dict):
        inner = {}
    return tuple(repr(config.get(k, inner.get(k))) for k in GEOMETRY)


def quantization_of(m: Manifest) -> str | None:
    """The manifest's quantization (its quantization.txt tag, else the config's ``quant_method``), None if unquantized."""
    for line in (m.quantization_txt or "").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            return None if line.lower() == "none" else line.lower()
    qc = m.config.get("quantization_config") if isinstance(m.config, dict) else None
    if isinstance(qc, dict) and qc.get("quant_method"):
        return str(qc["quant_method"]).lower()
    if m.hf_quant_config:
        return "modelopt"
    return None


def needs_memory(findings: list[dict[str, Any]]) -> bool:
    return any(f.get("rule") in FIT_RULES and f.get("severity") == "error" for f in findings)


def fitting_variants(
    session: Session,
    manifest: Manifest,
    nodes: list[Node],
    target: LaunchTarget,
    limit: int = 5,
    *,
    policy: Profile | None = None,
) -> list[dict[str, Any]]:
    """Up to ``limit`` quantized manifests of ``manifest``'s model (newest version per name) that these nodes would
    run with the target's engine args (quantization and dtype left to the variant): ``{"manifest", "quantization",
    "verdict", "kv_cache_tokens"}``. Bounded: the newest ``SCANNED`` manifests, judged only on a geometry match."""
    want = geometry(manifest.config)
    out: list[dict[str, Any]] = []
    seen: set[str] = {manifest.name}
    try:
        line = resolve_version(target.vllm_version)[1]
    except DomainError:
        return []  # the launch itself reports the version
    args = {k: v for k, v in target.engine_args.items() if dest_of(k, line) not in QUANT_ARGS}
    for m in session.execute(select(Manifest).order_by(Manifest.id.desc()).limit(SCANNED)).scalars():
        if m.name in seen:
            continue
        seen.add(m.name)
        tag = quantization_of(m)
        if tag is None or geometry(m.config) != want:
            continue
        try:
            result = validate(
                launch_request(m, nodes, target.model_copy(update={"engine_args": args})),
                model_ref=m.uri,
                alternatives=False,
                policy=policy,
            )
        except (DomainError, ApiError):
            continue
        if result.verdict != "reject":
            out.append(
                {
                    "manifest": f"{m.name}@{m.version}",
                    "quantization": tag,
                    "verdict": result.verdict,
                    "kv_cache_tokens": (result.budget or {}).get("kv_cache_tokens"),
                }
            )
            if len(out) >= limit:
                break
    return out
