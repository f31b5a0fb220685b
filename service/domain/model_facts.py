"""Model facts read from a Hugging Face ``config.json`` the way vLLM 0.33 reads them.

Sources (vLLM 0.33.0 wheel, paths under vllm/):
- text config of multimodal models: ``text_config`` (also ``llm_config`` / ``language_config``)
  (transformers_utils/model_arch_config_convertor.py:82-83);
- KV heads: first of ``n_head_kv, num_kv_heads, num_key_value_heads, multi_query_group_num, num_attention_groups``,
  default = attention heads; Falcon ``multi_query`` without the new decoder architecture = 1 KV head
  (transformers_utils/config.py:56-63, model_arch_config_convertor.py:152-157);
- head_dim: ``head_dim`` if > 0, else ``hidden_size_per_head``, else hidden // heads (convertor:91-118);
- derived maximum length: as the target release derives it (service/domain/max_len.py: length keys, ``model_max_length``,
  rope scaling per release, overrides);
- MLA: ``kv_lora_rank`` present on an MLA model type (convertor:294-342);
- quantization_config from ``quantization_config`` / ``text_config.quantization_config`` / ``compression_config``,
  or ``hf_quant_config.json`` for ModelOpt checkpoints (convertor:241-292).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import DomainError
from .layer_layout import LayerLayout, layer_layout

if TYPE_CHECKING:  # max_len reads this module's checks; imported where used
    from .max_len import LengthInput, MaxLen

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

# ---------------------------------------------------------------------------------------------------------------
# Documented ranges of the config.json values read here (README "Input bounds"). Generous — far above any real model
# (the largest known: ~200 layers, hidden 2^14-2^15, 256k vocabulary, 512 experts, 10M context) — so no real config
# is refused; they exist so that no arithmetic on an input number overflows or runs for long.
# ---------------------------------------------------------------------------------------------------------------
MAX_LAYERS = 10_000
MAX_HEADS = 1 << 16
MAX_HIDDEN = 1 << 20
MAX_WIDTH = 1 << 24  # intermediate (MLP) widths
MAX_HEAD_DIM = 1 << 16
MAX_EXPERTS = 1 << 16
MAX_VOCAB = 1 << 26
MAX_LENGTH = 1 << 40  # tokens: position embeddings, sliding windows, derived lengths
MAX_ROPE_FACTOR = 1e6
MAX_BITS = 64
# keys other modules read from the raw text config (memory/, rules/shapes.py): checked here, once
RAW_INT_KEYS: dict[str, tuple[int, int]] = {
    "num_experts_per_tok": (0, MAX_EXPERTS),
    "experts_per_token": (0, MAX_EXPERTS),
    "moe_topk": (0, MAX_EXPERTS),
    "num_experts_per_token": (0, MAX_EXPERTS),
    "decoder_sparse_step": (0, MAX_LAYERS),
    "sliding_window_pattern": (0, MAX_LAYERS),
    "num_nextn_predict_layers": (0, MAX_LAYERS),
}


def _first(cfg: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for k in keys:
        v = cfg.get(k)
        if v is not None:
            return v
    return None


def _first_key(cfg: dict[str, Any], keys: tuple[str, ...]) -> tuple[str, Any]:
    """The first of ``keys`` with a value, and that value (``(keys[0], None)`` when none has one)."""
    for k in keys:
        v = cfg.get(k)
        if v is not None:
            return k, v
    return keys[0], None


def config_int(value: Any, field: str, lo: int = 0, hi: int = MAX_LENGTH) -> int | None:
    """The one check every config.json integer goes through: None stays None; anything but an integral number
    (booleans, strings, lists, 1.5) or a number outside ``[lo, hi]`` is a DomainError (422) naming ``field``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DomainError(
            field, f"{field} must be an integer, got {type(value).__name__} {_short(value)}", rule="config_invalid"
        )
    if isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()):
        raise DomainError(field, f"{field} must be an integer, got {_short(value)}", rule="config_invalid")
    if not lo <= value <= hi:
        raise DomainError(
            field, f"{field} must be between {lo} and {hi}, got {_short(value)}", rule="config_out_of_range"
        )
    return int(value)


