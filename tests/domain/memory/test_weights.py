"""Weights (service/domain/memory/weights.py) on real configs: parameters from config.json, MXFP4 experts, a
manifest's weights_bytes split like the estimate, and hybrid / DeepSeek-V4 layers costed by kind."""

from __future__ import annotations

import pytest

from service.domain.context import build_context
from service.domain.errors import DomainError
from service.domain.layer_layout import LayerKind
from service.domain.memory import compute_budget, estimate_weights
from service.domain.model_facts import read_model_facts
from service.domain.request import LaunchRequest
from service.domain.validate import validate
from tests.support import model_config, request
from tests.support.memory import budget


def test_llama31_70b_params_from_config():
    ctx, b = budget("meta-llama__Meta-Llama-3.1-70B", tensor_parallel_size=4)
    assert b.weights_params == pytest.approx(70.55e9, rel=0.002)


def test_manifest_weights_bytes_used_when_known():
    req = request("meta-llama__Meta-Llama-3.1-70B", tensor_parallel_size=4)
    req["model"]["weights_bytes"] = 141_107_412_992  # bf16 70.55e9 × 2
    ctx = build_context(LaunchRequest.model_validate(req))
    b = compute_budget(ctx)
    assert b.weights_source.startswith("manifest")
    assert b.weights_bytes_per_gpu == pytest.approx(141_107_412_992 / 4, rel=0.01)


def test_gpt_oss_mxfp4_weights():
    """gpt-oss-120b: ~61 GB checkpoint (MXFP4 experts, bf16 attention/embeddings) on one GPU."""
    ctx = build_context(LaunchRequest.model_validate(request("openai__gpt-oss-120b", count=1)))
    est = estimate_weights(ctx.facts, 1, 1, False, 2, None)
    assert 60e9 <= est.total_bytes <= 67e9


# -- every family from one layer layout (service/domain/layer_layout.py, memory/layer_costs.py) ----------------------
NEMOTRON = "nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
# 31.58 B parameters: llama.cpp's print_info of the converted checkpoint (lmstudio-ai/lmstudio-bug-tracker#1365,
# "model params = 31.58 B"); NVIDIA publishes 31.6 B. The index's total_size was not retrievable (SOURCES.md), so the
# BF16 checkpoint is taken as 2 bytes per parameter.
NEMOTRON_CHECKPOINT_BYTES = 31.58e9 * 2
DSV4 = "deepseek-ai__DeepSeek-V4-Pro"
# The checkpoint's 64 safetensors files: 805.32 GiB of tensors (805.33 GiB on disk), MTP layer included
# (model report in the code index, file id 62525154746; SOURCES.md).
DSV4_CHECKPOINT_BYTES = 805.32 * 2**30


def test_nemotron_h_layers_follow_the_hybrid_pattern():
    facts = read_model_facts(model_config(NEMOTRON))
    kinds = dict(zip(facts.layout.kinds, facts.layout.counts(0, 52), strict=True))
    assert {(k.mixer, k.mlp): n for k, n in kinds.items()} == {
        ("mamba2", "none"): 23,
        ("none", "moe"): 23,
        ("attention", "none"): 6,
    }
    assert facts.layout.count_where(0, 6, mixer="attention") == 1  # "MEMEM*": layer 5


def test_nemotron3_nano_bf16_weights_match_the_checkpoint():
    est = estimate_weights(read_model_facts(model_config(NEMOTRON)), 1, 1, False, 2, None)
    assert abs(est.total_bytes / NEMOTRON_CHECKPOINT_BYTES - 1) < 0.03, est.total_bytes
    assert est.moe_layers == 23


def test_nemotron3_nano_bf16_fits_one_b200():
    r = validate(
        LaunchRequest.model_validate(request(NEMOTRON, gpu="b200-180gb", count=1, trust_remote_code=True)),
        alternatives=False,
    )
    assert not r.errors, [(f.rule, f.message) for f in r.errors]
    assert abs(r.budget["weights_bytes_per_gpu"] / NEMOTRON_CHECKPOINT_BYTES - 1) < 0.03


def test_mamba2_groups_that_tp_does_not_divide_are_replicated():
    """n_groups 8 at TP 16: vLLM extends the groups to 16 (mamba_utils.py:261-269), so a rank holds more than 1/16."""
    facts = read_model_facts(model_config(NEMOTRON))
    mamba = facts.layout.kinds.index(LayerKind("mamba2", "none"))
    whole = estimate_weights(facts, 1, 1, False, 2, None).kind_rank[mamba]
    assert estimate_weights(facts, 8, 1, False, 2, None).kind_rank[mamba] == pytest.approx(whole / 8, rel=1e-3)
    assert estimate_weights(facts, 16, 1, False, 2, None).kind_rank[mamba] > whole / 16 * 1.01


def test_deepseek_v4_pro_weights_match_the_checkpoint():
    est = estimate_weights(read_model_facts(model_config(DSV4)), 16, 1, False, 2, None)
    assert abs(est.checkpoint_bytes / DSV4_CHECKPOINT_BYTES - 1) < 0.03, est.checkpoint_bytes / 2**30
    assert est.total_bytes < est.checkpoint_bytes  # vLLM loads the MTP layer only as a speculative draft
    assert "experts 0.5312 B/param" in est.quant  # expert_dtype defaults to fp4: MXFP4 experts


