"""The multimodal and communication terms of the memory model on real configs, each against the vLLM source it
mirrors: the vision tower's weights and multimodal profile (service/domain/multimodal.py) and the communication
buffers at TP > 1 (service/domain/memory/communication.py ``communication_buffers``)."""

from __future__ import annotations

import copy

import pytest

from bench.kv_accuracy import component_summary, evaluate
from service.domain.context import build_context
from service.domain.gpus import GIB, MIB
from service.domain.memory import NCCL_CONNECTION_BYTES, Accounting, communication_buffers, compute_budget
from service.domain.model_facts import read_model_facts
from service.domain.multimodal import mllama_image_geometry, per_patch_bytes, qwen_image_grid, vision_tower
from service.domain.request import LaunchRequest
from tests.support import CASES, case_request, load_case, request
from tests.support.multimodal import QWEN2_VL_7B, UI_TARS, vl_request

# Qwen2.5-VL-7B-Instruct's vision_config (the published values: gated SiLU MLP of 3420, out_hidden_size 3584)
QWEN25_VL_VISION = {
    "depth": 32,
    "fullatt_block_indexes": [7, 15, 23, 31],
    "hidden_act": "silu",
    "hidden_size": 1280,
    "in_chans": 3,
    "intermediate_size": 3420,
    "model_type": "qwen2_5_vl",
    "num_heads": 16,
    "out_hidden_size": 3584,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "spatial_patch_size": 14,
    "temporal_patch_size": 2,
    "tokens_per_second": 2,
    "window_size": 112,
}


def budget_of(req: LaunchRequest):
    return compute_budget(build_context(req))


# --- the vision tower ---------------------------------------------------------------------------------------------
def test_qwen2_vl_vision_tower_weights_match_what_vllm_printed():
    """Qwen2-VL-7B: 32 blocks of width 1280 (QKV + proj 4 W², fc1/fc2 2 × W × 5120), the merger (5120² + 5120 ×
    3584) and the Conv3d patch embedding — 675M parameters, 1.26 GiB in bf16 (qwen2_vl.py:394-520). With the text
    model that is the 15.51 GiB vLLM printed for UI-TARS-7B (0.6.6) and 15.53 GiB for a Qwen2-VL-7B fine-tune
    (0.13); without the tower the estimate was 1.3 GiB short."""
    tower = vision_tower(read_model_facts(QWEN2_VL_7B))
    assert (tower.family, tower.width, tower.depth, tower.mlp_width, tower.out_hidden) == (
        "qwen2_vl",
        1280,
        32,
        5120,
        3584,
    )
    assert tower.params == pytest.approx(675.6e6, rel=0.002)
    b = budget_of(
        vl_request(
            version="0.6.6",
            gpu={"name": "24 GB", "compute_capability": "8.6", "memory_bytes": 25415468974},
            max_model_len=8192,
        )
    )
    assert b.vision_weights_bytes == pytest.approx(1.258 * GIB, rel=0.002)
    assert b.weights_bytes_per_gpu / GIB == pytest.approx(15.51, abs=0.1)


def test_qwen25_vl_vision_tower_is_gated():
    """Qwen2.5-VL's vision MLP is gated (gate_up 2 × 3420 + down, qwen2_5_vl.py Qwen2_5_VisionMLP) and its merger
    outputs out_hidden_size."""
    cfg = dict(
        QWEN2_VL_7B,
        model_type="qwen2_5_vl",
        architectures=["Qwen2_5_VLForConditionalGeneration"],
        vision_config=QWEN25_VL_VISION,
    )
    tower = vision_tower(read_model_facts(cfg))
    assert (tower.family, tower.gated_mlp, tower.mlp_width, tower.out_hidden) == ("qwen2_5_vl", True, 3420, 3584)
    assert tower.params == pytest.approx(676.6e6, rel=0.003)
    # per patch at TP 1: max(attention 9 W, MLP 2 W + 3 × 3420) = 12,820 values + 1176 pixel values, bf16
    assert per_patch_bytes(tower, 1, 2) == (2 * 1280 + 3 * 3420 + 1176) * 2


