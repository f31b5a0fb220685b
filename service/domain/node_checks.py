"""What a signed plan tells its node to check before vLLM starts (claim ``node_checks``): the hardware the plan was
validated for, what vLLM will request of each GPU's memory, the weights files the manifest recorded and what the
weights must be whatever way the manifest was registered (``weights_expected``: domain/weights_expect.py).

The agent compares these with what nvidia-smi and the weights directory show (service/agent/gpus.py, weights.py)
and refuses to start on a difference. Carried in the signed claims, so a node checks against what the service
judged, not against anything the network could change.
"""

from __future__ import annotations

from typing import Any

from .errors import DomainError
from .gpus import Gpu, catalogue, lookup


def check_facts(*, gpu: Gpu, gpu_count: int, gpus: list[dict[str, Any]] | None, kept: bool = False) -> None:
    """A node's hardware facts must agree with themselves (``PUT /v1/nodes/{name}/facts``): the per-GPU list, when
    there is one, has ``gpu_count`` entries with distinct indices, all of one model (Preflight validates a node as
    one GPU model: a mixed node is refused, not described by one of its GPUs), and that model is ``gpu`` (by
    catalogue id, or by name for a custom GPU). ``kept``: the list is the one stored before (the request left
    ``gpus`` out), and the message says how to replace or clear it. Raises DomainError naming the field."""
    if not gpus:
        return
    hint = (
        " (the stored per-GPU list, kept because the request left `gpus` out: send the GPUs as read, or "
        '`"gpus": null` to clear it)'
        if kept
        else ""
    )
    if len(gpus) != gpu_count:
        raise DomainError(
            "gpus", f"gpus lists {len(gpus)} GPU(s) but gpu_count is {gpu_count}{hint}", rule="facts_inconsistent"
        )
    seen: set[object] = set()
    first = str(gpus[0].get("name", ""))
    for i, g in enumerate(gpus):
        if g.get("index") in seen:
            raise DomainError(
                f"gpus.{i}.index", f"GPU index {g.get('index')} is listed twice{hint}", rule="facts_inconsistent"
            )
        seen.add(g.get("index"))
        name = str(g.get("name", ""))
        if name.strip().lower() != first.strip().lower():
            raise DomainError(
                f"gpus.{i}.name",
                f"the node mixes GPU models (gpus.0 is {first!r}, gpus.{i} is "
                f"{name!r}): Preflight validates a node as one GPU model; give each model its own "
                f"node{hint}",
                rule="facts_mixed_gpus",
            )
    known = lookup(first)
    same = (
        (known.id == gpu.id)
        if known is not None
        else (gpu.id == "custom" and gpu.name.strip().lower() == first.strip().lower())
    )
    if not same:
        raise DomainError(
            "gpus.0.name",
            f"nvidia-smi's name {first!r} is "
            f"{known.id if known is not None else 'not in the GPU catalogue'}, but gpu is {gpu.id}"
            f"{' (' + gpu.name + ')' if gpu.id == 'custom' else ''}{hint}",
            rule="facts_inconsistent",
        )


def hardware_claim(*, gpu_id: str, gpu: dict[str, Any], count: int, interconnect: str | None) -> dict[str, Any]:
    """The node's GPUs as the plan was validated for them: model (catalogue id, or ``custom`` with its name),
    memory per GPU as nvidia-smi reports it (bytes), how many, and the interconnect."""
    known = catalogue().get(gpu_id)
    # memory is compared at boot only when it is a figure nvidia-smi reports (a custom GPU's, or a catalogue entry
    # with one): a marketed size (A10G: 24 GiB sold, 23028 MiB reported) would be drift on every healthy node
    exact = known is None or known.memory_source.startswith("nvidia-smi")
    return {
        "gpu_id": gpu_id,
        "gpu_name": str(gpu.get("name") or gpu_id),
        "memory_bytes": int(gpu["memory_bytes"]),
        "memory_checked": exact,
        "compute_capability": gpu.get("compute_capability"),
        "count": int(count),
        "interconnect": interconnect,
    }


def memory_claim(
    *,
    effective: dict[str, Any],
    budget: dict[str, Any] | None,
    kv_cache_memory_bytes: int | None,
    gpus_used: int,
    gpus_per_node: int,
) -> dict[str, Any]:
    """What vLLM 0.33 will request of each GPU it uses (vllm/v1/worker/utils.py:716-772): the utilization it runs
    with (defaults applied), ``kv_cache_memory_bytes`` when set, the weights per GPU the budget counted, and how many
    of the node's GPUs the launch uses (the topology's GPUs per node: domain/topology.py ``local_world``)."""
    used = min(gpus_per_node, max(1, int(gpus_used)))
    return {
        "gpu_memory_utilization": float(effective.get("gpu_memory_utilization") or 0.92),
        "kv_cache_memory_bytes": int(kv_cache_memory_bytes) if kv_cache_memory_bytes is not None else None,
        "weights_bytes_per_gpu": int((budget or {}).get("weights_bytes_per_gpu") or 0),
        "gpus": used,
    }


def node_checks_claim(
    *,
    hardware: dict[str, Any],
    memory: dict[str, Any],
    weights: dict[str, Any] | None,
    weights_expected: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The claim: ``weights`` the manifest's files when it recorded them, ``weights_expected`` what every node must
    find whatever way the manifest was registered (domain/weights_expect.py)."""
    out: dict[str, Any] = {"hardware": hardware, "memory": memory}
    if weights:
        out["weights"] = weights
    if weights_expected is not None:
        out["weights_expected"] = weights_expected
    return out
