"""What each decoder layer of a text model is, read from config.json the way vLLM 0.33 builds its layers: a token
mixer (attention of some kind, or a state-space / convolution mixer, or none) and an MLP (dense, MoE, or none).

The layout is stored as runs of equal layers with the count of each kind before every run, so the layers of each
kind in any range ``[lo, hi)`` (a pipeline stage) come from two binary searches. It is built once per config
(``read_model_facts``), in one pass over at most ``num_hidden_layers`` (≤ 10,000) layers.

Per-layer sources (vllm 0.33.0 vllm/model_executor/models/...):
- ``hybrid_override_pattern`` (Nemotron-H): ``M`` Mamba2, ``*`` attention, ``-`` dense MLP, ``E`` MoE, one
  character per layer and the layer count is the pattern's length (nemotron_h.py:548-553, 595-615);
- ``layer_types`` (Qwen3-Next / Qwen3.5 without it: every ``full_attention_interval``-th layer full attention, as
  their Transformers configs derive it): ``linear_attention`` Gated DeltaNet (qwen3_next.py:668, qwen3_5.py:259), ``conv`` short
  convolution (lfm2.py:435, lfm2_moe.py:433), ``mamba`` Mamba2 (granitemoehybrid.py:321-350); any other entry
  (``full_attention``, ``sliding_attention``, ``attention``) is attention — sliding layers have the same weights;
- Jamba ``attn_layer_period/offset`` and ``expert_layer_period/offset`` (jamba.py:144-145, 322; transformers
  JambaConfig.layers_block_type / layers_num_experts);
- DeepSeek-V4 ``compress_ratios``: 4 = compressed attention with an indexer, 128 = compressed attention, else
  sliding-window attention only (vllm/transformers_utils/deepseek_v4_utils.py:6-17;
  vllm/models/deepseek_v4/attention.py:236-330);
- MoE layers: DeepSeek ``i >= first_k_dense_replace and i % moe_layer_freq == 0`` (deepseek_v2.py:1269, 1293-1297);
  Qwen-MoE ``i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0`` (qwen3_moe.py:385-391); Llama 4
  ``(i + 1) % interleave_moe_layer_step == 0`` (llama4.py:340-353); a ``moe_layer_freq`` or ``mlp_layer_types``
  list names each layer.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from dataclasses import dataclass
from typing import Any

from .errors import DomainError

HYBRID_CHARS = {"M": ("mamba2", "none"), "*": ("attention", "none"), "-": ("none", "dense"), "E": ("none", "moe")}
LAYER_TYPE_MIXERS = {"linear_attention": "gdn", "conv": "short_conv", "mamba": "mamba2"}
DSV4_TYPES = {"deepseek_v4", "deepseek_v41"}
# configs whose Transformers class derives ``layer_types`` from ``full_attention_interval`` (default 4) when
# config.json omits it: Qwen3NextConfig / Qwen3_5*Config (transformers 5.24 models/qwen3_next/
# configuration_qwen3_next.py:129-134, qwen3_5/configuration_qwen3_5.py:111-116), which vLLM reads as hf_config
INTERVAL_TYPES = {"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"}


def interval_layer_types(interval: object, layers: int) -> list[str]:
    """Every ``interval``-th layer full attention, the others linear attention."""
    n = interval if type(interval) is int and interval > 0 else 4
    return ["linear_attention" if (i + 1) % n else "full_attention" for i in range(layers)]


@dataclass(frozen=True, slots=True)
class LayerKind:
    """One kind of decoder layer: its token mixer (``attention``, ``mla``, ``dsv4`` / ``dsv4_c4`` /
    ``dsv4_c128``, ``mamba``, ``mamba2``, ``gdn``, ``short_conv``, ``none``) and its MLP (``dense``, ``moe``,
    ``none``)."""

    mixer: str
    mlp: str


@dataclass(frozen=True, slots=True)
class LayerLayout:
    """The decoder layers as runs of equal kinds: run ``r`` starts at layer ``starts[r]``, is of kind
    ``kinds[run_kind[r]]``, and ``before[r]`` counts the layers of each kind before it."""

    kinds: tuple[LayerKind, ...]
    starts: tuple[int, ...]
    run_kind: tuple[int, ...]
    before: tuple[tuple[int, ...], ...]
    num_layers: int
    mixers: frozenset[str] = frozenset()  # the mixers present: asking for an absent one costs one set lookup

    def upto(self, i: int) -> tuple[int, ...]:
        """Layers of each kind among layers ``[0, i)``."""
        i = max(0, min(i, self.num_layers))
        r = bisect.bisect_right(self.starts, i) - 1
        if r < 0:
            return (0,) * len(self.kinds)
        out = list(self.before[r])
        out[self.run_kind[r]] += i - self.starts[r]
        return tuple(out)

    def counts(self, lo: int, hi: int) -> tuple[int, ...]:
        """Layers of each kind among layers ``[lo, hi)``."""
        if len(self.starts) == 1:  # one run (most models): no search, asked per stage by every memory rule
            n = self.num_layers
            return (max(0, min(hi, n) - max(lo, 0)),)
        return tuple(b - a for a, b in zip(self.upto(lo), self.upto(hi), strict=True))

    def count_mixers(self, lo: int, hi: int, mixers: tuple[str, ...]) -> int:
        """Layers in ``[lo, hi)`` whose mixer is one of ``mixers``."""
        if self.mixers.isdisjoint(mixers):
            return 0
        if len(self.kinds) == 1:
            return self.counts(lo, hi)[0]
        return sum(n for k, n in zip(self.kinds, self.counts(lo, hi), strict=True) if k.mixer in mixers)

    def count_where(self, lo: int, hi: int, mixer: str | None = None, mlp: str | None = None) -> int:
        """Layers in ``[lo, hi)`` whose mixer / MLP is the one named."""
        if mixer is not None and mixer not in self.mixers:
            return 0
        if len(self.kinds) == 1:
            k = self.kinds[0]
            wanted = (mixer is None or k.mixer == mixer) and (mlp is None or k.mlp == mlp)
            return self.counts(lo, hi)[0] if wanted else 0
        return sum(
            n
            for k, n in zip(self.kinds, self.counts(lo, hi), strict=True)
            if (mixer is None or k.mixer == mixer) and (mlp is None or k.mlp == mlp)
        )


def runs_of(per_layer: list[tuple[str, str]]) -> LayerLayout:
    """The layout of a per-layer list of ``(mixer, mlp)`` pairs."""
    kinds: dict[tuple[str, str], int] = {}
    starts: list[int] = []
    run_kind: list[int] = []
    before: list[tuple[int, ...]] = []
    seen: list[int] = []
    i = 0
    for key, group in itertools.groupby(per_layer):
        k = kinds.setdefault(key, len(kinds))
        if k == len(seen):
            seen.append(0)
        starts.append(i)
        run_kind.append(k)
        before.append(tuple(seen))
        n = sum(1 for _ in group)
        seen[k] += n
        i += n
    width = len(kinds)
    return LayerLayout(
        kinds=tuple(LayerKind(m, p) for m, p in kinds),
        starts=tuple(starts),
        run_kind=tuple(run_kind),
        before=tuple(b + (0,) * (width - len(b)) for b in before),
        num_layers=len(per_layer),
        mixers=frozenset(m for m, _ in kinds),
    )


def _int(text: dict[str, Any], key: str, default: int) -> int:
    v = text.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else default


def _hybrid(pattern: Any, layers: int, prefix: str) -> list[tuple[str, str]]:
    """Nemotron-H: one character per layer (nemotron_h.py:548-553, 597-602: any other character is refused)."""
    field = prefix + "hybrid_override_pattern"
    if not isinstance(pattern, str) or len(pattern) != layers:
        raise DomainError(
            field, f"{field} must be a string of num_hidden_layers ({layers}) characters", rule="config_invalid"
        )
    bad = set(pattern) - set(HYBRID_CHARS)
    if bad:
        raise DomainError(
            field,
            f"{field} has layer types {sorted(bad)}; vLLM builds only M (Mamba2), * (attention), - (MLP), E (MoE)",
            rule="config_invalid",
        )
    return [HYBRID_CHARS[c] for c in pattern]


def _mixers(text: dict[str, Any], layers: int, model_type: str | None, is_mla: bool) -> list[str]:
    base = "mla" if is_mla else "attention"
    if model_type in DSV4_TYPES:
        ratios = text.get("compress_ratios")
        ratios = [r if type(r) is int else 0 for r in ratios[:layers]] if isinstance(ratios, (list, tuple)) else []
        ratios += [0] * (layers - len(ratios))
        return [{4: "dsv4_c4", 128: "dsv4_c128"}.get(r, "dsv4") for r in ratios]
    types = text.get("layer_types")
    if types is None and model_type in INTERVAL_TYPES:
        types = interval_layer_types(text.get("full_attention_interval"), layers)
    if isinstance(types, (list, tuple)) and len(types) >= layers:
        # "linear_attention" is a Gated DeltaNet where the config sizes one (Qwen3-Next / Qwen3.5)
        named = {**LAYER_TYPE_MIXERS, "linear_attention": "gdn" if "linear_num_value_heads" in text else base}
        return [named.get(t, base) if isinstance(t, str) else base for t in types[:layers]]
    period = text.get("attn_layer_period")
    if isinstance(period, int) and not isinstance(period, bool) and period > 0:
        offset = _int(text, "attn_layer_offset", 0)
        return [base if i % period == offset else "mamba" for i in range(layers)]
    return [base] * layers


def _is_moe(text: dict[str, Any], first_k: int, mlp_only: set[int]) -> Any:
    """The per-layer MoE rule of the config's family (see the module docstring)."""
    interleave = text.get("interleave_moe_layer_step")
    if isinstance(interleave, int) and not isinstance(interleave, bool) and interleave > 0:
        return lambda i: (i + 1) % interleave == 0
    period = text.get("expert_layer_period")
    if isinstance(period, int) and not isinstance(period, bool) and period > 0:
        offset = _int(text, "expert_layer_offset", 0)
        return lambda i: i % period == offset
    for key in ("moe_layer_freq", "mlp_layer_types"):
        per_layer = text.get(key)
        if isinstance(per_layer, (list, tuple)):
            return lambda i: i < len(per_layer) and per_layer[i] not in (0, False, "dense", None)
    sparse_step = text.get("decoder_sparse_step")
    if isinstance(sparse_step, int) and not isinstance(sparse_step, bool) and sparse_step > 1:
        return lambda i: i >= first_k and i not in mlp_only and (i + 1) % sparse_step == 0
    freq = _int(text, "moe_layer_freq", 1)
    return lambda i: i >= first_k and i not in mlp_only and i % freq == 0