# --- tokens per item ------------------------------------------------------------------------------------------------
def test_qwen_image_grid_follows_get_image_size_with_most_features():
    """qwen2_vl.py:1079-1128: max_pixels // (14 × 2)² merged tokens, factor pair with aspect ≤ 200."""
    assert qwen_image_grid(12845056, 14, 2) == 16384  # official Qwen2-VL / Qwen2.5-VL preprocessor_config
    assert qwen_image_grid(1003520, 14, 2) == 1280  # transformers' Qwen2VLImageProcessor default (28·28·1280)
    assert qwen_image_grid(16777216, 16, 2) == 16384  # Qwen3-VL (patch 16): longest_edge 16777216


def test_max_pixels_from_preprocessor_config_and_mm_processor_kwargs():
    """The checkpoint's preprocessor_config.json sets max_pixels; --mm-processor-kwargs overrides it
    (qwen2_vl.py:950-978)."""
    official = budget_of(vl_request(max_model_len=8192)).multimodal
    small = budget_of(vl_request(max_model_len=8192, preprocessor={"max_pixels": 1003520})).multimodal
    override = budget_of(
        vl_request(
            max_model_len=8192, preprocessor={"max_pixels": 1003520}, mm_processor_kwargs={"max_pixels": 2116800}
        )
    ).multimodal
    assert (official["tokens_per_item"], official["patches_per_item"]) == (16384, 65536)
    # 1280-token frames: a video of 12 frames (6 × 1280 = 7680 ≤ 8192 tokens) outgrows the image
    assert (small["modality"], small["tokens_per_item"]) == ("video", 7680)
    assert override["tokens_per_item"] >= qwen_image_grid(2116800, 14, 2) == 2700


# --- the V1 profile (vllm 0.33.0 gpu_model_runner.py:6072-6144, encoder_budget.py:150-190) ------------------------
def test_v1_profile_batch_is_the_encoder_budget_over_tokens_per_item():
    one = budget_of(vl_request(max_model_len=8192, limit_mm_per_prompt={"image": 1, "video": 0})).multimodal
    assert (one["modality"], one["items"]) == ("image", 1)  # budget max(8192, 16384) // 16384
    two = budget_of(
        vl_request(max_model_len=8192, max_num_batched_tokens=32768, limit_mm_per_prompt={"image": 2, "video": 0})
    ).multimodal
    assert two["items"] == 2  # budget 32768 // 16384, max_num_seqs × min(2, 8192 // 16384 → 1) allows it


def test_v1_video_wins_when_max_model_len_holds_more_frames():
    """Frames: the most whose tokens fit max_model_len (≤ 14); at 32768 that is 4 frames = 2 × 16384 tokens, more
    than an image, and ``get_modality_with_max_tokens`` picks the video (qwen2_vl.py:1138-1196)."""
    mm = budget_of(vl_request(max_model_len=32768)).multimodal
    assert (mm["modality"], mm["tokens_per_item"], mm["patches_per_item"]) == ("video", 32768, 131072)


def test_skip_mm_profiling_and_zero_limits_remove_the_encoder_peak():
    base = budget_of(
        vl_request(
            gpu={"name": "RTX 3090", "compute_capability": "8.6", "memory_bytes": 25318832210}, max_model_len=4096
        )
    )
    skipped = budget_of(
        vl_request(
            gpu={"name": "RTX 3090", "compute_capability": "8.6", "memory_bytes": 25318832210},
            max_model_len=4096,
            skip_mm_profiling=True,
        )
    )
    zero = budget_of(
        vl_request(
            gpu={"name": "RTX 3090", "compute_capability": "8.6", "memory_bytes": 25318832210},
            max_model_len=4096,
            limit_mm_per_prompt={"image": 0, "video": 0},
        )
    )
    assert base.encoder_peak_bytes > 1.5 * GIB and base.activation_peak_bytes == base.encoder_peak_bytes
    assert skipped.multimodal["skipped"].startswith("--skip-mm-profiling")
    assert skipped.activation_peak_bytes < base.activation_peak_bytes
    assert zero.activation_peak_bytes == skipped.activation_peak_bytes
    assert skipped.vision_weights_bytes == base.vision_weights_bytes  # the tower is still loaded