def config_number(value: Any, field: str, lo: float, hi: float) -> float | None:
    """A config.json number (int or float) within ``[lo, hi]``, or None; else a DomainError naming ``field``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DomainError(
            field, f"{field} must be a number, got {type(value).__name__} {_short(value)}", rule="config_invalid"
        )
    if not (lo <= value <= hi):  # also refuses NaN
        raise DomainError(
            field, f"{field} must be between {lo:g} and {hi:g}, got {_short(value)}", rule="config_out_of_range"
        )
    return float(value)


def config_dict(value: Any, field: str) -> dict[str, Any] | None:
    if value is None or isinstance(value, dict):
        return value
    raise DomainError(field, f"{field} must be an object, got {type(value).__name__}", rule="config_invalid")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _pos_int(value: Any, field: str, hi: int = MAX_LENGTH) -> int | None:
    return config_int(value, field, 0, hi)


def _get_int(cfg: dict[str, Any], key: str, prefix: str, lo: int = 0, hi: int = MAX_LENGTH) -> int | None:
    """``config_int(cfg.get(key), prefix + key, lo, hi)``; a plain in-range int (what a real config.json holds)
    returns without building the field name."""
    value = cfg.get(key)
    if value is None:
        return None
    if type(value) is int and lo <= value <= hi:
        return value
    return config_int(value, prefix + key, lo, hi)


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
    raw: dict[str, Any]
    source: str
    bits: int | None = None
    group_size: int | None = None
    sym: bool | None = None
    desc_act: bool | None = None
    weight_block_size: tuple[int, int] | None = None
    kv_cache_quant: str | None = None


# Decoders whose MLP is two matrices (up, down: 2·H·I parameters), not a gated pair (gate_up, down: 3·H·I). Read from
# vLLM 0.33.0's model files: model_executor/models/falcon.py:225-257 (FalconMLP: dense_h_to_4h, dense_4h_to_h),
# gpt2.py:115-141 (c_fc, c_proj), gpt_j.py:126-150 (fc_in, fc_out), opt.py:126-169 (fc1, fc2), bloom.py:150-173
# (dense_h_to_4h, dense_4h_to_h), nemotron.py:138-165 (up_proj, down_proj: relu²), nemotron_h.py:92-132 and 229-240
# (NemotronHMLP up_proj, down_proj: its dense MLP, shared experts and routed experts); and those 0.33 serves through
# the Transformers backend (registry.py:753-767) with transformers' own two-matrix MLPs: PhiForCausalLM (fc1, fc2),
# GPTNeoXForCausalLM (dense_h_to_4h, dense_4h_to_h), GPTBigCodeForCausalLM and Starcoder2ForCausalLM (c_fc, c_proj).
# Every other decoder is counted gated (LlamaMLP and its many copies: gate_up_proj as MergedColumnParallelLinear).
NON_GATED_MLP = frozenset(
    {
        "FalconForCausalLM",
        "RWForCausalLM",
        "GPT2LMHeadModel",
        "GPTJForCausalLM",
        "OPTForCausalLM",
        "BloomForCausalLM",
        "NemotronForCausalLM",
        "PhiForCausalLM",
        "GPTNeoXForCausalLM",
        "GPTBigCodeForCausalLM",
        "Starcoder2ForCausalLM",
        "NemotronHForCausalLM",
    }
)


# built per plan, with 35 fields: not frozen, because a frozen __init__ pays an object.__setattr__ call per field
# (a third of reading a config.json); nothing assigns to a ModelFacts after read_model_facts builds it
@dataclass(slots=True)
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
    layout: LayerLayout = field(repr=False)  # what each decoder layer is (layer_layout.py)
    raw_text_config: dict[str, Any] = field(repr=False, default_factory=dict)
    # the whole config.json (vision_config …)
    raw_config: dict[str, Any] = field(repr=False, default_factory=dict, compare=False)
    # the derivation behind derived_max_model_len: the default length, the rope factor, what the release fails on
    max_len: MaxLen | None = field(repr=False, default=None, compare=False)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of H × intermediate in a dense layer's MLP: 2 (up, down) or 3 (gate, up, down)."""
        return 2 if any(a in NON_GATED_MLP for a in self.architectures) else 3


