"""The quantization format a checkpoint's tensors show, and whether its tag and configs agree with it.

Read from the names, dtypes and shapes of the tensors (service/domain/tensors.py), module by module (a module is a
tensor name without its last component: ``model.layers.0.self_attn.q_proj``). The layouts are vLLM's own, from the
parameters its loaders create (vllm 0.33.0 ``vllm/model_executor/layers/quantization/``):

- GPTQ (auto_gptq.py:375-429): ``qweight`` int32 ``[in / pack, out]`` (packed along the input), ``qzeros`` int32
  ``[groups, out / pack]``, ``scales`` ``[groups, out]``, ``pack = 32 // bits`` (:146), ``groups = in // group_size``
  (one group for ``group_size = -1``, :355-372).
- AWQ (auto_awq.py:455-495): ``qweight`` int32 ``[in, out / pack]`` (packed along the output), ``qzeros`` int32
  ``[groups, out / pack]``, ``scales`` ``[groups, out]`` (pack: :196).
- compressed-tensors WNA16 (compressed_tensors/schemes/compressed_tensors_wNa16.py:176-243): ``weight_packed``
  int32 ``[out, ceil(in·bits/32)]``, ``weight_scale`` ``[out, in // group_size]``, ``weight_shape`` int64 ``[2]``,
  ``weight_zero_point`` int32 ``[ceil(out·bits/32), groups]`` when asymmetric. W8A8 int8 (compressed_tensors_w8a8_int8.py:
  58-83): ``weight`` int8 ``[out, in]``, ``weight_scale`` ``[out, 1]`` or per tensor.
- FP8 (fp8.py:312-339, utils/fp8_utils.py:1395-1440): ``weight`` F8_E4M3 ``[out, in]``; per tensor ``weight_scale``
  of one element per partition; per channel ``[out, 1]``; block ``weight_scale_inv`` (the DeepSeek-V3 name, :338)
  ``[ceil(out / block_n), ceil(in / block_k)]``.
- NVFP4: ModelOpt (modelopt.py:2023-2066) ``weight`` U8 ``[out, in / 2]`` (two FP4 per byte), ``weight_scale``
  F8_E4M3 ``[out, in / 16]``, ``weight_scale_2`` F32; compressed-tensors (compressed_tensors_w4a4_nvfp4.py:52-84)
  the same as ``weight_packed`` / ``weight_scale`` / ``weight_global_scale``.
- MXFP4: compressed-tensors (compressed_tensors_w4a4_mxfp4.py:64-88) ``weight_packed`` U8 ``[out, in / 2]``,
  ``weight_scale`` U8 (E8M0) ``[out, in / 32]``; gpt-oss (models/gpt_oss.py:1382-1385, mxfp4.py:212-262)
  ``experts.gate_up_proj_blocks`` / ``down_proj_blocks`` U8 with ``…_scales`` U8, blocks of 32.
- bitsandbytes (vllm 0.24.0 model_loader/bitsandbytes_loader.py:235-248): 8-bit when a name ends ``.SCB`` or
  ``.weight_format``; 4-bit when its last component holds ``absmax``, ``quant_map`` or ``bitsandbytes``
  (``….weight.quant_state.bitsandbytes__nf4``).
- unquantized: a floating-point ``weight`` of two or more dimensions (embeddings and norms aside).

A module of one layout is never read as another; what the shapes leave open (the bits of a symmetric
compressed-tensors pack without the module's input width at hand) is left None, and a check needing it is skipped:
a false refusal is worse than a missed one.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .tensors import TensorInfo

FLOAT = frozenset({"F16", "BF16", "F32", "F64"})
FP8 = frozenset({"F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ"})
# projections whose input is the hidden state (their input width is the layer norm's)
HIDDEN_INPUT = frozenset({"q_proj", "k_proj", "v_proj", "qkv_proj", "gate_proj", "up_proj", "gate_up_proj", "w1", "w3"})
MAX_PATTERNS = 32
T = TypeVar("T")


@dataclass(frozen=True)
class ModuleScheme:
    """One module's layout: ``scheme`` (gptq, awq, int_pack, int8, fp8, nvfp4, mxfp4, bitsandbytes, none), what its
    shapes say of bits / group size / FP8 granularity and block, and the tensor that shows it."""

    module: str
    scheme: str
    evidence: str
    bits: int | None = None
    group_size: int | None = None  # -1: one group over the whole input (channelwise)
    granularity: str | None = None  # fp8: tensor | channel | block
    block: frozenset[tuple[int, int]] | None = None  # fp8 block: the (block_n, block_k) the shapes allow
    dtype: str | None = None


@dataclass(frozen=True)
class TensorFormat:
    """The checkpoint's format: the quantized scheme most modules use (``none`` when no module is quantized), every
    scheme with its module count, the parameters the shapes fix, the tensor that shows it, and the modules left
    unquantized (name patterns, digits as ``*``, with counts)."""

    scheme: str
    schemes: Mapping[str, int]
    evidence: str | None
    bits: int | None = None
    group_size: int | None = None
    granularity: str | None = None
    block: tuple[int, int] | None = None
    weight_dtype: str | None = None
    unquantized: tuple[tuple[str, int], ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"scheme": self.scheme, "schemes": dict(self.schemes), "evidence": self.evidence}
        for k in ("bits", "group_size", "granularity", "weight_dtype"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        if self.block is not None:
            out["block"] = list(self.block)
        if self.unquantized:
            out["unquantized"] = [{"modules": p, "count": n} for p, n in self.unquantized]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TensorFormat:
        """From ``as_dict``'s form (validated by the API schema before it gets here)."""
        block = d.get("block")
        return cls(
            scheme=str(d.get("scheme") or "none"),
            schemes=dict(d.get("schemes") or {}),
            evidence=d.get("evidence"),
            bits=d.get("bits"),
            group_size=d.get("group_size"),
            granularity=d.get("granularity"),
            block=(int(block[0]), int(block[1])) if isinstance(block, list) and len(block) == 2 else None,
            weight_dtype=d.get("weight_dtype"),
            unquantized=tuple((u["modules"], u["count"]) for u in d.get("unquantized") or ()),
        )

    def describe(self) -> str:
        """In words, for a message: ``gptq 4-bit group 128 (model.layers.0.mlp.down_proj.qweight)``."""
        parts = [self.scheme if self.scheme != "none" else f"unquantized {self.weight_dtype or ''}".strip()]
        if self.bits:
            parts.append(f"{self.bits}-bit")
        if self.group_size is not None:
            parts.append("channelwise" if self.group_size == -1 else f"group {self.group_size}")
        if self.granularity:
            parts.append(f"per-{self.granularity}" if self.granularity != "block" else "block")
        if self.block:
            parts.append(f"{self.block[0]}x{self.block[1]}")
        return " ".join(parts)


