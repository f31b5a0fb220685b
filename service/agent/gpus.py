"""What the node's GPUs are and hold, read from nvidia-smi, and the two boot checks made with it: inventory drift
(the GPUs differ from the hardware the plan was validated for) and free memory (vLLM 0.33 would refuse to start).

Parsing and judging are pure functions over text and typed values; ``read_*`` run nvidia-smi (bounded: a time limit
and at most 1 MiB of output). nvidia-smi's ``--format=csv,noheader,nounits`` prints one line per GPU, fields
separated by ``", "``, memory in MiB.
"""

from __future__ import annotations

import math
import os
import re
import select
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..domain.errors import DomainError
from ..domain.gpus import lookup, parse_capability

MIB = 1 << 20
GIB = 1 << 30
QUERY_GPUS = ["--query-gpu=index,name,memory.total,memory.used,compute_cap,pci.bus_id", "--format=csv,noheader,nounits"]
QUERY_APPS = ["--query-compute-apps=pid,process_name,used_memory,gpu_uuid,gpu_bus_id", "--format=csv,noheader,nounits"]
TOPOLOGY = ["topo", "-m"]
MAX_OUTPUT = 1 << 20
MAX_GPUS = 64  # a node's gpu_count is at most 64 (NodeIn)
MEMORY_TOLERANCE = 0.02  # one SKU's memory.total differs by driver and ECC mode by well under 2 %


class NvidiaSmiError(Exception):
    """nvidia-smi could not be run or printed something this module cannot read."""


@dataclass(frozen=True)
class ObservedGpu:
    """One GPU as nvidia-smi reports it."""

    index: int
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    compute_capability: str  # "9.0"
    bus_id: str

    @property
    def memory_free_bytes(self) -> int:
        return max(0, self.memory_total_bytes - self.memory_used_bytes)


@dataclass(frozen=True)
class ComputeApp:
    """A process holding GPU memory (``--query-compute-apps``)."""

    pid: int
    process_name: str
    used_memory_bytes: int
    gpu_uuid: str
    gpu_bus_id: str


def _fields(line: str, n: int, what: str) -> list[str]:
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < n:
        raise NvidiaSmiError(f"nvidia-smi {what} line has {len(parts)} fields, expected {n}: {line[:120]!r}")
    # a name with a comma: everything between the fixed fields belongs to the name
    return parts


def _mib(value: str, what: str) -> int:
    if not re.fullmatch(r"\d{1,9}", value):
        raise NvidiaSmiError(f"nvidia-smi {what} is not a whole number of MiB: {value[:40]!r}")
    return int(value) * MIB


def parse_gpus(text: str) -> list[ObservedGpu]:
    """Parse ``--query-gpu=index,name,memory.total,memory.used,compute_cap,pci.bus_id --format=csv,noheader,nounits``.
    Raises NvidiaSmiError on anything else (a driver error message, a header, junk)."""
    gpus = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        parts = _fields(line, 6, "GPU")
        index, name = parts[0], ", ".join(parts[1 : len(parts) - 4])
        total, used, cc, bus = parts[-4:]
        if not re.fullmatch(r"\d{1,3}", index):
            raise NvidiaSmiError(f"nvidia-smi printed {line[:120]!r}, not a GPU line")
        try:
            major, minor = parse_capability(cc, "compute_cap")
        except DomainError as exc:
            raise NvidiaSmiError(f"nvidia-smi GPU {index}: {exc.message}") from None
        if not name or len(name) > 128 or not name.isprintable():
            raise NvidiaSmiError(f"nvidia-smi GPU {index}: unreadable name {name[:40]!r}")
        gpus.append(
            ObservedGpu(
                index=int(index),
                name=name,
                memory_total_bytes=_mib(total, "memory.total"),
                memory_used_bytes=_mib(used, "memory.used"),
                compute_capability=f"{major}.{minor}",
                bus_id=bus[:32],
            )
        )
        if len(gpus) > MAX_GPUS:
            raise NvidiaSmiError(f"nvidia-smi lists more than {MAX_GPUS} GPUs")
    if not gpus:
        raise NvidiaSmiError("nvidia-smi lists no GPU")
    return sorted(gpus, key=lambda g: g.index)


