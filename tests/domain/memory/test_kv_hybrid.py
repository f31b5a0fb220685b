"""KV cache of hybrid models (service/domain/memory/kv_specs.py, kv_cache.py): only attention layers grow with the
length, a Mamba-like layer holds one state per sequence, and vLLM groups the layers into KV cache groups of equal
page size. Figures are worked by hand from vLLM's formulas (each test says which), and two real start-up logs are
reproduced to the token from the pool they printed."""

from __future__ import annotations

import pytest

from service.domain.context import build_context
from service.domain.gpus import GIB
from service.domain.memory import compute_budget
from service.domain.request import LaunchRequest
from tests.support import model_config, request

NEMOTRON = "nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
QWEN35 = "Qwen__Qwen3.5-35B-A3B"


def budget(
    model: str,
    gpu: str = "h100-sxm-80gb",
    version: str | None = None,
    config: dict | None = None,
    workload: dict | None = None,
    **args,
):
    req = request(model, gpu, count=8, environment="benchmark", **args)
    req["workload"] = workload
    if config is not None:
        req["model"]["config"] = config
    if version:
        req["vllm_version"] = version
    return compute_budget(build_context(LaunchRequest.model_validate(req)))


def test_nemotron3_nano_charges_six_attention_layers_and_a_mamba_state_per_sequence():
    """52 layers = 23 Mamba2 + 23 MoE + 6 attention (hybrid_override_pattern), TP 1, vLLM 0.33:

    attention: 2 KV heads × 128 × 2 (K, V) × 2 B = 1,024 B per token and layer → 6,144 B/token (not 52 layers);
    Mamba2 state (mamba_utils.py:186-210): conv (4 − 1) × (64·64 + 2·8·128) × 2 B = 36,864 B, SSM 64 × 64 × 128 × 4 B
    (mamba_ssm_cache_dtype float32) = 2,097,152 B → 2,134,016 B;
    block = 16 × cdiv(2,134,016, 16 × 1,024) = 16 × 131 = 2,096 tokens; page = 2,096 × 1,024 = 2,146,304 B
    (platforms/interface.py:1098-1128); groups: 23 ≥ 1.5 × 6 → 6 layers a group, 1 attention + cdiv(23, 6) = 4
    Mamba groups (kv_cache_planning.py:521-556); bytes per block = 6 × 2,146,304 = 12,877,824;
    a 262,144-token request: cdiv(262,144, 2,096) = 126 attention blocks + 4 × 3 state blocks (prefix caching on by
    default: align mode, 2 + 1 prefill checkpoint; kv_cache_interface.py:1135-1141) = 138."""
    b = budget(NEMOTRON, tensor_parallel_size=1)
    assert b.kv_bytes_per_token_per_gpu == 6_144
    assert b.block_size == 2_096
    assert b.bytes_per_block == 12_877_824
    assert b.kv_layers_per_gpu == 29
    assert [(g["kind"], g["layers"], g["groups"]) for g in b.kv_cache_groups] == [("full", 6, 1), ("state", 23, 4)]
    assert b.max_concurrency == b.num_gpu_blocks / 138
    assert b.kv_cache_tokens == int(b.num_gpu_blocks / 138 * 262_144)
    assert b.kv_state_bytes_per_seq == 12 * 12_877_824


def test_nemotron_without_prefix_caching_holds_one_state_block_a_group():
    """mamba_cache_mode none: 1 block per state group → 126 + 4 = 130 blocks per 262,144-token request; TP 2 halves
    the state (groups 8 divisible by 2) and the KV heads: 1,067,008 B against 512 B/token → the same 2,096 block."""
    b = budget(NEMOTRON, tensor_parallel_size=2, enable_prefix_caching=False)
    assert b.block_size == 2_096
    assert b.bytes_per_block == 6 * 2_096 * 512
    assert b.max_concurrency == b.num_gpu_blocks / 130


def test_mamba_state_makes_max_num_seqs_bound_per_sequence():
    """At 1,000 tokens a request takes 1 attention block + 12 state blocks: the state, not the tokens, bounds the
    sequences the pool holds."""
    b = budget(NEMOTRON, tensor_parallel_size=1, workload={"avg_seq_len": 1000})
    assert b.max_num_seqs_bound == b.num_gpu_blocks // 13


