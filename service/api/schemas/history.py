"""Which config ran where: a node's history and runs, a plan's placements."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .base import Out
from .plans import GroupOut


class PlacementReportOut(Out):
    status: str = Field(description="The last report's status.")
    at: str | None = Field(description="When it was received (ISO 8601).")
    message: str | None = Field(description="The agent's line for people.")


class PlacementOut(Out):
    """One plan on one node: when it was assigned, fetched, started, running, stopped or exited."""

    plan_id: str = Field(description="Plan id.")
    node: str = Field(description="Node name.")
    seq: int = Field(description="The node's seq of the plan.")
    assignment_status: str = Field(description="active, superseded or revoked.")
    assigned_at: str | None = Field(description="When it was assigned (ISO 8601).")
    first_fetched_at: str | None = Field(description="The agent's first fetch of it.")
    last_fetched_at: str | None = Field(description="The last recorded fetch.")
    fetches: int = Field(description="Recorded fetches.")
    started_at: str | None = Field(description="The first ``started`` report.")
    running_at: str | None = Field(description="The first ``running`` report.")
    failed_at: str | None = Field(description="The first ``failed`` report.")
    stopped_at: str | None = Field(description="The first ``stopped`` report.")
    exited_at: str | None = Field(description="The first ``exited`` report.")
    refused_at: str | None = Field(description="The first ``refused`` report.")
    last_report: PlacementReportOut | None = Field(description="The newest report on it.")
    group: int | None = Field(description="The node's group in the plan.")
    rank: int | None = Field(description="Its rank in the group.")
    role: str | None = Field(description="replica, head or worker.")


class PlacementsOut(Out):
    plan_id: str = Field(description="Plan id.")
    plan_status: str = Field(description="active, superseded or revoked.")
    approved_by: str = Field(description="Who created it.")
    created_at: str | None = Field(description="When (ISO 8601).")
    placements: list[PlacementOut] = Field(description="Per node.")
    groups: list[GroupOut] | None = Field(default=None, description="Per group (plans with a topology).")


class ManifestRefOut(Out):
    name: str = Field(description="The model's name.")
    version: str = Field(description="The weight version.")
    digest: str = Field(description="The manifest's digest.")


class HistoryItemOut(PlacementOut):
    approved_by: str = Field(description="Who created the plan.")
    plan_status: str = Field(description="The plan's status.")
    manifest: ManifestRefOut = Field(description="What the plan loads.")
    vllm_version: str | None = Field(description="The vLLM release it was validated for.")
    argv: list[str] = Field(description="What the node ran.")
    group_status: str | None = Field(description="The state of the node's multi-node group (null: a replica).")


class HistoryOut(Out):
    node: str = Field(description="Node name.")
    items: list[HistoryItemOut] = Field(description="Plans assigned to the node, newest first.")
    next: int | None = Field(
        description="The cursor of the next page (pass it as ``before_seq``); null on the last page."
    )


class RunOut(Out):
    """One run of vLLM on the node."""

    run_id: str = Field(description="The agent's run id (``plan:<id>`` for agents that sent none).")
    plan_id: str | None = Field(description="The plan it ran.")
    started_at: str | None = Field(description="When it started (ISO 8601).")
    running_at: str | None = Field(description="When vLLM reported ready.")
    ended_at: str | None = Field(description="When it ended; null while it runs.")
    end: str | None = Field(description="stopped, exited or interrupted (the node's next start); null while it runs.")
    exit_status: Any = Field(description="vLLM's exit status, as the agent reported it.")
    signal: Any = Field(description="The signal it was stopped with, as the agent reported it.")
    vllm: Any = Field(description="What vLLM printed at start-up, as the agent reported it.")
    tail: Any = Field(description="The last lines vLLM printed, as the agent reported them.")
    offline_boot: Any = Field(description="Whether the agent started it from its saved plan, service unreachable.")
    seq: int | None = Field(description="The node's seq of the plan.")
    argv: list[str] | None = Field(description="What the node ran.")
    group: int | None = Field(description="The node's group in the plan.")
    rank: int | None = Field(description="Its rank in the group.")
    role: str | None = Field(description="replica, head or worker.")
    group_status: str | None = Field(description="The state of its multi-node group (null: a replica).")
    manifest: ManifestRefOut | None = Field(description="What the plan loads.")
    last_heartbeat_at: str | None = Field(description="The last heartbeat of a run still open.")


class RunsOut(Out):
    node: str = Field(description="Node name.")
    since: str | None = Field(description="The window's start (ISO 8601).")
    until: str | None = Field(description="The window's end.")
    items: list[RunOut] = Field(description="Runs overlapping the window, oldest first.")
