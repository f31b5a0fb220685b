"""Weights per GPU from a checkpoint's tensors (service/domain/rank_weights.py) on reconstructed layouts of real
public checkpoints (tests/support/checkpoints.py), and the config.json formula (memory/weights.py) held to them."""

from __future__ import annotations

import pytest

from service.domain.memory import estimate_weights
from service.domain.model_facts import read_model_facts
from service.domain.rank_weights import MAX_LAYERS, RankWeights, rank_weights
from service.domain.tensors import TensorInfo
from tests.support import model_config
from tests.support.checkpoints import llama_like

# ``metadata.total_size`` of each model's published model.safetensors.index.json (bf16 / fp16 bytes), which the
# reconstruction must reproduce to the byte.
PUBLISHED_TOTAL = {
    "meta-llama__Meta-Llama-3.1-8B": 16_060_522_496,
    "meta-llama__Meta-Llama-3.1-70B": 141_107_412_992,
    "mistralai__Mixtral-8x7B-v0.1": 93_405_585_408,
    "meta-llama__Llama-2-13b-hf": 26_031_728_640,
}
FIXTURES = [
    *PUBLISHED_TOTAL,
    "meta-llama__Meta-Llama-3.1-405B",
    "Qwen__Qwen3-8B",
    "Qwen__Qwen3-30B-A3B",
    "Qwen__Qwen2.5-72B-Instruct",
    "01-ai__Yi-34B",
]


def _t(name: str, shape: tuple[int, ...], dtype: str = "BF16") -> TensorInfo:
    n = 1
    for d in shape:
        n *= d
    return TensorInfo(name, dtype, shape, n * (1 if dtype.startswith("F8") else 2), "model.safetensors")


@pytest.mark.parametrize("model", list(PUBLISHED_TOTAL))
def test_reconstruction_matches_the_published_total(model):
    tensors = llama_like(model_config(model))
    rw = rank_weights(tensors)
    assert rw is not None
    assert sum(t.nbytes for t in tensors.values()) == rw.total == PUBLISHED_TOTAL[model]


@pytest.mark.parametrize("model", FIXTURES)
@pytest.mark.parametrize("tp", [1, 2, 8])
@pytest.mark.parametrize("pp", [1, 4])
def test_formula_within_one_percent_of_the_tensors_per_rank(model, tp, pp):
    config = model_config(model)
    facts = read_model_facts(config)
    rw = rank_weights(llama_like(config))
    assert rw is not None
    exact = rw.max_stage_bytes(facts.num_hidden_layers, tp, 1, facts.total_num_kv_heads, pp)
    formula = estimate_weights(facts, tp, 1, False, 2, None).max_stage_bytes(pp)
    assert formula == pytest.approx(exact, rel=0.01)


def test_llama_70b_per_rank_bytes():
    """TP 8: every linear 1/8, the 128256-row vocabulary (a multiple of 64) 1/8 each way, norms whole."""
    facts = read_model_facts(model_config("meta-llama__Meta-Llama-3.1-70B"))
    rw = rank_weights(llama_like(model_config("meta-llama__Meta-Llama-3.1-70B")))
    assert rw is not None
    H = 8192
    layer = (2 * H * H + 2 * 1024 * H + 3 * H * 28672) * 2 // 8 + 2 * H * 2
    vocab = 128256 * H * 2 // 8
    assert rw.layer_rank(0, 8, 1, facts.total_num_kv_heads) == layer
    assert rw.max_stage_bytes(80, 8, 1, 8, 1) == 80 * layer + 2 * vocab + H * 2


def test_kv_heads_replicate_past_tp_and_experts_split_over_tp_times_dp():
    rw = rank_weights(
        {
            t.name: t
            for t in (
                _t("model.layers.0.self_attn.q_proj.weight", (4096, 4096)),
                _t("model.layers.0.self_attn.k_proj.weight", (1024, 4096)),  # 8 KV heads of 128
                _t("model.layers.0.self_attn.o_proj.bias", (4096,)),  # row-parallel bias: whole on every rank
                _t("model.layers.0.mlp.gate.weight", (64, 4096)),  # the router: replicated
                _t("model.layers.0.mlp.experts.0.up_proj.weight", (1024, 4096)),
            )
        }
    )
    assert rw is not None
    split, kv, repl, experts = rw.layers[0]
    assert (split, kv, repl, experts) == (4096 * 4096 * 2, 1024 * 4096 * 2, 4096 * 2 + 64 * 4096 * 2, 1024 * 4096 * 2)
    # TP 16 > 8 KV heads: one head per rank (linear.py:1065-1068), not 1/16 of them
    assert rw.layer_rank(0, 16, 1, 8) == split // 16 + kv // 8 + repl + experts // 16
    assert rw.layer_rank(0, 4, 2, 8) == split // 4 + kv // 4 + repl + experts // 8


