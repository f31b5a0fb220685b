"""The validator: a launch request in, a verdict with findings, the budget and the rendered command out.

``validate(request)`` is the one entry point shared by ``preflight check``, ``POST /v1/validate`` and
``POST /v1/plans``. It raises DomainError only for input that cannot be judged at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .context import LaunchContext, build_context
from .findings import Finding, Severity, verdict_of
from .loading import option_of, redact_argv
from .memory import compute_budget
from .policy_profile import Profile, default_profile
from .render import render_argv, shell_command
from .request import LaunchRequest
from .rules import run_rules


@dataclass
class ValidationResult:
    """``verdict``: accept | warn | reject. ``argv`` is rendered even for a rejection (what would have run)."""

    verdict: str
    findings: list[Finding]
    argv: list[str]
    command: str
    vllm_version: str
    effective: dict[str, Any]
    budget: dict[str, Any] | None = None
    recommendations: list[dict[str, Any]] = field(default_factory=list)
    alternatives: list[dict[str, Any]] = field(default_factory=list)
    policy: dict[str, str] = field(default_factory=dict)  # the profile that judged it: name and digest
    context: LaunchContext | None = field(default=None, repr=False)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.ERROR]

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "findings": [f.as_dict() for f in self.findings],
            "argv": self.argv,
            "command": self.command,
            "vllm_version": self.vllm_version,
            "effective": self.effective,
            "budget": self.budget,
            "recommendations": self.recommendations,
            "alternatives": self.alternatives,
            "policy": self.policy,
        }


_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


def effective_values(ctx: LaunchContext) -> dict[str, Any]:
    """The values vLLM would run with, defaults applied (vllm 0.33.0 vllm/config/cache.py:185, 215-224;
    vllm/engine/arg_utils.py:2940-3039, 3151-3240)."""
    return {
        "tensor_parallel_size": ctx.tp,
        "pipeline_parallel_size": ctx.pp,
        "max_model_len": ctx.max_model_len,
        "derived_max_model_len": ctx.facts.derived_max_model_len,
        "gpu_memory_utilization": ctx.gpu_memory_utilization,
        "max_num_seqs": ctx.max_num_seqs,
        "max_num_batched_tokens": ctx.max_num_batched_tokens,
        "enable_chunked_prefill": ctx.enable_chunked_prefill,
        "dtype": ctx.dtype,
        "kv_cache_dtype": ctx.kv_cache_dtype,
        "block_size": ctx.block_size,
        "gpu": ctx.gpu.as_dict(),
    }


def validate(
    request: LaunchRequest,
    *,
    model_ref: str | None = None,
    fill: bool = True,
    alternatives: bool = True,
    policy: Profile | None = None,
) -> ValidationResult:
    """Judge one launch request.

    When the request carries a ``workload`` and ``fill`` is true, the engine arguments it leaves out are first filled
    with the recommended values (service/domain/recommend.py, docs/operating.md §9); each filled value is listed in
    ``recommendations`` with its reason, and the verdict judges the filled launch. A rejected launch also lists
    ``alternatives``: up to three ``engine_args`` patches, nearest first, that would pass (service/domain/
    alternatives.py; each one re-validated). ``policy`` is the profile that rules the operators' findings for the
    request's environment (policy_profile.py; default: the shipped one).

    Raises DomainError (service.domain.errors) for input that cannot be judged (unknown GPU, unsupported
    vllm_version, config.json without heads/layers/hidden size, unknown quantization.txt tag, ill-typed engine args).
    """
    original = request
    recommendations: list[dict[str, Any]] = []
    if fill and request.workload is not None:
        from .recommend import recommend

        engine_args, recommendations = recommend(request)
        request = request.model_copy(update={"engine_args": engine_args})
    profile = policy or default_profile()
    ctx = build_context(request)
    ctx.policy = profile.rules_for(ctx.environment)
    findings = run_rules(ctx, "config")
    ctx.budget = compute_budget(ctx)
    findings = profile.judge(findings + run_rules(ctx, "budget"), ctx.environment)
    findings.sort(key=lambda f: _ORDER[f.severity])
    argv = ctx.notes.get("argv")
    if argv is None or (model_ref is not None and argv[2] != model_ref):
        argv = render_argv(ctx, model_ref)
    secret = {f.field for f in findings if f.rule == "secret_in_engine_args" and f.field}
    if secret:  # a refused launch is shown, never signed: without the secret it carried
        argv = redact_argv(argv, {ctx.line.options[d].flag for d in map(option_of, secret) if d in ctx.line.options})
    result = ValidationResult(
        verdict=verdict_of(findings),
        findings=findings,
        argv=argv,
        command=shell_command(argv, request.env),
        vllm_version=ctx.version,
        effective=effective_values(ctx),
        budget=ctx.budget.as_dict() if ctx.budget is not None else None,
        recommendations=recommendations,
        policy=profile.provenance(),
        context=ctx,
    )
    if alternatives and result.verdict == "reject":
        from .alternatives import nearest_alternatives

        result.alternatives = nearest_alternatives(original, result, policy=profile)
    return result
