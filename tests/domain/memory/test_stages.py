"""Pipeline stages (service/domain/memory/stages.py): layers split over PP ranks as vLLM splits them."""

from __future__ import annotations

from service.domain.memory import pp_partition
from tests.support.memory import budget


def test_pp_partition_matches_vllm():
    assert pp_partition(61, 4) == [15, 15, 16, 15]
    assert pp_partition(61, 2) == [31, 30]
    assert pp_partition(80, 4) == [20, 20, 20, 20]


def test_pipeline_parallel_partition_and_max_stage():
    assert pp_partition(61, 4) == [15, 15, 16, 15]
    assert pp_partition(61, 2) == [31, 30]
    _, b = budget("deepseek-ai__DeepSeek-V3", "h200-141gb", count=8, tensor_parallel_size=2, pipeline_parallel_size=4)
    assert b.kv_layers_per_gpu == 16
