"""How a vLLM release reconciles the checkpoint's quantization method with ``--quantization``: the release's own
override mechanism, reproduced per release.

``ModelConfig._verify_quantization`` (vllm 0.33.0 vllm/config/model.py:1383-1469; 0.6.6 vllm/config.py:545-591)
asks every quantization method, in an order it builds, ``override_quantization_method(quant_cfg, user_quant[,
hf_config])``. The first answer that is not None replaces both the checkpoint's method and the user's value (so
``--quantization awq`` on a ModelOpt FP8 checkpoint runs ``modelopt`` in 0.33); without one, a user value that differs
from the checkpoint's ``quant_method`` is refused.

Which methods a release asks, in which order, and where each override is defined is generated from the release
(``service/data/vllm/quant_overrides/<release>.json``, scripts/vllm_quant_overrides_inside.py). What each override
answers for a (checkpoint config, user value, model type, GPU) is read from the release's source here, one small
predicate per config class; the release's own verdicts on a grid of such inputs
(``tests/fixtures/vllm_quant_overrides/``) are what the predicates are tested against. A class the data names and no
predicate here knows is not guessed at: the launch is not refused for it (a false reject costs more than a missed
check).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from .gpus import Gpu
from .versions import DATA_DIR, VersionLine

Release = tuple[int, int, int]


@dataclass(frozen=True)
class Site:
    """Where a release defines one method's override: its config class, ``vllm/<path>:<line>``, a code digest."""

    cls: str
    at: str
    code: str


@dataclass(frozen=True)
class OverrideFacts:
    """A release's generated override facts: the order its _verify_quantization asks the methods in (``order_by_user``:
    where a user value changes it, up to the claim that ends the asking), the methods whose config class has its own
    override, and per method what its get_quant_config does on a checkpoint without any quantization config
    (``no_config``: ``ok`` or vLLM's error)."""

    version: str
    verify_at: str
    order: tuple[str, ...]
    order_by_user: dict[str, tuple[str, ...]]
    methods: dict[str, Site]
    no_config: dict[str, str] = field(default_factory=dict)
    # the ``overrides`` list the release's guard checks a claim against (None: no guard, <= 0.9) and its methods
    guard: tuple[str, ...] | None = None
    quantization_methods: tuple[str, ...] = ()


@cache
def override_facts(version: str) -> OverrideFacts | None:
    """The generated facts of release ``version`` (a line's ``newest``); None where none were generated."""
    path = DATA_DIR / "quant_overrides" / f"{version}.json"
    if not path.exists():
        return None
    raw = json.loads(path.read_text())
    return OverrideFacts(
        version=raw["vllm_version"],
        verify_at=raw["verify_at"],
        order=tuple(raw["order"]),
        order_by_user={u: tuple(o) for u, o in raw["order_by_user"].items()},
        methods={n: Site(m["class"], m["at"], m["code"]) for n, m in raw["methods"].items()},
        no_config=dict(raw.get("no_config", {})),
        guard=tuple(raw["overrides_list"]) if raw.get("overrides_list") is not None else None,
        quantization_methods=tuple(raw.get("quantization_methods", ())),
    )


@dataclass(frozen=True)
class Probe:
    """One question to the overrides: the checkpoint's ``quant_cfg`` as vLLM normalises it (``quant_method``
    lower-case), the user's value, the top-level config.json ``model_type`` (vLLM passes ``self.hf_config``), the
    platform (``cuda`` / ``rocm``) and compute capability (80 for 8.0), the release and the process environment."""

    cfg: Mapping[str, Any]
    user: str | None
    model_type: str | None
    platform: str
    capability: int
    release: Release
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def method(self) -> str:
        m = self.cfg.get("quant_method", "")
        return m.lower() if isinstance(m, str) else ""


class OverrideRefusal(ValueError):
    """An override that raises instead of answering (vLLM's own message)."""


Predicate = Callable[[Probe, Site], "str | None"]


def _has(value: Any, options: tuple[Any, ...]) -> bool:
    """``value in options`` as vLLM's dict / list look-ups compare (4.0 == 4, True == 1); unhashable values and
    mixed types are simply not members."""
    return isinstance(value, (int, float, str)) and value in options


