"""The audit log, its verification and checkpoints, and the KV calibration."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from .base import JSON, Number, Out


class AuditEventOut(Out):
    id: int = Field(description="Event id (the cursor).")
    seq: int | None = Field(description="Its position in the chain; null until it is sealed.")
    ts: str = Field(description="When it was written (ISO 8601, UTC).")
    actor: str = Field(description="Who did it.")
    kind: str = Field(description="What happened (e.g. ``plan.created``).")
    subject: str | None = Field(description="What it is about (``plan:<id>``, ``node:<name>``, …).")
    node: str | None = Field(description="The node it is about.")
    plan_id: str | None = Field(description="The plan it is about.")
    model: str | None = Field(description="The model it is about.")
    payload: Any = Field(description="The event's details.")
    payload_digest: str = Field(description="sha256 of the canonical payload.")
    prev_hash: str | None = Field(description="The previous event's hash; null until sealed.")
    hash: str | None = Field(description="This event's hash; null until sealed.")


class AuditListOut(Out):
    items: list[AuditEventOut] = Field(description="Events in the order they were written.")
    next: int | None = Field(description="The cursor of the next page (pass it as ``after``); null on the last page.")


class VerifyOut(Out):
    """The chain recomputed: ``ok``, or what is broken."""

    model_config = ConfigDict(extra="allow")  # what service/audit.py reports beyond these is passed on as it is

    ok: bool = Field(description="Every link, hash, MAC and checkpoint holds.")
    events: int = Field(description="Events in the chain (up to the first broken one).")
    head: str | None = Field(default=None, description="The chain's last hash (an unbroken chain).")
    ids_digest: str | None = Field(default=None, description="Digest of the event ids in chain order.")
    macs: str | None = Field(default=None, description="checked or unchecked (no keys to check them with).")
    pending: int | None = Field(default=None, description="Events written but not sealed yet.")
    forged: list[Any] | None = Field(default=None, description="Ids of rows the service did not write.")
    first_broken: JSON | None = Field(
        default=None, description="The first event that breaks the chain: id, seq, kind, reason."
    )
    checkpoint: JSON | None = Field(
        default=None,
        description="The newest checkpoint the chain was checked against, "
        "or the one it no longer matches (with ``reason``).",
    )
    compared: list[JSON] | None = Field(default=None, description="Every checkpoint copy compared.")
    copies: list[Any] | None = Field(
        default=None, description="Ids of unsealed copies of another row (the same nonce): never sealed."
    )
    cut: JSON | None = Field(
        default=None,
        description="A cut tail: the chain ends (``last_seq``) below the recorded head (``head_seq``); "
        "``first_missing`` is the first seq deleted.",
    )
    head_record: JSON | None = Field(
        default=None,
        description="The recorded head (audit_head) is missing, edited (its MAC), unsigned when it must be "
        "signed, or below the chain's end: ``reason``.",
    )
    orphans: list[JSON] | None = Field(
        default=None,
        description="Token, plan, assignment and rollout rows without the event that created them: "
        "``{table, id, missing}``.",
    )
    warnings: list[Any] | None = Field(default=None, description="Checkpoint copies that could not be read.")


class CheckpointOut(Out):
    checkpoint: str = Field(description="The signed checkpoint (compact JWS, typ audit-checkpoint).")
    claims: JSON | None = Field(description="Its claims, when its key still verifies it (null: a retired key).")


class CalibrationItemOut(Out):
    plan_id: str = Field(description="Plan id.")
    node: str = Field(description="Node name.")
    gpu: str = Field(description="The node's GPU (catalogue id).")
    model: str = Field(description="The manifest's name.")
    predicted_kv_tokens: int = Field(description="KV cache tokens the plan predicted.")
    actual_kv_tokens: int = Field(description="KV cache tokens vLLM printed.")
    relative_error: Number = Field(description="predicted ÷ actual − 1.")
    at: str | None = Field(description="When it was reported (ISO 8601).")


class CalibrationOut(Out):
    count: int = Field(description="Comparisons.")
    median_abs_error: Number | None = Field(description="Median |relative error| (null: none).")
    p90_abs_error: Number | None = Field(description="90th percentile |relative error|.")
    within_5pct: Number | None = Field(description="Share within ±5 %.")
    within_10pct: Number | None = Field(description="Share within ±10 %.")
    items: list[CalibrationItemOut] = Field(description="The newest comparisons.")