def text_config_of(config: dict[str, Any]) -> dict[str, Any]:
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


def derive_max_model_len(
    text: dict[str, Any], model_type: str | None, prefix: str = "model.config.", length: LengthInput | None = None
) -> tuple[int, str, int | None]:
    """``(length, key, model_max_length)`` as the release of ``length`` derives it (the newest without one); see
    service/domain/max_len.py."""
    from .max_len import derive

    ml = derive(text, model_type, prefix, length)
    return ml.derived, ml.key, ml.model_max_length


MODELOPT_ALGOS = {  # vllm 0.33.0 model_arch_config_convertor.py:241-292
    "FP8": "modelopt",
    "FP8_PER_CHANNEL_PER_TOKEN": "modelopt",
    "FP8_PB_WO": "modelopt",
    "NVFP4": "modelopt_fp4",
    "MXFP8": "modelopt_mxfp8",
    "MIXED_PRECISION": "modelopt_mixed",
}


def _modelopt(raw: dict[str, Any], source: str) -> QuantConfig | None:
    """A ModelOpt config (``producer.name == "modelopt"`` or the legacy ``quantization.quant_algo``), or None."""
    producer = (raw.get("producer") or {}).get("name") if isinstance(raw.get("producer"), dict) else None
    modelopt = raw.get("quantization") if isinstance(raw.get("quantization"), dict) else None
    if producer != "modelopt" and (modelopt is None or "quant_algo" not in modelopt):
        return None
    q = modelopt or raw
    algo = str(q.get("quant_algo") or "").upper()
    if algo not in MODELOPT_ALGOS:
        raise DomainError(
            "model.hf_quant_config",
            f"Unknown ModelOpt quant algo: {algo or None}",
            rule="quant_unknown",
            accepted=sorted(MODELOPT_ALGOS),
        )
    kvq = q.get("kv_cache_quant_algo")
    return QuantConfig(
        method=MODELOPT_ALGOS[algo], raw=raw, source=source, kv_cache_quant=str(kvq).lower() if kvq else None
    )


def _ct_weights(raw: dict[str, Any], qf: str) -> tuple[dict[str, Any] | None, str]:
    """A compressed-tensors config's first weight scheme and its field prefix (every group checked for shape)."""
    weights: dict[str, Any] | None = None
    wf = ""
    groups = config_dict(raw.get("config_groups"), qf + "config_groups") or {}
    for name, grp in groups.items():
        config_dict(grp, f"{qf}config_groups.{name}")
        if isinstance(grp, dict):
            for part in ("weights", "input_activations", "output_activations"):
                config_dict(grp.get(part), f"{qf}config_groups.{name}.{part}")
        if isinstance(grp, dict) and isinstance(grp.get("weights"), dict) and weights is None:
            weights = grp["weights"]
            wf = f"{qf}config_groups.{name}.weights."
    return weights, wf


def _block_pair(block: Any, field: str) -> tuple[int, int] | None:
    if block is None:
        return None
    n = config_int(block[0], field + "[0]", 1, MAX_WIDTH)
    k = config_int(block[1], field + "[1]", 1, MAX_WIDTH)
    if n is None or k is None:
        raise DomainError(field, f"{field} must be a list of two integers", rule="config_invalid")
    return n, k


