"""Pipeline stages (service/domain/memory/stages.py): layers split over PP ranks as vLLM splits them."""

from __future__ import annotations

from service.domain.memory import pp_partition


def test_pp_partition_matches_vllm():
    assert pp_partition(61, 4) == [15, 15, 16, 15]
    assert pp_partition(61, 2) == [31, 30]
    assert pp_partition(80, 4) == [20, 20, 20, 20]