def test_mm_encoder_tp_mode_data_replicates_the_tower():
    """``--mm-encoder-tp-mode data``: the tower is not TP-split (qwen2_vl.py:1408, disable_tp) and each rank encodes
    its share of the items at full width."""
    w = budget_of(vl_request(count=2, interconnect="nvlink", tensor_parallel_size=2, max_model_len=8192))
    d = budget_of(
        vl_request(
            count=2, interconnect="nvlink", tensor_parallel_size=2, max_model_len=8192, mm_encoder_tp_mode="data"
        )
    )
    tp1 = budget_of(vl_request(max_model_len=8192))
    assert w.vision_weights_bytes * 2 == pytest.approx(tp1.vision_weights_bytes, abs=2)
    assert d.vision_weights_bytes == tp1.vision_weights_bytes
    # data mode: the one item runs on one rank at full width, as at TP 1; weights mode all-gathers QKV
    # (qwen2_vl.py:329-335): 10 W + 3 W / 2 live at the attention, above the halved MLP (2 W + 8 W / 2)
    assert d.encoder_peak_bytes == tp1.encoder_peak_bytes
    tower = vision_tower(read_model_facts(QWEN2_VL_7B))
    assert per_patch_bytes(tower, 2, 2) == int((11.5 * 1280 + 1176) * 2)


def test_vision_attention_live_set_follows_the_release():
    """Per patch, Qwen2-VL-7B (W 1280) at TP 1 in bf16: 0.33/0.13 keep 10 W (= the MLP's 2 W + 8 W), 0.11 rotated
    cat(Q, K) in fp32 after contiguous copies (19 W), 0.10 rotated Q and K in fp32 one at a time (12 W), 0.6-0.9 did
    it in torch ops (15 W) — the source lines are listed at QWEN_VL_ATTENTION_WIDTHS."""
    tower = vision_tower(read_model_facts(QWEN2_VL_7B))
    widths = {
        v: per_patch_bytes(tower, 1, 2, v) // 2 - 1176
        for v in ((0, 33, 0), (0, 13, 0), (0, 11, 0), (0, 10, 2), (0, 8, 5), (0, 6, 6))
    }
    assert widths == {
        (0, 33, 0): 10 * 1280,
        (0, 13, 0): 10 * 1280,
        (0, 11, 0): 19 * 1280,
        (0, 10, 2): 12 * 1280,
        (0, 8, 5): 15 * 1280,
        (0, 6, 6): 15 * 1280,
    }


# --- the V0 profile (vllm 0.6.6 worker/model_runner.py profile_run, multimodal/processing.py:848-888) -------------
def test_v0_profile_cuts_sequences_by_max_multimodal_tokens():
    """UI-TARS-7B's launch on 0.6.6 with the official Qwen2-VL processor (max_pixels 12845056): max_mm_tokens =
    image 16384 + video 16384, so max_num_seqs = max(1, 8192 // 32768) = 1; the dummy sequence holds the image's
    16384 placeholders (longer than 8192: not truncated). With the case's own processor (max_pixels 2116800, bounded
    by its log): 2,700 tokens an item, 8192 // 5400 = 1 sequence of 8192 tokens."""
    req = case_request(UI_TARS)
    req["model"]["preprocessor_config"] = None
    b = compute_budget(build_context(LaunchRequest.model_validate(req)))
    assert b.multimodal["text_num_seqs"] == 1 and b.multimodal["items"] == 1
    assert b.profiled_tokens == 16384
    own = compute_budget(build_context(LaunchRequest.model_validate(case_request(UI_TARS))))
    assert (own.multimodal["tokens_per_item"], own.multimodal["text_num_seqs"], own.profiled_tokens) == (2700, 1, 8192)


# --- communication buffers (vllm 0.33.0 distributed/device_communicators/*.py) -------------------------------------
def comm(
    tp: int,
    interconnect: str = "nvlink",
    gpu: str = "h100-sxm-80gb",
    env: dict | None = None,
    version: str | None = None,
    **args,
):
    req = request(
        "meta-llama__Meta-Llama-3.1-70B", gpu, count=8, interconnect=interconnect, tensor_parallel_size=tp, **args
    )
    if env:
        req["env"] = env
    req["vllm_version"] = version
    ctx = build_context(LaunchRequest.model_validate(req))
    return communication_buffers(ctx, Accounting.for_version(ctx.version, ctx.request.env))


