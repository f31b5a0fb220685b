"""The parallel_extras rules (service/domain/rules/parallel_extras.py): MLP and vocabulary splits, pipeline stages,
expert parallel and multi-node rules on real configs."""

from __future__ import annotations

import pytest

from service.domain.request import LaunchRequest
from service.domain.validate import validate
from tests.support import model_config, request
from tests.support.rules import FIXTURES, TP_SIZES, errors, found, head_valid

FAMILY = (
    "tp_mlp_divisible",
    "tp_vocab_divisible",
    "tp_heads_divisible",
    "pp_layers",
    "ep_requires_moe",
    "nnodes",
    "dp_external_dense",
    "eplb_requires_ep",
)


@pytest.mark.parametrize("model", FIXTURES)
@pytest.mark.parametrize("tp", TP_SIZES)
def test_accept_side_fixture_models(model, tp):
    """Every fixture model at every head-valid power-of-two TP passes the split rules (2 nodes × 8 GPUs, Ray)."""
    if not head_valid(model_config(model), tp):
        pytest.skip("TP not allowed by the head rules")
    req = request(model, count=8, nodes=2, tensor_parallel_size=tp, distributed_executor_backend="ray")
    assert errors(req, *FAMILY) == []


def test_mlp_not_divisible_llama3_tp3():
    # Llama-3.1-8B: 32 heads / 8 KV fail at TP=3 too, but the MLP 14336 % 3 != 0 is reported by its own rule
    (f,) = errors(request("meta-llama__Llama-3.1-8B-Instruct", count=3, tensor_parallel_size=3), "tp_mlp_divisible")
    assert "14336 is not divisible by 3" in f.message


def test_moe_expert_width_split_over_tp_times_dp_and_ep_fix():
    # Qwen3-30B-A3B: without EP the 768-wide experts are split over TP × DP = 5 ranks (768 % 5 != 0)
    req = request("Qwen__Qwen3-30B-A3B", count=5, tensor_parallel_size=1, data_parallel_size=5)
    (f,) = errors(req, "tp_mlp_divisible")
    assert f.remedy["enable_expert_parallel"] is True and "768" in f.message
    req["engine_args"]["enable_expert_parallel"] = True
    assert errors(req, "tp_mlp_divisible") == []


def test_vocab_padded_llama2_tp3():
    (f,) = errors(request("meta-llama__Llama-2-13b-hf", count=3, tensor_parallel_size=3), "tp_vocab_divisible")
    assert "32000" in f.message and f.remedy["tensor_parallel_size"] == [1, 2]


def test_vocab_padding_to_64_makes_tp6_ok_for_llama3():
    # 128256 = 64 × 2004; 2004 % 6 == 0 → padded vocab divisible by 6 (heads fail separately)
    assert (
        errors(request("meta-llama__Meta-Llama-3.1-70B", count=8, tensor_parallel_size=6), "tp_vocab_divisible") == []
    )


def test_pp_layers_uneven_is_info_and_too_many_stages_is_error():
    req = request(
        "deepseek-ai__DeepSeek-V3",
        count=8,
        nodes=4,
        tensor_parallel_size=8,
        pipeline_parallel_size=4,
        distributed_executor_backend="ray",
    )
    (f,) = found(req, "pp_layers")
    assert f.severity.value == "info" and f.data["stages"] == [15, 15, 16, 15]
    req = request(
        "meta-llama__Llama-3.1-8B-Instruct",
        count=8,
        nodes=8,
        tensor_parallel_size=1,
        pipeline_parallel_size=64,
        distributed_executor_backend="ray",
    )
    (f,) = errors(req, "pp_layers")
    assert f.remedy == {"pipeline_parallel_size": 32}


def test_pp_layer_partition_env():
    req = request("meta-llama__Meta-Llama-3.1-70B", count=8, tensor_parallel_size=4, pipeline_parallel_size=2)
    req["env"] = {"VLLM_PP_LAYER_PARTITION": "40,39"}
    (f,) = errors(req, "pp_layers")
    assert "sum(partitions)=79" in f.message
    req["env"] = {"VLLM_PP_LAYER_PARTITION": "41,39"}
    assert errors(req, "pp_layers") == []


def test_ep_on_dense_and_on_moe():
    assert errors(
        request("meta-llama__Meta-Llama-3.1-70B", tensor_parallel_size=8, enable_expert_parallel=True),
        "ep_requires_moe",
    )
    assert not errors(
        request("mistralai__Mixtral-8x7B-Instruct-v0.1", tensor_parallel_size=8, enable_expert_parallel=True),
        "ep_requires_moe",
    )
    assert errors(
        request("mistralai__Mixtral-8x7B-Instruct-v0.1", tensor_parallel_size=8, enable_eplb=True), "eplb_requires_ep"
    )


def test_external_dp_dense_only_for_moe():
    assert errors(
        request("meta-llama__Llama-3.1-8B-Instruct", count=8, data_parallel_size=2, data_parallel_rank=0),
        "dp_external_dense",
    )
    assert not errors(
        request("Qwen__Qwen3-30B-A3B", count=8, data_parallel_size=2, data_parallel_rank=0), "dp_external_dense"
    )


