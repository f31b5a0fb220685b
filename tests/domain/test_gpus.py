"""GPU catalogue look-ups (service/domain/gpus.py): by id and by the name nvidia-smi prints, inline and unknown
GPUs."""

from __future__ import annotations

import pytest

from service.domain.errors import DomainError
from service.domain.gpus import lookup, resolve


def test_lookup_by_id_and_nvidia_smi_name():
    assert lookup("h100-sxm-80gb") is lookup("NVIDIA H100 80GB HBM3")
    g = lookup("nvidia h100 80gb hbm3")
    assert g.capability_int == 90 and g.memory_bytes == 85520809984 and g.fp8
    t4 = lookup("NVIDIA Tesla T4")
    assert t4.compute_capability == (7, 5) and not t4.bf16


def test_inline_gpu_and_unknown_gpu():
    g = resolve({"name": "NVIDIA GeForce RTX 3090", "compute_capability": "8.6", "memory_bytes": 25769803776})
    assert g.capability_int == 86 and g.bf16 and not g.fp8
    with pytest.raises(DomainError) as exc:
        resolve("NVIDIA H900")
    assert exc.value.field == "hardware.gpu" and "h100-sxm-80gb" in exc.value.accepted
