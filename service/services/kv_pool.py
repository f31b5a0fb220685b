"""A pinned KV pool: once a node has reported what vLLM printed for a launch, a new plan for the
same launch can fix the pool with ``--kv-cache-memory-bytes N`` (vLLM 0.33: profiling-based sizing skipped,
gpu_memory_utilization ignored; vllm 0.33.0 vllm/v1/worker/gpu_worker.py:656-681), so every replica gets the same
pool whatever else holds memory on its GPU.

The plan body's ``kv_cache_pool`` chooses: ``utilization`` (default: vLLM sizes the pool from gpu_memory_utilization)
or ``pinned``. The pinned value is the measured one, in this order:

1. vLLM's own suggestion (the agent's ``vllm.kv_cache_memory_bytes_suggested``): in 0.33 the pool "to fit into
   requested memory" — requested memory minus weights, non-torch, activation peak, CUDA graphs and a 150 MiB buffer
   (gpu_worker.py:1012-1066);
2. else the pool it printed, ``Available KV cache memory: X GiB`` (two decimals: within 5 MiB).

"The same launch" is a plan of the same manifest and vLLM version whose engine arguments equal this body's apart
from the pool's own (``gpu_memory_utilization``, ``kv_cache_memory_bytes``), reported ``running`` by one of this
plan's nodes (their GPUs are the same model: plans.launch_request). Several nodes: the smallest of their latest
figures, so the pool fits every one. Nothing reported yet: 422 ``kv_pool_not_measured``.
"""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..api.schemas import LaunchTarget
from ..db.models import Manifest, Node, Plan, Report
from ..domain.engine_args import dest_of
from ..domain.versions import resolve_version
from ..errors import Invalid

GIB = 1 << 30
POOL_KEYS = ("gpu_memory_utilization", "kv_cache_memory_bytes")
MAX_POOL_BYTES = 1 << 50
SCAN_LIMIT = 1000  # the most recent running reports looked at per request (bounded work)
T = TypeVar("T", bound=LaunchTarget)


def _launch_key(engine_args: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (engine_args or {}).items() if k not in POOL_KEYS}


def measured_pool(details: dict[str, Any] | None) -> tuple[int, str] | None:
    """The pool bytes a ``running`` report's ``details.vllm`` gives, and where the figure came from."""
    vllm = (details or {}).get("vllm")
    if not isinstance(vllm, dict):
        return None
    hint = vllm.get("kv_cache_memory_bytes_suggested")
    if isinstance(hint, int) and not isinstance(hint, bool) and 0 < hint <= MAX_POOL_BYTES:
        return hint, "vLLM's --kv-cache-memory-bytes suggestion"
    gib = vllm.get("available_kv_cache_gib")
    if isinstance(gib, (int, float)) and not isinstance(gib, bool) and 0 < gib * GIB <= MAX_POOL_BYTES:
        return int(gib * GIB), "vLLM's printed 'Available KV cache memory'"
    return None


def apply(session: Session, manifest: Manifest, nodes: list[Node], target: T) -> T:
    """The target with ``engine_args.kv_cache_memory_bytes`` set when ``kv_cache_pool`` is ``pinned``."""
    if target.kv_cache_pool != "pinned":
        return target
    line = resolve_version(target.vllm_version)[1]
    if any(dest_of(k, line) == "kv_cache_memory_bytes" for k in target.engine_args):
        raise Invalid(
            "kv_cache_pool pinned takes the pool nodes reported: leave engine_args.kv_cache_memory_bytes "
            "out (or use kv_cache_pool utilization with your own value)",
            field="kv_cache_pool",
            errors=[
                {
                    "field": "engine_args.kv_cache_memory_bytes",
                    "rule": "kv_pool_conflict",
                    "message": "kv_cache_memory_bytes given with kv_cache_pool pinned",
                }
            ],
        )
    wanted = _launch_key(target.engine_args)
    names = [n.name for n in nodes]
    # a figure a node reports is believed only below its GPU's memory: one node cannot pin an impossible pool
    ceiling = min(int(n.gpu["memory_bytes"]) for n in nodes)
    rows = session.execute(
        select(Report.node_name, Report.details, Plan.request, Plan.vllm_version)
        .join(Plan, Plan.id == Report.plan_id)
        .where(Plan.manifest_id == manifest.id, Report.status == "running", Report.node_name.in_(names))
        .order_by(Report.id.desc())
        .limit(SCAN_LIMIT)
    ).all()
    latest: dict[str, tuple[int, str]] = {}
    target_version = resolve_version(target.vllm_version)[0]
    for node, details, request, version in rows:
        if node in latest or version != target_version or _launch_key((request or {}).get("engine_args")) != wanted:
            continue
        m = measured_pool(details)
        if m and m[0] < ceiling:
            latest[node] = m
    if not latest:
        raise Invalid(
            f"kv_cache_pool pinned: no node of this plan ({', '.join(names)}) has reported the KV pool vLLM printed "
            f"for {manifest.name}@{manifest.version} with these engine arguments; run it once with "
            "kv_cache_pool utilization first",
            field="kv_cache_pool",
            errors=[
                {
                    "field": "kv_cache_pool",
                    "rule": "kv_pool_not_measured",
                    "message": "no reported KV pool for this manifest and launch on these nodes",
                }
            ],
        )
    pool, _source = min(latest.values())
    return target.model_copy(update={"engine_args": {**target.engine_args, "kv_cache_memory_bytes": pool}})