def test_nnodes_rules():
    base = dict(count=8, nodes=2, tensor_parallel_size=8, pipeline_parallel_size=2, nnodes=2)
    assert not errors(request("deepseek-ai__DeepSeek-V3", **base), "nnodes")
    assert errors(request("deepseek-ai__DeepSeek-V3", **base, distributed_executor_backend="ray"), "nnodes")
    bad_rank = errors(request("deepseek-ai__DeepSeek-V3", **base, node_rank=2), "nnodes")
    assert "between 0 and 1" in bad_rank[0].message
    uneven = errors(request("deepseek-ai__DeepSeek-V3", count=8, nodes=3, tensor_parallel_size=8, nnodes=3), "nnodes")
    assert "evenly divide" in uneven[0].message


def test_master_port_is_judged_where_the_nodes_meet():
    """vLLM uses --master-port only across nodes (vllm 0.33.0 distributed/parallel_state.py:1875-1878): on one node
    any integer passes, as vLLM's own parser and create_engine_config take it; across nodes it must be a TCP port."""
    one = request(
        "meta-llama__Meta-Llama-3.1-8B", count=4, tensor_parallel_size=2, max_model_len=8192, master_port=100000
    )
    assert validate(LaunchRequest.model_validate(one)).verdict != "reject"
    base = dict(count=8, nodes=2, tensor_parallel_size=8, pipeline_parallel_size=2, nnodes=2)
    (f,) = errors(request("deepseek-ai__DeepSeek-V3", **base, master_port=100000), "nnodes")
    assert f.field == "engine_args.master_port" and "0-65535" in f.message
    assert not errors(request("deepseek-ai__DeepSeek-V3", **base, master_port=65535), "nnodes")


def test_elastic_ep_and_eplb():
    qwen = "Qwen__Qwen3-30B-A3B"
    (f,) = errors(
        request(qwen, tensor_parallel_size=2, enable_expert_parallel=True, enable_elastic_ep=True), "eplb_options"
    )
    assert f.message == "Elastic EP is only supported with enable_eplb=True." and f.remedy == {"enable_eplb": True}
    ok = request(qwen, tensor_parallel_size=2, enable_expert_parallel=True, enable_elastic_ep=True, enable_eplb=True)
    assert not errors(ok, "eplb_options")
    (f,) = errors(request(qwen, count=1, enable_expert_parallel=True, enable_eplb=True), "eplb_options")
    assert f.message == "EPLB requires tensor, prefill-context, or data parallelism, but got TP=1, PCP=1, DP=1."
    (f,) = errors(request(qwen, eplb_config={"num_redundant_experts": 8}), "eplb_options")
    assert f.message.startswith("num_redundant_experts is set to 8 but EPLB is not enabled.")
    # EPLBConfig validates in lax mode: "8" is 8
    (f,) = errors(request(qwen, eplb_config={"num_redundant_experts": "8"}), "eplb_options")
    assert f.message.startswith("num_redundant_experts is set to 8")


def test_decode_context_parallel_divides_tp():
    llama = "meta-llama__Llama-3.1-8B-Instruct"
    (f,) = errors(request(llama, tensor_parallel_size=4, decode_context_parallel_size=3), "dcp_tp_divisible")
    assert f.message == "tp_size=4 must be divisible by dcp_size=3." and f.remedy == {
        "decode_context_parallel_size": [1, 2, 4]
    }
    assert not errors(request(llama, tensor_parallel_size=4, decode_context_parallel_size=2), "dcp_tp_divisible")


def test_nsight_needs_ray_workers():
    llama = "meta-llama__Llama-3.1-8B-Instruct"
    (f,) = errors(request(llama, tensor_parallel_size=2, ray_workers_use_nsight=True), "nsight_requires_ray")
    assert f.message.startswith("Unable to use nsight profiling unless workers run with Ray.")
    ok = request(llama, tensor_parallel_size=2, ray_workers_use_nsight=True, distributed_executor_backend="ray")
    assert not errors(ok, "nsight_requires_ray")


QWEN_MOE = "Qwen__Qwen3-30B-A3B"  # 32 attention heads, 4 KV heads
LLAMA8 = "meta-llama__Llama-3.1-8B-Instruct"


def _at(req: dict, version: str) -> dict:
    req["vllm_version"] = version
    return req


def test_numa_bind_nodes_need_numa_bind():
    (f,) = errors(request(LLAMA8, count=1, numa_bind_nodes=[0]), "numa_bind")
    assert f.message.startswith("numa_bind_nodes and numa_bind_cpus require numa_bind=True.")
    assert f.field == "engine_args.numa_bind_nodes" and f.remedy == {"numa_bind": True}
    assert not errors(request(LLAMA8, count=1, numa_bind=True, numa_bind_cpus=["0-3"]), "numa_bind")
    assert not errors(_at(request(LLAMA8, count=1, numa_bind_nodes=[0]), "0.18.1"), "numa_bind")  # no such option