def parse_compute_apps(text: str) -> list[ComputeApp]:
    """Parse ``--query-compute-apps=pid,process_name,used_memory,gpu_uuid,gpu_bus_id``; lines it cannot read are
    skipped (this list only explains a refusal, it never decides one)."""
    apps = []
    for raw in text.splitlines()[:4096]:
        parts = [p.strip() for p in raw.split(",")]
        if len(parts) < 4 or not re.fullmatch(r"[0-9]{1,10}", parts[0]):
            continue
        bus = parts[-1] if len(parts) >= 5 else ""
        uuid = parts[-2] if len(parts) >= 5 else parts[-1]
        used = parts[-3] if len(parts) >= 5 else parts[-2]
        name = ", ".join(parts[1 : len(parts) - (3 if len(parts) >= 5 else 2)])
        apps.append(
            ComputeApp(
                pid=int(parts[0][:10]),
                process_name=name[:256],
                used_memory_bytes=int(used) * MIB if re.fullmatch(r"[0-9]{1,9}", used) else 0,
                gpu_uuid=uuid[:64],
                gpu_bus_id=bus[:32],
            )
        )
    return apps


def parse_interconnect(text: str, count: int) -> str | None:
    """``nvidia-smi topo -m``: ``nvlink`` when every pair of GPUs is joined by NVLinks (``NV#``), else ``pcie``;
    None for a single GPU. Only the matrix rows (``GPUn`` followed by the ``X`` diagonal) are read, not the legend."""
    if count <= 1:
        return None
    rows: dict[int, list[str]] = {}
    for raw in text.splitlines()[:512]:
        m = re.match(r"^\s*GPU([0-9]{1,4})\s+(.*)$", raw)
        if not m:
            continue
        cells = raw.split()[1:]
        if "X" not in cells:
            continue
        rows[int(m.group(1))] = cells[:count]
    if len(rows) < count:
        return "pcie"  # not all GPUs in the matrix: never claim NVLink on a guess
    for i in range(count):
        row = rows.get(i, [])
        for j in range(count):
            if i != j and (j >= len(row) or not re.fullmatch(r"NV\d+", row[j])):
                return "pcie"
    return "nvlink"


def _run(nvidia_smi: str, args: list[str], timeout: float = 30.0) -> str:
    """nvidia-smi's output, read up to MAX_OUTPUT bytes (more is an error, never buffered), within ``timeout``."""
    import tempfile

    what = f"{nvidia_smi} {' '.join(args[:1])}"
    try:
        with tempfile.TemporaryFile() as err_file:
            p = subprocess.Popen([nvidia_smi, *args], stdout=subprocess.PIPE, stderr=err_file, stdin=subprocess.DEVNULL)
            assert p.stdout is not None  # stdout=PIPE
            try:
                deadline = time.monotonic() + timeout
                chunks, size = [], 0
                fd = p.stdout.fileno()
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0 or not select.select([fd], [], [], left)[0]:
                        raise subprocess.TimeoutExpired(what, timeout)
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > MAX_OUTPUT:
                        raise NvidiaSmiError(f"{what}: more than {MAX_OUTPUT} bytes of output")
                    chunks.append(chunk)
                code = p.wait(max(0.1, deadline - time.monotonic()))
            finally:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                p.stdout.close()
            err_file.seek(0)
            err = err_file.read(2000).decode("utf-8", "replace")
    except FileNotFoundError:
        raise NvidiaSmiError(f"{nvidia_smi}: not found (install the NVIDIA driver, or name it with --nvidia-smi)")
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NvidiaSmiError(f"{what}: {exc}") from None
    out = b"".join(chunks).decode("utf-8", "replace")
    if code != 0:
        raise NvidiaSmiError(f"{what} failed (exit {code}): {(err or out).strip()[:300]}")
    return out


def read_gpus(nvidia_smi: str = "nvidia-smi") -> list[ObservedGpu]:
    return parse_gpus(_run(nvidia_smi, QUERY_GPUS))


def read_interconnect(nvidia_smi: str, count: int) -> str | None:
    return parse_interconnect(_run(nvidia_smi, TOPOLOGY), count) if count > 1 else None


def read_interconnect_quietly(nvidia_smi: str, count: int) -> str | None:
    """The interconnect for the node's facts; None when ``topo -m`` cannot be read (the facts still go out)."""
    try:
        return read_interconnect(nvidia_smi, count)
    except NvidiaSmiError:
        return None


