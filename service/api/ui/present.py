"""Presentation helpers for the pages (pure: typed values in, values for a template out): the per-GPU memory bar,
the tuning loop's small charts, and the Jinja2 filters for times, counts and JSON."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from ...domain.text import escape_invisible

GIB = 1024**3
SEGMENTS = (  # (budget key, label, css class) in the order vLLM spends the GPU's memory
    ("weights_bytes_per_gpu", "Weights", "seg-weights"),
    ("activation_peak_bytes", "Activation peak", "seg-activation"),
    ("cuda_graph_bytes", "CUDA graphs", "seg-graphs"),
    ("non_torch_bytes", "Non-torch", "seg-nontorch"),
    ("kv_cache_bytes_per_gpu", "KV cache", "seg-kv"),
)
CHART_SERIES = (
    ("max_num_seqs", "max_num_seqs"),
    ("num_requests_waiting", "waiting"),
    ("num_preemptions", "preemptions"),
    ("e2e_p99_s", "P99 e2e (s)"),
)


def memory_bar(budget: dict[str, Any] | None) -> dict[str, Any] | None:
    """The per-GPU memory bar of a plan's budget: each claimant's bytes, GiB and share of the GPU's memory, and the
    headroom left (what ``gpu_memory_utilization`` keeps free plus anything unclaimed). None without a budget."""
    if not budget or not budget.get("gpu_memory_bytes"):
        return None
    total = int(budget["gpu_memory_bytes"])
    segs: list[dict[str, Any]] = []
    used = 0
    for key, label, css in SEGMENTS:
        value = max(0, int(budget.get(key) or 0))
        used += value
        segs.append({"key": key, "label": label, "css": css, "bytes": value})
    segs.append({"key": "headroom", "label": "Headroom", "css": "seg-headroom", "bytes": max(0, total - used)})
    scale = max(total, used)
    x = 0.0
    for s in segs:
        s["gib"] = round(s["bytes"] / GIB, 2)
        s["pct"] = round(100 * s["bytes"] / scale, 2)
        s["x"] = round(x, 2)
        x += s["pct"]
    return {
        "segments": segs,
        "total_gib": round(total / GIB, 2),
        "over": used > total,
        "utilization": budget.get("gpu_memory_utilization"),
        "max_model_len": budget.get("max_model_len"),
        "max_concurrency": budget.get("max_concurrency"),
        "kv_cache_tokens": budget.get("kv_cache_tokens"),
        "max_num_seqs_bound": budget.get("max_num_seqs_bound"),
        "log_line": budget.get("log_line"),
    }


def tuning_charts(windows: list[dict[str, Any]], width: int = 320, height: int = 36) -> list[dict[str, Any]]:
    """One small line chart per series of the tuning loop's windows, as SVG polyline points scaled to the series'
    own maximum, with the first, last and largest value for the text beside it."""
    out = []
    n = len(windows)
    for key, label in CHART_SERIES:
        vals = [w.get(key) for w in windows]
        nums = [float(v) for v in vals if isinstance(v, (int, float))]
        top = max(nums) if nums else 0.0
        pts = []
        for i, v in enumerate(vals):
            if not isinstance(v, (int, float)):
                continue
            x = width * i / max(1, n - 1)
            y = height - (height - 2) * (float(v) / top if top > 0 else 0.0) - 1
            pts.append(f"{x:.1f},{y:.1f}")
        out.append(
            {
                "key": key,
                "label": label,
                "points": " ".join(pts),
                "width": width,
                "height": height,
                "first": nums[0] if nums else None,
                "last": nums[-1] if nums else None,
                "max": top if nums else None,
            }
        )
    return out


def short_time(value: str | None) -> str:
    if not value:
        return "—"
    try:
        t = dt.datetime.fromisoformat(value)
    except ValueError:
        return value
    return t.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(value: str | None, now: dt.datetime | None = None) -> str:
    if not value:
        return "never"
    t = dt.datetime.fromisoformat(value)
    seconds = int(((now or dt.datetime.now(dt.UTC)) - t).total_seconds())
    if seconds < 0:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


def thousands(value: Any) -> str:
    return (
        f"{value:,}"
        if isinstance(value, int) and not isinstance(value, bool)
        else ("—" if value is None else str(value))
    )


def pretty_json(value: Any) -> str:
    """JSON for reading: ×, é and 中 as themselves; invisible, format and bidi characters escaped (text.py)."""
    return escape_invisible(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False), keep="\n")