# ------------------------------------------------------------------------------------------- Marlin conversions


def _marlin_capable(p: Probe, group: Any) -> bool:
    """Marlin kernels on this GPU for this group size: CUDA capability 8.0+ (7.5+ from 0.15; ROCm not asked from
    0.21) and group size -1/32/64/128 (utils/marlin_utils.py query_marlin_supported_quant_types and
    _check_marlin_supported: vllm 0.6.6 :28-73; 0.13.0 :40-109; 0.15.1 :54; 0.21.0 :41-141)."""
    if not (p.platform == "rocm" and p.release >= (0, 21, 0)):
        if p.capability < (75 if p.release >= (0, 15, 0) else 80):
            return False
    return _has(group, (-1, 32, 64, 128))


def _awq_marlin_compatible(p: Probe) -> bool:
    """AWQMarlinConfig.is_awq_marlin_compatible (vllm 0.6.6 awq_marlin.py:131-153; 0.21.0 :312-334): CUDA (and
    ROCm from 0.21), ``awq`` with bits, group_size and zero_point set, a zero point (Marlin's AWQ types are
    zero-point types), 4 bits (8 too up to 0.8: uint8 was a Marlin zero-point type then)."""
    if not (p.platform == "cuda" or (p.platform == "rocm" and p.release >= (0, 21, 0))) or p.method != "awq":
        return False
    bits, group, zp = p.cfg.get("bits"), p.cfg.get("group_size"), p.cfg.get("zero_point")
    if bits is None or group is None or zp is None or not zp:
        return False
    return _has(bits, (4, 8) if p.release < (0, 9, 0) else (4,)) and _marlin_capable(p, group)


def _gptq_marlin_compatible(p: Probe) -> bool:
    """GPTQMarlinConfig.is_gptq_marlin_compatible (vllm 0.6.6 gptq_marlin.py:130-153; 0.21.0 :278-300): CUDA only,
    ``gptq`` with bits, group_size, sym and desc_act set, (bits, sym) in {(4, True), (8, True)}."""
    if p.platform != "cuda" or p.method != "gptq":
        return False
    bits, group, sym = p.cfg.get("bits"), p.cfg.get("group_size"), p.cfg.get("sym")
    if bits is None or group is None or sym is None or p.cfg.get("desc_act") is None:
        return False
    return _has(bits, (4, 8)) and _has(sym, (True,)) and _marlin_capable(p, group)


def awq_marlin(p: Probe, site: Site) -> str | None:
    """vllm 0.6.6-0.18.1 awq_marlin.py override (0.18.1 :149-171); 0.21.0 :234-259 first skips it under
    VLLM_BATCH_INVARIANT. Claims a Marlin-compatible AWQ checkpoint for no value, ``marlin`` or ``awq_marlin``;
    ``awq`` keeps the slow AWQ kernel (no claim)."""
    if p.release >= (0, 21, 0) and _env_true(p.env, "VLLM_BATCH_INVARIANT"):
        return None
    ok = _awq_marlin_compatible(p) and p.user in (None, "marlin", "awq_marlin")
    return "awq_marlin" if ok else None


def gptq_marlin(p: Probe, site: Site) -> str | None:
    """vllm 0.6.6-0.21.0 gptq_marlin.py override (0.21.0 :221-243): a Marlin-compatible GPTQ checkpoint for no
    value, ``marlin`` or ``gptq_marlin``; ``gptq`` keeps the GPTQ kernel."""
    ok = _gptq_marlin_compatible(p) and p.user in (None, "marlin", "gptq_marlin")
    return "gptq_marlin" if ok else None


def marlin(p: Probe, site: Site) -> str | None:
    """vllm 0.6.6-0.9.2 marlin.py override (0.9.2 :94-110): a checkpoint in Marlin format (``checkpoint_format:
    marlin`` or ``is_marlin_format``) for no value, ``gptq`` or ``marlin``."""
    fmt = p.cfg.get("checkpoint_format") == "marlin" or bool(p.cfg.get("is_marlin_format", False))
    return "marlin" if fmt and p.user in (None, "gptq", "marlin") else None


