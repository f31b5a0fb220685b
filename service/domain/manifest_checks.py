"""Checks a weight manifest must pass at registration: the same rules a plan would fail later, applied now so that
a manifest whose quantization.txt, config.json ``quantization_config`` and ``hf_quant_config.json`` disagree is never
stored (the tag exists to stop exactly this mix-up)."""

from __future__ import annotations

from typing import Any

from .errors import DomainError
from .findings import Finding, Severity
from .linear_shapes import ModuleShapes
from .model_facts import read_quant_config
from .tensor_format import Claim, TensorFormat, detect_format, format_findings

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


def tensor_claims(
    config: dict[str, Any], hf_quant_config: dict[str, Any] | None, quantization_txt: str | None
) -> list[Claim]:
    """What the tag and the two configs say the checkpoint is, for comparing with its tensors. config.json without
    a quantization_config says "unquantized" only when no hf_quant_config.json stands in for it (vLLM reads that
    one then: vllm 0.33.0 vllm/config/model.py ``_parse_quant_hf_config``)."""
    from .quant_tag import parse_quantization_txt
    from .versions import all_quant_methods

    claims = []
    if quantization_txt:
        tag = parse_quantization_txt(quantization_txt, all_quant_methods())
        bits, group = tag.params.get("bits", ""), tag.params.get("group_size", "")
        claims.append(
            Claim(
                "quantization.txt",
                "model.quantization_txt",
                tag.method,
                bits=int(bits) if bits.isdigit() else None,
                group_size=int(group) if group.lstrip("-").isdigit() and len(group) < 9 else None,
            )
        )
    for source, fld, q in (
        ("config.json", "model.config.quantization_config", read_quant_config(config, None)),
        (
            "hf_quant_config.json",
            "model.hf_quant_config",
            read_quant_config({}, hf_quant_config) if hf_quant_config else None,
        ),
    ):
        if q is not None:
            claims.append(Claim(source, fld, q.method, q.bits, q.group_size, q.weight_block_size))
        elif source == "config.json" and not hf_quant_config:
            claims.append(Claim(source, fld, None))
    return claims


def posted_format(tensors: dict[str, Any]) -> TensorFormat | None:
    """The format the manifest's tensors show: read again here from their linear shapes (``linears``) when the
    manifest records them — the client's ``format`` must agree with it (a DomainError naming ``tensors.format``
    otherwise) — else the ``format`` as posted; None without one."""
    posted = TensorFormat.from_dict(tensors["format"]) if isinstance(tensors.get("format"), dict) else None
    linears = tensors.get("linears")
    if not isinstance(linears, list) or not linears:
        return posted
    entries = [ModuleShapes.from_dict(m) for m in linears]
    pseudo = {t.name: t for m in entries for t in m.tensors().values()}
    ours = detect_format(pseudo, {m.first: m.count for m in entries})
    if posted is not None:
        for key in ("scheme", "bits", "group_size", "granularity", "block"):
            theirs, mine = getattr(posted, key), getattr(ours, key)
            if mine is not None and theirs != mine:
                raise DomainError(
                    "tensors.format",
                    f"tensors.format says {key} {theirs!r}, but the tensors' shapes (tensors.linears) show "
                    f"{ours.describe()} (tensor {ours.evidence}): the format is read from the tensors, not taken as "
                    "sent.",
                    rule="tensors_format",
                )
    return ours if ours.scheme != "none" or posted is None else posted


def _layers_problem(config: dict[str, Any], hf_quant_config: dict[str, Any] | None, tensors: dict[str, Any]) -> None:
    """A checkpoint whose tensors hold none of config.json's decoder layers is not that model's (the per-layer
    record, ``ranks``, has no byte in layers 0 .. num_hidden_layers - 1)."""
    ranks = tensors.get("ranks")
    if not isinstance(ranks, dict):
        return
    from .model_facts import read_model_facts

    layers = read_model_facts(config, hf_quant_config).num_hidden_layers
    if layers and not any(sum(layer) for layer in ranks.get("layers", [])[:layers]):
        raise DomainError(
            "tensors",
            f"config.json has {layers} decoder layers (num_hidden_layers) but the tensors hold none of them: no tensor "
            "of decoder layer 0 (model.layers.0.input_layernorm.weight or any other model.layers.0.* / "
            "layers.0.* tensor) — these weights are not this config's model.",
            rule="tensors_layers_missing",
        )


def check_manifest(
    config: dict[str, Any],
    hf_quant_config: dict[str, Any] | None,
    quantization_txt: str | None,
    tensors: dict[str, Any] | None = None,
) -> None:
    """Raise DomainError (a 422 naming the field and the rule) for the first finding: tensors that hold none of the
    config's layers, a posted format the tensors' shapes contradict, the tensors' own format against the tag and
    configs (its message says which source is wrong), then the sources among themselves."""
    if tensors:
        _layers_problem(config, hf_quant_config, tensors)
        fmt = posted_format(tensors)
        if fmt is not None:
            for f in format_findings(fmt, tensor_claims(config, hf_quant_config, quantization_txt)):
                raise DomainError(f.field or "tensors", f.message, rule=f.rule)
    for f in manifest_findings(config, hf_quant_config, quantization_txt):
        raise DomainError(f.field or "model.quantization_txt", f.message, rule=f.rule)
