"""Model-family facts across every fixture config of the family: Llama 4's interleaved MoE layers (weights), and
the length vLLM derives for configs without a length key (Transformers' config class default)."""

from __future__ import annotations

import json

import pytest

from service.domain.memory import estimate_weights
from service.domain.model_facts import read_model_facts
from service.domain.request import LaunchRequest
from service.domain.validate import validate
from service.domain.versions import resolve_version
from tests.support import CASES, MODELS, model_config, request

LINE = resolve_version("0.33.0")[1]
LLAMA4 = {  # fixture -> (published total parameters incl. the ~0.9B vision tower, MoE layers)
    "meta-llama__Llama-4-Maverick-17B-128E-Instruct": (400e9, 24),
    "meta-llama__Llama-4-Scout-17B-16E-Instruct": (109e9, 48),
}


@pytest.mark.parametrize("fixture", sorted(LLAMA4))
def test_llama4_weights_count_only_the_interleaved_moe_layers(fixture):
    total, moe_layers = LLAMA4[fixture]
    est = estimate_weights(read_model_facts(model_config(fixture)), 8, 1, False, 2, None)
    assert est.moe_layers == moe_layers
    assert abs(est.total_params - total) / total < 0.02, est.total_params


def test_every_llama4_fixture_is_covered():
    family = {
        p.name
        for p in MODELS.iterdir()
        if (p / "config.json").exists() and json.loads((p / "config.json").read_text()).get("model_type") == "llama4"
    }
    assert family == set(LLAMA4)


def test_maverick_tp8_pp2_over_two_h100_nodes_passes():
    req = request(
        "meta-llama__Llama-4-Maverick-17B-128E-Instruct",
        count=8,
        nodes=2,
        tensor_parallel_size=8,
        pipeline_parallel_size=2,
        distributed_executor_backend="ray",
        max_model_len=8192,
        gpu_memory_utilization=0.9,
    )
    r = validate(LaunchRequest.model_validate(req), alternatives=False)
    assert r.verdict != "reject", [f.message for f in r.errors]
    assert 45 < r.budget["weights_bytes_per_gpu"] / 2**30 < 48  # 746 GiB over 16 GPUs


def _falcon_configs():
    out = {
        p.name: json.loads((p / "config.json").read_text())
        for p in MODELS.iterdir()
        if (p / "config.json").exists() and json.loads((p / "config.json").read_text()).get("model_type") == "falcon"
    }
    for path in sorted((CASES / "handed").glob("*.json")):
        case = json.loads(path.read_text())
        cfg = case["model"].get("config")
        if isinstance(cfg, dict) and cfg.get("model_type") == "falcon":
            out[path.stem] = cfg
    return out


FALCON = _falcon_configs()


@pytest.mark.parametrize("name", sorted(FALCON))
def test_falcon_without_a_length_key_derives_2048_like_vllm(name):
    cfg = FALCON[name]
    assert not any(k in cfg for k in ("max_position_embeddings", "n_positions", "seq_length"))
    facts = read_model_facts(cfg, None, LINE.length_defaults)
    assert (facts.derived_max_model_len, facts.max_len_key) == (2048, "max_position_embeddings")


def test_length_defaults_come_from_transformers_config_classes():
    assert LINE.length_defaults["falcon"] == {"max_position_embeddings": 2048}
    assert LINE.length_defaults["llama"]["max_position_embeddings"] == 2048


@pytest.mark.parametrize(
    "fixture,interleave",
    [("meta-llama__Llama-4-Maverick-17B-128E-Instruct", 2), ("meta-llama__Llama-4-Scout-17B-16E-Instruct", 1)],
)
def test_llama4_moe_layers_per_pipeline_stage_follow_the_interleave(fixture, interleave):
    est = estimate_weights(read_model_facts(model_config(fixture)), 8, 1, False, 2, None)
    for lo, hi in ((0, 48), (0, 24), (24, 48), (0, 1), (1, 2), (5, 17), (47, 48)):
        assert est.moe_in(lo, hi) == sum(1 for i in range(lo, hi) if (i + 1) % interleave == 0), (lo, hi)