def gptq_marlin_24(p: Probe, site: Site) -> str | None:
    """vllm 0.6.6-0.15.1 gptq_marlin_24.py override (0.15.1 :115-131): ``checkpoint_format: marlin_24`` for no
    value, ``gptq`` or ``gptq_marlin_24``."""
    fmt = p.cfg.get("checkpoint_format") == "marlin_24"
    return "gptq_marlin_24" if fmt and p.user in (None, "gptq", "gptq_marlin_24") else None


def bitblas(p: Probe, site: Site) -> str | None:
    """vllm 0.8.5-0.15.1 bitblas.py override (0.15.1 :161-178): ``checkpoint_format: bitblas`` (or
    ``is_bitblas_format``) for no value, ``gptq`` or ``bitblas``."""
    fmt = p.cfg.get("checkpoint_format") == "bitblas" or bool(p.cfg.get("is_bitblas_format", False))
    return "bitblas" if fmt and p.user in (None, "gptq", "bitblas") else None


def gptq_bitblas(p: Probe, site: Site) -> str | None:
    """vllm 0.8.5-0.15.1 gptq_bitblas.py override (0.15.1 :181-205), for no value, ``bitblas`` or
    ``gptq_bitblas``. From 0.9 is_gptq_bitblas_compatible needs CUDA and ends in utils/bitblas_utils.py
    _check_bitblas_supported importing the ``bitblas`` package (0.9.2 :77; 0.10.2 :76-87), which vLLM does not
    install: no claim. 0.8.5 (gptq_bitblas.py:186-210, bitblas_utils.py:29-74) asks neither the platform, the
    package nor even the quant_method: bits, group_size, sym and desc_act set, (bits, sym) in {(4, True), (8,
    True)}, capability 7.0+ and a BitBLAS group size."""
    if p.release >= (0, 9, 0) or p.user not in (None, "bitblas", "gptq_bitblas"):
        return None
    bits, group, sym = p.cfg.get("bits"), p.cfg.get("group_size"), p.cfg.get("sym")
    if bits is None or group is None or sym is None or p.cfg.get("desc_act") is None:
        return None
    ok = _has(bits, (4, 8)) and _has(sym, (True,)) and p.capability >= 70 and _has(group, (-1, 32, 64, 128))
    return "gptq_bitblas" if ok else None


def not_on_gpu(p: Probe, site: Site) -> str | None:
    """Overrides that claim only on CPU / XPU (ipex_quant.py 0.6.6-0.15.1, cpu_wna16.py 0.13.0-0.21.0): never on a
    CUDA or ROCm GPU."""
    return None


# --------------------------------------------------------------------------------------------- MoE WNA16 (AWQ/GPTQ)


def _desc_act_ok(p: Probe) -> bool:
    """GPTQ activation ordering MoE WNA16 accepts: none (<= 0.28: ``not desc_act``); from 0.30
    utils/gptq_utils.py normalize_and_validate_gptq_desc_act (0.33.0 :23-50): none, or with one group (-1), and no
    ``dynamic`` rule turning it on with groups."""
    act, group = p.cfg.get("desc_act", False), p.cfg.get("group_size")
    if p.release < (0, 30, 0):
        return not p.cfg.get("desc_act")
    if act and group != -1:
        return False
    dynamic = p.cfg.get("dynamic") or {}
    if not isinstance(dynamic, Mapping):
        return False
    for pattern, rule in dynamic.items():
        if str(pattern).startswith("-:") or not isinstance(rule, Mapping):
            continue
        if rule.get("desc_act", act) and rule.get("group_size", group) != -1:
            return False
    return True


def moe_wna16(p: Probe, site: Site) -> str | None:
    """vllm 0.7.3-0.33.0 moe_wna16.py override (0.33.0 :145-151) and is_moe_wna16_compatible (0.33.0 :153-187):
    only for ``--quantization moe_wna16``; GPTQ with 4 or 8 bits and supported activation ordering, or 4-bit AWQ
    on a GPU of the AWQ kernel's capability (7.5+)."""
    if p.user != "moe_wna16":
        return None
    bits = p.cfg.get("bits")
    gptq = p.method == "gptq" and _desc_act_ok(p) and _has(bits, (4, 8))
    awq = p.method == "awq" and _has(bits, (4,)) and p.capability >= 75
    return "moe_wna16" if gptq or awq else None


