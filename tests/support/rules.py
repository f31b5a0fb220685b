"""Helpers for the rule-family tests: run the validator on a request dict and pick findings by code; AWQ and GPTQ
variants of a real config."""

from __future__ import annotations

from service.domain.context import build_context
from service.domain.findings import Finding
from service.domain.model_facts import read_model_facts
from service.domain.request import LaunchRequest
from service.domain.rules.parallel import kv_heads_ok
from service.domain.validate import validate
from tests.support import MODELS, request

FIXTURES = sorted(d.name for d in MODELS.iterdir() if d.is_dir())
TP_SIZES = (1, 2, 4, 8, 16)


def run(req: dict):
    return validate(LaunchRequest.model_validate(req))


def context(req: dict):
    return build_context(LaunchRequest.model_validate(req))


def found(req: dict, *codes: str, severity: str | None = None) -> list[Finding]:
    return [f for f in run(req).findings if f.rule in codes and (severity is None or f.severity.value == severity)]


def errors(req: dict, *codes: str) -> list[Finding]:
    return found(req, *codes, severity="error")


def head_valid(config: dict, tp: int) -> bool:
    """TP sizes the head rules allow (the accept-side sweeps only look at those)."""
    f = read_model_facts(config)
    return f.num_attention_heads % tp == 0 and kv_heads_ok(f.total_num_kv_heads, tp, f.is_mla)


AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}


def quantized(model: str, qcfg: dict, gpu: str = "a100-sxm4-80gb", **args) -> dict:
    req = request(model, gpu=gpu, **args)
    req["model"]["config"]["quantization_config"] = dict(qcfg)
    req["model"]["config"]["torch_dtype"] = "float16"
    return req
