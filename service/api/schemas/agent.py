"""The node agent's answers."""

from __future__ import annotations

from pydantic import Field

from .base import Out

SIGNED_PLAN = {
    "type": "string",
    "description": "The node's signed plan: a compact JWS (typ plan+jwt) the agent "
    "verifies against the keys pinned on the node.",
}


class ReportOut(Out):
    id: int | None = Field(description="The stored report's id (null for a heartbeat and a planless report).")
    plan_id: str | None = Field(description="The plan it was about.")
    node: str = Field(description="Node name.")
    status: str = Field(description="The status reported.")
    current: bool | None = Field(
        default=None,
        description=(
            "A heartbeat's answer: whether the plan is still the node's current one (false once superseded or revoked)."
        ),
    )