# ------------------------------------------------------------------------------------------------------- ModelOpt


def _modelopt_algo(p: Probe) -> str | None:
    """ModelOptQuantConfigBase._extract_modelopt_quant_algo (vllm 0.18.1 modelopt.py:242-259; 0.33.0 :288-305):
    the upper-cased ``quant_algo`` (nested under ``quantization`` or flat) of a ``modelopt`` config (any
    ``modelopt*`` method from 0.24)."""
    m = p.method
    if not (m.startswith("modelopt") if p.release >= (0, 24, 0) else m == "modelopt"):
        return None
    if "quantization" in p.cfg:
        q = p.cfg["quantization"]
        return str(q.get("quant_algo", "")).upper() if isinstance(q, Mapping) else None
    return str(p.cfg.get("quant_algo", "")).upper()


def _legacy_nested_algo(p: Probe) -> Any:
    """The nested ``quantization.quant_algo`` of a ``modelopt`` config for the 0.10-0.15 overrides (None when the
    method is not ``modelopt`` or ``quantization`` is not an object); ``""`` when there is no ``quantization``."""
    if p.method != "modelopt":
        return None
    q = p.cfg.get("quantization", {}) if "quantization" in p.cfg else {}
    return q.get("quant_algo", "") if isinstance(q, Mapping) else None


def _modelopt_fp8_legacy(p: Probe) -> bool:
    """ModelOptFp8Config in vllm 0.10.2-0.13.0 (0.13.0 modelopt.py:329-352: ``"FP8" in quant_algo``, nested or
    flat) and 0.15.1 (:381-404: the same on ``str(quant_algo).upper()``)."""
    if p.method != "modelopt":
        return False
    nested = "quantization" in p.cfg
    algo = _legacy_nested_algo(p) if nested else p.cfg.get("quant_algo", "")
    if nested and algo is None:
        return False
    if p.release >= (0, 15, 0):
        algo = str(algo).upper()
    return isinstance(algo, str) and "FP8" in algo


def _modelopt_fp4_legacy(p: Probe) -> bool:
    """ModelOptNvFp4Config in vllm 0.10.2-0.15.1 (0.15.1 modelopt.py:1050-1075): ``"NVFP4" in quant_algo`` when
    nested, ``"FP4" in quant_algo.upper()`` when flat."""
    if p.method != "modelopt":
        return False
    if "quantization" in p.cfg:
        algo = _legacy_nested_algo(p)
        return isinstance(algo, str) and "NVFP4" in algo
    algo = p.cfg.get("quant_algo", "")
    return isinstance(algo, str) and "FP4" in algo.upper()


def modelopt_fp8(p: Probe, site: Site) -> str | None:
    """ModelOptFp8Config (vllm 0.33.0 modelopt.py:453-459; 0.18.1 :412-418; 0.10.2-0.15.1: _modelopt_fp8_legacy):
    a ModelOpt FP8 checkpoint whatever the user named."""
    if p.release < (0, 18, 0):
        return "modelopt" if _modelopt_fp8_legacy(p) else None
    return "modelopt" if _modelopt_algo(p) == "FP8" else None


def modelopt_fp4(p: Probe, site: Site) -> str | None:
    """ModelOptNvFp4Config (vllm 0.33.0 modelopt.py:776-782; 0.10.2-0.15.1: _modelopt_fp4_legacy): a ModelOpt
    (NV)FP4 checkpoint whatever the user named."""
    if p.release < (0, 18, 0):
        return "modelopt_fp4" if _modelopt_fp4_legacy(p) else None
    algo = _modelopt_algo(p)
    return "modelopt_fp4" if algo is not None and "FP4" in algo else None


def modelopt_mxfp8(p: Probe, site: Site) -> str | None:
    """ModelOptMxFp8Config (vllm 0.18.1-0.33.0, 0.33.0 modelopt.py:1236-1242): quant_algo containing MXFP8."""
    algo = _modelopt_algo(p)
    return "modelopt_mxfp8" if algo is not None and "MXFP8" in algo else None


