"""Staged rollouts."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .base import JSON, Out, WarningOut


class WaveSpecOut(Out):
    percent: int = Field(description="Cumulative share of the nodes changed by the end of the wave.")
    bake_s: int = Field(description="Seconds it bakes, every unit ready, before the next one.")


class WaveOut(WaveSpecOut):
    index: int = Field(description="Wave index.")
    state: str = Field(description="pending, waiting, baking, done, skipped, halted, aborted or cancelled.")
    plan_ids: list[str] | None = Field(description="The plans signed for it.")
    signed_at: str | None = Field(description="When its first chunk was signed (ISO 8601).")
    settled_at: str | None = Field(description="When every unit was ready or failed.")
    done_at: str | None = Field(description="When it was left.")
    nodes: list[str] = Field(description="Its nodes.")


class RolloutNodeOut(Out):
    node: str = Field(description="Node name.")
    unit: int = Field(description="Its unit (a node, or a multi-node instance moving together).")
    wave: int = Field(description="Its wave.")
    head: bool = Field(description="It heads its unit's instance.")
    outcome: str = Field(
        description="unchanged, pending, ready, failed, superseded_by_hand, restored, not_restored or retry_restore."
    )
    failed: bool = Field(description="It failed a gate.")
    previous_plan_id: str | None = Field(description="The plan it ran before the rollout.")
    new_plan_id: str | None = Field(description="The rollout's plan for it.")
    new_seq: int | None = Field(description="Its seq of that plan.")
    restored_plan_id: str | None = Field(description="The plan that restored its previous content.")
    restored_seq: int | None = Field(description="Its seq of that plan.")
    signed_at: str | None = Field(description="When the rollout's plan was signed for it (ISO 8601).")
    evidence: JSON | None = Field(description="Why its outcome is what it is (reports, figures, reasons).")


class RolloutBaseOut(Out):
    id: str = Field(description="Rollout id.")
    state: str = Field(
        description="pending, waiting, baking, paused, halted, rolling_back, aborting, completed, "
        "rolled_back or aborted."
    )
    wave: int = Field(description="The current wave (-1 before the first).")
    promote: bool = Field(description="The current wave's bake is skipped.")
    paused_from: str | None = Field(description="The state it was paused in.")
    target: JSON = Field(
        description="The target as given, the manifest as ``name@version`` (``manifest_id``: the id it is pinned by)."
    )
    pinned: Any = Field(description="Per hardware shape, what every wave is signed with (decided at creation).")
    judged: Any = Field(description="Per hardware shape, the verdict and findings at creation.")
    selector: JSON | None = Field(description="The selector the nodes came from (null: names).")
    failure_limit: int = Field(description="Failed units tolerated before it halts.")
    failures: int = Field(description="Units failed so far.")
    gates: JSON = Field(description="ready_timeout_s and kv_tolerance.")
    bake_until: str | None = Field(description="When the current bake ends (ISO 8601).")
    reason: str | None = Field(description="Why it halted or was aborted.")
    nodes_total: int = Field(description="Its nodes.")
    created_by: str = Field(description="Who created it.")
    created_at: str | None = Field(description="When (ISO 8601).")
    updated_at: str | None = Field(description="Its last change.")


class RolloutSummaryOut(RolloutBaseOut):
    waves: list[WaveSpecOut] = Field(description="The waves as given.")


class RolloutOut(RolloutBaseOut):
    waves: list[WaveOut] = Field(description="The waves: share, bake, state, plans signed, nodes.")
    outcomes: dict[str, int] = Field(description="Nodes per outcome (what it changed).")
    nodes: list[RolloutNodeOut] = Field(
        description="Per node: unit, wave, outcome, the plans before, of and after the rollout, evidence."
    )


class RolloutCreatedOut(RolloutOut):
    warnings: list[WarningOut] | None = Field(
        default=None,
        description="Present when a setting will not act as its name says (``failure_limit_not_limiting``).",
    )


class RolloutListOut(Out):
    items: list[RolloutSummaryOut] = Field(description="Rollouts, newest first.")
    next: str | None = Field(description="The cursor of the next page (pass it as ``after``); null on the last page.")
