"""Multimodal models in the memory model: the vision tower's weights and what vLLM's profile run pushes through it.

vLLM 0.33 (V1) profiles a multimodal model before sizing the KV pool (vllm 0.33.0 vllm/v1/worker/gpu_model_runner.py
:6072-6144 ``profile_run``): unless ``--skip-mm-profiling``, it takes the modality whose item has the most tokens
(``MultiModalBudget.get_modality_with_max_tokens``, ties to the later name: ``video`` over ``image``), builds
``max_items_per_batch`` dummy items of the maximum feature size, runs the encoder on them in one batch
(``embed_multimodal``), keeps the outputs in the encoder cache, then runs the text dummy forward of
``max_num_batched_tokens`` tokens and the dummy sampler; the cache is cleared afterwards. The torch peak of the whole
run is the "activation peak" vLLM subtracts. The item count (vllm 0.33.0 vllm/multimodal/encoder_budget.py:150-190,
vllm/v1/core/encoder_cache_manager.py:333-380)::

    encoder budget      = max(max_num_batched_tokens, tokens per item)   (compute budget = cache size = MNBT)
    items per prompt    = max(1, min(limit_mm_per_prompt, max_model_len // tokens per item))
    items per batch     = max(1, min(budget // tokens per item, max_num_seqs' × items per prompt))

with ``max_num_seqs' = min(max_num_seqs, max_num_batched_tokens // tokens per item)`` when chunked prefill is off,
and ``limit_mm_per_prompt`` 999 for a modality the user did not name (vllm 0.33.0 vllm/config/multimodal.py:696-709).

The V0 engine (before 0.8) ran the encoder inside the profile forward instead: ``max_num_seqs`` was cut to
``max(1, min(max_num_seqs, max_num_batched_tokens // max_mm_tokens))`` sequences, each carrying
``limit_mm_per_prompt`` items (default 1) (vllm ≤ 0.7 vllm/worker/model_runner.py ``profile_run``).

Tokens per item for the Qwen-VL families follow their processing info (vllm 0.33.0
vllm/model_executor/models/qwen2_vl.py:980-1210, qwen3_vl.py:925-1050): the image with the most features is the
factor pair ``h × w = max_pixels // (patch × merge)²`` (aspect ≤ 200), ``h × w`` tokens and ``h × w × merge²``
patches; a video repeats that frame ``ceil(frames / temporal_patch)`` times, frames = the most that fit
``max_model_len`` (at most 14). ``max_pixels`` is the checkpoint's preprocessor_config.json (request field
``model.preprocessor_config``), overridden by ``--mm-processor-kwargs``; without either, the value the official
checkpoints of the family ship (Qwen2-VL / Qwen2.5-VL ``max_pixels`` 12845056, Qwen3-VL ``longest_edge`` 16777216:
16,384 tokens per image — what vLLM logs as "Encoder cache will be initialized with a budget of 16384 tokens").

Encoder activation per patch (Qwen2-VL vision block, vllm 0.33.0 vllm/model_executor/models/qwen2_vl.py:244-450):
the attention keeps the residual, the all-gathered QKV (3 × width, gathered at TP > 1, qwen2_vl.py:329-335), the
concatenated and rotated Q/K (2 × 2 × width) and the context with its contiguous copy — older releases kept more
(fp32 rotary, contiguous Q/K/V copies: ``QWEN_VL_ATTENTION_WIDTHS``); the MLP keeps the residual, its norm, fc1's
output and the activation's output (mlp width / TP each; gated MLPs: gate_up 2 × and act 1 ×). ``--mm-encoder-tp-mode data``
replicates the tower on every rank (no TP split of weights or widths) and spreads the items over the TP ranks
(qwen2_vl.py:1408, 1491 ``run_dp_sharded_mrope_vision_model``). Other vision towers (SigLIP / CLIP / InternViT /
mllama) are counted with the same per-patch arithmetic from their vision_config, one image of
``(image_size / patch_size)²`` patches (InternVL's dynamic tiles from ``max_dynamic_patch``; other tiling
processors — LLaVA-NeXT anyres — are not modelled: an assumption the budget states). mllama under V0 runs the
encoder-decoder profile (``_encoder_decoder_v0``, vllm 0.6.6 enc_dec_model_runner.py:264-340): every one of
``max_num_seqs`` sequences carries a ``max_num_tiles``-tile image, with the encoder's aspect-ratio attention mask.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import DomainError
from .model_facts import MAX_HIDDEN, MAX_LAYERS, ModelFacts, config_int

MAX_PIXELS_LIMIT = 1 << 28  # 16384 × 16384 pixels: bounds the factor search below (README "Input bounds")
QWEN_VL_DEFAULT_MAX_PIXELS = {
    # preprocessor_config.json of the official checkpoints (Qwen/Qwen2-VL-7B-Instruct, Qwen/Qwen2.5-VL-7B-Instruct:
    # "max_pixels": 12845056; Qwen/Qwen3-VL-8B-Instruct: "size": {"longest_edge": 16777216})
    "qwen2_vl": 12845056,
    "qwen2_5_vl": 12845056,
    "qwen3_vl": 16777216,
    "qwen3_vl_moe": 16777216,
}
QWEN_VL_MAX_FRAMES = {"qwen2_vl": 14, "qwen2_5_vl": 14}  # qwen2_vl.py:120 _MAX_FRAMES_PER_VIDEO
V0_DEFAULT_LIMIT = 1  # V0 limit_mm_per_prompt default per modality
V1_DEFAULT_LIMIT = 999  # vllm 0.33.0 vllm/config/multimodal.py:705-707


@dataclass(frozen=True)
class VisionTower:
    """The geometry of a vision encoder as config.json gives it."""

    family: str  # qwen2_vl | qwen2_5_vl | qwen3_vl | vit
    width: int  # the ViT's hidden size
    depth: int
    mlp_width: int
    gated_mlp: bool
    patch_size: int
    merge_size: int  # spatial merge (Qwen-VL: 2); 1 = none
    temporal_patch_size: int
    in_chans: int
    out_hidden: int  # what the projector/merger outputs (the text model's hidden size)
    mergers: int  # Qwen3-VL: 1 + deepstack mergers
    image_size: int | None  # generic ViT: the fixed input resolution
    tokens_per_image_config: int | None  # mm_tokens_per_image (Gemma 3) when config.json gives it
    max_num_tiles: int = 1  # mllama: tiles of ``image_size`` per image (vision_config.max_num_tiles)
    encoder_decoder: bool = False  # mllama: cross-attention model, V0's EncoderDecoderModelRunner

    @property
    def params(self) -> int:
        """Vision tower + projector parameters. Block: QKV + output projection (4 W²) and the MLP (2 or 3 × W × I),
        biases and norms; patch embedding ``in_chans × temporal × patch² × W``; Qwen-VL merger: LayerNorm and two
        linears ``(W·m²)² + W·m² × out`` per merger (qwen2_vl.py:476-520); a generic ViT's projector
        ``W × out + out²`` (LLaVA's two-layer MLP)."""
        W, I = self.width, self.mlp_width
        block = 4 * W * W + 4 * W + (3 if self.gated_mlp else 2) * W * I + I + W + 4 * W
        patch = self.in_chans * self.temporal_patch_size * self.patch_size**2 * W
        if self.family.startswith("qwen"):
            mw = W * self.merge_size**2
            proj = self.mergers * (mw * mw + mw + mw * self.out_hidden + self.out_hidden + 2 * W)
        else:
            proj = W * self.out_hidden + self.out_hidden * self.out_hidden
        return self.depth * block + patch + proj


def _int(
    v: dict[str, Any], keys: tuple[str, ...], field: str, default: int | None = None, hi: int = MAX_HIDDEN
) -> int | None:
    for k in keys:
        if v.get(k) is not None:
            return config_int(v.get(k), f"model.config.vision_config.{k}", 0, hi)
    return default


def vision_tower(facts: ModelFacts) -> VisionTower | None:
    """The vision tower of a multimodal config.json, or None (text-only, or no usable vision_config: a value of
    another shape — ``image_size: [336, 336]`` — leaves the tower unmodelled rather than refusing a launch vLLM
    would serve)."""
    try:
        return _vision_tower(facts)
    except DomainError:
        return None


def _vision_tower(facts: ModelFacts) -> VisionTower | None:
    config = facts.raw_config or {}
    vis = config.get("vision_config")
    if not isinstance(vis, dict):
        return None
    mt = str(config.get("model_type") or "")
    text_hidden = facts.hidden_size
    depth = _int(vis, ("depth", "num_hidden_layers", "num_layers"), "depth", hi=MAX_LAYERS)
    if mt == "mllama":  # 32 local + 8 global layers (transformers MllamaVisionConfig)
        depth = (depth or 32) + (_int(vis, ("num_global_layers",), "num_global_layers", 8, MAX_LAYERS) or 0)
    if not depth:
        return None
    patch = _int(vis, ("patch_size", "spatial_patch_size"), "patch_size", 14, 4096) or 14
    out = _int(vis, ("out_hidden_size",), "out_hidden_size") or text_hidden
    if mt == "qwen2_vl":
        width = _int(vis, ("embed_dim",), "embed_dim", 1280) or 1280
        ratio = vis.get("mlp_ratio", 4)
        ratio = ratio if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and 0 < ratio <= 64 else 4
        mlp, gated, family = int(width * ratio), False, "qwen2_vl"
        out = _int(vis, ("hidden_size",), "hidden_size") or text_hidden
    elif mt in ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"):
        width = _int(vis, ("hidden_size",), "hidden_size", 1280) or 1280
        mlp = _int(vis, ("intermediate_size",), "intermediate_size", 4 * width) or 4 * width
        gated, family = mt == "qwen2_5_vl", ("qwen2_5_vl" if mt == "qwen2_5_vl" else "qwen3_vl")
    else:
        vit_width = _int(vis, ("hidden_size", "embed_dim", "width"), "hidden_size")
        if not vit_width:
            return None
        width = vit_width
        mlp = _int(vis, ("intermediate_size",), "intermediate_size", 4 * width) or 4 * width
        gated, family = False, "vit"
    deepstack = vis.get("deepstack_visual_indexes")
    mergers = 1 + (len(deepstack) if isinstance(deepstack, list) and family == "qwen3_vl" else 0)
    image_size = _int(vis, ("image_size",), "image_size", None, 1 << 16)
    tpi = config.get("mm_tokens_per_image")
    tiles = (_int(vis, ("max_num_tiles",), "max_num_tiles", 4, 64) or 4) if mt == "mllama" else 1
    return VisionTower(
        family=family,
        width=width,
        depth=depth,
        mlp_width=mlp,
        gated_mlp=gated,
        patch_size=patch,
        merge_size=(_int(vis, ("spatial_merge_size",), "spatial_merge_size", 2, 64) or 1) if family != "vit" else 1,
        temporal_patch_size=(_int(vis, ("temporal_patch_size",), "temporal_patch_size", 2, 64) or 1)
        if family != "vit"
        else 1,
        in_chans=_int(vis, ("in_chans", "in_channels", "num_channels"), "in_chans", 3, 64) or 3,
        out_hidden=out,
        mergers=mergers,
        image_size=image_size,
        tokens_per_image_config=tpi
        if isinstance(tpi, int) and not isinstance(tpi, bool) and 0 < tpi < 1 << 20
        else None,
        max_num_tiles=tiles,
        encoder_decoder=mt == "mllama",
    )


# ---------------------------------------------------------------------------------------------------------------
# Tokens and patches per item
# ---------------------------------------------------------------------------------------------------------------
def _closest_factor_pair(n: int) -> tuple[int, int]:
    for d in range(math.isqrt(n), 0, -1):
        if n % d == 0:
            return d, n // d
    return 1, n


def qwen_image_grid(max_pixels: int, patch: int, merge: int) -> int:
    """Tokens of the image with the most features (qwen2_vl.py:1079-1128 ``get_image_size_with_most_features``):
    the largest ``h × w ≤ max_pixels // (patch·merge)²`` whose factor pair has aspect ≤ 200."""
    unit = patch * merge
    n = max(1, min(max_pixels, MAX_PIXELS_LIMIT) // (unit * unit))
    for seq in range(n, max(0, n - 64), -1):  # a near-square pair is always found within a few steps
        h, w = _closest_factor_pair(seq)
        if w / h <= 200:
            return h * w
    return 1


def _max_pixels(
    tower: VisionTower, facts: ModelFacts, preprocessor: dict[str, Any] | None, mm_kwargs: Any
) -> tuple[int, str]:
    """``max_pixels`` as vLLM resolves it: ``--mm-processor-kwargs`` (``max_pixels`` or ``size.longest_edge``) over
    the checkpoint's preprocessor_config.json over the family's official default (qwen2_vl.py:950-978)."""

    def read(d: Any) -> int | None:
        if not isinstance(d, dict):
            return None
        v = d.get("max_pixels")
        if v is None and isinstance(d.get("size"), dict):
            v = d["size"].get("longest_edge")
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return min(v, MAX_PIXELS_LIMIT)
        return None

    for src, d in (("--mm-processor-kwargs", mm_kwargs), ("preprocessor_config.json", preprocessor)):
        v = read(d) or (read(d.get("images_kwargs")) if isinstance(d, dict) else None)
        if v:
            return v, src
    mt = str((facts.raw_config or {}).get("model_type") or "")
    return QWEN_VL_DEFAULT_MAX_PIXELS.get(
        mt, QWEN_VL_DEFAULT_MAX_PIXELS.get(tower.family, 12845056)
    ), "the official checkpoints' preprocessor_config.json (not given)"


@dataclass(frozen=True)
class ModalityItem:
    modality: str
    tokens: int  # embeddings the item adds to the prompt (encoder cache entries)
    patches: int  # rows the vision blocks process


def max_items(
    tower: VisionTower, facts: ModelFacts, max_model_len: int, preprocessor: dict[str, Any] | None, mm_kwargs: Any
) -> tuple[dict[str, ModalityItem], list[str]]:
    """The item of each modality with the most features, as the processing info computes it."""
    notes: list[str] = []
    if tower.family == "vit":
        cfg = facts.raw_config or {}
        size = cfg.get("force_image_size") if isinstance(cfg.get("force_image_size"), int) else tower.image_size
        size = size if isinstance(size, int) and 0 < size <= 1 << 14 else 336
        side = size // max(1, tower.patch_size)
        per_tile = max(1, side * side)
        tiles, how = 1, "one tile"
        mdp = cfg.get("max_dynamic_patch")
        if (
            isinstance(mdp, int)
            and not isinstance(mdp, bool)
            and 1 <= mdp <= 64
            and cfg.get("dynamic_image_size", True)
        ):
            # InternVL: the most tiles a ratio i × j ≤ max_dynamic_patch gives, plus the thumbnail (vllm 0.33.0
            # vllm/transformers_utils/processors/internvl.py:70-98, models/internvl.py:155-189)
            tiles = mdp + (1 if cfg.get("use_thumbnail") and mdp != 1 else 0)
            how = f"{tiles} tiles (max_dynamic_patch {mdp}{' + thumbnail' if tiles > mdp else ''})"
        ratio = cfg.get("downsample_ratio")
        if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and 0 < ratio <= 1:
            per_tile_tokens = max(1, int(per_tile * ratio * ratio))  # pixel shuffle (internvl.py:605)
        else:
            per_tile_tokens = tower.tokens_per_image_config or per_tile
        patches, tokens = tiles * per_tile, tiles * per_tile_tokens
        notes.append(
            f"vision tower profiled on {size}px {how}: {patches:,} patches, {tokens:,} tokens per image"
            + ("" if tiles > 1 or tower.encoder_decoder else "; other tiling processors are not modelled")
        )
        return {"image": ModalityItem("image", tokens, patches)}, notes
    mp, src = _max_pixels(tower, facts, preprocessor, mm_kwargs)
    img = qwen_image_grid(mp, tower.patch_size, tower.merge_size)
    m2 = tower.merge_size**2
    notes.append(f"max_pixels {mp:,} from {src}: {img:,} tokens ({img * m2:,} patches) per image")
    items = {"image": ModalityItem("image", img, img * m2)}
    if tower.family in ("qwen2_vl", "qwen2_5_vl"):
        # frames: the most that fit max_model_len (_get_max_video_frames, closed form), at most 14; tokens =
        # ceil(frames / temporal_patch) × the image's (qwen2_vl.py:1138-1196)
        tps = tower.temporal_patch_size
        k = max_model_len // img if img else 0
        total = tps * k if k >= 1 else 1
        frames = max(1, min(total, QWEN_VL_MAX_FRAMES[tower.family]))
        grid_t = max(1, -(-frames // tps))
        items["video"] = ModalityItem("video", grid_t * img, grid_t * img * m2)
    return items, notes


# vLLM 0.33's dummy options per modality (vllm/config/multimodal.py:211-236: count ≥ 0; sizes > 0; extra keys
# forbidden for image, video and audio), checked by its ``limit_per_prompt`` validator (:471-495) at start-up
_DUMMY_OPTIONS = {
    "image": ("count", "width", "height"),
    "video": ("count", "num_frames", "width", "height"),
    "audio": ("count", "length"),
}
SIZE_KEYS = (
    "max_pixels",
    "min_pixels",
    "patch_size",
    "merge_size",
    "temporal_patch_size",
    "shortest_edge",
    "longest_edge",
)


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def limit_problems(raw: Any) -> list[str]:
    """Why vLLM would refuse ``--limit-mm-per-prompt`` (empty when it takes it): the legacy ``image=1,video=0`` form
    and JSON strings are read as the releases read them."""
    if raw is None:
        return []
    if isinstance(raw, str):
        text = raw.strip()[:4096]
        try:
            raw = (
                json.loads(text)
                if text.startswith("{")
                else {k.strip(): int(v) for k, v in (kv.split("=", 1) for kv in text.split(",") if "=" in kv)}
            )
        except (ValueError, RecursionError):
            return ["must be a JSON object of modality: count or options, or the form image=1,video=0"]
    if not isinstance(raw, dict):
        return ["must be a JSON object of modality: count or options"]
    out = []
    for k, v in list(raw.items())[:64]:
        if _whole(v):
            if v < 0:
                out.append(f"{k}: the count must be ≥ 0 (got {v})")
            continue
        if not isinstance(v, dict):
            out.append(f"{k}: a count (an integer ≥ 0) or an options object, not {type(v).__name__}")
            continue
        allowed = _DUMMY_OPTIONS.get(str(k))
        for name, x in list(v.items())[:64]:
            if allowed is not None and name not in allowed:
                out.append(f"{k}.{name}: not an option of {k} (allowed: {', '.join(allowed)})")
            elif name == "count" and not (_whole(x) and x >= 0):
                out.append(f"{k}.count must be an integer ≥ 0")
            elif (
                name != "count"
                and (allowed is not None or name in ("width", "height"))
                and x is not None
                and not (_whole(x) and x > 0)
            ):
                out.append(f"{k}.{name} must be a positive integer")
    return out


def size_problems(d: Any, where: str) -> list[str]:
    """Image size fields (``max_pixels``, ``patch_size``, ``merge_size``, …) that are present but not positive
    integers, in a processor config or ``--mm-processor-kwargs`` (also under ``size`` and ``images_kwargs``)."""
    if d is None:
        return []
    if not isinstance(d, dict):
        return [f"{where} must be a JSON object"]
    out = []
    for prefix, sub in (("", d), ("size.", d.get("size")), ("images_kwargs.", d.get("images_kwargs"))):
        if not isinstance(sub, dict):
            continue
        for k in SIZE_KEYS:
            if k in sub and sub[k] is not None and not (_whole(sub[k]) and 0 < sub[k] <= 1 << 40):
                out.append(f"{where}.{prefix}{k} must be a positive integer (got {str(sub[k])[:40]})")
    return out


def _limits(raw: Any, default: int) -> dict[str, int]:
    """``limit_mm_per_prompt`` as a dict (``{"image": 1}`` or ``{"image": {"count": 1}}``), a JSON string, or the
    older releases' ``image=1,video=0``."""
    out: dict[str, int] = {}
    if isinstance(raw, str):
        text = raw.strip()[:4096]
        try:
            raw = (
                json.loads(text)
                if text.startswith("{")
                else {k.strip(): int(v) for k, v in (kv.split("=", 1) for kv in text.split(",") if "=" in kv)}
            )
        except ValueError:
            return out
    if isinstance(raw, dict):
        for k, v in raw.items():
            if isinstance(v, dict):
                v = v.get("count")
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                out[str(k)] = min(v, 1 << 20)
    return out


# ---------------------------------------------------------------------------------------------------------------
# The profile
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EncoderProfile:
    """What the multimodal part of the profile run costs on one GPU (bytes)."""

    modality: str | None
    tokens_per_item: int
    patches_per_item: int
    items: int  # items in the profile batch (on the busiest rank in data mode: ``items_on_rank``)
    items_on_rank: int
    encoder_peak_bytes: int  # the encoder forward's own peak (inputs, widest live activations, outputs)
    encoder_output_bytes: int  # the outputs kept in the encoder cache during the text dummy run
    vision_weights_bytes: int  # the tower's weights on this GPU
    text_num_seqs: int | None  # V0: the profile's sequences (cut for multimodal items)
    skipped: str | None
    notes: tuple[str, ...]
    text_tokens: int | None = None  # V0: tokens of the text forward when the placeholders exceed the budget

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# Live activations per patch in a Qwen-VL vision block's attention, in units of the width, by the code of the
# release (the MLP's residual + norm + fc1 + act is 2 W + 8 W / TP in all of them):
# - 0.13 on (0.13.0 qwen2_vl.py:363-385, 0.33.0 qwen2_vl.py:355-392): residual 1 + QKV 3 + cat(Q, K) 2 + rotated
#   Q/K in bf16 (ApplyRotaryEmb) 2 + context and its contiguous copy 2 = 10;
# - 0.11-0.12 (0.11.0 qwen2_vl.py:277-284, 372-385): Q/K/V made contiguous (3 more), cat(Q, K) rotated in fp32
#   (input 4, output 4, cast 2): 1 + 3 + 3 + 2 + 4 + 4 + 2 = 19;
# - 0.10 (0.10.2 qwen2_vl.py:275-283, 355-370): contiguous Q/K/V, Q and K rotated one at a time in fp32 by the
#   bundled flash-attn kernel (input 2, output 2, cast 1): 1 + 3 + 3 + 5 = 12;
# - before (0.6.6 qwen2_vl.py:219-225, 270-288; 0.8.5 qwen2_vl.py:207-241): the same in torch ops (fp32 input 2,
#   x·cos 2, rotate_half·sin 2 + 2 temporaries): 1 + 3 + 3 + 8 = 15 — a public V0 log of a Qwen-VL model with a
#   1280-wide vision tower (6.59 GiB of weights, most likely Qwen2.5-VL-3B; vLLM's warning named one 16,384-token
#   image) printed a 2.47 GiB activation peak: 65,536 patches × (15 × 1280 + 1176) × 2 B = 2.49 GiB.
QWEN_VL_ATTENTION_WIDTHS = (((0, 13, 0), 10), ((0, 11, 0), 19), ((0, 10, 0), 12), ((0, 0, 0), 15))


def attention_widths(tower: VisionTower, version: tuple[int, int, int]) -> int:
    if tower.family == "vit":
        return 10
    return next(w for since, w in QWEN_VL_ATTENTION_WIDTHS if version >= since)


def per_patch_bytes(tower: VisionTower, tp: int, act_bytes: int, version: tuple[int, int, int] = (0, 33, 0)) -> int:
    """Live bytes per patch at the widest point of a vision block (see ``QWEN_VL_ATTENTION_WIDTHS``; at TP > 1 the
    local QKV slice is all-gathered, qwen2_vl.py:329-335), plus the patch's pixel values (``in_chans × temporal ×
    patch²`` in the activation dtype)."""
    W = tower.width
    attn = (attention_widths(tower, version) + (3 / tp if tp > 1 else 0)) * W
    mlp = 2 * W + (3 if tower.gated_mlp else 2) * tower.mlp_width / tp
    pixels = tower.in_chans * tower.temporal_patch_size * tower.patch_size**2
    return int((max(attn, mlp) + pixels) * act_bytes)


def encoder_profile(
    facts: ModelFacts,
    args: Any,
    *,
    v1_engine: bool,
    tp: int,
    act_bytes: int,
    weight_bytes: float,
    max_model_len: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    chunked_prefill: bool,
    preprocessor: dict[str, Any] | None,
    version: tuple[int, int, int] = (0, 33, 0),
) -> EncoderProfile | None:
    """The encoder's share of the profile run for this launch, or None for a text-only model.

    ``weight_bytes``: bytes per vision parameter (the activation dtype: vision towers stay unquantized in the
    checkpoints vLLM serves). ``args``: the engine arguments (``limit_mm_per_prompt``, ``skip_mm_profiling``,
    ``mm_encoder_tp_mode``, ``mm_processor_kwargs``).
    """
    tower = vision_tower(facts)
    if tower is None:
        return None
    data_mode = str(args.get("mm_encoder_tp_mode") or "weights") == "data" and v1_engine
    tp_w = 1 if data_mode else tp
    vision_w = int(tower.params * weight_bytes / tp_w)
    if tower.mergers > 1:
        # Qwen3-VL keeps one zeroed buffer of max_num_batched_tokens × hidden per deepstack level, allocated with
        # the model (vllm 0.33.0 vllm/model_executor/models/qwen3_vl.py:2030-2037): part of "model loading" memory
        vision_w += (tower.mergers - 1) * max_num_batched_tokens * facts.hidden_size * act_bytes
    notes: list[str] = [
        f"vision tower {tower.family}: {tower.params / 1e6:.0f}M parameters, "
        + ("replicated (--mm-encoder-tp-mode data)" if data_mode else f"split over TP {tp}")
    ]

    def none(reason: str) -> EncoderProfile:
        return EncoderProfile(None, 0, 0, 0, 0, 0, 0, vision_w, None, reason, tuple(notes))

    if v1_engine and bool(args.get("skip_mm_profiling", False)):
        return none("--skip-mm-profiling: the encoder is not profiled (gpu_model_runner.py:6075-6079)")
    items, more = max_items(tower, facts, max_model_len, preprocessor, args.get("mm_processor_kwargs"))
    notes += more
    default = V1_DEFAULT_LIMIT if v1_engine else V0_DEFAULT_LIMIT
    limits = _limits(args.get("limit_mm_per_prompt"), default)
    active = {m: it for m, it in items.items() if limits.get(m, default) > 0 and it.tokens > 0}
    if not active:
        return none("limit_mm_per_prompt is 0 for every modality: no encoder profiling")
    per = per_patch_bytes(tower, tp_w, act_bytes, version)
    if v1_engine:
        return _profile_v1(
            tower,
            active,
            limits,
            per,
            act_bytes,
            vision_w,
            notes,
            max_model_len,
            max_num_batched_tokens,
            max_num_seqs,
            chunked_prefill,
            tp,
            data_mode,
        )
    return _profile_v0(
        tower,
        facts,
        active,
        limits,
        default,
        per,
        act_bytes,
        vision_w,
        notes,
        max_num_batched_tokens,
        max_num_seqs,
        version,
        none,
    )


def _profile_v0(
    tower: VisionTower,
    facts: ModelFacts,
    active: dict[str, ModalityItem],
    limits: dict[str, int],
    default: int,
    per: int,
    act_bytes: int,
    vision_w: int,
    notes: list[str],
    max_num_batched_tokens: int,
    max_num_seqs: int,
    version: tuple[int, int, int],
    none: Callable[[str], EncoderProfile],
) -> EncoderProfile:
    """V0's profile run: the encoder-decoder runner's (mllama), else the decoder-only one's."""
    if tower.encoder_decoder:
        return _encoder_decoder_v0(
            tower,
            facts,
            per,
            limits.get("image", default),
            max_num_seqs,
            max_num_batched_tokens,
            act_bytes,
            vision_w,
            notes,
        )
    # V0 (vllm 0.6.6 vllm/worker/model_runner.py:1241-1262 profile_run): the sequences are cut by the registry's
    # max multimodal tokens — the sum over modalities of limit × tokens per item (video counted too) — and each
    # dummy sequence carries the dummy builder's items: images only in 0.6 (qwen2_vl.py:838-862
    # ``_get_dummy_mm_inputs``), images and videos from 0.7 (0.7.3 qwen2_vl.py:936-970
    # ``get_dummy_processor_inputs``); a sequence shorter than its placeholders is not truncated
    # (multimodal/processing.py:848-888), so the text forward runs over max(max_num_batched_tokens, all
    # placeholders) tokens.
    if version < (0, 7, 0) and "video" in active and "image" in active:
        # 0.6's registry sized a video like one image: ``_get_vision_info(data_type_key="video", mm_count=1)``
        # gives grid_t = max(1 // temporal_patch_size, 1) = 1 (vllm 0.6.6 qwen2_vl.py:645-712)
        img = active["image"]
        active = {**active, "video": ModalityItem("video", img.tokens, img.patches)}
    max_mm_tokens = sum(limits.get(m, default) * it.tokens for m, it in active.items())
    seqs = max(1, min(max_num_seqs, max_num_batched_tokens // max(1, max_mm_tokens)))
    dummy = active if version >= (0, 7, 0) else {m: it for m, it in active.items() if m == "image"}
    if not dummy:
        return none("no dummy multimodal item in this release's V0 profile (images only before 0.7)")
    n = seqs * sum(limits.get(m, default) for m in dummy)
    tokens_all = seqs * sum(limits.get(m, default) * it.tokens for m, it in dummy.items())
    patches_all = seqs * sum(limits.get(m, default) * it.patches for m, it in dummy.items())
    out = tokens_all * tower.out_hidden * act_bytes
    peak = patches_all * per + out
    modality, item = max(dummy.items(), key=lambda kv: (kv[1].tokens, kv[0]))
    notes.append(f"V0 profile: {seqs} sequence(s) with {', '.join(dummy)} items, {tokens_all:,} placeholder tokens")
    return EncoderProfile(
        modality,
        item.tokens,
        item.patches,
        n,
        n,
        int(peak),
        int(out),
        vision_w,
        seqs,
        None,
        tuple(notes),
        text_tokens=max(max_num_batched_tokens, tokens_all),
    )


def _profile_v1(
    tower: VisionTower,
    active: dict[str, ModalityItem],
    limits: dict[str, int],
    per: int,
    act_bytes: int,
    vision_w: int,
    notes: list[str],
    max_model_len: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    chunked_prefill: bool,
    tp: int,
    data_mode: bool,
) -> EncoderProfile:
    """The V1 encoder profile (the module docstring's formulas): the modality whose item has the most tokens, as
    many items as the encoder budget and the sequences hold, spread over the TP ranks in data mode."""
    modality, item = max(active.items(), key=lambda kv: (kv[1].tokens, kv[0]))
    T = item.tokens
    budget = max(max_num_batched_tokens, T)
    per_prompt = max(1, min(limits.get(modality, V1_DEFAULT_LIMIT), max_model_len // T))
    seqs = max_num_seqs if chunked_prefill else min(max_num_seqs, max_num_batched_tokens // T)
    n = max(1, min(budget // T, seqs * per_prompt))
    on_rank = -(-n // tp) if data_mode else n
    # Qwen3-VL's output carries the deepstack features too: [tokens, out_hidden × mergers] (qwen3_vl.py:885-904)
    out_width = tower.out_hidden * tower.mergers
    peak = on_rank * item.patches * per + on_rank * T * out_width * act_bytes
    out = n * T * out_width * act_bytes
    notes.append(f"encoder budget {budget:,} tokens: {n} {modality} item(s) of {T:,} tokens in the profile batch")
    return EncoderProfile(
        modality, T, item.patches, n, on_rank, int(peak), int(out), vision_w, None, None, tuple(notes)
    )


def mllama_image_geometry(tower: VisionTower) -> tuple[int, int]:
    """``(patches the vision blocks process, tokens the image adds)`` for one mllama image of ``max_num_tiles``
    tiles (vllm 0.6.6 vllm/model_executor/models/mllama.py): each tile is ``(image_size // patch)² + 1`` patches
    (the class embedding, :589), padded to a multiple of 8 for the encoder (:633-640); the padding is sliced off the
    output (:676-690), so ``get_max_mllama_image_tokens`` counts ``tiles × ((image_size // 14)² + 1)`` (:185-188)."""
    size = tower.image_size if tower.image_size and 0 < tower.image_size <= 1 << 14 else 560
    per_tile = (size // max(1, tower.patch_size)) ** 2 + 1
    padded = per_tile + (-per_tile) % 8
    return tower.max_num_tiles * padded, tower.max_num_tiles * per_tile


def _encoder_decoder_v0(
    tower: VisionTower,
    facts: ModelFacts,
    per: int,
    limit: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    act_bytes: int,
    vision_w: int,
    notes: list[str],
) -> EncoderProfile:
    """V0's encoder-decoder profile run (mllama): unlike the decoder-only runner it does **not** cut the sequences
    for the multimodal tokens — all ``max_num_seqs`` dummy sequences of ``max_num_batched_tokens // max_num_seqs``
    tokens carry the encoder dummy data of ``limit_mm_per_prompt`` images (vllm 0.6.6
    vllm/worker/enc_dec_model_runner.py:264-340; mllama.py:202-225: one 1024 × 1024 image, which the processor
    splits into ``max_num_tiles`` tiles), and the vision model runs on the whole batch at once
    (mllama.py:1269-1290 ``get_cross_attention_states``). Its self-attention takes an additive aspect-ratio mask of
    ``images × (tiles·padded patches)²`` elements in the activation dtype (mllama.py:228-255, 642-648 — 9.9 GiB
    for 128 four-tile images), live for the whole encoder next to the per-patch activations; the projected
    cross-attention states (``tokens × text hidden``) are kept for the decoder's forward.

    The per-patch live set is the generic ViT one (``per_patch_bytes``), not a trace of mllama's: its encoder also
    holds the five intermediate-layer states it concatenates into the output (and, in the global stage, their
    stacked copy, mllama.py:655-690), which a line-by-line count adds on top — more than the one public log
    (Llama-3.2-11B-Vision, 128 sequences: 36.63 GiB printed, 36.65 GiB here) shows. The sequence count, tiles,
    padding and mask are exact; the agreement of the total on that one log is not evidence for the live set."""
    images = max_num_seqs * max(1, limit)
    patches, tokens = mllama_image_geometry(tower)
    mask = images * patches * patches * act_bytes
    out = images * tokens * facts.hidden_size * act_bytes
    peak = mask + images * patches * per + out
    notes.append(
        f"V0 encoder-decoder profile: {max_num_seqs} sequence(s), {images} image(s) of {tower.max_num_tiles} "
        f"tiles ({patches:,} padded patches, {tokens:,} cross-attention tokens each); aspect-ratio mask "
        f"{mask / (1 << 30):.2f} GiB"
    )
    return EncoderProfile(
        "image",
        tokens,
        patches,
        images,
        images,
        int(peak),
        int(out),
        vision_w,
        max_num_seqs,
        None,
        tuple(notes),
        text_tokens=max_num_batched_tokens,
    )


__all__ = [
    "VisionTower",
    "vision_tower",
    "encoder_profile",
    "EncoderProfile",
    "qwen_image_grid",
    "per_patch_bytes",
    "mllama_image_geometry",
]