def test_vocab_padded_to_64_rows_and_towers_left_out():
    rw = rank_weights(
        {
            t.name: t
            for t in (
                _t("model.embed_tokens.weight", (32001, 128)),
                _t("lm_head.weight", (32001, 128)),
                _t("model.norm.weight", (128,)),
                _t("vision_tower.blocks.0.attn.qkv.weight", (384, 128)),
                _t("model.layers.0.input_layernorm.weight", (128,)),
            )
        }
    )
    assert rw is not None
    assert rw.excluded == 384 * 128 * 2 and rw.final == 128 * 2 and rw.layers == ((0, 0, 256, 0),)
    # 32001 rows → 32064 padded → 4008 rows per rank of 8
    assert rw.vocab_rank(rw.embedding, 8) == 4008 * 128 * 2
    assert rw.stage_bytes(1, 8, 1, 1, 2, 0) == 4008 * 256 + 256  # stage 0: embedding + layer 0
    assert rw.stage_bytes(1, 8, 1, 1, 2, 1) == 4008 * 256 + 256  # last stage: LM head + final norm


def test_layers_past_num_hidden_layers_are_not_counted():
    """DeepSeek's MTP layer (model.layers.61 of 61): vLLM builds it only as a draft."""
    rw = rank_weights({t.name: t for t in (_t(f"model.layers.{i}.mlp.down_proj.weight", (64, 64)) for i in range(3))})
    assert rw is not None
    assert rw.max_stage_bytes(2, 1, 1, 1, 1) == 2 * 64 * 64 * 2


def test_not_described_per_rank_checkpoints_or_huge_layer_numbers():
    assert rank_weights({"rank0/model.norm.weight": _t("rank0/model.norm.weight", (8,))}) is None
    big = f"model.layers.{MAX_LAYERS}.mlp.down_proj.weight"
    assert rank_weights({big: _t(big, (8, 8))}) is None


def test_record_round_trips():
    rw = rank_weights(llama_like(model_config("Qwen__Qwen3-30B-A3B")))
    assert rw is not None
    assert RankWeights.from_dict(rw.as_dict()) == rw
    assert len(rw.as_dict()["layers"]) == 48


# -- the budget: the tensors when the request carries them, the formula otherwise ----------------------------------
def _budget(model: str, ranks: dict | None, **engine_args):
    from service.domain.context import build_context
    from service.domain.memory import compute_budget
    from service.domain.request import LaunchRequest
    from tests.support import request

    req = request(model, **engine_args)
    if ranks is not None:
        req["model"]["tensor_ranks"] = ranks
    return compute_budget(build_context(LaunchRequest.model_validate(req)))


def test_budget_uses_the_tensors_and_says_so():
    model = "meta-llama__Meta-Llama-3.1-70B"
    rw = rank_weights(llama_like(model_config(model)))
    assert rw is not None
    b = _budget(model, rw.as_dict(), tensor_parallel_size=4, pipeline_parallel_size=2)
    assert b.weights_source == "checkpoint tensors, split as vLLM shards them"
    assert b.weights_bytes_per_gpu == rw.max_stage_bytes(80, 4, 1, 8, 2)
    estimated = _budget(model, None, tensor_parallel_size=4, pipeline_parallel_size=2)
    assert estimated.weights_source.startswith("estimated from config.json")
    assert estimated.weights_bytes_per_gpu == pytest.approx(b.weights_bytes_per_gpu, rel=0.01)


def test_budget_falls_back_when_the_tensors_do_not_describe_the_load():
    model = "meta-llama__Meta-Llama-3.1-8B"
    rw = rank_weights(llama_like(model_config(model)))
    assert rw is not None
    online = _budget(model, rw.as_dict(), tensor_parallel_size=1, quantization="fp8")  # vLLM converts at load
    assert online.weights_source.startswith("estimated from config.json")
    short = rw.as_dict()
    short["layers"] = short["layers"][:16]  # names the record did not recognise: layers missing
    assert _budget(model, short, tensor_parallel_size=1).weights_source.startswith("estimated from config.json")


def test_request_refuses_a_malformed_record():
    from pydantic import ValidationError

    from service.domain.request import LaunchRequest
    from tests.support import request

    req = request("meta-llama__Meta-Llama-3.1-8B")
    req["model"]["tensor_ranks"] = {"layers": [[1, 2, 3]], "embedding": [0, 0], "lm_head": [0, 0], "final": 0}
    with pytest.raises(ValidationError) as exc:
        LaunchRequest.model_validate(req)
    assert {e["loc"][-1] for e in exc.value.errors()} >= {"excluded"}
