"""service/domain/tensor_format.py: the format of small real checkpoints (written with the safetensors package in
the layouts vLLM's loaders create), and the tag / config claims the tensors contradict."""

from __future__ import annotations

import pytest

from service.domain.errors import DomainError
from service.domain.manifest_checks import check_manifest
from service.domain.tensor_format import detect_format
from service.domain.tensors import build_inventory, parse_header
from tests.support.safetensors_files import st_bytes

H, I, V = 64, 128, 256  # hidden, intermediate, vocabulary
PROJ = {"self_attn.q_proj": (H, H), "self_attn.o_proj": (H, H), "mlp.gate_proj": (H, I), "mlp.down_proj": (I, H)}


def _base(dtype: str = "BF16") -> dict:
    return {
        "model.embed_tokens.weight": (dtype, [V, H]),
        "model.layers.0.input_layernorm.weight": (dtype, [H]),
        "model.norm.weight": (dtype, [H]),
        "lm_head.weight": (dtype, [V, H]),
    }


def _layout(per_module) -> dict:
    out = _base()
    for name, (i, o) in PROJ.items():
        for param, spec in per_module(i, o).items():
            out[f"model.layers.0.{name}.{param}"] = spec
    return out


def gptq(bits=4, group=32):
    p = 32 // bits
    return _layout(
        lambda i, o: {
            "qweight": ("I32", [i // p, o]),
            "qzeros": ("I32", [i // group, o // p]),
            "scales": ("F16", [i // group, o]),
            "g_idx": ("I32", [i]),
        }
    )


def awq(bits=4, group=32):
    p = 32 // bits
    return _layout(
        lambda i, o: {
            "qweight": ("I32", [i, o // p]),
            "qzeros": ("I32", [i // group, o // p]),
            "scales": ("F16", [i // group, o]),
        }
    )


def ct_int4(group=32):
    return _layout(
        lambda i, o: {
            "weight_packed": ("I32", [o, i * 4 // 32]),
            "weight_scale": ("BF16", [o, i // group]),
            "weight_shape": ("I64", [2]),
        }
    )


def fp8(scale_shape):
    return _layout(lambda i, o: {"weight": ("F8_E4M3", [o, i]), **scale_shape(i, o)})


def fp8_block(b=32):
    return fp8(lambda i, o: {"weight_scale_inv": ("F32", [-(-o // b), -(-i // b)])})


def nvfp4():
    return _layout(
        lambda i, o: {
            "weight": ("U8", [o, i // 2]),
            "weight_scale": ("F8_E4M3", [o, i // 16]),
            "weight_scale_2": ("F32", []),
            "input_scale": ("F32", []),
        }
    )


def gpt_oss_mxfp4(experts=2):
    out = _base()
    for proj, (o, i) in {"gate_up_proj": (2 * I, H), "down_proj": (H, I)}.items():
        out[f"model.layers.0.mlp.experts.{proj}_blocks"] = ("U8", [experts, o, i // 32, 16])
        out[f"model.layers.0.mlp.experts.{proj}_scales"] = ("U8", [experts, o, i // 32])
        out[f"model.layers.0.mlp.experts.{proj}_bias"] = ("BF16", [experts, o])
    out["model.layers.0.self_attn.q_proj.weight"] = ("BF16", [H, H])
    return out


def bnb_nf4():
    out = _base()
    m = "model.layers.0.self_attn.q_proj.weight"
    out[m] = ("U8", [H * H // 2, 1])
    out[m + ".absmax"] = ("F32", [H * H // 64])
    out[m + ".quant_map"] = ("F32", [16])
    out[m + ".quant_state.bitsandbytes__nf4"] = ("U8", [100])
    return out


def fmt(layout, file="model.safetensors"):
    return detect_format(build_inventory([parse_header(st_bytes(layout), file)]).tensors)


@pytest.mark.parametrize(
    "layout, want",
    [
        (_layout(lambda i, o: {"weight": ("BF16", [o, i])}), {"scheme": "none", "weight_dtype": "BF16"}),
        (gptq(4, 32), {"scheme": "gptq", "bits": 4, "group_size": 32}),
        (gptq(8, 64), {"scheme": "gptq", "bits": 8, "group_size": 64}),
        (awq(4, 32), {"scheme": "awq", "bits": 4, "group_size": 32}),
        (ct_int4(32), {"scheme": "int_pack", "group_size": 32}),
        (fp8_block(32), {"scheme": "fp8", "granularity": "block", "block": [32, 32]}),
        (fp8(lambda i, o: {"weight_scale": ("F32", [])}), {"scheme": "fp8", "granularity": "tensor"}),
        (fp8(lambda i, o: {"weight_scale": ("F32", [o, 1])}), {"scheme": "fp8", "granularity": "channel"}),
        (nvfp4(), {"scheme": "nvfp4", "bits": 4, "group_size": 16}),
        (gpt_oss_mxfp4(), {"scheme": "mxfp4", "bits": 4, "group_size": 32}),
        (bnb_nf4(), {"scheme": "bitsandbytes", "bits": 4}),
    ],
    ids=[
        "bf16",
        "gptq4",
        "gptq8",
        "awq4",
        "ct_int4",
        "fp8_block",
        "fp8_tensor",
        "fp8_channel",
        "nvfp4",
        "mxfp4",
        "bnb",
    ],
)
def test_format_from_the_tensors(layout, want):
    got = fmt(layout).as_dict()
    assert {k: got.get(k) for k in want} == want


def test_symmetric_compressed_tensors_bits_from_the_hidden_width():
    f = fmt(ct_int4(32))
    assert f.bits == 4  # q_proj / gate_proj read the hidden state: 8 int32 words over 64 inputs


def test_unquantized_modules_named():
    f = fmt(gptq())
    assert dict(f.unquantized) == {"lm_head": 1}
    assert f.evidence and f.evidence.endswith(".qweight")
    layout = gptq()
    layout["model.visual.blocks.0.attn.qkv.weight"] = ("BF16", [3 * H, H])
    layout["model.layers.0.mlp.shared_expert.down_proj.weight"] = ("BF16", [H, I])
    assert dict(fmt(layout).unquantized) == {
        "lm_head": 1,
        "model.layers.*.mlp.shared_expert.down_proj": 1,
        "model.visual.blocks.*.attn.qkv": 1,
    }


def test_tp_sharded_checkpoint_counts_each_rank():
    """Per-rank files (vLLM's ShardedStateLoader names) hold the same names, each its rank's slice."""
    half = {"model.layers.0.self_attn.q_proj.weight": ("BF16", [H // 2, H]), "lm_head.weight": ("BF16", [V // 2, H])}
    headers = [parse_header(st_bytes(half), f"model-rank-{r}-part-0.safetensors") for r in (0, 1)]
    inv = build_inventory(headers)
    assert sorted(inv.tensors) == [
        "rank0/lm_head.weight",
        "rank0/model.layers.0.self_attn.q_proj.weight",
        "rank1/lm_head.weight",
        "rank1/model.layers.0.self_attn.q_proj.weight",
    ]
    assert inv.total_bytes == 2 * 2 * (H // 2 * H + V // 2 * H)


def _record(layout) -> dict:
    return {"format": fmt(layout).as_dict()}


def _refusal(layout, *, tag=None, config=None, hf=None) -> str:
    with pytest.raises(DomainError) as info:
        check_manifest({**LLAMA, **(config or {})}, hf, tag, _record(layout))
    assert info.value.rule == "quant_mismatch"
    return info.value.message


LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": H,
    "intermediate_size": I,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 1,
    "vocab_size": V,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
}
GPTQ_CONFIG = {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False}}
AWQ_CONFIG = {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True}}


def test_mislabeled_checkpoint_refused_naming_both_sides_and_the_tensor():
    """AWQ tensors under a GPTQ tag and config: both wrong, the tensor named."""
    msg = _refusal(awq(), tag="gptq\n", config=GPTQ_CONFIG)
    assert "quantization.txt says gptq" in msg and "the tensors are awq 4-bit group 32" in msg
    assert "model.layers.0.mlp.down_proj.qweight" in msg


def test_tag_right_config_wrong_says_which():
    msg = _refusal(awq(), tag="awq\n", config=GPTQ_CONFIG)
    assert msg.startswith("config.json says gptq") and "config.json is wrong" in msg
    assert "quantization.txt agrees with the tensors" in msg


def test_tag_wrong_config_right_says_which():
    msg = _refusal(awq(), tag="gptq\n", config=AWQ_CONFIG)
    assert msg.startswith("quantization.txt says gptq") and "quantization.txt is wrong" in msg


def test_unquantized_tag_on_quantized_tensors_and_the_reverse():
    assert "quantization.txt says unquantized weights" in _refusal(fp8_block(), tag="none\n")
    plain = _layout(lambda i, o: {"weight": ("BF16", [o, i])})
    msg = _refusal(plain, config=GPTQ_CONFIG)
    assert "config.json says gptq, a method that needs quantized tensors" in msg and "unquantized BF16" in msg


def test_bits_group_and_block_checked():
    msg = _refusal(gptq(8, 32), config=GPTQ_CONFIG)
    assert "gptq 4-bit" in msg and "8-bit" in msg
    bad = {"quantization_config": {**GPTQ_CONFIG["quantization_config"], "group_size": 128}}
    assert "group size 128" in _refusal(gptq(4, 32), config=bad)
    block = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    assert "block 128x128" in _refusal(fp8_block(32), config=block)


def test_agreeing_checkpoints_registered():
    check_manifest({**LLAMA, **GPTQ_CONFIG}, None, "gptq\n", _record(gptq()))
    check_manifest({**LLAMA, **AWQ_CONFIG}, None, "awq\n", _record(awq()))
    block = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [32, 32]}}
    check_manifest({**LLAMA, **block}, None, "fp8\n", _record(fp8_block(32)))
    plain = _layout(lambda i, o: {"weight": ("BF16", [o, i])})
    check_manifest(LLAMA, None, None, _record(plain))
    check_manifest(LLAMA, None, "fp8\n", _record(plain))  # online fp8
