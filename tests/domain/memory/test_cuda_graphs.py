"""CUDA graph memory (service/domain/memory/cuda_graphs.py): enforce_eager removes it, and releases before 0.11
do not count it in the budget."""

from __future__ import annotations

from service.domain.memory import Accounting
from tests.support.memory import budget


def test_enforce_eager_removes_cuda_graphs_and_old_versions_do_not_count_them():
    _, graphs = budget("meta-llama__Meta-Llama-3.1-8B", count=1)
    _, eager = budget("meta-llama__Meta-Llama-3.1-8B", count=1, enforce_eager=True)
    assert graphs.cuda_graph_bytes > 0 and eager.cuda_graph_bytes == 0
    assert eager.kv_cache_bytes_per_gpu - graphs.kv_cache_bytes_per_gpu == graphs.cuda_graph_bytes
    assert Accounting.for_version("0.33.0").cuda_graphs_in_budget
    assert not Accounting.for_version("0.10.2").cuda_graphs_in_budget
    assert not Accounting.for_version("0.6.3").v1_engine