def test_deepseek_v4_pro_fp8_tp16_is_not_refused_for_block_alignment():
    req = request(DSV4, gpu="b200-180gb", count=8, nodes=2, tensor_parallel_size=16)
    req["engine_args"]["distributed_executor_backend"] = "ray"
    r = validate(LaunchRequest.model_validate(req), alternatives=False)
    assert not r.errors, [(f.rule, f.message) for f in r.errors]
    assert 50 < r.budget["weights_bytes_per_gpu"] / 2**30 < 56


def test_deepseek_v4_on_rocm_builds_its_shared_expert_unpadded():
    req = request(DSV4, gpu="mi300x-192gb", count=8, nodes=2, tensor_parallel_size=16)
    req["engine_args"]["distributed_executor_backend"] = "ray"
    r = validate(LaunchRequest.model_validate(req), alternatives=False)
    [f] = [f for f in r.errors if f.rule == "fp8_block_alignment"]
    # the merged gate/up (192 per rank) is let through (vllm 0.33.0 linear.py:562-581); its down_proj is not
    assert "input_size_per_partition = 192 is not divisible by weight quantization block_k = 128" in f.message


def test_a_manifest_total_size_with_mtp_layers_splits_like_the_estimate():
    req = request(DSV4, gpu="b200-180gb", count=8, nodes=2, tensor_parallel_size=16)
    req["engine_args"]["distributed_executor_backend"] = "ray"
    req["model"]["weights_bytes"] = int(DSV4_CHECKPOINT_BYTES)
    b = compute_budget(build_context(LaunchRequest.model_validate(req)))
    est = estimate_weights(read_model_facts(model_config(DSV4)), 16, 1, False, 2, None)
    assert b.weights_bytes_per_gpu == pytest.approx(
        est.max_stage_bytes(1) * DSV4_CHECKPOINT_BYTES / est.checkpoint_bytes, rel=1e-3
    )


def test_qwen_moe_sparse_step_counts_layers_like_vllm():
    """Qwen-MoE: layer i is MoE iff i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0
    (qwen3_moe.py:385-391)."""
    cfg = {**model_config("Qwen__Qwen3-30B-A3B"), "decoder_sparse_step": 2, "mlp_only_layers": [1, 2]}
    facts = read_model_facts(cfg)
    want = [i for i in range(48) if i not in (1, 2) and (i + 1) % 2 == 0]
    assert facts.layout.count_where(0, 48, mlp="moe") == len(want)
    assert facts.layout.count_where(0, 8, mlp="moe") == sum(1 for i in want if i < 8)


@pytest.mark.parametrize("pattern", ["MEMEM*E", "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEMX", 52])
def test_a_hybrid_pattern_vllm_cannot_build_is_a_422_naming_it(pattern):
    with pytest.raises(DomainError) as e:
        read_model_facts({**model_config(NEMOTRON), "hybrid_override_pattern": pattern})
    assert e.value.field == "model.config.hybrid_override_pattern"


def test_qwen35_gated_deltanet_layers_and_size():
    """Qwen3.5-35B-A3B: layer_types gives 30 Gated DeltaNet + 10 gated-attention layers, every one MoE; 35 B total
    parameters published (transformers docs/source/en/model_doc/qwen3_5_moe.md: "35B total/3B active", vision tower
    of ~0.4 B included)."""
    facts = read_model_facts(model_config("Qwen__Qwen3.5-35B-A3B"))
    assert facts.layout.count_where(0, 40, mixer="gdn") == 30
    assert facts.layout.count_where(0, 40, mixer="attention", mlp="moe") == 10
    est = estimate_weights(facts, 1, 1, False, 2, None)
    assert abs(est.total_params / 35e9 - 1) < 0.03, est.total_params
    assert est.checkpoint_bytes > est.total_bytes  # mtp_num_hidden_layers: 1


def test_the_layout_cache_does_not_serve_one_config_for_another_that_compares_equal():
    """The layout cache is shared by every request: lists equal in Python (``[4.0] == [4]``) but read differently
    must not share an entry, or one request's config decides another's layout."""
    from service.domain.layer_layout import _layout, layer_layout

    for ratios in ([4.0, 128.0, 0.0], [4, 128, 0]):
        args = ({"compress_ratios": ratios}, 3, "deepseek_v4", 0, 0, False, "")
        assert layer_layout(*args) == _layout(*args)


def test_an_integral_float_in_mlp_only_layers_names_that_layer():
    """vLLM tests ``layer_idx not in config.mlp_only_layers`` (qwen3_moe.py:385-391): 3.0 names layer 3 as 3 does."""
    cfg = model_config("Qwen__Qwen3-30B-A3B")
    as_float = read_model_facts({**cfg, "mlp_only_layers": [3.0]}).layout
    as_int = read_model_facts({**cfg, "mlp_only_layers": [3]}).layout
    assert as_float.count_where(0, 48, mlp="moe") == as_int.count_where(0, 48, mlp="moe") == 47
