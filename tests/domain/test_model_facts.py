"""config.json facts read the way vLLM 0.33 reads them, on the real fixture configs."""

from __future__ import annotations

import pytest

from service.domain.errors import DomainError
from service.domain.model_facts import derive_max_model_len, read_model_facts
from tests.support import hf_quant_config, model_config

# name: (heads, kv_heads, head_dim, layers, derived max len, checkpoint quant method)
EXPECTED = {
    "01-ai__Yi-34B": (56, 8, 128, 60, 4096, None),
    "Qwen__Qwen2.5-72B-Instruct": (64, 8, 128, 80, 32768, None),
    "Qwen__Qwen3-235B-A22B-FP8": (64, 4, 128, 94, 40960, "fp8"),
    "Qwen__Qwen3-30B-A3B": (32, 4, 128, 48, 40960, None),
    "Qwen__Qwen3-8B": (32, 8, 128, 36, 40960, None),
    "deepseek-ai__DeepSeek-V3": (128, 128, 576, 61, 163840, "fp8"),  # MLA: 512 + 64; yarn does not rescale
    "meta-llama__Llama-2-13b-hf": (40, 40, 128, 40, 4096, None),
    "meta-llama__Llama-3.1-8B-Instruct": (32, 8, 128, 32, 131072, None),  # llama3 rope: no rescale
    "meta-llama__Meta-Llama-3.1-405B": (128, 8, 128, 126, 131072, None),
    "meta-llama__Meta-Llama-3.1-70B": (64, 8, 128, 80, 131072, None),
    "microsoft__Phi-3-medium-4k-instruct": (40, 10, 128, 40, 4096, None),
    "mistralai__Mixtral-8x7B-Instruct-v0.1": (32, 8, 128, 32, 32768, None),
    "moonshotai__Kimi-K2.5": (64, 64, 576, 61, 262144, "compressed-tensors"),  # text_config of a VLM
    "nvidia__Llama-3.1-70B-Instruct-FP8": (64, 8, 128, 80, 131072, "modelopt"),  # from hf_quant_config.json
    "openai__gpt-oss-120b": (64, 8, 64, 36, 131072, "mxfp4"),  # explicit head_dim, not 2880/64
    "tiiuae__falcon-40b": (128, 8, 64, 60, 2048, None),  # num_kv_heads key; no length key → 2048
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_facts(name):
    f = read_model_facts(model_config(name), hf_quant_config(name))
    heads, kv, head_dim, layers, max_len, quant = EXPECTED[name]
    assert (f.num_attention_heads, f.total_num_kv_heads, f.head_dim, f.num_hidden_layers) == (
        heads,
        kv,
        head_dim,
        layers,
    )
    assert f.derived_max_model_len == max_len
    assert (f.quant.method if f.quant else None) == quant


def test_deepseek_v3_mla_and_moe_facts():
    f = read_model_facts(model_config("deepseek-ai__DeepSeek-V3"))
    assert f.is_mla and (f.kv_lora_rank, f.qk_rope_head_dim) == (512, 64)
    assert (f.num_experts, f.moe_intermediate_size, f.intermediate_size) == (256, 2048, 18432)
    assert f.quant.weight_block_size == (128, 128)


def test_kimi_reads_text_config_and_its_quantization():
    f = read_model_facts(model_config("moonshotai__Kimi-K2.5"))
    assert f.is_multimodal and f.model_type == "kimi_k2"
    assert (f.quant.bits, f.quant.group_size, f.quant.sym) == (4, 32, True)


def test_modelopt_kv_cache_quant_from_hf_quant_config():
    name = "nvidia__Llama-3.1-70B-Instruct-FP8"
    assert read_model_facts(model_config(name)).quant is None  # config.json alone looks like bf16
    assert read_model_facts(model_config(name), hf_quant_config(name)).quant.kv_cache_quant == "fp8"


@pytest.mark.parametrize(
    "text,expected",
    [
        ({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2.0}}, 8192),
        ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, 16384),
        (
            {
                "max_position_embeddings": 32768,
                "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
            },
            32768,
        ),
        (
            {
                "max_position_embeddings": 131072,
                "rope_scaling": {"type": "longrope", "factor": 32.0, "original_max_position_embeddings": 4096},
            },
            131072,  # LongRoPE never scales; its original length is only the default (tests/domain/test_max_len.py)
        ),
        ({"max_position_embeddings": 8192, "seq_length": 2048}, 2048),
        ({"max_position_embeddings": 8192, "model_max_length": 131072}, 131072),
        ({}, 2048),
    ],
)
def test_derived_max_len_rules(text, expected):
    assert derive_max_model_len(text, "llama")[0] == expected


def test_gemma3_rope_factor_never_scales():
    assert (
        derive_max_model_len(
            {"max_position_embeddings": 32768, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}, "gemma3_text"
        )[0]
        == 32768
    )


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda c: c.pop("num_attention_heads"), "num_attention_heads"),
        (lambda c: c.update(num_hidden_layers="many"), "num_hidden_layers"),
        (lambda c: c.update(num_key_value_heads=-1), "num_key_value_heads"),
    ],
)
def test_missing_or_invalid_keys_name_the_field(mutate, field):
    cfg = model_config("meta-llama__Meta-Llama-3.1-70B")
    mutate(cfg)
    with pytest.raises(DomainError) as exc:
        read_model_facts(cfg)
    assert field in exc.value.field


# Parameter counts the model pages publish (Hugging Face's safetensors metadata: "Model size"), against the estimate
# from config.json alone — a two-matrix MLP (Falcon: dense_h_to_4h, dense_4h_to_h; vllm 0.33.0
# model_executor/models/falcon.py:225-257) counted as a gated one put Falcon-40B at 57.9 B.
@pytest.mark.parametrize(
    "name, published_b, matrices",
    [
        ("tiiuae__falcon-40b", 41.8, 2),
        ("meta-llama__Meta-Llama-3.1-8B", 8.03, 3),
        ("meta-llama__Meta-Llama-3.1-70B", 70.6, 3),
    ],
)
def test_parameter_count_from_config_matches_the_published_size(name, published_b, matrices):
    from service.domain.memory import estimate_weights

    facts = read_model_facts(model_config(name))
    assert facts.mlp_matrices == matrices
    params = estimate_weights(facts, 1, 1, False, 2, None).total_params / 1e9
    assert params == pytest.approx(published_b, rel=0.005)