def read_quant_config(config: dict[str, Any], hf_quant_config: dict[str, Any] | None) -> QuantConfig | None:
    """The checkpoint's quantization config: config.json ``quantization_config`` (or the text config's, or
    ``compression_config``), else a ModelOpt ``hf_quant_config.json`` (``producer.name == "modelopt"``)
    (vllm 0.33.0 model_arch_config_convertor.py:241-292; vllm/config/model.py:1383-1462).

    Raises DomainError for a ModelOpt ``quant_algo`` vLLM does not know (convertor:241-292).
    """
    text = text_config_of(config)
    raw = config.get("quantization_config") or text.get("quantization_config") or config.get("compression_config")
    source = "config.json"
    if not raw and hf_quant_config:
        raw, source = hf_quant_config, "hf_quant_config.json"
    if not isinstance(raw, dict) or not raw:
        return None
    modelopt = _modelopt(raw, source)
    if modelopt is not None:
        return modelopt
    method = raw.get("quant_method") or ""
    if not isinstance(method, str):
        raise DomainError(
            "model.config.quantization_config.quant_method", "quant_method must be a string", rule="config_invalid"
        )
    method = method.lower().replace("compressed_tensors", "compressed-tensors")
    if not method:
        return None
    qf = "model.config.quantization_config." if source == "config.json" else "model.hf_quant_config."
    for key in ("ignore", "modules_to_not_convert", "exclude_modules", "ignored_layers"):
        names = raw.get(key)
        if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise DomainError(qf + key, f"{qf + key} must be a list of module names (strings)", rule="config_invalid")
    bits = raw.get("bits", raw.get("w_bit", raw.get("num_bits")))
    group = raw.get("group_size", raw.get("q_group_size"))
    sym = raw.get("sym")
    if method == "awq":
        sym = not raw.get("zero_point", True)
    block = raw.get("weight_block_size")
    if block is not None and not (isinstance(block, (list, tuple)) and len(block) == 2):
        raise DomainError(
            qf + "weight_block_size", "weight_block_size must be a list of two integers", rule="config_invalid"
        )
    block_field = qf + "weight_block_size"
    if method == "compressed-tensors":
        weights, wf = _ct_weights(raw, qf)
        if weights:
            bits = config_int(weights.get("num_bits", bits), wf + "num_bits", 0, MAX_BITS)
            group = config_int(weights.get("group_size", group), wf + "group_size", -1, MAX_WIDTH)
            sym = weights.get("symmetric", sym)
            structure = weights.get("block_structure")
            if weights.get("type") == "float" and isinstance(structure, list) and len(structure) == 2:
                block, block_field = structure, wf + "block_structure"
    bits = config_int(bits, qf + "bits", 0, MAX_BITS)
    group = config_int(group, qf + "group_size", -1, MAX_WIDTH)
    kv_scheme = raw.get("kv_cache_scheme")
    return QuantConfig(
        method=method,
        raw=raw,
        source=source,
        bits=bits,
        group_size=group,
        sym=bool(sym) if sym is not None else None,
        desc_act=bool(raw["desc_act"]) if raw.get("desc_act") is not None else None,
        weight_block_size=_block_pair(block, block_field),
        kv_cache_quant="fp8" if isinstance(kv_scheme, dict) and kv_scheme.get("type") == "float" else None,
    )


def _vision(config: dict[str, Any]) -> VisionTower | None:
    vis = config.get("vision_config")
    if not isinstance(vis, dict):
        return None
    f = "model.config.vision_config."
    hk, heads = _first_key(vis, ("num_attention_heads", "num_heads", "n_head", "attention_heads"))
    sk, hidden = _first_key(vis, ("hidden_size", "embed_dim", "width"))
    lk, layers = _first_key(vis, ("num_hidden_layers", "depth", "num_layers"))
    mt = vis.get("model_type")
    return VisionTower(
        model_type=mt if isinstance(mt, str) else None,
        num_attention_heads=config_int(heads, f + hk, 0, MAX_HEADS),
        hidden_size=config_int(hidden, f + sk, 0, MAX_HIDDEN),
        num_hidden_layers=config_int(layers, f + lk, 0, MAX_LAYERS),
    )


def _read(text: dict[str, Any], prefix: str, keys: tuple[str, ...], lo: int = 0, hi: int = MAX_LENGTH) -> int | None:
    """The first of ``keys`` the text config gives, checked (errors name that key); None when none is given."""
    for key in keys:
        value = text.get(key)
        if value is not None:
            if type(value) is int and lo <= value <= hi:
                return value
            return config_int(value, prefix + key, lo, hi)
    return None


