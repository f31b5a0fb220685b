"""The shapes of a checkpoint's linear layers as its safetensors headers give them, kept compact for a manifest: one
entry per distinct (module pattern, parameter dtypes and shapes) — ``model.layers.*.mlp.down_proj`` with its
``weight`` and ``weight_scale_inv`` — so ~30 entries describe DeepSeek-V3's 91k tensors. The alignment rules
(rules/quant_alignment.py) read per-rank sizes, quantization groups and FP8 blocks from these entries instead of
config.json when a manifest carries them (``checkpoint_linears``).

How vLLM 0.33.0 partitions each module (vllm/model_executor/layers/linear.py; models/*.py name the modules):

- ColumnParallelLinear splits the output: ``output_size_per_partition = divide(output_size, tp_size)`` (:497); a
  merged layer (QKVParallelLinear: q/k/v; MergedColumnParallelLinear: gate/up, Mamba's ``in_proj``) has one output
  partition per part (:500-504), KV heads replicated when TP exceeds them (:1065-1071).
- RowParallelLinear splits the input: ``input_size_per_partition = divide(input_size, tp_size)`` (:1708).
- ReplicatedLinear (routers, MLA's ``q_a_proj`` / ``kv_a_proj_with_mqa``) is whole on every rank (:329).
- Routed experts split their intermediate size over the TP × DP ranks without expert parallelism, and not at all
  with it (fused_moe/config.py:1106-1114, 1353).

A checkpoint's module names are its own: q/k/v and gate/up arrive separately and vLLM merges them at load
(``stacked_params_mapping`` in the model files), so the parts of a merged layer are entries of their own here, each
judged with the partition it becomes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .rank_weights import LAYER, SCOPED, TOWER
from .tensor_format import ModuleScheme, by_module, classify_module
from .tensors import TensorInfo

MAX_ENTRIES = 1024  # distinct (pattern, shapes): per-layer widths (Nemotron-NAS, OpenELM) stay well below
MAX_PARAMS = 16
INDEX = re.compile(r"\.\d{1,9}(?=\.|$)")

# the last name component of a checkpoint module -> how vLLM partitions the layer it becomes
ROW = frozenset({"o_proj", "down_proj", "w2", "out_proj", "dense", "c_proj", "dense_4h_to_h", "wo", "fc2"})
MERGED = frozenset(
    {"q_proj", "k_proj", "v_proj", "qkv_proj", "query_key_value", "gate_proj", "up_proj", "gate_up_proj", "w1",
     "w3", "in_proj", "in_proj_qkvz", "in_proj_ba", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"}
)  # fmt: skip
SINGLE = frozenset({"q_b_proj", "kv_b_proj", "c_fc", "dense_h_to_4h", "fc1"})
REPLICATED = frozenset(
    {"gate", "router", "q_a_proj", "kv_a_proj_with_mqa", "fused_qkv_a_proj", "shared_expert_gate", "conv1d"}
)
KV_PARTS = frozenset({"k_proj", "v_proj"})


@dataclass(frozen=True)
class ModuleShapes:
    """One distinct module layout: its name pattern (indices as ``*``), how many modules share it, the first of them,
    and its parameters (last name component -> (dtype, shape))."""

    pattern: str
    count: int
    first: str
    params: Mapping[str, tuple[str, tuple[int, ...]]]

    def as_dict(self) -> dict[str, Any]:
        return {
            "module": self.pattern,
            "count": self.count,
            "first": self.first,
            "params": {p: {"dtype": d, "shape": list(s)} for p, (d, s) in sorted(self.params.items())},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModuleShapes:
        """From ``as_dict`` (validated by the schema: service/domain/request.py ``TensorLinear``)."""
        params = {p: (str(v["dtype"]), tuple(int(x) for x in v["shape"])) for p, v in d["params"].items()}
        return cls(str(d["module"]), int(d["count"]), str(d["first"]), params)

    def tensors(self) -> dict[str, TensorInfo]:
        """The first module's parameters as tensors (byte counts from dtype × shape), for tensor_format."""
        from .tensors import DTYPE_BITS

        out = {}
        for p, (dtype, shape) in self.params.items():
            n = 1
            for x in shape:
                n *= x
            out[p] = TensorInfo(f"{self.first}.{p}", dtype, shape, n * DTYPE_BITS.get(dtype, 8) // 8, "")
        return out


def linear_shapes(tensors: Mapping[str, TensorInfo]) -> list[ModuleShapes] | None:
    """The distinct linear module layouts of the decoder layers (a module with a tensor of two or more dimensions;
    towers of other modalities left out), in name order; None for a checkpoint saved per rank or one with more than
    MAX_ENTRIES distinct layouts (not recorded)."""
    groups: dict[tuple[str, tuple[tuple[str, str, tuple[int, ...]], ...]], list[str]] = {}
    for module, params in by_module(tensors).items():
        if SCOPED.match(module):
            return None
        if not LAYER.search(module + ".") or TOWER.search(module):
            continue
        if not any(len(t.shape) >= 2 for t in params.values()) or len(params) > MAX_PARAMS:
            continue
        key = (INDEX.sub(".*", module), tuple(sorted((p, t.dtype, t.shape) for p, t in params.items())))
        groups.setdefault(key, []).append(module)
        if len(groups) > MAX_ENTRIES:
            return None
    out = []
    for (pattern, params_key), modules in groups.items():
        first = min(modules, key=_natural)
        out.append(ModuleShapes(pattern, len(modules), first, {p: (d, s) for p, d, s in params_key}))
    return sorted(out, key=lambda m: _natural(m.first))


def _natural(name: str) -> tuple[Any, ...]:
    return tuple(int(x) if x.isdigit() else x for x in re.split(r"(\d+)", name))


@dataclass(frozen=True)
class CheckpointLinear:
    """One checkpoint module as a TP rank holds it (``kind``: row, column, merged, replicated), its unsplit input and
    output widths from its tensors, its quantization as its tensors show it (tensor_format), the tensor that shows
    the widths and the scale tensor, each with its shape."""

    module: ModuleShapes
    kind: str
    leaf: str
    full_in: int
    full_out: int
    expert: bool
    scheme: ModuleScheme | None
    tensor: str
    shape: tuple[int, ...]
    scale: str | None
    scale_shape: tuple[int, ...] | None


def _widths(p: Mapping[str, TensorInfo], s: ModuleScheme | None) -> tuple[str, int, int] | None:
    """(the tensor that shows them, input width, output width) of one module from its tensors and layout."""
    if s is not None and s.scheme in ("gptq", "awq") and "qweight" in p and "scales" in p:
        qw, sc = p["qweight"], p["scales"]
        out = sc.shape[-1]
        if s.scheme == "gptq":  # qweight [in / pack, out]
            pack = 32 // s.bits if s.bits else None
            return (qw.name, qw.shape[-2] * pack, out) if pack else None
        return qw.name, qw.shape[-2], out  # AWQ qweight [in, out / pack]
    if "weight_packed" in p:
        wp, ws = p["weight_packed"], p.get("weight_scale")
        if len(wp.shape) < 2:
            return None
        if wp.dtype == "U8":  # two FP4 values a byte: [out, in / 2]; gpt-oss blocks [..., out, in / 32, 16]
            if ws is not None and len(wp.shape) == len(ws.shape) + 1 and len(wp.shape) >= 3:
                return wp.name, wp.shape[-2] * wp.shape[-1] * 2, wp.shape[-3]
            return wp.name, wp.shape[-1] * 2, wp.shape[-2]
        if s is not None and s.bits:
            return wp.name, wp.shape[-1] * 32 // s.bits, wp.shape[-2]
        return None
    w = p.get("weight")
    if w is None or len(w.shape) < 2:
        return None
    return w.name, w.shape[-1], w.shape[-2]


def _kind(leaf: str, mla: bool) -> str | None:
    if leaf in REPLICATED:
        return "replicated"
    if leaf in ROW:
        return "row"
    if mla and leaf == "q_proj":  # MLA without q_lora_rank: one ColumnParallelLinear (models/deepseek_v2.py)
        return "column"
    if leaf in MERGED:
        return "merged"
    if leaf in SINGLE:
        return "column"
    return None


def checkpoint_linears(entries: Sequence[ModuleShapes], *, mla: bool = False) -> list[CheckpointLinear]:
    """The recorded modules whose partitioning is known, with their widths and layouts (modules of other names —
    convolutions, unfamiliar projections — are left out: their layout is not guessed)."""
    out = []
    for m in entries:
        leaf = m.pattern.rsplit(".", 1)[-1]
        kind = _kind(leaf, mla)
        if kind is None:
            continue
        p = m.tensors()
        scheme = classify_module(m.first, p)
        widths = _widths(p, scheme)
        if widths is None:
            continue
        tensor, full_in, full_out = widths
        shown = p[tensor.rsplit(".", 1)[-1]]
        sc = p.get("weight_scale_inv") or p.get("weight_scale") or p.get("scales")
        out.append(
            CheckpointLinear(
                m, kind, leaf, full_in, full_out, ".experts" in m.pattern, scheme, tensor, shown.shape,
                sc.name if sc is not None else None, sc.shape if sc is not None else None,
            )
        )  # fmt: skip
    return out
