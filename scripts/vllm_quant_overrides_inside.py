"""Runs INSIDE the catalogue environment (see scripts/gen_vllm_catalogue.py) with one vLLM release importable: records
how that release reconciles a checkpoint's quantization config with ``--quantization``, by running the release's own
``ModelConfig._verify_quantization`` (vllm 0.33.0 vllm/config/model.py:1383-1469; vllm/config.py in <= 0.9).

That function asks every quantization method, in an order it builds, ``override_quantization_method(quant_cfg,
user_quant[, hf_config])``; the first answer that is not None replaces both the checkpoint's method and the user's,
and a user value that still differs from the checkpoint's is refused ("Quantization method specified in the model
config (...) does not match ..."). Two things are written as JSON on stdout:

- ``order``: the methods in the order the release asks them (``overrides_list``: the methods its guard allows to
  claim, from 0.10) (``order_by_user``: where a user value changes it, e.g.
  0.33 asks ``humming`` first when the user names it); ``methods``: for each method whose config class has its own
  ``override_quantization_method``, the class, where the method is defined and a digest of its code;
- ``no_config``: per method, what the release's get_quant_config does on a checkpoint without any quantization
  config (``ok`` or the error, e.g. "Cannot find the config file for awq");
- ``grid``: the release's verdict for a grid of representative checkpoint configs (as ``quant_cfg`` reaches the
  function, i.e. after vLLM's normalisation) × model types × GPUs (CUDA compute capabilities and ROCm) × every user
  value (None and each method name): the method vLLM ends with, or the error it raises.

The platform is stubbed (``current_platform`` reports CUDA or ROCm and the capability asked for; its
verify_quantization is a no-op) and deprecated methods are allowed, so every verdict is the override mechanism's
alone. Never imported by the service.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import importlib
import importlib.util
import inspect
import json
import pathlib
import sys
import tempfile
import textwrap
import types
from unittest.mock import patch

from vllm_catalogue_inside import MOCKED, auto_import, mock

FP8_GROUP = {
    "targets": ["Linear"],
    "weights": {"type": "float", "num_bits": 8, "strategy": "channel", "symmetric": True, "dynamic": False},
    "input_activations": {"type": "float", "num_bits": 8, "strategy": "token", "symmetric": True, "dynamic": True},
}
W4A16_GROUP = {
    "targets": ["Linear"],
    "weights": {"type": "int", "num_bits": 4, "strategy": "group", "group_size": 128, "symmetric": True},
}


def _awq(bits=4, group=128, zp=True, **extra):
    return {"quant_method": "awq", "bits": bits, "group_size": group, "zero_point": zp, "version": "gemm", **extra}


def _gptq(bits=4, group=128, sym=True, act=False, **extra):
    return {"quant_method": "gptq", "bits": bits, "group_size": group, "sym": sym, "desc_act": act, **extra}


def _modelopt(algo, method="modelopt", **extra):
    q = {"quant_algo": algo, "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"], **extra}
    return {"producer": {"name": "modelopt", "version": "0.19.0"}, "quantization": q, "quant_method": method}


# quant_cfg as it reaches _verify_quantization (after the release's normalisation: quant_method lower-case, ModelOpt
# hf_quant_config.json given its quant_method by model_arch_config_convertor.py / _parse_quant_hf_config).
CONFIGS: dict[str, dict] = {
    "awq-4-g128-zp": _awq(),
    "awq-4-g64-zp": _awq(group=64),
    "awq-4-g128-nozp": _awq(zp=False),
    "awq-4-g7-zp": _awq(group=7),
    "awq-8-g128-zp": _awq(bits=8),
    "awq-4-no-group": {"quant_method": "awq", "bits": 4, "zero_point": True},
    "gptq-4-g128-sym": _gptq(),
    "gptq-8-g128-sym": _gptq(bits=8),
    "gptq-4-g128-asym": _gptq(sym=False),
    "gptq-3-g128-sym": _gptq(bits=3),
    "gptq-4-g7-sym": _gptq(group=7),
    "gptq-4-g128-act": _gptq(act=True),
    "gptq-4-gm1-act": _gptq(group=-1, act=True),
    "gptq-4-no-desc-act": {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True},
    "gptq-4-fmt-marlin": _gptq(checkpoint_format="marlin"),
    "gptq-4-is-marlin": _gptq(is_marlin_format=True),
    "gptq-4-fmt-marlin24": _gptq(checkpoint_format="marlin_24"),
    "gptq-4-fmt-bitblas": _gptq(checkpoint_format="bitblas"),
    "marlin": {"quant_method": "marlin", "group_size": 128, "lm_head": False},
    "modelopt-fp8": _modelopt("FP8"),
    "modelopt-fp8-pc-pt": _modelopt("FP8_PER_CHANNEL_PER_TOKEN"),
    "modelopt-fp8-pb-wo": _modelopt("FP8_PB_WO"),
    "modelopt-nvfp4": _modelopt("NVFP4", "modelopt_fp4", group_size=16),
    "modelopt-mixed": _modelopt("MIXED_PRECISION", "modelopt_mixed"),
    "modelopt-mxfp8": {"quant_method": "modelopt", "quantization": {"quant_algo": "MXFP8", "exclude_modules": []}},
    "modelopt-flat-fp8": {"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["lm_head"]},
    "modelopt-flat-nvfp4": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16},
    "modelopt_fp4-flat-nvfp4": {"quant_method": "modelopt_fp4", "quant_algo": "NVFP4", "group_size": 16},
    "mxfp8": {"quant_method": "mxfp8", "ignored_layers": ["lm_head"]},
    "mxfp4": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "router"]},
    "gpt_oss_mxfp4": {"quant_method": "gpt_oss_mxfp4", "modules_to_not_convert": ["router"]},
    "fp8": {"quant_method": "fp8", "activation_scheme": "dynamic"},
    "fp8-block": {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "weight_block_size": [128, 128],
    },
    "deepseek_v4_fp8": {"quant_method": "deepseek_v4_fp8", "weight_block_size": [128, 128]},
    "compressed-tensors-fp8": {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {"group_0": FP8_GROUP},
        "ignore": ["lm_head"],
    },
    "compressed-tensors-w4a16": {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"group_0": W4A16_GROUP},
        "ignore": ["lm_head"],
    },
    "quark-mxfp4": {
        "quant_method": "quark",
        "global_quant_config": {"weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32}},
    },
    "quark-fp8": {
        "quant_method": "quark",
        "global_quant_config": {"weight": {"dtype": "fp8_e4m3", "qscheme": "per_tensor"}},
    },
    "auto-round": {"quant_method": "auto-round", "bits": 4, "group_size": 128, "sym": True},
    "inc": {"quant_method": "inc", "bits": 4, "group_size": 128, "sym": True},
    "fbgemm_fp8": {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0, "modules_to_not_convert": ["lm_head"]},
    "experts_int8": {"quant_method": "experts_int8"},
    "bitsandbytes": {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
    "gguf": {"quant_method": "gguf"},
    "torchao": {"quant_method": "torchao", "quant_type": {"default": {"_type": "Int4WeightOnlyConfig"}}},
    "unknown": {"quant_method": "no_such_method"},
}
MODEL_TYPES = ("llama", "gpt_oss", "deepseek_v4", "deepseek_v41")
GPUS = (("cuda", 70), ("cuda", 75), ("cuda", 80), ("cuda", 90), ("rocm", 94))
MISMATCH = "Quantization method specified in the model config"


def retry(fn, tries: int = 300):
    """``fn()``, mocking third-party modules it fails to import (as auto_import does for a module)."""
    last = None
    for _ in range(tries):
        try:
            return fn()
        except ModuleNotFoundError as e:
            if not e.name or e.name.split(".")[0] == "vllm" or e.name == last:
                raise
            last = e.name
            mock(e.name)
        except ImportError as e:
            name = getattr(e, "name", None)
            if name and name not in sys.modules and name.split(".")[0] != "vllm":
                mock(name)
                continue
            raise
    raise ImportError("gave up mocking")


def stub_platform(kind: str, capability: int) -> None:
    """Make the release's ``current_platform`` report ``kind`` (cuda / rocm) with ``capability`` (e.g. 80)."""
    platforms = importlib.import_module("vllm.platforms")
    interface = importlib.import_module("vllm.platforms.interface")
    cls = type(platforms.current_platform)
    cls._enum = interface.PlatformEnum.CUDA if kind == "cuda" else interface.PlatformEnum.ROCM
    cap = interface.DeviceCapability(capability // 10, capability % 10)
    cls.get_device_capability = classmethod(lambda c, device_id=0: cap)
    cls.verify_quantization = classmethod(lambda c, quant: None)
    cls.device_type = "cuda"
    try:  # a few checks (gptq_bitblas.py in 0.8-0.15) ask torch itself
        import torch

        torch.cuda.get_device_capability = lambda device=None: (capability // 10, capability % 10)
    except ImportError:
        pass


def code_digest(fn) -> str:
    """A digest of a function's code (docstrings and layout ignored): equal digests, equal code."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    body = tree.body[0].body
    body = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(getattr(s, "value", None), ast.Constant))]
    return hashlib.sha1(ast.dump(ast.Module(body=body, type_ignores=[])).encode()).hexdigest()[:8]


def where(fn, root: pathlib.Path) -> str:
    """``vllm/<path>:<line>`` of the ``def`` line of ``fn`` (past its decorators)."""
    code = fn.__code__
    lines = pathlib.Path(code.co_filename).read_text().splitlines()
    line = code.co_firstlineno
    while line <= len(lines) and "def " not in lines[line - 1]:
        line += 1
    return f"vllm/{pathlib.Path(code.co_filename).resolve().relative_to(root.resolve())}:{line}"


# Modules a method's config class needs only on a GPU platform (get_quantization_config picks them at call time).
GPU_ONLY_MODULES = ("vllm.models.deepseek_v41",)


def _no_torch_compile() -> None:
    try:
        import torch
    except ImportError:
        return

    def compile_(model=None, **kwargs):
        return model if model is not None else (lambda fn: fn)

    torch.compile = compile_


def verifier():
    """ModelConfig._verify_quantization of this release and the quantization package it asks. Every config class
    is imported first with the platform unspecified: module-level code that asks a CUDA platform for its compiled
    kernels would fail here; the override functions ask the platform when called, after stub_platform.
    ``torch.compile`` is made a no-op first: 0.8 compiles a function when vocab_parallel_embedding.py is imported,
    which pulls torch's inductor in against the placeholder ``triton`` module vLLM installs without triton."""
    _no_torch_compile()
    config = auto_import("vllm.config")
    quant = auto_import("vllm.model_executor.layers.quantization")
    for name in quant.QUANTIZATION_METHODS:
        retry(lambda: quant.get_quantization_config(name))  # noqa: B023 - called at once
    for name in GPU_ONLY_MODULES:
        if importlib.util.find_spec(name.rsplit(".", 1)[0]) and importlib.util.find_spec(name):
            retry(lambda: importlib.import_module(name))  # noqa: B023 - called at once
    return config.ModelConfig._verify_quantization, quant


def run(verify, quant, cfg: dict, user: str | None, model_type: str) -> tuple[str, list[str]]:
    """One verdict: ``ok:<method>`` / ``error:<message>``, and the names asked, in order."""
    asked: list[str] = []
    real = quant.get_quantization_config

    def spy(name):
        asked.append(name)
        return retry(lambda: real(name))

    hf_config = types.SimpleNamespace(model_type=model_type, quantization_config=copy.deepcopy(cfg))
    me = types.SimpleNamespace(
        quantization=user,
        hf_config=hf_config,
        model_arch_config=types.SimpleNamespace(quantization_config=copy.deepcopy(cfg)),
        allow_deprecated_quantization=True,
    )
    parsed = copy.deepcopy(cfg)
    me._parse_quant_hf_config = lambda *a, **k: parsed
    targets = [patch.object(quant, "get_quantization_config", spy)]
    lazy = verify.__globals__.get("me_quant")  # >= 0.9: a LazyLoader that copies the module's names when loaded
    if lazy is not None and lazy is not quant:
        _ = lazy.QUANTIZATION_METHODS  # loaded now, not while the spy is in place
        targets.append(patch.object(lazy, "get_quantization_config", spy))
    if "get_quantization_config" in verify.__globals__:  # <= 0.8: imported by name into vllm/config.py
        targets.append(patch.dict(verify.__globals__, {"get_quantization_config": spy}))
    for t in targets:
        t.start()
    try:
        verify(me)
        verdict = f"ok:{me.quantization}"
    except Exception as e:  # noqa: BLE001 - every refusal is recorded as vLLM words it
        text = str(e).split(" Must be one of ")[0]  # the unknown-method error lists every method: the name is enough
        verdict = "mismatch" if text.startswith(MISMATCH) else f"error:{type(e).__name__}: {text}"
    finally:
        for t in reversed(targets):
            t.stop()
    return verdict, asked


def overrides(quant, order: list[str], root: pathlib.Path) -> dict:
    base = quant.QuantizationConfig.override_quantization_method.__func__
    out = {}
    for name in order:
        cls = retry(lambda: quant.get_quantization_config(name))  # noqa: B023 - called at once
        fn = cls.override_quantization_method.__func__
        if fn is base:
            continue
        out[name] = {"class": cls.__name__, "at": where(fn, root), "code": code_digest(fn)}
    return out


def overrides_list(verify) -> list[str] | None:
    """The ``overrides`` list _verify_quantization keeps, where it refuses a method that claims from outside it
    ("Quantization method {name} is an override but is has not been added to the `overrides` list above": vllm
    0.33.0 vllm/config/model.py:1395-1447); None for releases without that guard (<= 0.9)."""
    source = textwrap.dedent(inspect.getsource(verify))
    if "is an override but" not in source:
        return None
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Assign)
            and any(getattr(t, "id", None) == "overrides" for t in node.targets)
            and isinstance(node.value, ast.List)
        ):
            return [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
    return None


def no_config(quant) -> dict[str, str]:
    """Per method, what the release's get_quant_config does for a checkpoint with no quantization config and no
    other JSON file (vllm 0.33.0 vllm/model_executor/model_loader/weight_utils.py:197-393): ``ok``, or the error it
    raises ("Cannot find the config file for awq")."""
    weight_utils = auto_import("vllm.model_executor.model_loader.weight_utils")
    resolve = None
    if hasattr(sys.modules["vllm.config"], "__path__") and importlib.util.find_spec("vllm.config.quantization"):
        resolve = getattr(importlib.import_module("vllm.config.quantization"), "resolve_quantization_config", None)
    out = {}
    with tempfile.TemporaryDirectory() as empty:
        for name in quant.QUANTIZATION_METHODS:
            try:  # EngineArgs passes the online shorthand's arguments (0.33: engine/arg_utils.py:922-926)
                online = resolve(name, None) if resolve else None
            except Exception:  # noqa: BLE001 - not a shorthand
                online = None
            model = types.SimpleNamespace(
                quantization=name,
                hf_config=types.SimpleNamespace(),
                model=empty,
                tokenizer=empty,
                revision=None,
                hf_overrides={},
                quantization_config=online,
            )
            load = types.SimpleNamespace(download_dir=None, model_loader_extra_config={})
            try:
                retry(lambda: weight_utils.get_quant_config(model, load))  # noqa: B023 - called at once
                out[name] = "ok"
            except Exception as e:  # noqa: BLE001 - recorded as vLLM words it
                out[name] = f"{type(e).__name__}: {str(e)[:300]}"
    return out


def grid(verify, quant, users: list[str | None]) -> dict:
    """Verdicts, deduplicated: ``cells[cfg|model_type|gpu] = index`` into ``outcomes``; an outcome lists the
    verdict for no user value (``none``), the user values accepted (``ok``: value -> method) and the other errors
    (``error``); every other user value is a mismatch."""
    outcomes: list[dict] = []
    index: dict[str, int] = {}
    cells: dict[str, int] = {}
    for kind, cc in GPUS:
        stub_platform(kind, cc)
        for cid, cfg in CONFIGS.items():
            for mt in MODEL_TYPES:
                out: dict = {"none": None, "ok": {}, "error": {}}
                for user in users:
                    verdict, _ = run(verify, quant, cfg, user, mt)
                    if user is None:
                        out["none"] = verdict
                    elif verdict.startswith("ok:"):
                        out["ok"][user] = verdict[3:]
                    elif verdict != "mismatch":
                        out["error"][user] = verdict[6:]
                key = json.dumps(out, sort_keys=True)
                if key not in index:
                    index[key] = len(outcomes)
                    outcomes.append(out)
                cells[f"{cid}|{mt}|{kind}{cc}"] = index[key]
    return {
        "configs": CONFIGS,
        "model_types": list(MODEL_TYPES),
        "gpus": [f"{k}{c}" for k, c in GPUS],
        "cells": cells,
        "outcomes": outcomes,
    }


def main() -> None:
    root = pathlib.Path(importlib.util.find_spec("vllm").origin).parent
    verify, quant = verifier()  # first: importing vllm (its version) needs the mocks auto_import installs
    version = importlib.import_module("vllm.version").__version__
    stub_platform("cuda", 90)
    methods = list(quant.QUANTIZATION_METHODS)
    users: list[str | None] = [None, *methods]
    nobody = {"quant_method": "no_such_method"}
    _, order = run(verify, quant, nobody, None, "llama")
    by_user = {}
    for user in methods:
        _, asked = run(verify, quant, nobody, user, "llama")
        if asked != order[: len(asked)]:  # a different order, not a claim that stops early
            by_user[user] = asked
    json.dump(
        {
            "vllm_version": version,
            "verify_at": where(verify, root),
            "quantization_methods": methods,
            "order": order,
            "overrides_list": overrides_list(verify),
            "order_by_user": by_user,
            "methods": overrides(quant, order, root),
            "no_config": no_config(quant),
            "grid": grid(verify, quant, users),
            "mocked_modules": sorted(set(MOCKED)),
        },
        sys.stdout,
        indent=1,
        sort_keys=True,
    )


if __name__ == "__main__":
    main()