def _attention_shape(text: dict[str, Any], prefix: str, model_type: str | None) -> tuple[int, int, int, int]:
    """``(attention heads, layers, hidden size, KV heads)``: the first three required; KV heads from the first KV
    key, Falcon ``multi_query`` without the new decoder architecture one, otherwise the attention heads (vllm 0.33.0
    vllm/transformers_utils/config.py:56-63, model_arch_config_convertor.py:152-157)."""
    heads = _read(text, prefix, HEAD_KEYS, 1, MAX_HEADS)
    layers = _read(text, prefix, LAYER_KEYS, 1, MAX_LAYERS)
    hidden = _read(text, prefix, HIDDEN_KEYS, 1, MAX_HIDDEN)
    for name, value in (("num_attention_heads", heads), ("num_hidden_layers", layers), ("hidden_size", hidden)):
        if not value:
            raise DomainError(
                prefix + name,
                f"config.json has no usable {name} (needed to build the model)",
                rule="config_missing_key",
            )
    assert heads and layers and hidden  # checked just above
    kv_given = _read(text, prefix, KV_HEAD_KEYS, 0, MAX_HEADS)
    if kv_given and kv_given > heads:
        raise DomainError(
            prefix + _first_key(text, KV_HEAD_KEYS)[0],
            f"{kv_given} key/value heads but only {heads} attention heads (each KV head serves a group "
            f"of query heads: there cannot be more)",
            rule="config_out_of_range",
        )
    if model_type in FALCON_TYPES and not text.get("new_decoder_architecture") and text.get("multi_query"):
        kv = 1
    else:
        kv = kv_given or heads
    return heads, layers, hidden, kv


def _head_dim(
    text: dict[str, Any], prefix: str, model_type: str | None, hidden: int, heads: int
) -> tuple[int, dict[str, int | None]]:
    """``(head_dim, MLA dimensions)``: ``head_dim`` if > 0, else ``hidden_size_per_head``, else hidden // heads
    (convertor:91-118); an MLA model caches the latent, head size = kv_lora_rank + qk_rope_head_dim
    (convertor:92-98). The MLA dimensions are empty for other model types."""
    head_dim = _get_int(text, "head_dim", prefix, 0, MAX_HEAD_DIM) or _get_int(
        text, "hidden_size_per_head", prefix, 0, MAX_HEAD_DIM
    )
    mla: dict[str, int | None] = {}
    if model_type in MLA_MODEL_TYPES:
        for k, hi in (
            ("kv_lora_rank", MAX_HIDDEN),
            ("q_lora_rank", MAX_HIDDEN),
            ("qk_rope_head_dim", MAX_HEAD_DIM),
            ("qk_nope_head_dim", MAX_HEAD_DIM),
            ("v_head_dim", MAX_HEAD_DIM),
        ):
            mla[k] = _get_int(text, k, prefix, 0, hi)
    kv_lora = mla.get("kv_lora_rank")
    if kv_lora:
        head_dim = kv_lora + (mla["qk_rope_head_dim"] or 0)
    return head_dim or hidden // heads, mla


def _lengths(
    text: dict[str, Any],
    model_type: str | None,
    prefix: str,
    length_defaults: dict[str, Any] | None,
    length: LengthInput | None,
) -> MaxLen:
    """The derived maximum length; ``length_defaults`` are the length keys the Transformers config class of this
    model_type sets when config.json omits them (FalconConfig: max_position_embeddings=2048), from the target
    release's generated catalogue."""
    from .max_len import derive

    defaults = (length_defaults or {}).get(model_type) if isinstance(model_type, str) else None
    if defaults and not any(k in text for k in LENGTH_KEYS):
        return derive({**text, **defaults}, model_type, prefix, length)
    return derive(text, model_type, prefix, length)


def _moe_intermediate(text: dict[str, Any], prefix: str, num_experts: int, model_type: str | None) -> int | None:
    """The expert MLP width: ``moe_intermediate_size``; Mixtral and gpt-oss name it ``intermediate_size``."""
    return _get_int(text, "moe_intermediate_size", prefix, 0, MAX_WIDTH) or (
        _get_int(text, "intermediate_size", prefix, 0, MAX_WIDTH)
        if num_experts and model_type in ("mixtral", "gpt_oss")
        else None
    )


