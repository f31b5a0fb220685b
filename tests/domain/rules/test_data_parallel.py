"""The data-parallel launch rules (service/domain/rules/data_parallel.py): load-balancing modes, ranks and local
sizes as vLLM reads them, with the message of the target release line."""

from __future__ import annotations

from tests.support import request
from tests.support.rules import errors

QWEN = "Qwen__Qwen3-30B-A3B"  # MoE: external data parallel is allowed
CODES = ("dp_lb_mode", "dp_external_rank", "dp_size_local", "dp_rank_range", "dp_external_dense")


def test_local_size_above_dp():
    (f,) = errors(request(QWEN, data_parallel_size=2, data_parallel_size_local=4), "dp_size_local")
    assert f.message == "data_parallel_size_local (4) must be <= data_parallel_size (2)"
    assert f.remedy == {"data_parallel_size_local": 2}
    assert not errors(request(QWEN, data_parallel_size=4, data_parallel_size_local=2), *CODES)


def test_rank_out_of_range():
    (f,) = errors(request(QWEN, data_parallel_size=2, data_parallel_rank=2), "dp_rank_range")
    assert f.message == "data_parallel_rank (2) must be in the range [0, 2)"
    assert f.remedy == {"data_parallel_rank": 1}
    assert not errors(request(QWEN, data_parallel_size=2, data_parallel_rank=1), *CODES)


def test_external_lb_needs_a_rank_unless_nnodes_infers_it():
    (f,) = errors(request(QWEN, data_parallel_size=2, data_parallel_external_lb=True), "dp_external_rank")
    assert "requires a data-parallel rank" in f.message
    inferred = request(QWEN, nodes=2, data_parallel_size=2, data_parallel_external_lb=True, nnodes=2, node_rank=0)
    assert not errors(inferred, *CODES)


def test_external_rank_with_local_size_or_single_replica():
    (f,) = errors(
        request(QWEN, data_parallel_size=2, data_parallel_rank=0, data_parallel_size_local=2), "dp_external_rank"
    )
    assert "requires `--data-parallel-size-local 1`; got 2" in f.message
    (f,) = errors(request(QWEN, data_parallel_rank=0), "dp_external_rank")
    assert f.message == "data_parallel_external_lb can only be set when data_parallel_size > 1"


def test_hybrid_lb():
    (f,) = errors(request(QWEN, data_parallel_size=2, data_parallel_hybrid_lb=True), "dp_lb_mode")
    assert "`--data-parallel-hybrid-lb` requires `--data-parallel-size-local`" in f.message
    both = request(
        QWEN, data_parallel_size=2, data_parallel_hybrid_lb=True, data_parallel_external_lb=True, data_parallel_rank=0
    )
    (f,) = errors(both, "dp_lb_mode")
    assert "cannot be enabled together" in f.message
    ok = request(QWEN, data_parallel_size=4, data_parallel_hybrid_lb=True, data_parallel_size_local=2)
    assert not errors(ok, *CODES)


def test_older_lines_print_their_own_message():
    req = request(QWEN, data_parallel_size=2, data_parallel_hybrid_lb=True)
    req["vllm_version"] = "0.24.0"
    (f,) = errors(req, "dp_lb_mode")
    assert f.message == "data_parallel_size_local must be set to use data_parallel_hybrid_lb."


def test_dense_external_only_with_dp_above_one():
    llama = "meta-llama__Llama-3.1-8B-Instruct"
    assert errors(request(llama, data_parallel_size=2, data_parallel_rank=0), "dp_external_dense")
    single = errors(request(llama, data_parallel_rank=0), *CODES)
    assert [f.rule for f in single] == ["dp_external_rank"]


def test_fault_tolerance_needs_external_load_balancing():
    moe = "Qwen__Qwen3-30B-A3B"
    (f,) = errors(request(moe, count=2, tensor_parallel_size=2, enable_fault_tolerance=True), "dp_fault_tolerance")
    assert f.message.startswith("Fault tolerance requires external load balancer mode")
    ok = request(moe, count=2, data_parallel_size=2, data_parallel_rank=0, enable_fault_tolerance=True)
    assert not errors(ok, "dp_fault_tolerance")
    old = request(moe, count=2, enable_fault_tolerance=True)
    old["vllm_version"] = "0.26.0"  # no such option before 0.28: flag_unsupported judges it
    assert not errors(old, "dp_fault_tolerance")


def test_multi_port_external_lb():
    moe = "Qwen__Qwen3-30B-A3B"
    (f,) = errors(request(moe, count=2, data_parallel_multi_port_external_lb=True), "dp_multi_port")
    assert f.message == "Error: --data-parallel-multi-port-external-lb requires --data-parallel-size > 1"
    (f,) = errors(
        request(moe, count=2, data_parallel_multi_port_external_lb=True, data_parallel_size=2), "dp_multi_port"
    )
    assert f.message == "Error: --data-parallel-multi-port-external-lb requires --data-parallel-size-local >= 2"
    base = {"data_parallel_multi_port_external_lb": True, "data_parallel_size": 4, "data_parallel_size_local": 2}
    assert not errors(request(moe, count=4, **base), "dp_multi_port")
    (f,) = errors(request(moe, count=4, data_parallel_start_rank=3, **base), "dp_multi_port")
    assert f.message == "Error: multi-port supervised ranks would exceed --data-parallel-size"
    (f,) = errors(request(moe, count=4, port=9255, **base), "dp_multi_port")
    assert f.message == "Error: --data-parallel-supervisor-port 9256 overlaps with child rank ports 9255-9256"