def read_compute_apps(nvidia_smi: str = "nvidia-smi") -> list[ComputeApp]:
    try:
        return parse_compute_apps(_run(nvidia_smi, QUERY_APPS))
    except NvidiaSmiError:
        return []


# --- the node's facts, as the service stores them --------------------------------------------------------------


def node_facts(gpus: list[ObservedGpu], interconnect: str | None) -> dict:
    """The body of ``PUT /v1/nodes/{name}/facts``: the GPU model by its catalogue id when nvidia-smi's name is in
    the catalogue, else a custom GPU with the reported memory and capability; the count; the interconnect; and each
    GPU as read. The service refuses a node of mixed models (422 ``gpus.N.name``; ``mixed_models`` says it first).
    With several GPUs, an interconnect of None means ``topo -m`` could not be read: it is left out, so the facts
    keep the stored one (an omitted field is kept, an explicit null clears it)."""
    first = gpus[0]
    known = lookup(first.name)
    gpu: str | dict = (
        known.id
        if known is not None
        else {
            "name": first.name,
            "compute_capability": first.compute_capability,
            "memory_bytes": first.memory_total_bytes,
        }
    )
    out: dict = {"gpu": gpu, "gpu_count": len(gpus), "gpus": [asdict(g) for g in gpus]}
    if interconnect is not None or len(gpus) <= 1:
        out["interconnect"] = interconnect
    return out


def mixed_models(gpus: list[ObservedGpu]) -> str | None:
    """Why the GPUs cannot be one node's facts (None when they can): Preflight validates a node as one GPU model."""
    for g in gpus[1:]:
        if g.name.strip().lower() != gpus[0].name.strip().lower():
            return (
                f"the node mixes GPU models (GPU {gpus[0].index} is {gpus[0].name}, GPU {g.index} is {g.name}): "
                f"Preflight validates a node as one GPU model"
            )
    return None


# --- boot check 1: drift --------------------------------------------------------------------------------------


def _same_model(g: ObservedGpu, hw: dict) -> bool:
    if hw.get("gpu_id") and hw["gpu_id"] != "custom":
        known = lookup(g.name)
        return known is not None and known.id == hw["gpu_id"]
    return g.name.strip().lower() == str(hw.get("gpu_name", "")).strip().lower()


def drift(gpus: list[ObservedGpu], hardware: dict, interconnect: str | None = None) -> list[str]:
    """How the GPUs nvidia-smi lists differ from the hardware a plan was validated for (the signed
    ``node_checks.hardware`` claim: ``gpu_id``, ``gpu_name``, ``memory_bytes``, ``count``, ``interconnect``). Empty
    when they match. Memory is compared within MEMORY_TOLERANCE (one SKU reports a few MiB more or less by driver),
    and only when ``memory_checked`` (the figure is one nvidia-smi reports, not a marketed size)."""
    out = []
    want = int(hardware["count"])
    if len(gpus) != want:
        out.append(f"GPU count: the plan was validated for {want}, nvidia-smi lists {len(gpus)}")
    for g in gpus:
        if not _same_model(g, hardware):
            out.append(
                f"GPU {g.index} ({g.bus_id}): model {g.name!r}, the plan was validated for "
                f"{hardware.get('gpu_name') or hardware.get('gpu_id')!r}"
            )
        elif hardware.get("memory_bytes") and hardware.get("memory_checked", True):
            expected = int(hardware["memory_bytes"])
            if abs(g.memory_total_bytes - expected) > MEMORY_TOLERANCE * expected:
                out.append(
                    f"GPU {g.index} ({g.bus_id}): memory.total {g.memory_total_bytes // MIB} MiB, the plan "
                    f"was validated for {expected // MIB} MiB"
                )
    if hardware.get("interconnect") == "nvlink" and interconnect is not None and interconnect != "nvlink":
        out.append(f"interconnect: the plan was validated for nvlink, nvidia-smi topo -m shows {interconnect}")
    return out


# --- boot check 2: free memory ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryShortfall:
    gpu: ObservedGpu
    needed_bytes: int
    why: str  # which figure the need comes from

    def message(self) -> str:
        g = self.gpu
        return (
            f"GPU {g.index} ({g.bus_id}): {g.memory_free_bytes / GIB:.2f} GiB free of "
            f"{g.memory_total_bytes / GIB:.2f} GiB, the plan needs {self.needed_bytes / GIB:.2f} GiB ({self.why})"
        )