def read_model_facts(
    config: dict[str, Any],
    hf_quant_config: dict[str, Any] | None = None,
    length_defaults: dict[str, Any] | None = None,
    length: LengthInput | None = None,
) -> ModelFacts:
    """Read a config.json dict into ModelFacts; ``length`` names the release whose length derivation applies (and
    the rope keys an override replaced), the newest release without it.

    Raises DomainError naming the ``model.config.<key>`` that is missing or invalid (attention heads, layers and
    hidden size are required: vLLM cannot build a model without them).
    """
    if not isinstance(config, dict) or not config:
        raise DomainError("model.config", "config.json must be a non-empty JSON object", rule="config_invalid")
    text = text_config_of(config)
    model_type = text.get("model_type") or config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise DomainError("model.config.model_type", "model_type must be a string", rule="config_invalid")
    prefix = "model.config." + ("text_config." if text is not config else "")
    heads, layers, hidden, kv = _attention_shape(text, prefix, model_type)
    head_dim, mla = _head_dim(text, prefix, model_type, hidden, heads)
    is_mla = bool(mla.get("kv_lora_rank"))
    for k, (lo, hi) in RAW_INT_KEYS.items():
        _get_int(text, k, prefix, lo, hi)
    _layer_lists(text, prefix)
    max_len = _lengths(text, model_type, prefix, length_defaults, length)
    num_experts = _read(text, prefix, EXPERT_KEYS, 0, MAX_EXPERTS) or 0
    first_k = _get_int(text, "first_k_dense_replace", prefix, 0, MAX_LAYERS) or 0
    arch = _architectures(config, text)
    sw = text.get("sliding_window")
    sw = None if sw is None or isinstance(sw, bool) else config_int(sw, prefix + "sliding_window", 0, MAX_LENGTH)
    vocab = _vocab(config, text, prefix)
    return ModelFacts(
        model_type=model_type,
        architectures=tuple(arch),
        num_attention_heads=heads,
        total_num_kv_heads=kv,
        head_dim=head_dim,
        num_hidden_layers=layers,
        hidden_size=hidden,
        intermediate_size=_read(text, prefix, INTERMEDIATE_KEYS, 0, MAX_WIDTH),
        moe_intermediate_size=_moe_intermediate(text, prefix, num_experts, model_type),
        shared_expert_intermediate_size=_get_int(text, "shared_expert_intermediate_size", prefix, 0, MAX_WIDTH),
        num_experts=num_experts,
        n_shared_experts=_get_int(text, "n_shared_experts", prefix, 0, MAX_EXPERTS) or 0,
        first_k_dense_replace=first_k,
        vocab_size=vocab,
        tie_word_embeddings=bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
        torch_dtype=_normalise_dtype(
            config.get("dtype") or config.get("torch_dtype") or text.get("dtype") or text.get("torch_dtype")
        ),
        derived_max_model_len=max_len.derived,
        max_len_key=max_len.key,
        model_max_length=max_len.model_max_length,
        rope_type=max_len.rope_type,
        rope_factor=max_len.rope_factor,
        sliding_window=sw or None,
        is_mla=is_mla,
        kv_lora_rank=mla["kv_lora_rank"] if is_mla else None,
        qk_rope_head_dim=mla["qk_rope_head_dim"] if is_mla else None,
        qk_nope_head_dim=mla["qk_nope_head_dim"] if is_mla else None,
        v_head_dim=mla["v_head_dim"] if is_mla else None,
        q_lora_rank=mla["q_lora_rank"] if is_mla else None,
        quant=read_quant_config(config, hf_quant_config),
        vision=_vision(config),
        has_auto_map=bool(config.get("auto_map") or text.get("auto_map")),
        is_multimodal=text is not config or "vision_config" in config,
        layout=layer_layout(text, layers, model_type, num_experts, first_k, is_mla, prefix),
        raw_text_config=text,
        raw_config=config,
        max_len=max_len,
    )