def test_communication_buffers_h100_tp8_from_vllm_and_nccl_sizes():
    """TP 8 on H100 NVLink, 0.33: custom all-reduce meta 256 KiB (capped by CUSTOM_ALL_REDUCE_MAX_SIZES["9.0"][8]
    with symmetric memory on) + IPC buffer max(256 KiB, 2 MiB, 16 MiB) + rank_data 8 MiB; symmetric memory 64 MiB
    (SYMM_MEM_ALL_REDUCE_MAX_SIZES); NCCL 16 ring channels × 9.19 MiB; NVLS 16 × 2 × 1 MiB × 8 heads."""
    total, parts = comm(8)
    car = 256 * 1024 + 16 * MIB + 8 * MIB
    assert total == car + 64 * MIB + 16 * NCCL_CONNECTION_BYTES + 256 * MIB
    assert NCCL_CONNECTION_BYTES == 9_633_792  # 4 MiB + 512 KiB + 4,915,200 B
    assert any("NVLS" in p for p in parts)


def test_communication_buffers_switch_with_topology_and_flags():
    assert comm(1) == (0, [])
    no_nvls, _ = comm(8, env={"NCCL_NVLS_ENABLE": "0"})
    with_nvls, _ = comm(8)
    assert with_nvls - no_nvls == 256 * MIB
    pcie, parts = comm(8, interconnect="pcie")  # custom all-reduce refuses > 2 PCIe GPUs; NCCL 2 channels
    assert pcie == 64 * MIB + 2 * NCCL_CONNECTION_BYTES and not any("custom" in p for p in parts)
    tp2, parts2 = comm(2)  # NVLS only above 2 ranks
    assert not any("NVLS" in p for p in parts2) and any("custom" in p for p in parts2)
    off, _ = comm(2, disable_custom_all_reduce=True)
    assert tp2 - off == 8 * MIB + 16 * MIB + 8 * MIB  # symm-mem caps max_size to 64 MiB ≥ 8 MiB: stays 8 MiB


def test_qwen3_235b_tp8_ep_pcie_non_torch_close_to_printed():
    """The TP 8 + EP run on 8 × L40S PCIe printed 0.21 GiB non-torch (0.17-0.21 over the ranks): the TP and EP
    groups' NCCL rings (2 channels each on PCIe) over the one-GPU 0.15 GiB."""
    r = {x.id: x for x in evaluate()}["qwen3-235b-2507-fp8-8xl40s-tp8-ep"]
    nt = r.component("non_torch_gib")
    assert nt.predicted_gib == pytest.approx(0.15 + 4 * NCCL_CONNECTION_BYTES / GIB, abs=0.001)
    assert abs(nt.delta_gib) < 0.05


# --- per-component accuracy (bench.kv_accuracy) ---------------------------------------------------------------------
def test_component_accuracy_reports_every_printed_component():
    results = evaluate()
    s = component_summary(results)
    assert set(s) == {"weights", "activation peak", "non-torch", "CUDA graphs", "KV pool"}
    assert s["weights"]["cases"] == 17 and s["weights"]["median_abs_error"] < 0.01
    vl = {r.id: r for r in results}["qwen2vl-7b-ft-bf16-rtx3090-mml4k-v0130"]
    assert abs(vl.component("weights_gib").error) < 0.01  # the vision tower is counted


def test_v0_nccl_221_nvls_buffers_per_communicator():
    """Before 0.9 (NCCL 2.21) NVLS took 24 channels × 2 × (4 MiB + 2 MiB) per head (vllm-project/vllm#9699's NCCL
    line: nvlsTotalSize 2415919104 at 8 heads); V0 had two NCCL communicators on the TP group (PyNccl and the torch
    device group its input broadcast used) — no custom all-reduce change, no symmetric memory then."""
    total, parts = comm(8, version="0.6.6")
    assert total == 2 * 16 * NCCL_CONNECTION_BYTES + (8 + 8 + 8) * MIB + 2 * 2415919104
    v1, _ = comm(8, version="0.8.5")
    assert v1 == 16 * NCCL_CONNECTION_BYTES + (8 + 8 + 8) * MIB + 2415919104