def modelopt_mixed(p: Probe, site: Site) -> str | None:
    """ModelOptMixedPrecisionConfig (vllm 0.18.1-0.33.0, 0.33.0 modelopt.py:1658-1664): MIXED_PRECISION."""
    return "modelopt_mixed" if _modelopt_algo(p) == "MIXED_PRECISION" else None


def petit_nvfp4(p: Probe, site: Site) -> str | None:
    """PetitNvFp4Config (vllm 0.10.2-0.18.1, 0.18.1 petit.py:135-145): on ROCm, an NVFP4 / ModelOpt checkpoint."""
    if p.platform != "rocm":
        return None
    qc = p.cfg.get("quantization", p.cfg)
    if not isinstance(qc, Mapping):
        return None
    algo = qc.get("quant_algo") or qc.get("quant_method") or ""
    return "petit_nvfp4" if isinstance(algo, str) and algo.upper() in ("NVFP4", "MODELOPT_FP4", "MODELOPT") else None


# --------------------------------------------------------------------------------------- names and model types


def auto_awq(p: Probe, site: Site) -> str | None:
    """AutoAWQConfig (vllm 0.24.0-0.33.0, 0.33.0 auto_awq.py:263-286): every AWQ checkpoint for no value, ``awq``,
    ``awq_marlin``, ``auto_awq`` or ``marlin`` (not on CPU)."""
    return "auto_awq" if p.method == "awq" and p.user in (None, "awq", "awq_marlin", "auto_awq", "marlin") else None


def auto_gptq(p: Probe, site: Site) -> str | None:
    """AutoGPTQConfig (vllm 0.24.0-0.33.0, 0.33.0 auto_gptq.py:214-233): every GPTQ checkpoint for no value,
    ``gptq``, ``gptq_marlin``, ``auto_gptq`` or ``marlin``."""
    ok = p.method == "gptq" and p.user in (None, "gptq", "gptq_marlin", "auto_gptq", "marlin")
    return "auto_gptq" if ok else None


def inc(p: Probe, site: Site) -> str | None:
    """INCConfig (vllm 0.15.1-0.33.0, 0.33.0 inc/inc.py:361-368): an ``auto-round`` checkpoint runs ``inc``."""
    return "inc" if p.cfg.get("quant_method") == "auto-round" else None


def gguf(p: Probe, site: Site) -> str | None:
    """GGUFConfig (vllm 0.21.0 gguf.py:86-93): ``--quantization gguf`` overrides any checkpoint config."""
    return "gguf" if p.user == "gguf" else None


def humming(p: Probe, site: Site) -> str | None:
    """HummingConfig (vllm 0.21.0-0.33.0, 0.33.0 humming.py:179-191): ``--quantization humming`` overrides any
    checkpoint config (0.33 asks it first: config/model.py:1417-1419), except gpt-oss MXFP4, which it refuses."""
    if p.user != "humming":
        return None
    if p.model_type == "gpt_oss" and p.cfg.get("quant_method") == "mxfp4":
        raise OverrideRefusal("For gpt-oss model, use '--moe-backend humming' instead of '--quantization humming'.")
    return "humming"


def gpt_oss_mxfp4(p: Probe, site: Site) -> str | None:
    """GptOssMxfp4Config (vllm 0.21.0-0.33.0, 0.33.0 mxfp4.py:129-146): an ``mxfp4`` (or ``gpt_oss_mxfp4``)
    checkpoint of model_type gpt_oss runs ``gpt_oss_mxfp4`` whatever the user named."""
    ok = p.cfg.get("quant_method") in ("mxfp4", "gpt_oss_mxfp4") and p.model_type == "gpt_oss"
    return "gpt_oss_mxfp4" if ok else None


DEEPSEEK_V41_TYPES = ("deepseek_v4", "deepseek_v4_text", "deepseek_v41", "deepseek_v41_text")