def _architectures(config: dict[str, Any], text: dict[str, Any]) -> list[str]:
    arch = config.get("architectures") or text.get("architectures") or []
    if not isinstance(arch, list) or not all(isinstance(a, str) for a in arch):
        raise DomainError(
            "model.config.architectures", "architectures must be a list of class names (strings)", rule="config_invalid"
        )
    return arch


def _vocab(config: dict[str, Any], text: dict[str, Any], prefix: str) -> int | None:
    """The vocabulary size, named where it was read (the text config, or the top level of a multimodal config)."""
    in_text = bool(text.get("vocab_size")) or text is config
    return config_int(
        text.get("vocab_size") or config.get("vocab_size"),
        prefix + "vocab_size" if in_text else "model.config.vocab_size",
        0,
        MAX_VOCAB,
    )


def _layer_lists(text: dict[str, Any], prefix: str) -> None:
    """Per-layer lists other modules read (``mlp_only_layers``, ``layer_types``, a ``moe_layer_freq`` list): lists of
    at most MAX_LAYERS entries, layer indices integers in range."""
    for key in ("mlp_only_layers", "layer_types", "moe_layer_freq"):
        value = text.get(key)
        if value is None or (key == "moe_layer_freq" and not isinstance(value, list)):
            if key == "moe_layer_freq" and value is not None:
                config_int(value, prefix + key, 0, MAX_LAYERS)
            continue
        if not isinstance(value, list) or len(value) > MAX_LAYERS:
            raise DomainError(
                prefix + key, f"{prefix + key} must be a list of at most {MAX_LAYERS} entries", rule="config_invalid"
            )
        if key == "mlp_only_layers":
            for i, v in enumerate(value):
                config_int(v, f"{prefix}{key}[{i}]", 0, MAX_LAYERS)


def divisors(n: int, limit: int | None = None) -> list[int]:
    """Positive divisors of ``n`` up to ``limit`` (inclusive), ascending — O(sqrt(n)) whatever ``limit`` is."""
    if n <= 0:
        return []
    top = n if limit is None else min(n, limit)
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
        d += 1
    return [x for x in small + large[::-1] if x <= top]


VOCAB_PADDING = 64  # vllm 0.33.0 vllm/model_executor/layers/vocab_parallel_embedding.py:36 (DEFAULT_VOCAB_PADDING_SIZE)


def padded_vocab(vocab_size: int) -> int:
    """The vocabulary as vLLM shards it: padded to a multiple of 64 (vocab_parallel_embedding.py:95-97)."""
    return round_up(vocab_size, VOCAB_PADDING)


def round_up(x: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is ≥ ``x`` (integer arithmetic: exact for any size)."""
    return -(-x // multiple) * multiple


def kv_heads_ok(kv: int, tp: int, is_mla: bool) -> bool:
    """KV heads divisible by TP (TP ≤ KV heads) or dividing it (each KV head replicated); MLA is exempt
    (vllm 0.33.0 vllm/model_executor/layers/linear.py:1065-1071)."""
    if is_mla:
        return True
    return kv % tp == 0 if tp <= kv else tp % kv == 0


def tp_accepted(facts: ModelFacts, tp: int) -> bool:
    """vLLM can shard the text model over ``tp`` ranks: heads divisible (vllm 0.33.0 vllm/config/model.py:1557-1564),
    the KV-head rule, and the padded vocabulary divisible (vocab_parallel_embedding.py:286-306); the MLP and
    quantization rules judge the rest."""
    return (
        facts.num_attention_heads % tp == 0
        and kv_heads_ok(facts.total_num_kv_heads, tp, facts.is_mla)
        and (not facts.vocab_size or padded_vocab(facts.vocab_size) % tp == 0)
    )


def accepted_tp_sizes(facts: ModelFacts, limit: int) -> list[int]:
    """The TP sizes up to ``limit`` that ``tp_accepted`` holds for, ascending (a valid TP divides the heads)."""
    return [t for t in divisors(facts.num_attention_heads, limit) if tp_accepted(facts, t)]
