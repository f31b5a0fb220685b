"""Recommendations: the launch values a careful operator would choose, following docs/operating.md §9 (and §2-§7),
for the engine arguments the request leaves out. Values the request sets are never changed.

``recommend(request)`` returns ``(engine_args, explanations)``: the request's engine args with the filled values
added, and one ``{"field", "value", "why"}`` per filled value. Choices (documented where the guide leaves room):

- ``tensor_parallel_size`` (§2): the largest valid TP up to the GPUs of one node (heads, KV heads and padded vocab
  divisible). On a PCIe node (``interconnect == "pcie"``) the smallest valid TP whose budget holds one
  ``max_model_len`` request and at least 0.5 × the concurrency target instead (all-reduce over PCIe dominates).
- ``max_model_len`` (§4): ``min(ceil(P99 × 1.2) rounded up to a multiple of 1024, the derived maximum)``; the
  multiple of 1024 gives the guide's "peak ≈ 6k → 8192" (7200 → 8192). Without a P99: left to vLLM (derived max).
- ``max_num_batched_tokens`` (§6): 4096 long-in/short-out, 8192 balanced (or unknown), 16384 short-in/long-out;
  raised to max_model_len when chunked prefill is off.
- ``enable_chunked_prefill`` (§6): on, unless the workload's P99 is below 512 tokens (all prompts short).
- ``enforce_eager`` (§7): off.
- ``gpu_memory_utilization`` and ``max_num_seqs`` (§3, §5, §9): stage ``initial`` (the default: the guide's
  conservative start) → 0.85 and 0.5 × bound; ``production`` → 0.90 and 0.75 × bound, where
  ``bound = KV pool / (KV bytes per token × avg_seq_len)`` (``max_model_len`` when the workload gives no average),
  computed with the memory model (service/domain/memory/) for the recommended values; capped at
  max_num_batched_tokens (vLLM requires max_num_batched_tokens ≥ max_num_seqs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .context import build_context
from .engine_args import resolve_name
from .errors import DomainError
from .memory import Budget, compute_budget, format_gib
from .model_facts import accepted_tp_sizes
from .request import LaunchRequest, Workload
from .rules.policy import p99_with_headroom, recommended_max_model_len
from .versions import resolve_version

MNBT_BY_SHAPE = {"long_in_short_out": 4096, "balanced": 8192, "short_in_long_out": 16384}
STAGES = {"initial": (0.85, 0.5), "production": (0.90, 0.75)}
SHORT_PROMPTS = 512


def _norm(request: LaunchRequest) -> dict[str, Any]:
    """The request's engine arguments by dest (``-tp`` or an abbreviation such as ``tensor-parallel`` included)."""
    line = resolve_version(request.vllm_version)[1]
    return {resolve_name(k, line): v for k, v in request.engine_args.items()}


def _budget_for(request: LaunchRequest, args: dict[str, Any]) -> Budget:
    return compute_budget(build_context(request.model_copy(update={"engine_args": args})))


def valid_tps(request: LaunchRequest, limit: int) -> list[int]:
    """TPs up to ``limit`` that vLLM accepts for this model (model_facts.py ``tp_accepted``)."""
    return accepted_tp_sizes(build_context(request.model_copy(update={"engine_args": {}})).facts, limit)


@dataclass
class _Fill:
    """The engine arguments being filled: what the request gave, the values so far, one explanation each."""

    request: LaunchRequest
    given: dict[str, Any]
    args: dict[str, Any]
    why: list[dict[str, Any]]
    stage: Literal["initial", "production"]
    derived: int  # the model's derived maximum length

    @property
    def workload(self) -> Workload | None:
        return self.request.workload

    def wants(self, fld: str) -> bool:
        return fld not in self.given

    def explain(self, fld: str, value: Any, text: str) -> None:
        self.args[fld] = value
        self.why.append({"field": fld, "value": value, "why": text})


def recommend(request: LaunchRequest) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Fill the engine arguments the request leaves out (docs/operating.md §9). Raises DomainError for input that
    cannot be judged (as ``validate`` does)."""
    given = _norm(request)
    wl = request.workload
    f = _Fill(
        request,
        given,
        dict(given),
        [],
        wl.stage if wl and wl.stage else "initial",
        build_context(request).facts.derived_max_model_len,
    )
    _fill_max_model_len(f)  # before TP: the PCIe choice depends on it
    _fill_chunked_prefill(f)
    _fill_batched_tokens(f)
    if f.wants("enforce_eager"):
        f.explain(
            "enforce_eager",
            False,
            "CUDA graphs on: 10-20 % faster than eager; eager is for debugging only (docs/operating.md §7)",
        )
    if f.wants("gpu_memory_utilization"):
        util_target = STAGES[f.stage][0]
        f.explain(
            "gpu_memory_utilization",
            util_target,
            f"stage {f.stage}: {util_target} ({'conservative start' if f.stage == 'initial' else 'production cap'}; "
            "docs/operating.md §3, §9 — vLLM's own default 0.92 is above the production cap)",
        )
    _fill_tensor_parallel(f)
    _fill_max_num_seqs(f)
    return f.args, f.why


def _fill_max_model_len(f: _Fill) -> None:
    """§4: from the traffic's P99, not the model card."""
    wl = f.workload
    if not f.wants("max_model_len") or not wl or not wl.p99_seq_len:
        return
    f.explain(
        "max_model_len",
        recommended_max_model_len(wl.p99_seq_len, f.derived),
        f"P99 {wl.p99_seq_len} tokens × 1.2 = {p99_with_headroom(wl.p99_seq_len)}, rounded up to a multiple of "
        f"1024, capped at the model's maximum {f.derived} (docs/operating.md §4: from the traffic, not the model "
        f"card)",
    )


