"""The GPU catalogue: vendor facts per GPU model, from service/data/gpus.json (a copy of the sourced catalogue,
see tests/fixtures/GPUS-SOURCES.md).

Look-up is by catalogue id (``h100-sxm-80gb``) or by the name ``nvidia-smi`` prints (``NVIDIA H100 80GB HBM3``),
case-insensitively. A GPU outside the catalogue can be described inline with its compute capability and memory.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from .errors import DomainError

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class Gpu:
    """One GPU model.

    ``memory_bytes``: total device memory in bytes as nvidia-smi reports it (``memory.total`` MiB × 2^20); where the
    catalogue has no reported figure, the marketed size in GiB (a slight over-estimate for HBM parts, documented per
    entry in ``memory_source``). ``compute_capability``: ``(major, minor)``; ``None`` for AMD parts.
    """

    id: str
    name: str
    vendor: str
    compute_capability: tuple[int, int] | None
    memory_bytes: int
    memory_source: str
    bf16: bool
    fp8: bool
    nvlink: bool | None
    nvidia_smi_names: tuple[str, ...] = ()

    @property
    def capability_int(self) -> int | None:
        """Compute capability as vLLM prints it: ``major * 10 + minor`` (9.0 → 90)."""
        if self.compute_capability is None:
            return None
        return self.compute_capability[0] * 10 + self.compute_capability[1]

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "vendor": self.vendor,
            "compute_capability": None if self.compute_capability is None else "{}.{}".format(*self.compute_capability),
            "memory_bytes": self.memory_bytes,
            "bf16": self.bf16,
            "fp8": self.fp8,
            "nvlink": self.nvlink,
        }


def parse_capability(value: str | float | None, field: str = "hardware.gpu.compute_capability") -> tuple[int, int]:
    """Parse ``"8.6"`` / ``8.6`` / ``"86"`` into ``(8, 6)``.

    Raises DomainError when the value is not a plausible CUDA compute capability (major 3..15).
    """
    text = str(value).strip() if value is not None else ""
    m = re.fullmatch(r"(\d{1,2})\.(\d)", text) or re.fullmatch(r"(\d)(\d)", text)
    if not m:
        raise DomainError(field, f"compute capability {value!r} is not of the form MAJOR.MINOR (e.g. 8.0, 9.0)")
    major, minor = int(m.group(1)), int(m.group(2))
    if not 3 <= major <= 15:
        raise DomainError(field, f"compute capability {value!r} is outside any CUDA GPU (3.0 .. 15.x)")
    return major, minor


def _entry_to_gpu(e: dict[str, Any]) -> Gpu:
    name = e["name"]
    smi = re.findall(r"nvidia-smi name: '([^']+)'", name)
    plain = re.sub(r"\s*\(.*\)\s*$", "", name).strip()
    names = tuple(dict.fromkeys([*smi, plain]))
    if e.get("memory_bytes_reported"):
        mem, src = int(e["memory_bytes_reported"]), "nvidia-smi memory.total"
    elif e.get("nvidia_smi_memory_total_mib"):
        mem, src = int(e["nvidia_smi_memory_total_mib"]) * MIB, "nvidia-smi memory.total"
    else:
        mem, src = int(e["memory_gb_marketed"]) * GIB, "marketed size (GiB); no nvidia-smi figure in the catalogue"
    cc = parse_capability(e["compute_capability"]) if e.get("compute_capability") else None
    return Gpu(
        id=e["id"],
        name=plain,
        vendor=e.get("vendor") or "NVIDIA",
        compute_capability=cc,
        memory_bytes=mem,
        memory_source=src,
        bf16=bool(e.get("bf16")),
        fp8=bool(e.get("fp8")),
        nvlink=e.get("nvlink"),
        nvidia_smi_names=names,
    )


@lru_cache(maxsize=1)
def catalogue() -> dict[str, Gpu]:
    """All catalogue GPUs by id."""
    raw = json.loads(resources.files("service").joinpath("data/gpus.json").read_text())
    return {e["id"]: _entry_to_gpu(e) for e in raw}


def _norm(s: str) -> str:
    return re.sub(r"[\s_-]+", " ", s.strip().lower())


def lookup(key: str) -> Gpu | None:
    """Find a GPU by catalogue id or by nvidia-smi name (case- and separator-insensitive); None if unknown."""
    cat = catalogue()
    if key in cat:
        return cat[key]
    k = _norm(key)
    for gpu in cat.values():
        if _norm(gpu.id) == k or any(_norm(n) == k for n in gpu.nvidia_smi_names):
            return gpu
    return None


def resolve(gpu: str | dict[str, Any], field: str = "hardware.gpu") -> Gpu:
    """Resolve a request's ``hardware.gpu``: a catalogue id / nvidia-smi name, or an inline description
    ``{"name", "compute_capability", "memory_bytes"}``.

    An inline description whose name is in the catalogue takes the catalogue's feature flags (bf16, fp8, NVLink)
    with the request's capability and memory. Raises DomainError for an unknown name without capability and memory.
    """
    if isinstance(gpu, str):
        found = lookup(gpu)
        if found is None:
            raise DomainError(
                field,
                f"unknown GPU {gpu!r}: not a catalogue id or nvidia-smi name. Give "
                '{"name", "compute_capability", "memory_bytes"} for a GPU outside the catalogue.',
                rule="gpu_unknown",
                accepted=sorted(catalogue()),
            )
        return found
    name = str(gpu.get("name") or "").strip()
    known = lookup(name) if name else None
    cc_raw, mem = gpu.get("compute_capability"), gpu.get("memory_bytes")
    if cc_raw is None or mem is None:
        if known is not None:
            return known
        raise DomainError(field, f"unknown GPU {name!r}: give compute_capability and memory_bytes", rule="gpu_unknown")
    cc = parse_capability(cc_raw, f"{field}.compute_capability")
    if not isinstance(mem, int) or isinstance(mem, bool) or not (1 * GIB <= mem <= 4096 * GIB):
        raise DomainError(f"{field}.memory_bytes", f"memory_bytes {mem!r} must be an integer between 1 GiB and 4 TiB")
    major = cc[0]
    return Gpu(
        id=known.id if known else "custom",
        name=name or "custom GPU",
        vendor=known.vendor if known else "NVIDIA",
        compute_capability=cc,
        memory_bytes=mem,
        memory_source="request",
        bf16=known.bf16 if known else major >= 8,
        fp8=known.fp8 if known else (cc >= (8, 9)),
        nvlink=known.nvlink if known else None,
        nvidia_smi_names=(name,),
    )