def test_v0_from_07_profiles_images_and_videos():
    """From 0.7 the V0 dummy carries every modality's items (0.7.3 qwen2_vl.py:936-970): Qwen2-VL at max_model_len 4096
    profiles one 16,384-token image and one 16,384-token video — 32,768 placeholders, the figure vLLM's warning
    prints ("worst-case total number of multimodal tokens (32768) ... {'image': 16384, 'video': 16384}") — and
    bounding video to 0 halves the encoder's share (a public V0 log: 4.93 → 2.47 GiB activation)."""
    both = budget_of(vl_request(version="0.7.3", max_model_len=4096))
    image = budget_of(vl_request(version="0.7.3", max_model_len=4096, limit_mm_per_prompt="image=1,video=0"))
    assert (both.multimodal["items"], both.profiled_tokens) == (2, 32768)
    assert (image.multimodal["items"], image.profiled_tokens) == (1, 16384)
    assert both.encoder_peak_bytes == 2 * image.encoder_peak_bytes


def test_qwen3_vl_deepstack_outputs_and_buffers():
    """Qwen3-VL: three deepstack mergers besides the main one (vision_config.deepstack_visual_indexes); the encoder
    output is [tokens, out_hidden × 4] (qwen3_vl.py:885-904) and the model allocates one max_num_batched_tokens ×
    hidden buffer per deepstack level (qwen3_vl.py:2030-2037). Patch 16, merge 2: 16,384 tokens per image at the
    official longest_edge 16777216."""
    vision = {
        "deepstack_visual_indexes": [8, 16, 24],
        "depth": 27,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1152,
        "in_channels": 3,
        "intermediate_size": 4304,
        "model_type": "qwen3_vl",
        "num_heads": 16,
        "num_position_embeddings": 2304,
        "out_hidden_size": 4096,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    # Qwen3-VL-8B-Instruct's published geometry (text_config / vision_config of its config.json)
    text = {
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "head_dim": 128,
        "max_position_embeddings": 262144,
        "model_type": "qwen3_vl_text",
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 151936,
        "rms_norm_eps": 1e-06,
    }
    cfg = {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "text_config": text,
        "vision_config": vision,
        "torch_dtype": "bfloat16",
    }
    tower = vision_tower(read_model_facts(cfg))
    assert (tower.family, tower.mergers, tower.patch_size) == ("qwen3_vl", 4, 16)
    b = budget_of(vl_request(cfg, max_model_len=8192, limit_mm_per_prompt={"image": 1, "video": 0}))
    mm = b.multimodal
    assert (mm["tokens_per_item"], mm["patches_per_item"], mm["items"]) == (16384, 65536, 1)
    assert b.encoder_output_bytes == 16384 * 4096 * 4 * 2
    mnbt = build_context(vl_request(cfg, max_model_len=8192)).max_num_batched_tokens
    assert b.vision_weights_bytes == int(tower.params * 2) + 3 * mnbt * 4096 * 2


def test_cli_check_reads_the_model_directorys_preprocessor_config(tmp_path):
    """`preflight check` with model.path: the directory's preprocessor_config.json sets the image limit."""
    import json

    from service.cli.check_files import load_request_file

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(QWEN2_VL_7B))
    (tmp_path / "m" / "preprocessor_config.json").write_text(json.dumps({"max_pixels": 1003520, "min_pixels": 3136}))
    f = tmp_path / "launch.json"
    f.write_text(
        json.dumps(
            {
                "model": {"path": "m"},
                "hardware": {"gpu": "h100-sxm-80gb", "count": 1},
                "engine_args": {"max_model_len": 4096, "limit_mm_per_prompt": {"image": 1, "video": 0}},
            }
        )
    )
    req = LaunchRequest.model_validate(load_request_file(f))
    assert req.model.preprocessor_config["max_pixels"] == 1003520
    assert budget_of(req).multimodal["tokens_per_item"] == 1280