def test_qwen35_gated_deltanet_on_hopper_and_ampere():
    """Qwen3.5-35B-A3B: 10 full-attention + 30 Gated DeltaNet layers (layer_types). Attention 2 × 256 × 2 × 2 B =
    2,048 B/token; GDN state (mamba_utils.py:272-294): conv 3 × (2·16·128 + 32·128) × 2 B = 49,152 B, recurrent
    32 × 128 × 128 × 4 B (mamba_ssm_dtype float32) = 2,097,152 B → 2,146,304 B. Groups of 10: 1 + 3.

    H100: FlashInfer GDN prefill exports checkpoints in align mode, so blocks are multiples of lcm(16, 64) = 64
    (gdn_attn.py:34): 64 × cdiv(2,146,304, 64 × 2,048) = 1,088; a 262,144-token request cdiv(262,144, 1,088) = 241
    + 3 × 3 = 250 blocks. A100 (Triton GDN, no checkpoint): 16 × cdiv(2,146,304, 16 × 2,048) = 1,056; 249 + 3 × 2 = 255."""
    h100 = budget(QWEN35, tensor_parallel_size=2)
    assert (h100.block_size, h100.bytes_per_block) == (1_088, 10 * 1_088 * 1_024)
    assert h100.max_concurrency == h100.num_gpu_blocks / 250
    a100 = budget(QWEN35, "a100-sxm4-80gb", tensor_parallel_size=2)
    assert a100.block_size == 1_056
    assert a100.max_concurrency == a100.num_gpu_blocks / 255


def test_qwen3_next_style_config_without_layer_types():
    """Qwen3-Next / Qwen3.5 configs may omit layer_types: Transformers derives them from full_attention_interval
    (every 4th layer full attention), and so does the layout."""
    cfg = model_config(QWEN35)
    text = cfg.get("text_config", cfg)
    text.pop("layer_types")
    assert (
        budget(QWEN35, config=cfg, tensor_parallel_size=2).kv_cache_groups
        == budget(QWEN35, tensor_parallel_size=2).kv_cache_groups
    )


@pytest.mark.parametrize(
    ("pool_gib", "tokens", "concurrency"),
    [(5.98, 567_978, 4.33), (6.01, 569_878, 4.35)],
)
def test_qwen36_35b_a3b_rtx5090_logs(pool_gib, tokens, concurrency):
    """Two vLLM 0.24.0 start-up logs of Qwen3.6-35B-A3B (NVFP4) on one RTX 5090 — github.com/noonghunna/club-3090
    issues 612 and 652: kv_cache_dtype fp8, prefix caching on, max_model_len 131,072 — printed "Available KV cache
    memory: 5.98 GiB / 6.01 GiB", "GPU KV cache size: 567,978 / 569,878 tokens", "Maximum concurrency … 4.33x /
    4.35x". Qwen3.6-35B-A3B is the Qwen3.5-35B-A3B architecture (qwen3_5_moe: 30 GDN + 10 gated-attention layers).

    fp8 attention: 2 × 256 × 2 × 1 B = 1,024 B/token; GDN state 2,146,304 B (bf16 conv, float32 recurrent state);
    block 16 × cdiv(2,146,304, 16 × 1,024) = 2,096, page 2,146,304 (no padding); bytes per block 10 × 2,146,304 =
    21,463,040 → 299 / 300 blocks; 0.24 with prefix caching: align mode, 2 blocks a GDN group and no checkpoint
    block → 63 + 3 × 2 = 69 blocks a request: 299 / 69 = 4.333 → int(4.333 × 131,072) = 567,978 (a float32 state
    would give 4.54x, one state block 4.60x, the 40 layers as attention 0.74x)."""
    req = {
        "model": {"name": "Qwen/Qwen3.6-35B-A3B", "config": model_config(QWEN35)},
        "hardware": {
            "gpu": {"name": "NVIDIA GeForce RTX 5090", "compute_capability": "12.0", "memory_bytes": 33_666_482_176},
            "count": 1,
        },
        "vllm_version": "0.24.0",
        "environment": "benchmark",
        "engine_args": {
            "max_model_len": 131_072,
            "kv_cache_dtype": "fp8",
            "enable_prefix_caching": True,
            "max_num_batched_tokens": 8192,
            "max_num_seqs": 1,
            "kv_cache_memory_bytes": int(pool_gib * GIB),
        },
    }
    b = compute_budget(build_context(LaunchRequest.model_validate(req)))
    assert b.bytes_per_block == 21_463_040
    assert b.kv_cache_tokens == tokens
    assert round(b.max_concurrency, 2) == concurrency


def test_releases_before_021_print_blocks_per_group():
    """vLLM 0.18.1 (prefix caching off for hybrids before 0.26: one state block a group) printed
    num_blocks // KV cache groups × smallest group block size (vllm 0.20.0 v1/core/kv_cache_utils.py:1689-1703):
    5 groups, block 2,096."""
    b = budget(NEMOTRON, version="0.18.1", tensor_parallel_size=1)
    assert b.block_size == 2_096
    assert b.kv_cache_tokens == b.num_gpu_blocks // 5 * 2_096
    assert b.max_concurrency == b.num_gpu_blocks / 130