def test_microbatching_needs_an_overlapping_all2all_backend():
    (f,) = errors(request(QWEN_MOE, count=2, tensor_parallel_size=2, enable_dbo=True), "microbatching")
    assert "deepep_low_latency, deepep_high_throughput, nixl_ep all2all backends on this platform" in f.message
    assert "allgather_reducescatter is not supported" in f.message
    assert errors(request(QWEN_MOE, count=2, tensor_parallel_size=2, ubatch_size=2), "microbatching")
    ok = request(QWEN_MOE, count=2, tensor_parallel_size=2, enable_dbo=True, all2all_backend="nixl_ep")
    assert not errors(ok, "microbatching")
    assert errors(_at(dict(ok, engine_args=dict(ok["engine_args"])), "0.21.0"), "microbatching")  # nixl_ep from 0.24
    assert not errors(request(QWEN_MOE, count=2, tensor_parallel_size=2, ubatch_size=1), "microbatching")


def test_microbatching_up_to_015_judges_only_a_given_backend():
    """Up to 0.15 an unset --all2all-backend came from the node's VLLM_ALL2ALL_BACKEND: not judged."""
    assert not errors(
        _at(request(QWEN_MOE, count=2, tensor_parallel_size=2, enable_dbo=True), "0.13.0"), "microbatching"
    )
    req = _at(request(QWEN_MOE, count=2, tensor_parallel_size=2, enable_dbo=True, all2all_backend="naive"), "0.13.0")
    (f,) = errors(req, "microbatching")
    assert f.message.startswith("Microbatching currently only supports the deepep_low_latency, deepep_high_throughput")


def test_microbatching_token_thresholds():
    base = {"tensor_parallel_size": 2, "enable_dbo": True, "all2all_backend": "deepep_low_latency"}
    (f,) = errors(request(QWEN_MOE, count=2, dbo_decode_token_threshold=1, **base), "microbatching")
    assert f.message == (
        "dbo_decode_token_threshold and dbo_prefill_token_threshold must be at least the number of microbatches (2)."
    )
    assert not errors(request(QWEN_MOE, count=2, dbo_decode_token_threshold=2, **base), "microbatching")
    assert not errors(_at(request(QWEN_MOE, count=2, dbo_decode_token_threshold=1, **base), "0.28.0"), "microbatching")


def test_dcp_on_gqa_models_needs_tp_above_kv_heads():
    (f,) = errors(request(QWEN_MOE, count=4, tensor_parallel_size=4, decode_context_parallel_size=2), "dcp_kv_heads")
    assert f.message.startswith(
        "Decode context parallelism for GQA/MQA requires `--tensor-parallel-size` (4) to be greater than the model's "
        "total number of KV heads (4)."
    )
    (f,) = errors(request(QWEN_MOE, count=8, tensor_parallel_size=8, decode_context_parallel_size=4), "dcp_kv_heads")
    assert f.message.startswith("`--decode-context-parallel-size` (4) exceeds the maximum supported value (2)")
    assert f.remedy == {"decode_context_parallel_size": [1, 2]}
    assert not errors(
        request(QWEN_MOE, count=8, tensor_parallel_size=8, decode_context_parallel_size=2), "dcp_kv_heads"
    )
    old = _at(request(QWEN_MOE, count=4, tensor_parallel_size=4, decode_context_parallel_size=2), "0.13.0")
    (f,) = errors(old, "dcp_kv_heads")
    assert f.message.startswith("tensor parallel size 4 must be greater than total num kv heads 4")


def test_dcp_kv_heads_skips_mla_models():
    req = request("deepseek-ai__DeepSeek-V3", gpu="h200-141gb", count=8, tensor_parallel_size=8,
                  decode_context_parallel_size=8)  # fmt: skip
    assert not errors(req, "dcp_kv_heads")


@pytest.mark.parametrize(("args", "field"), [({"nnodes": 0}, "nnodes"), ({"node_rank": -1}, "node_rank")])
def test_node_count_and_rank_bounds_come_from_the_release(args, field):
    """vLLM 0.33's ParallelConfig bounds them (nnodes ge=1, node_rank ge=0: vllm/config/parallel.py:323-326, the
    catalogue's value facts); 0.13's config code takes them on one node, where nothing reads them."""
    base = dict(count=4, tensor_parallel_size=2, max_model_len=8192, **args)
    new = request("meta-llama__Meta-Llama-3.1-8B", **base)
    new["vllm_version"] = "0.33.0"
    found = [f for f in validate(LaunchRequest.model_validate(new)).errors if f.field == f"engine_args.{field}"]
    assert [f.rule for f in found] == ["flag_unsupported"], found
    old = request("meta-llama__Meta-Llama-3.1-8B", **base)
    old["vllm_version"] = "0.13.0"
    assert validate(LaunchRequest.model_validate(old)).verdict != "reject"
