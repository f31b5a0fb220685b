"""Checks a weight manifest must pass at registration: the same rules a plan would fail later, applied now so that
a manifest whose quantization.txt, config.json ``quantization_config`` and ``hf_quant_config.json`` disagree is never
stored (the tag exists to stop exactly this mix-up)."""

from __future__ import annotations

from typing import Any

from .errors import DomainError
from .findings import Finding, Severity
from .model_facts import read_quant_config

SRC = "vllm 0.33.0 vllm/config/model.py (_parse_quant_hf_config, _verify_quantization); service/domain/rules/quantization.py"


def manifest_findings(
    config: dict[str, Any], hf_quant_config: dict[str, Any] | None, quantization_txt: str | None
) -> list[Finding]:
    """Errors a plan for this manifest would get whatever the launch: the checkpoint's two quantization sources
    disagree, or the tag disagrees with the checkpoint (``quant_mismatch``) or names a pre-quantized method for an
    unquantized checkpoint (``quant_no_config``)."""
    out: list[Finding] = []
    in_config = read_quant_config(config, None)
    in_hf = read_quant_config({}, hf_quant_config) if hf_quant_config else None
    if in_config and in_hf and in_config.method != in_hf.method:
        out.append(
            Finding(
                "quant_mismatch",
                Severity.ERROR,
                f"config.json's quantization_config says {in_config.method} but hf_quant_config.json says "
                f"{in_hf.method}; vLLM reads config.json's, so the weights would be loaded as {in_config.method}.",
                {"hf_quant_config": in_config.method},
                SRC,
                "model.hf_quant_config",
            )
        )
    if quantization_txt:
        from .context import build_context
        from .quant_tag import parse_quantization_txt
        from .request import LaunchRequest
        from .rules.quantization import quant_mismatch
        from .versions import all_quant_methods, version_lines

        method = parse_quantization_txt(quantization_txt, all_quant_methods()).method
        # judge the tag at the newest line that knows it (bitsandbytes and gguf left core, but older lines have them)
        line = next(
            (l for l in reversed(version_lines()) if method is None or method in l.quant_methods), version_lines()[-1]
        )
        request = LaunchRequest.model_validate(
            {
                "model": {"config": config, "hf_quant_config": hf_quant_config, "quantization_txt": quantization_txt},
                "hardware": {"gpu": "h100-sxm-80gb", "count": 1},
                "environment": "benchmark",
                "vllm_version": line.newest,
            }
        )
        ctx = build_context(request)
        out += [
            f
            for f in quant_mismatch(ctx)
            if f.severity is Severity.ERROR and f.rule in ("quant_mismatch", "quant_no_config")
        ]
    return out


def check_manifest(
    config: dict[str, Any], hf_quant_config: dict[str, Any] | None, quantization_txt: str | None
) -> None:
    """Raise DomainError (a 422 naming the field and the rule) for the first finding."""
    for f in manifest_findings(config, hf_quant_config, quantization_txt):
        raise DomainError(f.field or "model.quantization_txt", f.message, rule=f.rule)