def test_mamba_models_ran_on_v0_before_010():
    """Before 0.10 V1 refused Mamba layers (vllm 0.9.2 engine/arg_utils.py:1396-1405): V0 caches the 6 attention
    layers in blocks of 16 and keeps the Mamba state beside the pool for max_num_seqs (256 → 256) sequences: 23 ×
    (36,864 + 64·64·128·2) B = 23 × 1,085,440 B each (auto SSM dtype before 0.13)."""
    b = budget(NEMOTRON, version="0.9.2", tensor_parallel_size=1)
    assert b.accounting["engine"] == "v0"
    assert (b.kv_layers_per_gpu, b.block_size, b.bytes_per_block) == (6, 16, 16 * 6_144)
    assert b.kv_state_bytes_per_seq == 0
    pool_without = b.usable_bytes - b.weights_bytes_per_gpu - b.overhead_bytes
    assert pool_without - b.pool_raw_bytes == 256 * 23 * 1_085_440


def test_gpt_oss_eagle_draft_pads_the_sliding_group():
    """gpt-oss-120b + an EAGLE layer: 18 sliding vs 19 full layers; 19 < 1.5 × 18, so groups of 19 layers, the
    sliding one padded (kv_cache_planning.py:521-533): a block is 19 pages of 16 × 2,048 B."""
    b = budget("openai__gpt-oss-120b", tensor_parallel_size=1, speculative_config={"method": "eagle3"})
    assert b.bytes_per_block == 19 * 16 * 2_048
    assert [(g["kind"], g["groups"]) for g in b.kv_cache_groups] == [("full", 1), ("sliding", 1)]


def test_deepseek_v4_pro_packs_its_caches_per_block():
    """DeepSeek-V4-Pro (compress_ratios: 30 layers of ratio 4, 31 of ratio 128; a 128-token window on all 61), TP 8,
    fp8_ds_mla pages padded to 576 B (kv_dsv4.py): compressed latent 64 × 584 → 37,440 (ratio 4), 2 × 584 → 1,728
    (ratio 128); indexer keys 64 × 132 → 8,640; sliding window 64 × 584 → 37,440; compressor states 4 × 2,048 × 4 B
    and 8 × 1,024 × 4 B → 32,832, the indexer's 4 × 512 × 4 B → 8,640.

    Buckets: latent + indexer (unbalanced: 30/31/30 layers) one group of 30 × 37,440 + 31 × 1,728 + 30 × 8,640 =
    1,435,968 B; chunk = approximate_gcd([61, 30, 31], ≥ 30) = 31 → sliding window 2 groups (31 × 37,440), ratio-4
    compressors 1 group (30 × 41,472), ratio-128 1 group (31 × 32,832); a block is the widest group, 1,435,968 B
    (kv_cache_planning.py:914-1041). KV per token 1,435,968 / 256 = 5,609 B (not 61 × 2,048 = 124,928).
    A request of L tokens, T in flight: cdiv(L, 256) + 2 × (cdiv(min(127 + T, L), 64) + 1)
    + cdiv(min(7 + T, L), 4) + 1 + cdiv(min(127 + T, L), 8) + 1 (kv_cache_interface.py:643-648, 918-955)."""
    b = budget("deepseek-ai__DeepSeek-V4-Pro", "h200-141gb", tensor_parallel_size=8)
    assert (b.block_size, b.bytes_per_block, b.kv_bytes_per_token_per_gpu) == (256, 1_435_968, 5_609)
    assert [(g["page_bytes"], g["groups"]) for g in b.kv_cache_groups] == [
        (1_435_968, 1),
        (37_440, 2),
        (32_832 + 8_640, 1),
        (32_832, 1),
    ]
    L, T = b.max_model_len, b.profiled_tokens
    bpr = -(-L // 256) + 2 * (-(-min(127 + T, L) // 64) + 1) + -(-min(7 + T, L) // 4) + 1 + -(-min(127 + T, L) // 8) + 1
    assert b.max_concurrency == b.num_gpu_blocks / bpr
    assert b.kv_layers_per_gpu == 61


def test_approximate_gcd_is_vllms_least_padding():
    from service.domain.memory.kv_dsv4 import approximate_gcd

    assert approximate_gcd([61, 30, 31], 30) == 31
    assert approximate_gcd([12, 12], 12) == 12
    assert approximate_gcd([4, 6], 1) == 2  # no padding at 1 or 2: a tie takes the larger
