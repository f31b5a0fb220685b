"""Per-rank linear shapes (service/domain/rules/shapes.py, read by quant_alignment and parallel_extras; no rules of
its own) on real fixture configs, against the sizes worked out by hand from each config.json."""

from __future__ import annotations

import pytest

from service.domain.model_facts import read_model_facts
from service.domain.rules.shapes import dense_mlp_present, linear_layers, moe_ranks, shared_expert_size
from tests.support import model_config, request
from tests.support.rules import context


def test_llama_31_8b_at_tp8_splits_heads_and_mlp_eight_ways():
    # hidden 4096, 32 heads and 8 KV heads of 128, intermediate 14336
    layers = {
        (l.name, l.kind): l
        for l in linear_layers(context(request("meta-llama__Meta-Llama-3.1-8B", tensor_parallel_size=8)))
    }
    qkv = layers["model.layers.0.self_attn.qkv_proj", "column"]
    assert (qkv.full_out, qkv.parts_out, qkv.ranks) == (6144, (512, 128, 128), 8)
    assert layers["model.layers.0.self_attn.o_proj", "row"].in_rank == 4096 // 8
    assert layers["model.layers.0.mlp.gate_up_proj", "column"].parts_out == (14336 // 8, 14336 // 8)
    down = layers["model.layers.0.mlp.down_proj", "row"]
    assert (down.full_in, down.in_rank, down.exact, down.moe) == (14336, 1792, True, False)


def test_mixtral_experts_split_over_tp_times_dp_unless_expert_parallel():
    req = request("mistralai__Mixtral-8x7B-v0.1", tensor_parallel_size=4, data_parallel_size=2)
    assert moe_ranks(context(req)) == 8
    experts = [l for l in linear_layers(context(req)) if l.moe]
    assert [(l.kind, l.in_rank, l.parts_out) for l in experts] == [
        ("column", 4096, (1792, 1792)),
        ("row", 1792, (4096,)),
    ]
    assert moe_ranks(context(dict(req, engine_args={**req["engine_args"], "enable_expert_parallel": True}))) == 1


@pytest.mark.parametrize(
    "fixture,dense,shared",
    [
        ("meta-llama__Meta-Llama-3.1-8B", True, None),  # dense model
        ("mistralai__Mixtral-8x7B-v0.1", False, None),  # every layer routed, no shared expert
        ("Qwen__Qwen3-30B-A3B", False, None),  # decoder_sparse_step 1, no mlp_only_layers
        ("deepseek-ai__DeepSeek-V3", True, 2048),  # first_k_dense_replace 3; 1 shared expert × moe_intermediate 2048
    ],
)
def test_dense_mlp_and_shared_expert_from_the_config(fixture, dense, shared):
    facts = read_model_facts(model_config(fixture))
    assert (dense_mlp_present(facts), shared_expert_size(facts)) == (dense, shared)
