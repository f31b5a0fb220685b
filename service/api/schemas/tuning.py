"""The tuning loop."""

from __future__ import annotations

from pydantic import Field

from .base import JSON, Number, Out
from .plans import PlanCreatedOut


class AppliedOut(Out):
    plan: str = Field(description="The plan the service applied.")
    action: str = Field(description="The loop's action it carried out.")


class WindowRecordedOut(Out):
    id: int = Field(description="The stored window's id.")
    node: str = Field(description="Node name.")
    plan: str = Field(description="The plan that ran in the window.")
    current: bool = Field(description="Whether that plan is the node's current one.")
    applied: AppliedOut | None = Field(
        default=None,
        description=("Present when the plan's ``tuning.auto_apply`` made the service apply the loop's next plan."),
    )


class WindowOut(Out):
    id: int = Field(description="Window id.")
    plan: str = Field(description="The plan that ran in it.")
    at: str | None = Field(description="When it was stored (ISO 8601).")
    window_s: Number = Field(description="Its length in seconds.")
    num_requests_running: Number = Field(description="vllm:num_requests_running at its end.")
    num_requests_waiting: Number = Field(description="vllm:num_requests_waiting at its end.")
    kv_cache_usage_perc: Number = Field(description="vllm:kv_cache_usage_perc, 0..1.")
    num_preemptions: Number = Field(description="Preemptions over the window.")
    ttft_p99_s: Number | None = Field(description="Time-to-first-token P99 (null: no request finished its prefill).")
    e2e_p99_s: Number | None = Field(description="End-to-end latency P99 (null: no request finished).")
    generation_tokens_per_s: Number = Field(description="Generated tokens per second.")


class EngineArgsOut(Out):
    engine_args: JSON = Field(description="The engine arguments.")


class NextOut(EngineArgsOut):
    max_num_seqs: int = Field(description="The proposed max_num_seqs.")
    gpu_memory_utilization: Number = Field(description="The proposed gpu_memory_utilization.")
    memo: JSON = Field(description="The memo the next plan carries.")


class TuningStatusOut(Out):
    node: str = Field(description="Node name.")
    plan: str = Field(description="The node's current plan.")
    current: EngineArgsOut = Field(description="The current plan's engine arguments.")
    memo: JSON = Field(description="The current plan's memo (SLO, auto_apply, the levels that held).")
    state: str = Field(description="exploring, knee_found, settled, backing_off or stuck.")
    action: str = Field(description="What the loop does next (measure, hold, …).")
    next: NextOut | None = Field(description="The next plan's engine arguments (null: keep the current plan).")
    reasons: list[str] = Field(description="Why, for people.")
    evidence: list[WindowOut] = Field(description="The windows the decision was made from.")


class TuningAppliedOut(Out):
    from_: str = Field(alias="from", description="The plan it superseded.")
    state: str = Field(description="The loop's state.")
    action: str = Field(description="The action carried out.")
    reasons: list[str] = Field(description="Why.")
    evidence: list[WindowOut] = Field(description="The windows it was decided from.")
    memo: JSON = Field(description="The memo the new plan carries.")


class TuningPlanOut(PlanCreatedOut):
    tuning: TuningAppliedOut = Field(description="The decision this plan carries out.")  # type: ignore[assignment]
