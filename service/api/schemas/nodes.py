"""GPU nodes and their state."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .base import Out


class NodeOut(Out):
    name: str = Field(description="Node name.")
    gpu: dict[str, Any] = Field(description="The GPU model as the catalogue (or the inline description) gives it.")
    gpu_count: int = Field(description="GPUs in the node.")
    interconnect: str | None = Field(description="nvlink or pcie between the node's GPUs; null: unknown.")
    address: str | None = Field(description="Where the other nodes of a multi-node instance reach it.")
    labels: dict[str, str] = Field(description="Free-form labels.")
    created_at: str | None = Field(description="When it was registered (ISO 8601).")
    gpus: list[dict[str, Any]] | None = Field(
        default=None, description=("Each GPU as nvidia-smi read it (present when the node's facts listed them).")
    )


class NodeRegisteredOut(NodeOut):
    agent_token: str = Field(description="The node's agent token: shown once.")


class NodeFactsOut(NodeOut):
    agent_token: str | None = Field(
        default=None,
        description=("The node's new agent token, shown once: present when the node was created or its token rotated."),
    )


class NodeTokenOut(Out):
    name: str = Field(description="Node name.")
    agent_token: str = Field(description="The node's new agent token: shown once.")


class NodePlanOut(Out):
    """The node's current plan, as the fleet view shows it."""

    id: str = Field(description="Plan id.")
    seq: int = Field(description="The node's seq of this plan.")
    status: str = Field(description="The plan's status (active, superseded, revoked).")
    verdict: str = Field(description="accept or warn.")
    model: str = Field(description="The manifest's name.")
    manifest: str = Field(description="``name@version``.")
    vllm_version: str | None = Field(description="The vLLM release it was validated for.")
    created_at: str | None = Field(description="When the plan was created (ISO 8601).")
    predicted_kv_tokens: Any = Field(description="The KV cache tokens the plan predicts (null when not computed).")
    group: int | None = Field(description="The node's group in the plan (null for plans made before topologies).")
    rank: int | None = Field(description="The node's rank in its group.")
    role: str | None = Field(description="replica, head or worker.")
    measured_kv_tokens: int | None = Field(description="The KV cache tokens vLLM printed on this node, when reported.")


class LastReportOut(Out):
    plan_id: str | None = Field(description="The plan the report was about (null: a planless report).")
    status: str = Field(description="What the agent reported.")
    message: str | None = Field(description="The agent's line for people.")
    at: str | None = Field(description="When the service received it (ISO 8601).")


class NodeViewOut(NodeOut):
    """A node with its current plan and the state its agent reported."""

    plan: NodePlanOut | None = Field(description="Its current plan (null: none).")
    last_report: LastReportOut | None = Field(description="The agent's newest report (null: none yet).")
    last_seen_at: str | None = Field(description="When the agent was last heard from (ISO 8601).")
    running_plan_id: str | None = Field(description="The plan the agent's reports say runs.")
    drift: bool = Field(description="A plan other than the current one runs.")
    status: str = Field(description="running, starting, failed, refused, stopped, stale, pending or unplanned.")


class NodeListOut(Out):
    items: list[NodeViewOut] = Field(description="Nodes by name.")
    next: str | None = Field(description="The cursor of the next page (pass it as ``after``); null on the last page.")