def _fill_chunked_prefill(f: _Fill) -> None:
    """§6: on, unless every prompt is short."""
    if not f.wants("enable_chunked_prefill"):
        return
    wl = f.workload
    short = bool(wl and wl.p99_seq_len and wl.p99_seq_len < SHORT_PROMPTS)
    f.explain(
        "enable_chunked_prefill",
        not short,
        "every prompt is short (P99 < 512 tokens): chunking gains nothing (docs/operating.md §6)"
        if short
        else "on: long prompts are cut into chunks so decodes keep running between them (docs/operating.md §6); "
        "vLLM 0.33's default too",
    )


def _fill_batched_tokens(f: _Fill) -> None:
    """§6: by the workload's shape; at least max_model_len when chunked prefill is off."""
    if not f.wants("max_num_batched_tokens"):
        return
    wl = f.workload
    shape = wl.shape if wl and wl.shape else None
    mnbt = MNBT_BY_SHAPE.get(shape or "balanced", 8192)
    reason = (
        f"workload shape {shape}: " if shape else "no workload shape: the guide's starting point "
    ) + f"{mnbt} tokens per step (docs/operating.md §6: 4096 long-in/short-out, 8192 balanced, 16384 short-in/long-out)"
    if not f.args.get("enable_chunked_prefill", True):
        mml_now = int(f.args.get("max_model_len") or f.derived)
        if mnbt < mml_now:
            mnbt = mml_now
            reason += f"; raised to max_model_len {mml_now} because chunked prefill is off (vLLM refuses less)"
    f.explain("max_num_batched_tokens", mnbt, reason)


def _fill_tensor_parallel(f: _Fill) -> None:
    """§2: the largest valid TP of the node; on PCIe the smallest whose KV cache holds one max_model_len request."""
    if not f.wants("tensor_parallel_size"):
        return
    hw = f.request.hardware
    limit = hw.count // int(f.args.get("pipeline_parallel_size", 1) or 1)
    tps = valid_tps(f.request, max(1, limit))
    choice = tps[-1] if tps else 1
    reason = (
        f"the largest TP up to the node's {hw.count} GPUs that the model accepts "
        f"(valid: {tps}); spreading weights thin leaves each GPU more KV cache (docs/operating.md §2)"
    )
    if hw.interconnect == "pcie":
        for t in tps:
            try:
                b = _budget_for(f.request, {**f.args, "tensor_parallel_size": t})
            except DomainError:
                continue
            if b.fits_max_model_len and (b.max_num_seqs_bound or 0) >= 1:
                choice = t
                reason = (
                    f"PCIe node (no NVLink): the smallest valid TP ({t}, of {tps}) whose KV cache holds "
                    "one max_model_len request; all-reduce over PCIe makes larger TP slower (docs/operating.md §2)"
                )
                break
    f.explain("tensor_parallel_size", choice, reason)


def _fill_max_num_seqs(f: _Fill) -> None:
    """§5, §9: the stage's fraction of the KV bound with the values chosen so far (two passes: the sampler's profile
    memory depends on max_num_seqs), capped at max_num_batched_tokens."""
    if not f.wants("max_num_seqs"):
        return
    fraction = STAGES[f.stage][1]
    trial = {**f.args, "max_num_seqs": 256}
    for _ in range(2):
        b = _budget_for(f.request, trial)
        mns = min(
            max(1, int((b.max_num_seqs_bound or 0) * fraction)),
            int(trial.get("max_num_batched_tokens") or b.profiled_tokens),
        )
        trial["max_num_seqs"] = mns
    wl = f.workload
    f.explain(
        "max_num_seqs",
        mns,
        f"bound = KV pool {format_gib(b.kv_cache_bytes_per_gpu)} GiB / ({b.kv_bytes_per_token_per_gpu:,} B/token "
        f"× {b.max_num_seqs_bound_seq_len} tokens"
        f"{' average' if wl and wl.avg_seq_len else ' (max_model_len; no average given)'}) ≈ "
        f"{b.max_num_seqs_bound}; stage {f.stage} takes {fraction} × bound (docs/operating.md §5, §9)",
    )


def recommended_budget(request: LaunchRequest) -> tuple[dict[str, Any], list[dict[str, Any]], Budget]:
    """``recommend`` plus the budget of the recommended launch."""
    args, why = recommend(request)
    return args, why, _budget_for(request, args)
