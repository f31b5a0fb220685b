"""The calibration loop: what Preflight predicted for the KV cache vs what vLLM printed at start-up, per plan and
node (the agent parses vLLM's log and sends the figures with its report)."""

from __future__ import annotations

import statistics
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..db.models import Calibration, Manifest, Node, Plan, iso

GIB = 1 << 30


def record(session: Session, *, plan: Plan, node: str, details: dict[str, Any]) -> Calibration | None:
    """Store predicted vs actual when the report carries ``vllm.kv_cache_tokens`` (and optionally
    ``vllm.available_kv_cache_gib``) and the plan has a budget. Returns the row, or None when nothing to compare."""
    if session.execute(
        select(Calibration.id).where(Calibration.plan_id == plan.id, Calibration.node_name == node)
    ).first():
        return None  # one comparison per plan and node (the "running" report; a later "failed" repeats it)
    printed = details.get("vllm")
    if not isinstance(printed, dict):
        printed = {}
    actual = printed.get("kv_cache_tokens")
    predicted = (plan.budget or {}).get("kv_cache_tokens")
    if not isinstance(actual, int) or isinstance(actual, bool) or actual <= 0 or not predicted:
        return None
    gib = printed.get("available_kv_cache_gib")
    node_row = session.execute(select(Node).where(Node.name == node)).scalar_one()
    manifest = session.get_one(Manifest, plan.manifest_id)
    row = Calibration(
        plan_id=plan.id,
        node_name=node,
        gpu_id=node_row.gpu_id,
        model=manifest.name,
        predicted_kv_tokens=int(predicted),
        actual_kv_tokens=actual,
        predicted_kv_bytes=(plan.budget or {}).get("kv_cache_bytes_per_gpu"),
        actual_kv_bytes=int(gib * GIB) if isinstance(gib, (int, float)) else None,
        relative_error=predicted / actual - 1,
    )
    session.add(row)
    session.flush()
    return row


def summary(session: Session, *, model: str | None = None, gpu: str | None = None, limit: int = 100) -> dict:
    """The error distribution of the estimate on the real fleet: count, median and p90 of |error|, the share within
    ±5 % and ±10 %, and the latest rows."""
    q = select(Calibration).order_by(Calibration.id.desc())
    if model:
        q = q.where(Calibration.model == model)
    if gpu:
        q = q.where(Calibration.gpu_id == gpu)
    rows = list(session.execute(q).scalars())
    errs = sorted(abs(r.relative_error) for r in rows)
    n = len(errs)
    return {
        "count": n,
        "median_abs_error": statistics.median(errs) if n else None,
        "p90_abs_error": errs[min(n - 1, int(0.9 * n))] if n else None,
        "within_5pct": sum(e <= 0.05 for e in errs) / n if n else None,
        "within_10pct": sum(e <= 0.10 for e in errs) / n if n else None,
        "items": [
            {
                "plan_id": r.plan_id,
                "node": r.node_name,
                "gpu": r.gpu_id,
                "model": r.model,
                "predicted_kv_tokens": r.predicted_kv_tokens,
                "actual_kv_tokens": r.actual_kv_tokens,
                "relative_error": round(r.relative_error, 4),
                "at": iso(r.created_at),
            }
            for r in rows[:limit]
        ],
    }
