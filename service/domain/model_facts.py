"""Model facts read from a Hugging Face ``config.json`` the way vLLM 0.33 reads them.

Sources (vLLM 0.33.0 wheel, see ../shared/vllm-rules.md):
- text config of multimodal models: ``text_config`` (also ``llm_config`` / ``language_config``), §1.1;
- KV heads: first of ``n_head_kv, num_kv_heads, num_key_value_heads, multi_query_group_num, num_attention_groups``,
  default = attention heads; Falcon ``multi_query`` without the new decoder architecture = 1 KV head
  (vllm/transformers_utils/config.py:56-63, model_arch_config_convertor.py:152-157), §1.2;
- head_dim: ``head_dim`` if > 0, else ``hidden_size_per_head``, else hidden // heads (convertor:91-118), §7.1;
- derived maximum length: smallest of the length keys, ``model_max_length`` overriding, rope scaling factor applied
  only for scaling rope types (convertor:374-407, model.py:2598-2650), §4;
- MLA: ``kv_lora_rank`` present on an MLA model type (convertor:294-342), §1.9;
- quantization_config from ``quantization_config`` / ``text_config.quantization_config`` / ``compression_config``,
  or ``hf_quant_config.json`` for ModelOpt checkpoints (convertor:241-292), §2.3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .errors import DomainError

KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num", "num_attention_groups")
HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "dim")
INTERMEDIATE_KEYS = ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim")
EXPERT_KEYS = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")
# vllm 0.33.0 model_arch_config_convertor.py:374-407 (order irrelevant: the smallest wins)
LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# rope types whose factor does NOT extend the derived length (model.py:2598-2634; yarn since PR #56446)
NON_SCALING_ROPE_TYPES = {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"}
MLA_MODEL_TYPES = {
    "deepseek_v2",
    "deepseek_v3",
    "deepseek_v32",
    "deepseek_mtp",
    "kimi_k2",
    "kimi_linear",
    "glm_moe_dsa",
    "longcat_flash",
    "pangu_ultra_moe",
    "mistral_large_3",
}
FALCON_TYPES = {"falcon", "RefinedWeb", "RefinedWebModel"}
DEFAULT_MAX_LEN = 2048  # model.py:2579-2596: assumed when config.json has no length key


def _first(cfg: dict, keys: tuple[str, ...]) -> Any:
    for k in keys:
        v = cfg.get(k)
        if v is not None:
            return v
    return None


def _pos_int(value: Any, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 0:
        raise DomainError(field, f"{field} must be a non-negative integer, got {value!r}", rule="config_invalid")
    return int(value)


@dataclass(frozen=True)
class VisionTower:
    """A TP-sharded vision encoder: its head count (and hidden size) as config.json gives them."""

    model_type: str | None
    num_attention_heads: int | None
    hidden_size: int | None
    num_hidden_layers: int | None


@dataclass(frozen=True)
class QuantConfig:
    """The checkpoint's quantization as vLLM resolves it from config.json / hf_quant_config.json.

    ``method``: vLLM's name after normalisation (``awq``, ``gptq``, ``fp8``, ``compressed-tensors``, ``modelopt``,
    ``modelopt_fp4``, ``mxfp4``, …). ``bits``/``group_size``/``sym``/``desc_act`` for int4/int8 methods;
    ``weight_block_size`` for FP8 block quantization; ``raw`` the dict as found.
    """

    method: str
    raw: dict
    source: str
    bits: int | None = None
    group_size: int | None = None
    sym: bool | None = None
    desc_act: bool | None = None
    weight_block_size: tuple[int, int] | None = None
    kv_cache_quant: str | None = None


@dataclass(frozen=True)
class ModelFacts:
    """What vLLM needs to know about a model, read from its config.json.

    Sizes are element counts; ``derived_max_model_len`` is in tokens. ``total_num_kv_heads`` is the value vLLM
    uses for divisibility checks (for MLA models the real latent cache is one head: see ``is_mla``).
    """

    model_type: str | None
    architectures: tuple[str, ...]
    num_attention_heads: int
    total_num_kv_heads: int
    head_dim: int
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int | None
    moe_intermediate_size: int | None
    shared_expert_intermediate_size: int | None
    num_experts: int
    n_shared_experts: int
    first_k_dense_replace: int
    vocab_size: int | None
    tie_word_embeddings: bool
    torch_dtype: str | None
    derived_max_model_len: int
    max_len_key: str
    model_max_length: int | None
    rope_type: str | None
    rope_factor: float | None
    sliding_window: int | None
    is_mla: bool
    kv_lora_rank: int | None
    qk_rope_head_dim: int | None
    qk_nope_head_dim: int | None
    v_head_dim: int | None
    q_lora_rank: int | None
    quant: QuantConfig | None
    vision: VisionTower | None
    has_auto_map: bool
    is_multimodal: bool
    raw_text_config: dict = field(repr=False, default_factory=dict)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


def text_config_of(config: dict) -> dict:
    """The text part of a (possibly multimodal) config, as ``hf_text_config`` in vLLM."""
    for key in ("text_config", "llm_config", "language_config"):
        sub = config.get(key)
        if isinstance(sub, dict) and sub:
            return sub
    return config


def _normalise_dtype(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).replace("torch.", "").lower()
    return {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(text, text)


def _rope(text: dict) -> tuple[str | None, float | None, dict | None]:
    rope = text.get("rope_scaling") or text.get("rope_parameters")
    if not isinstance(rope, dict):
        return None, None, None
    # Transformers v5 nests per-layer-type parameters; take the first dict that names a type
    if "rope_type" not in rope and "type" not in rope:
        nested = [v for v in rope.values() if isinstance(v, dict)]
        rope = nested[0] if nested else rope
    rtype = rope.get("rope_type") or rope.get("type")
    factor = rope.get("factor")
    return (str(rtype) if rtype else None), (float(factor) if isinstance(factor, (int, float)) else None), rope


def derive_max_model_len(text: dict, model_type: str | None) -> tuple[int, str, int | None]:
    """The maximum length vLLM 0.33 derives: ``(length, key, model_max_length)``.

    Smallest present length key; a truthy ``model_max_length`` overrides it; rope ``factor`` multiplies it only for
    scaling types (linear, dynamic, …), never for su/longrope/llama3/yarn/deepseek_yarn or gemma3; LongRoPE uses
    ``original_max_position_embeddings``. Mirrors vllm 0.33.0 model_arch_config_convertor.py:374-407 and
    vllm/config/model.py:2579-2650 (YaRN rule after PR #56446). No key → 2048.
    """
    found: list[tuple[int, str]] = []
    for k in LENGTH_KEYS:
        v = text.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            found.append((int(v), k))
    mml = text.get("model_max_length")
    mml = int(mml) if isinstance(mml, (int, float)) and not isinstance(mml, bool) and mml > 0 else None
    if not found:
        return DEFAULT_MAX_LEN, "default", mml
    length, key = min(found)
    if mml:
        length, key = mml, "model_max_length"
    rtype, factor, rope = _rope(text)
    if rope is not None and rtype and not (model_type or "").startswith("gemma3"):
        if rtype == "longrope" and rope.get("original_max_position_embeddings"):
            length = int(rope["original_max_position_embeddings"])
        elif rtype not in NON_SCALING_ROPE_TYPES and factor:
            length = int(length * factor)
    return length, key, mml


def read_quant_config(config: dict, hf_quant_config: dict | None) -> QuantConfig | None:
    """The checkpoint's quantization config (§2.3): config.json ``quantization_config`` (or the text config's, or
    ``compression_config``), else a ModelOpt ``hf_quant_config.json`` (``producer.name == "modelopt"``).

    Raises DomainError for a ModelOpt ``quant_algo`` vLLM does not know (convertor:241-292).
    """
    text = text_config_of(config)
    raw = config.get("quantization_config") or text.get("quantization_config") or config.get("compression_config")
    source = "config.json"
    if not raw and hf_quant_config:
        raw, source = hf_quant_config, "hf_quant_config.json"
    if not isinstance(raw, dict) or not raw:
        return None
    producer = (raw.get("producer") or {}).get("name") if isinstance(raw.get("producer"), dict) else None
    modelopt = raw.get("quantization") if isinstance(raw.get("quantization"), dict) else None
    if producer == "modelopt" or (modelopt is not None and "quant_algo" in modelopt):
        q = modelopt or raw
        algo = str(q.get("quant_algo") or "").upper()
        table = {
            "FP8": "modelopt",
            "FP8_PER_CHANNEL_PER_TOKEN": "modelopt",
            "FP8_PB_WO": "modelopt",
            "NVFP4": "modelopt_fp4",
            "MXFP8": "modelopt_mxfp8",
            "MIXED_PRECISION": "modelopt_mixed",
        }
        if algo not in table:
            raise DomainError(
                "model.hf_quant_config", f"Unknown ModelOpt quant algo: {algo or None}", rule="quant_unknown",
                accepted=sorted(table),
            )
        kvq = q.get("kv_cache_quant_algo")
        return QuantConfig(method=table[algo], raw=raw, source=source, kv_cache_quant=str(kvq).lower() if kvq else None)
    method = str(raw.get("quant_method") or "").lower().replace("compressed_tensors", "compressed-tensors")
    if not method:
        return None
    bits = raw.get("bits", raw.get("w_bit", raw.get("num_bits")))
    group = raw.get("group_size", raw.get("q_group_size"))
    sym = raw.get("sym")
    if method == "awq":
        sym = not raw.get("zero_point", True)
    block = raw.get("weight_block_size")
    if method == "compressed-tensors":
        weights = None
        for grp in (raw.get("config_groups") or {}).values():
            if isinstance(grp, dict) and isinstance(grp.get("weights"), dict):
                weights = grp["weights"]
                break
        if weights:
            bits = weights.get("num_bits", bits)
            group = weights.get("group_size", group)
            sym = weights.get("symmetric", sym)
            if weights.get("type") == "float" and weights.get("block_structure"):
                block = weights.get("block_structure")
    kv_scheme = raw.get("kv_cache_scheme")
    return QuantConfig(
        method=method,
        raw=raw,
        source=source,
        bits=int(bits) if isinstance(bits, (int, float)) and not isinstance(bits, bool) else None,
        group_size=int(group) if isinstance(group, (int, float)) and not isinstance(group, bool) else None,
        sym=bool(sym) if sym is not None else None,
        desc_act=bool(raw["desc_act"]) if raw.get("desc_act") is not None else None,
        weight_block_size=(int(block[0]), int(block[1])) if isinstance(block, (list, tuple)) and len(block) == 2 else None,
        kv_cache_quant="fp8" if isinstance(kv_scheme, dict) and kv_scheme.get("type") == "float" else None,
    )


def _vision(config: dict) -> VisionTower | None:
    vis = config.get("vision_config")
    if not isinstance(vis, dict):
        return None
    heads = _first(vis, ("num_attention_heads", "num_heads", "n_head", "attention_heads"))
    return VisionTower(
        model_type=vis.get("model_type"),
        num_attention_heads=int(heads) if isinstance(heads, int) else None,
        hidden_size=_first(vis, ("hidden_size", "embed_dim", "width")),
        num_hidden_layers=_first(vis, ("num_hidden_layers", "depth", "num_layers")),
    )


def read_model_facts(config: dict, hf_quant_config: dict | None = None,
                     length_defaults: dict | None = None) -> ModelFacts:
    """Read a config.json dict into ModelFacts.

    Raises DomainError naming the ``model.config.<key>`` that is missing or invalid (attention heads, layers and
    hidden size are required: vLLM cannot build a model without them).
    """
    if not isinstance(config, dict) or not config:
        raise DomainError("model.config", "config.json must be a non-empty JSON object", rule="config_invalid")
    text = text_config_of(config)
    model_type = text.get("model_type") or config.get("model_type")
    prefix = "model.config." + ("text_config." if text is not config else "")
    heads = _pos_int(_first(text, HEAD_KEYS), prefix + "num_attention_heads")
    layers = _pos_int(_first(text, LAYER_KEYS), prefix + "num_hidden_layers")
    hidden = _pos_int(_first(text, HIDDEN_KEYS), prefix + "hidden_size")
    for name, value in (("num_attention_heads", heads), ("num_hidden_layers", layers), ("hidden_size", hidden)):
        if not value:
            raise DomainError(prefix + name, f"config.json has no usable {name} (needed to build the model)",
                              rule="config_missing_key")
    if model_type in FALCON_TYPES and not text.get("new_decoder_architecture") and text.get("multi_query"):
        kv = 1
    else:
        kv = _pos_int(_first(text, KV_HEAD_KEYS), prefix + "num_key_value_heads") or heads
    head_dim = _pos_int(text.get("head_dim"), prefix + "head_dim") or _pos_int(
        text.get("hidden_size_per_head"), prefix + "hidden_size_per_head"
    )
    is_mla = model_type in MLA_MODEL_TYPES and bool(text.get("kv_lora_rank"))
    if is_mla:  # MLA caches the latent: head size = kv_lora_rank + qk_rope_head_dim (convertor:92-98)
        head_dim = int(text["kv_lora_rank"]) + int(text.get("qk_rope_head_dim") or 0)
    if not head_dim:
        head_dim = hidden // heads
    # ``length_defaults``: the length keys the Transformers config class of this model_type sets when config.json
    # omits them (FalconConfig: max_position_embeddings=2048), from the target release's generated catalogue
    defaults = (length_defaults or {}).get(model_type) if isinstance(model_type, str) else None
    if defaults and not any(k in text for k in LENGTH_KEYS):
        derived, key, mml = derive_max_model_len({**text, **defaults}, model_type)
    else:
        derived, key, mml = derive_max_model_len(text, model_type)
    rtype, factor, _ = _rope(text)
    num_experts = _pos_int(_first(text, EXPERT_KEYS), prefix + "num_experts") or 0
    arch = config.get("architectures") or text.get("architectures") or []
    sw = text.get("sliding_window")
    return ModelFacts(
        model_type=model_type,
        architectures=tuple(str(a) for a in arch) if isinstance(arch, list) else (),
        num_attention_heads=heads,
        total_num_kv_heads=kv,
        head_dim=head_dim,
        num_hidden_layers=layers,
        hidden_size=hidden,
        intermediate_size=_pos_int(_first(text, INTERMEDIATE_KEYS), prefix + "intermediate_size"),
        moe_intermediate_size=_pos_int(text.get("moe_intermediate_size"), prefix + "moe_intermediate_size")
        or (_pos_int(text.get("intermediate_size"), prefix + "intermediate_size") if num_experts and model_type in ("mixtral", "gpt_oss") else None),
        shared_expert_intermediate_size=_pos_int(text.get("shared_expert_intermediate_size"), prefix + "shared_expert_intermediate_size"),
        num_experts=num_experts,
        n_shared_experts=_pos_int(text.get("n_shared_experts"), prefix + "n_shared_experts") or 0,
        first_k_dense_replace=_pos_int(text.get("first_k_dense_replace"), prefix + "first_k_dense_replace") or 0,
        vocab_size=_pos_int(text.get("vocab_size") or config.get("vocab_size"), prefix + "vocab_size"),
        tie_word_embeddings=bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
        torch_dtype=_normalise_dtype(
            config.get("dtype") or config.get("torch_dtype") or text.get("dtype") or text.get("torch_dtype")
        ),
        derived_max_model_len=derived,
        max_len_key=key,
        model_max_length=mml,
        rope_type=rtype,
        rope_factor=factor,
        sliding_window=sw if isinstance(sw, int) and sw > 0 else None,
        is_mla=is_mla,
        kv_lora_rank=text.get("kv_lora_rank") if is_mla else None,
        qk_rope_head_dim=text.get("qk_rope_head_dim") if is_mla else None,
        qk_nope_head_dim=text.get("qk_nope_head_dim") if is_mla else None,
        v_head_dim=text.get("v_head_dim") if is_mla else None,
        q_lora_rank=text.get("q_lora_rank") if is_mla else None,
        quant=read_quant_config(config, hf_quant_config),
        vision=_vision(config),
        has_auto_map=bool(config.get("auto_map") or text.get("auto_map")),
        is_multimodal=text is not config or "vision_config" in config,
        raw_text_config=text,
    )


def divisors(n: int, limit: int | None = None) -> list[int]:
    """Positive divisors of ``n`` up to ``limit`` (inclusive), ascending."""
    top = n if limit is None else min(n, limit)
    return [d for d in range(1, top + 1) if n % d == 0]


def round_up(x: int, multiple: int) -> int:
    return int(math.ceil(x / multiple) * multiple)