def test_mm_ipc_gpu_memory_gb_comes_out_of_the_pool():
    """vLLM 0.33 subtracts the frontend's multimodal IPC budget from the KV pool (gpu_ipc_memory.py:155-240)."""
    base = budget_of(vl_request(max_model_len=8192))
    ipc = budget_of(vl_request(max_model_len=8192, mm_ipc_gpu_memory_gb=2))
    assert base.pool_raw_bytes - ipc.pool_raw_bytes == 2 * GIB


def test_internvl_tiles_from_config():
    """InternVL2-8B's config.json: 448 px tiles of 14 px patches (1024 patches), pixel shuffle 0.5 (256 tokens a
    tile), max_dynamic_patch 12 + thumbnail = 13 tiles: 3,328 tokens, the figure vLLM's get_max_image_tokens gives
    (internvl.py:155-189); the vision tower InternViT-300M (24 × 1024, MLP 4096)."""
    cfg = {
        "architectures": ["InternVLChatModel"],
        "model_type": "internvl_chat",
        "downsample_ratio": 0.5,
        "dynamic_image_size": True,
        "force_image_size": 448,
        "max_dynamic_patch": 12,
        "min_dynamic_patch": 1,
        "use_thumbnail": True,
        "torch_dtype": "bfloat16",
        "llm_config": {
            "architectures": ["InternLM2ForCausalLM"],
            "model_type": "internlm2",
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 8,
            "max_position_embeddings": 32768,
            "vocab_size": 92553,
            "torch_dtype": "bfloat16",
        },
        "vision_config": {
            "architectures": ["InternVisionModel"],
            "model_type": "intern_vit_6b",
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_attention_heads": 16,
            "num_hidden_layers": 24,
            "image_size": 448,
            "patch_size": 14,
            "num_channels": 3,
        },
    }
    b = budget_of(vl_request(cfg, max_model_len=8192))
    mm = b.multimodal
    assert (mm["tokens_per_item"], mm["patches_per_item"]) == (13 * 256, 13 * 1024)
    assert mm["items"] == max(8192, 3328) // 3328  # the encoder budget over tokens per item


def test_an_unexpected_vision_config_shape_leaves_the_tower_unmodelled():
    cfg = copy.deepcopy(QWEN2_VL_7B)
    cfg["vision_config"]["patch_size"] = [14, 14]
    assert vision_tower(read_model_facts(cfg)) is None
    assert budget_of(vl_request(cfg, max_model_len=8192)).multimodal is None


# --- V0 encoder-decoder profile (mllama) and 0.6's video sizing -------------------------------------------------------
# Llama-3.2-11B-Vision as the llama32-11b-vision case carries it (no mllama config in tests/fixtures/models: the
# case's config is the published one's relevant fields, see its config_provenance)
MLLAMA_CASE = load_case(CASES / "kv" / "llama32-11b-vision-h100-eager-pr12126.json")


def mllama_budget(version: str = "0.6.6", **engine_args):
    req = case_request(MLLAMA_CASE)
    req["engine_args"].update(engine_args)
    return compute_budget(build_context(LaunchRequest.model_validate(req)), accounting_version=version)


def test_mllama_image_geometry_four_padded_tiles():
    """mllama.py (0.6.6): (560 // 14)² + 1 = 1601 patches per tile, padded to 1608 for the encoder (:633) and sliced
    back to 1601 for the output; max_num_tiles defaults to 4 (transformers MllamaVisionConfig) → 6432 / 6404."""
    tower = vision_tower(read_model_facts(MLLAMA_CASE["model"]["config"]))
    assert (tower.max_num_tiles, tower.encoder_decoder, tower.depth) == (4, True, 40)
    assert mllama_image_geometry(tower) == (6432, 6404)


def test_mllama_v0_profile_runs_every_sequence_with_an_image():
    """V0's encoder-decoder runner does not cut the sequences (enc_dec_model_runner.py:264-340): 128 sequences carry
    128 four-tile images. The aspect-ratio mask alone is 128 × 6432² × 2 B = 9.86 GiB; the whole encoder peak lands
    at the 36.63 GiB vLLM printed for this launch (PR 12126's log) and the KV pool within 1 % of its 14.65 GiB."""
    b = mllama_budget()
    mm = b.multimodal
    assert (mm["items"], mm["text_num_seqs"], b.profiled_tokens) == (128, 128, 65536)
    assert any("aspect-ratio mask 9.86 GiB" in a for a in b.assumptions)
    assert b.activation_peak_bytes / GIB == pytest.approx(36.63, rel=0.02)
    assert b.kv_cache_bytes_per_gpu / GIB == pytest.approx(14.65, rel=0.02)