def gpus_used(
    gpus: list[ObservedGpu], memory: dict, env: dict[str, str], argv: list[str] | None = None
) -> list[ObservedGpu]:
    """The GPUs vLLM will use: the first ``gpus`` of the signed memory claim (TP × PP × DP on this node), in the
    order ``--device-ids`` or ``CUDA_VISIBLE_DEVICES`` gives (indices as nvidia-smi numbers them), else 0, 1, …; every
    GPU of the node when the selection names GPUs otherwise (UUIDs, MIG) or does not cover the claim."""
    n = int(memory.get("gpus") or len(gpus))
    by_index = {g.index: g for g in gpus}
    selection = env.get("CUDA_VISIBLE_DEVICES")
    if argv is not None:  # --device-ids picks the GPUs too
        for i, a in enumerate(argv):
            if a == "--device-ids" and i + 1 < len(argv):
                selection = argv[i + 1]
            elif a.startswith("--device-ids="):
                selection = a.split("=", 1)[1]
    if selection is None:
        return list(gpus)[:n]
    entries = [x.strip() for x in selection.split(",") if x.strip()]
    if all(re.fullmatch(r"[0-9]{1,4}", x) and int(x) in by_index for x in entries):
        chosen = [by_index[int(x)] for x in entries][:n]
        if len(chosen) == n:
            return chosen
    # UUIDs, MIG names, unknown indices or too few: which GPUs vLLM gets cannot be told here — every GPU of the
    # node must have the room (fail closed, never an empty check)
    return list(gpus)


def memory_shortfalls(gpus: list[ObservedGpu], memory: dict) -> list[MemoryShortfall]:
    """Each used GPU whose free memory is below what vLLM 0.33 requests at start-up.

    vLLM's check (vllm 0.33.0 vllm/v1/worker/utils.py:716-772, ``request_memory``, called for every worker at
    gpu_worker.py:542 whether or not ``kv_cache_memory_bytes`` is set): ``requested = ceil(total ×
    gpu_memory_utilization)``; ``free < requested`` raises "Free memory on device … on startup is less than desired
    GPU memory utilization …". Here total and free are nvidia-smi's; vLLM's total is torch's (a few hundred MiB
    lower) and it measures free memory after its CUDA context and NCCL exist (lower too): the differences roughly
    cancel, so the verdicts agree except within about half a GiB of the line.
    With ``kv_cache_memory_bytes`` (gpu_worker.py:656-681, profiling skipped) the KV cache and the weights must also
    fit in free memory, or loading or the KV allocation runs out of memory."""
    util = float(memory.get("gpu_memory_utilization") or 0.92)
    kv = memory.get("kv_cache_memory_bytes")
    weights = int(memory.get("weights_bytes_per_gpu") or 0)
    out = []
    for g in gpus:
        requested = math.ceil(g.memory_total_bytes * util)
        if g.memory_free_bytes < requested:
            out.append(
                MemoryShortfall(
                    g, requested, f"gpu_memory_utilization {util} × {g.memory_total_bytes / GIB:.2f} GiB total"
                )
            )
        elif kv is not None and g.memory_free_bytes < int(kv) + weights:
            out.append(
                MemoryShortfall(
                    g,
                    int(kv) + weights,
                    f"kv_cache_memory_bytes {int(kv) / GIB:.2f} GiB + weights {weights / GIB:.2f} GiB per GPU",
                )
            )
    return out


def holders(apps: list[ComputeApp], gpus: list[ObservedGpu]) -> list[dict]:
    """The processes holding memory on these GPUs (matched by PCI bus id), largest first."""

    def norm(b: str) -> str:
        return b.lower().lstrip("0")[-12:]

    buses = {norm(g.bus_id): g.index for g in gpus}
    out: list[dict[str, Any]] = [
        {
            "pid": a.pid,
            "process_name": a.process_name,
            "used_memory_mib": a.used_memory_bytes // MIB,
            "gpu": buses.get(norm(a.gpu_bus_id)),
            "gpu_uuid": a.gpu_uuid,
        }
        for a in apps
        if not a.gpu_bus_id or norm(a.gpu_bus_id) in buses
    ]
    return sorted(out, key=lambda a: -a["used_memory_mib"])[:32]
