"""The policy rules (service/domain/rules/policy.py): gpu_memory_utilization's range and the operators' policy
under the shipped profile (service/data/policy/default.toml); the accept-side sweep covers the scheduler rules too."""

from __future__ import annotations

import pytest

from tests.support import request
from tests.support.rules import FIXTURES, errors, found

SCHED = ("batched_tokens_vs_max_len", "batched_tokens_lt_max_num_seqs", "util_range")
POLICY = (
    "util_too_high",
    "enforce_eager_production",
    "pcie_tp",
    "chunked_prefill_disabled",
    "max_model_len_oversized",
    "max_model_len_below_workload",
)
LLAMA = "meta-llama__Llama-3.1-8B-Instruct"


@pytest.mark.parametrize("model", FIXTURES)
@pytest.mark.parametrize("gpu", ("h100-sxm-80gb", "a100-sxm4-80gb"))
def test_accept_side_defaults(model, gpu):
    req = request(
        model,
        gpu=gpu,
        count=8,
        nodes=2,
        tensor_parallel_size=8,
        distributed_executor_backend="ray",
        gpu_memory_utilization=0.9,
    )
    assert errors(req, *SCHED) == []
    assert found(req, *POLICY) == []


@pytest.mark.parametrize("util,bad", [(0.0, True), (-0.1, True), (1.2, True), (1.0, False), (0.5, False)])
def test_util_range(util, bad):
    assert bool(errors(request(LLAMA, count=1, gpu_memory_utilization=util), "util_range")) is bad


@pytest.mark.parametrize(
    "env,util,severity",
    [
        ("production", 0.97, "error"),
        ("production", 0.95, "warning"),
        ("production", 0.93, "warning"),
        ("production", 0.9, None),
        ("production", None, "warning"),  # vLLM 0.33's default 0.92
        ("benchmark", 0.95, None),
        ("benchmark", 0.97, "warning"),
    ],
)
def test_util_too_high(env, util, severity):
    args = {} if util is None else {"gpu_memory_utilization": util}
    got = found(request(LLAMA, count=1, environment=env, **args), "util_too_high")
    assert [f.severity.value for f in got] == ([severity] if severity else [])


def test_enforce_eager_refused_in_production_warned_in_benchmark():
    (prod,) = found(request(LLAMA, count=1, enforce_eager=True), "enforce_eager_production")
    assert prod.severity.value == "error" and prod.data["policy"] == {"profile": "default", "action": "enforce"}
    (bench,) = found(request(LLAMA, count=1, enforce_eager=True, environment="benchmark"), "enforce_eager_production")
    assert bench.severity.value == "warning"


def test_pcie_tp():
    assert found(request(LLAMA, gpu="a10-24gb", count=2, interconnect="pcie", tensor_parallel_size=2), "pcie_tp")
    # interconnect unknown: an NVLink-less GPU model counts as PCIe
    assert found(request(LLAMA, gpu="l4-24gb", count=8, interconnect=None, tensor_parallel_size=8), "pcie_tp")
    assert not found(
        request(LLAMA, gpu="h100-sxm-80gb", count=2, interconnect="nvlink", tensor_parallel_size=2), "pcie_tp"
    )
    assert not found(request(LLAMA, gpu="a10-24gb", count=2, interconnect="pcie", tensor_parallel_size=1), "pcie_tp")


def _with_workload(req: dict, p99: int) -> dict:
    req["workload"] = {"avg_seq_len": p99 // 3, "p99_seq_len": p99, "shape": "balanced"}
    return req


def test_max_model_len_vs_workload():
    (f,) = found(_with_workload(request(LLAMA, count=1, max_model_len=131072), 6000), "max_model_len_oversized")
    assert f.remedy == {"max_model_len": 8192}
    assert not found(_with_workload(request(LLAMA, count=1, max_model_len=8192), 6000), "max_model_len_oversized")
    assert found(_with_workload(request(LLAMA, count=1, max_model_len=4096), 6000), "max_model_len_below_workload")
    bench = _with_workload(request(LLAMA, count=1, max_model_len=131072, environment="benchmark"), 6000)
    assert not found(bench, "max_model_len_oversized")


def test_chunked_prefill_disabled_warns():
    req = _with_workload(
        request(LLAMA, count=1, enable_chunked_prefill=False, max_model_len=32768, max_num_batched_tokens=32768), 30000
    )
    (f,) = found(req, "chunked_prefill_disabled")
    assert f.severity.value == "warning" and "30000" in f.message


NEMOTRON_H = "nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"  # hybrid: prefix caching on by default in 0.33


def _hybrid(version: str | None = None, **args):
    req = request(
        NEMOTRON_H,
        gpu="h200-141gb",
        count=2,
        tensor_parallel_size=2,
        trust_remote_code=True,
        max_model_len=8192,
        **args,
    )
    if version:
        req["vllm_version"] = version
    return req


def test_hybrid_prefix_caching_needs_chunked_prefill():
    (f,) = errors(_hybrid(enable_chunked_prefill=False), "mamba_prefix_caching_chunked_prefill")
    assert f.message.startswith("AssertionError: Chunked prefill is required for Mamba prefix caching.")
    assert f.remedy == {"enable_chunked_prefill": True, "enable_prefix_caching": False}
    # prefix caching off: vLLM only warns about chunked prefill
    off = _hybrid(enable_chunked_prefill=False, enable_prefix_caching=False)
    assert not errors(off, "mamba_prefix_caching_chunked_prefill", "chunked_prefill_disabled")
    assert [f.rule for f in found(off, "chunked_prefill_disabled")] == ["chunked_prefill_disabled"]
    assert not errors(_hybrid(), "mamba_prefix_caching_chunked_prefill")


def test_hybrid_prefix_caching_before_0_33_names_the_align_mode():
    """0.32 turns prefix caching on for a generative hybrid (config/model.py:2258-2260) and asserts chunked prefill
    under it in any Mamba cache mode (model_executor/models/config.py:685-696). 0.26 asserts only in 'align', which
    it picks for a class without SupportsMambaPrefixCaching: NemotronH has it (nemotron_h.py), so 'all' is picked."""
    (f,) = errors(_hybrid("0.32.0", enable_chunked_prefill=False), "mamba_prefix_caching_chunked_prefill")
    assert f.message.startswith("AssertionError: Chunked prefill is required for mamba cache mode 'align'.")
    assert not errors(_hybrid("0.26.0", enable_chunked_prefill=False), "mamba_prefix_caching_chunked_prefill")
    assert errors(
        _hybrid("0.26.0", enable_chunked_prefill=False, mamba_cache_mode="align"),
        "mamba_prefix_caching_chunked_prefill",
    )


def test_transformer_without_chunked_prefill_still_warns():
    req = request(LLAMA, count=1, enable_chunked_prefill=False, max_model_len=8192)
    assert not errors(req, "mamba_prefix_caching_chunked_prefill")
    assert [f.severity.value for f in found(req, "chunked_prefill_disabled")] == ["warning"]