def _ratio(a: int, b: int) -> int | None:
    return a // b if b and a % b == 0 else None


def _packs(module: str, p: Mapping[str, TensorInfo]) -> ModuleScheme | None:
    """GPTQ or AWQ from qweight / qzeros / scales."""
    qw, sc, qz = p["qweight"], p["scales"], p.get("qzeros")
    if len(qw.shape) < 2 or len(sc.shape) < 2:
        return None
    out = sc.shape[-1]
    if qw.shape[-1] == out:  # packed along the input: GPTQ
        pack = _ratio(out, qz.shape[-1]) if qz is not None and len(qz.shape) >= 2 else None
        width = qw.shape[-2] * pack if pack else None
        scheme = "gptq"
    else:  # packed along the output: AWQ
        pack = _ratio(out, qw.shape[-1])
        width = qw.shape[-2]
        scheme = "awq"
    bits = _ratio(32, pack) if pack else None
    groups = sc.shape[-2]
    group = (-1 if groups == 1 else _ratio(width, groups)) if width else None
    return ModuleScheme(module, scheme, qw.name, bits=bits, group_size=group, dtype=sc.dtype)


def _fp8(module: str, w: TensorInfo, p: Mapping[str, TensorInfo]) -> ModuleScheme:
    scale = p.get("weight_scale_inv") or p.get("weight_scale")
    if scale is None or len(w.shape) < 2:
        return ModuleScheme(module, "fp8", w.name, bits=8, granularity=None, dtype=w.dtype)
    elements = 1
    for d in scale.shape:
        elements *= d
    out, width = w.shape[-2], w.shape[-1]
    lead = len(w.shape) - 2  # stacked experts keep their leading dimensions in the scale too
    if elements == 1 or (len(scale.shape) <= 1 and elements <= 4):
        return ModuleScheme(module, "fp8", w.name, bits=8, granularity="tensor", dtype=w.dtype)
    if list(scale.shape[lead:]) == [out, 1] or list(scale.shape) == [out]:
        return ModuleScheme(module, "fp8", w.name, bits=8, granularity="channel", dtype=w.dtype)
    if len(scale.shape) >= 2:
        sn, sk = scale.shape[-2], scale.shape[-1]
        ns = {b for b in (2**i for i in range(15)) if -(-out // b) == sn}
        ks = {b for b in (2**i for i in range(15)) if -(-width // b) == sk}
        block = frozenset((n, k) for n in ns for k in ks)
        return ModuleScheme(module, "fp8", scale.name, bits=8, granularity="block", block=block, dtype=w.dtype)
    return ModuleScheme(module, "fp8", w.name, bits=8, dtype=w.dtype)


def _fp4(module: str, w: TensorInfo, sc: TensorInfo | None) -> ModuleScheme | None:
    """U8 packs of two FP4 values with group scales: E4M3 scales every 16 (NVFP4), E8M0 every 32 (MXFP4)."""
    if sc is None or not w.shape or not sc.shape:
        return None
    # gpt-oss blocks carry one more dimension than their scales: [..., in / 32, 16] bytes, 32 values a block
    group = 2 * w.shape[-1] if len(w.shape) == len(sc.shape) + 1 else _ratio(2 * w.shape[-1], sc.shape[-1])
    if sc.dtype == "F8_E4M3":
        return ModuleScheme(module, "nvfp4", sc.name, bits=4, group_size=group)
    if sc.dtype in ("U8", "F8_E8M0"):
        return ModuleScheme(module, "mxfp4", sc.name, bits=4, group_size=group)
    return None


def classify_module(module: str, p: Mapping[str, TensorInfo], hidden: int | None = None) -> ModuleScheme | None:
    """The layout of one module from its parameters (last name component -> tensor); None when it is no linear
    layer's (a norm, an embedding, a bias alone). ``hidden``: the model's hidden width, for a symmetric
    compressed-tensors pack's bits when the module reads the hidden state."""
    if "qweight" in p and "scales" in p:
        return _packs(module, p)
    if "weight_packed" in p:
        wp, sc = p["weight_packed"], p.get("weight_scale")
        if wp.dtype == "U8":
            return _fp4(module, wp, sc)
        zp = p.get("weight_zero_point")
        bits = None
        if zp is not None and sc is not None and len(zp.shape) == 2 and sc.shape:
            bits = _ratio(32 * zp.shape[0], sc.shape[0])
        elif hidden and module.rsplit(".", 1)[-1] in HIDDEN_INPUT and wp.shape:
            bits = _ratio(32 * wp.shape[-1], hidden)
        width = wp.shape[-1] * 32 // bits if bits else None
        groups = sc.shape[-1] if sc is not None and sc.shape else None
        group = (-1 if groups == 1 else _ratio(width, groups)) if width and groups else None
        return ModuleScheme(module, "int_pack", wp.name, bits=bits, group_size=group)
    w = p.get("weight")
    if w is None:
        return None
    if w.dtype in FP8:
        return _fp8(module, w, p)
    sc = p.get("weight_scale")
    if w.dtype == "U8" and sc is not None:
        return _fp4(module, w, sc)
    if w.dtype == "I8" and sc is not None:
        return ModuleScheme(module, "int8", w.name, bits=8)
    if w.dtype in FLOAT and len(w.shape) >= 2 and "embed" not in module and "wte" not in module:
        return ModuleScheme(module, "none", w.name, dtype=w.dtype)
    return None


_BNB8 = (".scb", ".weight_format")
_BNB4 = ("absmax", "quant_map", "nested_absmax", "nested_quant_map", "bitsandbytes")


def _bitsandbytes(names: list[str]) -> ModuleScheme | None:
    """A bitsandbytes checkpoint by its quant-state tensor names (vllm 0.24.0 bitsandbytes_loader.py:235-248)."""
    for name in names:
        if name.lower().endswith(_BNB8):
            return ModuleScheme(name.rsplit(".", 2)[0], "bitsandbytes", name, bits=8)
        if any(s in name.rsplit(".", 1)[-1] for s in _BNB4):
            return ModuleScheme(name.split(".weight.", 1)[0], "bitsandbytes", name, bits=4)
    return None


def by_module(tensors: Mapping[str, TensorInfo]) -> dict[str, dict[str, TensorInfo]]:
    """Tensors by module; gpt-oss's ``experts.gate_up_proj_blocks`` / ``_scales`` read as a module's
    ``weight_packed`` (U8) / ``weight_scale`` (vllm 0.33.0 models/gpt_oss.py:1382-1385)."""
    mods: dict[str, dict[str, TensorInfo]] = {}
    for name, t in tensors.items():
        module, _, param = name.rpartition(".")
        if param.endswith("_blocks") and t.dtype == "U8":
            module, param = f"{module}.{param[: -len('_blocks')]}", "weight_packed"
        elif param.endswith("_scales") and f"{module}.{param[: -len('_scales')]}_blocks" in tensors:
            module, param = f"{module}.{param[: -len('_scales')]}", "weight_scale"
        mods.setdefault(module, {})[param] = t
    return mods


def _hidden(tensors: Mapping[str, TensorInfo]) -> int | None:
    for name, t in tensors.items():
        if name.endswith("input_layernorm.weight") and len(t.shape) == 1:
            return t.shape[0]
    return None


def _common_block(blocks: list[frozenset[tuple[int, int]]]) -> tuple[int, int] | None:
    """The (block_n, block_k) every block-scaled module allows (the smallest when several fit every shape)."""
    if not blocks:
        return None
    common = frozenset.intersection(*blocks)
    return min(common) if common else None


def _only(values: list[T | None]) -> T | None:
    """The one value the modules agree on (ignoring those that could not tell); None when none or several."""
    seen = {v for v in values if v is not None}
    return seen.pop() if len(seen) == 1 else None


def detect_format(tensors: Mapping[str, TensorInfo], weights: Mapping[str, int] | None = None) -> TensorFormat:
    """The format of a checkpoint from its tensors (an Inventory's ``tensors``). ``weights``: how many modules each
    module stands for (module name -> count), when ``tensors`` hold one module per layout (linear_shapes)."""
    bnb = _bitsandbytes(list(tensors))
    hidden = _hidden(tensors)
    found = [m for name, p in by_module(tensors).items() if (m := classify_module(name, p, hidden)) is not None]
    if bnb is not None:
        found = [m for m in found if m.scheme != "none"] + [bnb]
    counts: Counter[str] = Counter()
    for m in found:
        counts[m.scheme] += (weights or {}).get(m.module, 1)
    quantized = [s for s, _ in counts.most_common() if s != "none"]
    plain = [m for m in found if m.scheme == "none"]
    dtypes = Counter(m.dtype for m in plain if m.dtype)
    weight_dtype = dtypes.most_common(1)[0][0] if dtypes else None
    if not quantized:
        return TensorFormat("none", dict(counts), plain[0].evidence if plain else None, weight_dtype=weight_dtype)
    scheme = quantized[0]
    mods = [m for m in found if m.scheme == scheme]
    groups = [m.group_size for m in mods]
    wide = [g for g in groups if g not in (None, -1)]  # one group over a narrow input says little: prefer wider
    granularity = _only([m.granularity for m in mods])
    block = _common_block([m.block for m in mods if m.block is not None]) if granularity == "block" else None
    patterns = Counter(re.sub(r"\.\d+\.", ".*.", m.module) for m in plain)
    return TensorFormat(
        scheme=scheme,
        schemes=dict(counts),
        evidence=mods[0].evidence,
        bits=_only([m.bits for m in mods]),
        group_size=_only(list(wide)) if wide else _only(groups),
        granularity=granularity,
        block=block,
        weight_dtype=weight_dtype,
        unquantized=tuple(sorted(patterns.items()))[:MAX_PATTERNS],
    )


# The quantization methods whose loaders read each layout (vllm 0.33.0 vllm/model_executor/layers/quantization/:
# the files cited in the module docstring, and the methods that claim those checkpoints through
# ``override_quantization_method``: moe_wna16, humming, inc/auto-round for GPTQ/AWQ packs; modelopt for its FP8 and
# NVFP4). Generous on purpose: a method missing here would be a false refusal.
SCHEME_METHODS: dict[str, frozenset[str]] = {
    "gptq": frozenset(
        {
            "gptq",
            "gptq_marlin",
            "gptq_marlin_24",
            "gptq_bitblas",
            "auto_gptq",
            "cpu_gptq",
            "marlin",
            "bitblas",
            "moe_wna16",
            "inc",
            "auto-round",
            "humming",
            "qqq",
        }
    ),  # fmt: skip
    "awq": frozenset({"awq", "awq_marlin", "auto_awq", "cpu_awq", "moe_wna16", "inc", "auto-round", "humming"}),
    "int_pack": frozenset({"compressed-tensors", "humming"}),
    "int8": frozenset({"compressed-tensors", "quark", "humming", "modelopt_mixed"}),
    "fp8": frozenset(
        {
            "fp8",
            "fbgemm_fp8",
            "modelopt",
            "modelopt_mixed",
            "compressed-tensors",
            "ptpc_fp8",
            "quark",
            "deepseek_v4_fp8",
            "fp8_per_tensor",
            "fp8_per_block",
            "fp8_per_channel",
            "humming",
        }
    ),  # fmt: skip
    "nvfp4": frozenset(
        {"modelopt_fp4", "modelopt", "modelopt_mixed", "nvfp4", "petit_nvfp4", "compressed-tensors", "quark", "humming"}
    ),
    "mxfp4": frozenset({"mxfp4", "gpt_oss_mxfp4", "compressed-tensors", "quark", "humming", "modelopt_mixed"}),
    "bitsandbytes": frozenset({"bitsandbytes"}),
}
# Methods that need a pre-quantized checkpoint: naming one for tensors that are all unquantized cannot load. Those
# that quantize at load (fp8, bitsandbytes, the online methods, …) are absent, as is anything unknown.
PRE_QUANTIZED = frozenset(
    {"gptq", "gptq_marlin", "gptq_marlin_24", "gptq_bitblas", "auto_gptq", "awq", "awq_marlin", "auto_awq",
     "compressed-tensors", "modelopt", "modelopt_fp4", "modelopt_mixed", "nvfp4", "gpt_oss_mxfp4", "fbgemm_fp8",
     "deepseek_v4_fp8", "moe_wna16"}
)  # fmt: skip

SRC = "vllm 0.33.0 vllm/model_executor/layers/quantization/ (auto_gptq.py, auto_awq.py, fp8.py, modelopt.py, …)"


@dataclass(frozen=True)
class Claim:
    """What one source says the checkpoint is: ``source`` (quantization.txt, config.json, hf_quant_config.json), its
    method (None: unquantized), and the parameters it states."""

    source: str
    field: str
    method: str | None
    bits: int | None = None
    group_size: int | None = None
    block: tuple[int, int] | None = None


def _disagreement(fmt: TensorFormat, c: Claim) -> str | None:
    """Why ``c`` cannot be true of tensors in ``fmt`` (None when it can, or when unsure)."""
    if fmt.scheme == "none":
        if c.method in PRE_QUANTIZED:
            return f"{c.method}, a method that needs quantized tensors"
        return None
    if c.method is None:
        return "unquantized weights"
    present = {s for s in fmt.schemes if s != "none"} | {fmt.scheme}
    if c.method in {m for methods in SCHEME_METHODS.values() for m in methods} and not any(
        c.method in SCHEME_METHODS.get(s, frozenset()) for s in present
    ):
        return c.method
    if fmt.bits and c.bits and c.bits != fmt.bits and fmt.scheme in ("gptq", "awq", "int_pack"):
        return f"{c.method} {c.bits}-bit"
    if fmt.group_size not in (None, -1) and c.group_size not in (None, -1, 0) and c.group_size != fmt.group_size:
        return f"{c.method} group size {c.group_size}"
    if fmt.block and c.block and tuple(c.block) != fmt.block:
        return f"{c.method} block {c.block[0]}x{c.block[1]}"
    return None


def format_findings(fmt: TensorFormat, claims: list[Claim]) -> list[Any]:
    """``quant_mismatch`` errors for the claims the tensors contradict, each naming both sides and the tensor that
    shows it; when the tag agrees with the tensors but a config does not, the message says the config is wrong,
    and when the tag disagrees but a config agrees, that the tag is."""
    from .findings import Finding, Severity

    wrong = {c.source: why for c in claims if (why := _disagreement(fmt, c)) is not None}
    out = []
    tensors = f"the tensors are {fmt.describe()}" + (f" (tensor {fmt.evidence})" if fmt.evidence else "")
    agreeing = [c.source for c in claims if c.source not in wrong]
    for c in claims:
        if c.source not in wrong:
            continue
        verdict = f"{c.source} is wrong" if agreeing else f"{c.source} disagrees with the weights"
        also = (
            f"; {' and '.join(agreeing)} agree{'s' if len(agreeing) == 1 else ''} with the tensors" if agreeing else ""
        )
        out.append(
            Finding(
                "quant_mismatch",
                Severity.ERROR,
                f"{c.source} says {wrong[c.source]}, but {tensors}: {verdict}{also}.",
                {"tensors": fmt.as_dict()},
                SRC,
                c.field,
                {"tensor": fmt.evidence, "claimed": c.method, "found": fmt.scheme},
            )
        )
    return out