def _mlps(text: dict[str, Any], layers: int, num_experts: int, first_k: int) -> list[str]:
    if not num_experts:
        return ["dense"] * layers
    # vLLM tests ``layer_idx not in config.mlp_only_layers`` (qwen3_moe.py:385-391): 3.0 names layer 3
    mlp_only = {int(i) for i in text.get("mlp_only_layers") or () if isinstance(i, (int, float)) and i == int(i)}
    is_moe = _is_moe(text, first_k, mlp_only)
    return ["moe" if is_moe(i) else "dense" for i in range(layers)]


# the config keys a layout depends on (besides the arguments of ``layer_layout``)
LAYOUT_KEYS = (
    "hybrid_override_pattern",
    "compress_ratios",
    "layer_types",
    "attn_layer_period",
    "attn_layer_offset",
    "interleave_moe_layer_step",
    "expert_layer_period",
    "expert_layer_offset",
    "moe_layer_freq",
    "mlp_layer_types",
    "decoder_sparse_step",
    "mlp_only_layers",
    "linear_num_value_heads",
    "full_attention_interval",
)


_NONE_GIVEN = (None,) * len(LAYOUT_KEYS)


def layer_layout(
    text: dict[str, Any], layers: int, model_type: str | None, num_experts: int, first_k: int, is_mla: bool, prefix: str
) -> LayerLayout:
    """The kind of every decoder layer (module docstring), as runs. A request reads its config once per plan it
    weighs (alternatives, remedies): the layout is cached on the values it depends on."""
    values = tuple(map(text.get, LAYOUT_KEYS))
    try:  # most configs give none of the keys: one short key for all of them
        key = tuple(map(_typed, values)) if values != _NONE_GIVEN else ()
        return _cached_layout(key, layers, model_type, num_experts, first_k, is_mla, prefix)
    except TypeError:  # an unhashable value (a hostile list of objects): build it uncached
        return _layout(
            dict(zip(LAYOUT_KEYS, values, strict=True)), layers, model_type, num_experts, first_k, is_mla, prefix
        )