def _quark_mxfp4_ocp(cfg: Mapping[str, Any]) -> bool:
    """DeepseekV4FP8Config._is_quark_mxfp4_ocp (vllm 0.28.0 models/deepseek_v4/quant_config.py:121-132)."""
    glob = cfg.get("global_quant_config") or {}
    weight = glob.get("weight") if isinstance(glob, Mapping) else None
    if not isinstance(weight, Mapping):
        return False
    return weight.get("dtype") == "fp4" and weight.get("qscheme") == "per_group" and weight.get("group_size") == 32


def deepseek_v4_fp8(p: Probe, site: Site) -> str | None:
    """DeepseekV4FP8Config: an ``fp8`` (or ``deepseek_v4_fp8``) checkpoint of a DeepSeek-V4 model, or any with
    ``--quantization deepseek_v4_fp8``. vllm 0.21.0-0.26.0 (0.26.0 models/deepseek_v4/quant_config.py:121-132);
    0.28.0 (:135-151) and 0.30.0's V4.1 class also claim a Quark MXFP4 export; the V4.1 class, which
    get_quantization_config picks on CUDA and ROCm from 0.30 (0.33.0 quantization/__init__.py:121-133), accepts
    the deepseek_v4(1)[_text] model types (0.33.0 models/deepseek_v41/quant_config.py:164-193); 0.32 no longer
    claims Quark."""
    qm = p.cfg.get("quant_method")
    quark = qm == "quark" and _quark_mxfp4_ocp(p.cfg) and (0, 28, 0) <= p.release < (0, 32, 0)
    if qm not in ("fp8", "deepseek_v4_fp8") and not quark:
        return None
    types = DEEPSEEK_V41_TYPES if "deepseek_v41" in site.at else ("deepseek_v4",)
    return "deepseek_v4_fp8" if p.model_type in types or p.user == "deepseek_v4_fp8" else None


# Each config class's override, and the code digests (generated ``code``) it was read from: a release whose override
# code differs fails tests/domain/test_quant_override.py until its predicate is read again.
PREDICATES: dict[str, tuple[Predicate, frozenset[str]]] = {
    "AWQMarlinConfig": (awq_marlin, frozenset({"cbbcb773", "a5b002b7"})),
    "GPTQMarlinConfig": (gptq_marlin, frozenset({"6fbea249"})),
    "MarlinConfig": (marlin, frozenset({"52c49d22"})),
    "GPTQMarlin24Config": (gptq_marlin_24, frozenset({"45a5974c"})),
    "BitBLASConfig": (bitblas, frozenset({"920226cc"})),
    "GPTQBitBLASConfig": (gptq_bitblas, frozenset({"e86c2244"})),
    "IPEXConfig": (not_on_gpu, frozenset({"a67317f6", "c35a1302"})),
    "CPUAWQConfig": (not_on_gpu, frozenset({"25c7e437"})),
    "CPUGPTQConfig": (not_on_gpu, frozenset({"ca6ec42f"})),
    "MoeWNA16Config": (moe_wna16, frozenset({"b7fa361c"})),
    "ModelOptFp8Config": (modelopt_fp8, frozenset({"075b54fa", "ccb19b79", "24d42d0d"})),
    "ModelOptNvFp4Config": (modelopt_fp4, frozenset({"b271fbc5", "9e092ea6"})),
    "ModelOptMxFp8Config": (modelopt_mxfp8, frozenset({"c2291ccb"})),
    "ModelOptMixedPrecisionConfig": (modelopt_mixed, frozenset({"d731ba5b"})),
    "PetitNvFp4Config": (petit_nvfp4, frozenset({"1c443b5c"})),
    "AutoAWQConfig": (auto_awq, frozenset({"bcf14c73"})),
    "AutoGPTQConfig": (auto_gptq, frozenset({"264a6f2c"})),
    "INCConfig": (inc, frozenset({"1d5a8fe3"})),
    "GGUFConfig": (gguf, frozenset({"a3333304"})),
    "HummingConfig": (humming, frozenset({"7da7f52c"})),
    "GptOssMxfp4Config": (gpt_oss_mxfp4, frozenset({"184b3d6d"})),
    "DeepseekV4FP8Config": (deepseek_v4_fp8, frozenset({"da4d9ee2", "4ee1061b", "581b9be6", "3bae1287", "9fcc484b"})),
}