def test_mllama_v0_profile_scales_with_max_num_seqs_and_limit():
    """A quarter of the sequences: a quarter of the images, mask and per-patch activations; no image allowed: no
    encoder profile at all."""
    full, quarter = mllama_budget(), mllama_budget(max_num_seqs=32)
    assert quarter.multimodal["items"] == 32
    assert quarter.encoder_peak_bytes * 4 == pytest.approx(full.encoder_peak_bytes, rel=1e-6)
    none = mllama_budget(limit_mm_per_prompt={"image": 0})
    assert none.encoder_peak_bytes == 0 and none.activation_peak_bytes < 10 * GIB


def test_v06_sizes_a_video_like_one_image():
    """0.6.6's registry sizes Qwen2-VL's video with mm_count 1 (grid_t = max(1 // 2, 1) = 1: qwen2_vl.py:645-712), so
    with a 1280-token processor max_mm_tokens = 1280 + 1280 and V0 profiles 8192 // 2560 = 3 sequences; from 0.7 the
    video holds the frames max_model_len allows (6 × 1280) and the sequences drop to 1."""
    pp = {"max_pixels": 1003520, "min_pixels": 3136}
    v066 = budget_of(vl_request(version="0.6.6", max_model_len=8192, preprocessor=pp))
    v073 = budget_of(vl_request(version="0.7.3", max_model_len=8192, preprocessor=pp))
    assert v066.multimodal["text_num_seqs"] == 3 and v066.multimodal["items"] == 3
    assert v073.multimodal["text_num_seqs"] == 1


def test_fine_tune_processor_from_its_source_vs_the_official_one():
    """qwen2vl-7b-ft (0.13): its merge notebook saved max_pixels 1280 × 28 × 28 — 1,280 tokens an image; video, not
    limited by ``{"image": 1}`` (999), wins with 6 frames (3 × 1,280 = 3,840 tokens, 15,360 patches), still below the
    2,048-token text forward — and the pool lands at +8 % of what vLLM printed; with the official processor (16,384
    tokens, 65,536 patches) the encoder pass alone would be 1.8 GiB and the pool −11 %."""
    case = load_case(CASES / "kv" / "qwen2vl-7b-ft-bf16-rtx3090-mml4k-v0130.json")
    printed = case["expect"]["kv"]["kv_cache_tokens"]
    req = case_request(case)
    own = compute_budget(build_context(LaunchRequest.model_validate(req)))
    req["model"]["preprocessor_config"] = None
    official = compute_budget(build_context(LaunchRequest.model_validate(req)))
    assert (own.multimodal["modality"], own.multimodal["tokens_per_item"], own.multimodal["patches_per_item"]) == (
        "video",
        3840,
        15360,
    )
    assert own.encoder_peak_bytes < own.activation_peak_bytes
    assert official.multimodal["tokens_per_item"] == 16384
    assert own.kv_cache_tokens / printed - 1 == pytest.approx(0.082, abs=0.01)
    assert official.kv_cache_tokens / printed - 1 == pytest.approx(-0.109, abs=0.01)


def test_mllama_falls_back_to_v0_while_v1_is_the_default():
    """From 0.8 V1 is the default, but mllama is SupportsV0Only (vllm 0.10.2 mllama.py:1273-1274) and the engine
    falls back to V0 unless VLLM_USE_V1 is set (0.8.5 engine/arg_utils.py:1402-1406): at 0.8.5 and 0.10.2 the budget
    is V0's — blocks × block_size tokens and the encoder-decoder profile of 128 images — like at 0.6.6."""
    for version in ("0.8.5", "0.10.2"):
        b = mllama_budget(version)
        assert b.accounting["engine"] == "v0" and b.multimodal["items"] == 128
        assert any("falls back to the V0 engine" in x for x in b.assumptions)
    assert mllama_budget("0.6.6").accounting["engine"] == "v0"