def _typed(v: Any) -> Any:
    """A config value as a cache key that keeps every type: ``True``, ``1`` and ``1.0`` are equal in Python but read
    differently (``compress_ratios`` [4.0] is no 4), so neither a value nor a list item may share another's entry."""
    if isinstance(v, list):
        return list, tuple((type(x), x) for x in v)
    return type(v), v


@functools.lru_cache(maxsize=64)
def _cached_layout(
    key: tuple[Any, ...],
    layers: int,
    model_type: str | None,
    num_experts: int,
    first_k: int,
    is_mla: bool,
    prefix: str,
) -> LayerLayout:
    values = ([x for _, x in v] if kind is list else v for kind, v in key) if key else _NONE_GIVEN
    return _layout(
        dict(zip(LAYOUT_KEYS, values, strict=True)), layers, model_type, num_experts, first_k, is_mla, prefix
    )


def _layout(
    text: dict[str, Any], layers: int, model_type: str | None, num_experts: int, first_k: int, is_mla: bool, prefix: str
) -> LayerLayout:
    pattern = text.get("hybrid_override_pattern")
    if pattern is not None:
        return runs_of(_hybrid(pattern, layers, prefix))
    mixers = _mixers(text, layers, model_type, is_mla)
    mlps = _mlps(text, layers, num_experts, first_k)
    return runs_of(list(zip(mixers, mlps, strict=True)))