def _env_true(env: Mapping[str, str], name: str) -> bool:
    """``bool(int(os.getenv(name, "0")))`` as vllm/envs.py reads such flags (a non-integer counts as unset)."""
    try:
        return bool(int(env.get(name, "0")))
    except ValueError:
        return False


# ------------------------------------------------------------------------------------------------ the verdict


MISMATCH = (
    "Quantization method specified in the model config ({ckpt}) does not match the quantization method specified "
    "in the `quantization` argument ({user})."
)


@dataclass(frozen=True)
class Verdict:
    """What the release does with one (checkpoint config, user value): ``method`` it runs (None: unquantized, or
    unknown after a refusal); ``claimed_by`` the method whose override decided (None: none did) and ``at`` where
    that override is; ``refusal`` vLLM's error text (a mismatch, or an override's own ValueError); ``mismatch``
    when the refusal is the mismatch; ``unread`` when an override this module has no predicate for was asked
    first (the verdict then accepts the user's value)."""

    method: str | None
    claimed_by: str | None = None
    at: str | None = None
    refusal: str | None = None
    mismatch: bool = False
    unread: bool = False


GUARD = (
    "Quantization method {name} is an override but is has not been added to the `overrides` list above. This is "
    "necessary to ensure that the overrides are checked in order of preference."
)


def _guarded(facts: OverrideFacts, name: str, claim: str, site: Site) -> Verdict:
    """A claim by a built-in method missing from the release's ``overrides`` list is refused (vllm 0.33.0
    vllm/config/model.py:1436-1447): 0.24 lists ``modelopt_mxfp8`` but not ``mxfp8``, which shares its class and is
    asked earlier, so every ModelOpt MXFP8 checkpoint fails there."""
    if facts.guard is not None and name in facts.quantization_methods and name not in facts.guard:
        return Verdict(method=None, claimed_by=name, at=site.at, refusal=GUARD.format(name=name))
    return Verdict(method=claim, claimed_by=name, at=site.at)


def platform_of(gpu: Gpu) -> tuple[str, int]:
    """(platform, capability) vLLM would report for ``gpu``: ROCm for AMD parts (their capability is not in the
    catalogue; every supported Instinct part is gfx90a or newer, 9.0+), CUDA otherwise (9.0 where unknown)."""
    if gpu.vendor.upper() == "AMD":
        return "rocm", gpu.capability_int or 94
    return "cuda", gpu.capability_int or 90


def reconcile(
    cfg: Mapping[str, Any] | None,
    user: str | None,
    *,
    model_type: str | None,
    gpu: Gpu,
    line: VersionLine,
    env: Mapping[str, str] | None = None,
) -> Verdict:
    """The release's _verify_quantization for the checkpoint's normalised ``quant_cfg`` (None: no quantization
    config, so no override is asked) and the user's value (vllm 0.33.0 vllm/config/model.py:1390-1462)."""
    if cfg is None:
        return Verdict(method=user)
    facts = override_facts(line.newest)
    platform, capability = platform_of(gpu)
    probe = Probe(cfg, user, model_type, platform, capability, line.release, env or {})
    ckpt = probe.method or None
    if facts is None:  # a line generated without its override facts: not judged
        return Verdict(method=user or ckpt, unread=True)
    for name in facts.order_by_user.get(user or "", facts.order):
        site = facts.methods.get(name)
        if site is None:  # the base class's override: always None
            continue
        known = PREDICATES.get(site.cls)
        if known is None:
            return Verdict(method=user or ckpt, claimed_by=name, at=site.at, unread=True)
        try:
            claim = known[0](probe, site)
        except OverrideRefusal as e:
            return Verdict(method=None, claimed_by=name, at=site.at, refusal=str(e))
        if claim is not None:
            return _guarded(facts, name, claim, site)
    if user is None or user == ckpt:
        return Verdict(method=user or ckpt)
    return Verdict(method=None, refusal=MISMATCH.format(ckpt=ckpt, user=user), mismatch=True)
