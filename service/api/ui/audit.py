"""The audit page: the timeline, newest first, filtered by node, model, kind and time, a page of ``AUDIT_PAGE``
events at a time; the chain's verify status on request and the newest checkpoint. Admin and auditor only."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from ...db.models import AuditEvent, iso
from ...db.session import Database
from ...domain.errors import DomainError
from ...errors import Busy
from ..deps import parse_time
from .auth import Auditor
from .render import PageError, PageRoute, bounded, page
from .state import UiState

AUDIT_PAGE = 100
KNOWN_KINDS = (
    "node.registered",
    "node.updated",
    "manifest.registered",
    "manifest.superseded",
    "plan.created",
    "plan.superseded",
    "plan.revoked",
    "plan.reissued",
    "plan.weights_check_skipped",
    "plan.fetched",
    "agent.fetched",
    "agent.started",
    "agent.running",
    "agent.stopped",
    "agent.exited",
    "agent.failed",
    "agent.refused",
    "agent.reset",
    "token.created",
    "token.revoked",
    "token.rotated",
)
FILTERS = ("node", "model", "kind", "since", "until")

router = APIRouter(route_class=PageRoute)


@dataclass(frozen=True)
class AuditFilters:
    """The page's filters as typed (the text as given, to show again in the form, and the times parsed)."""

    shown: dict[str, str]
    since: dt.datetime | None
    until: dt.datetime | None
    before: int | None
    verify: bool


def page_time(field: str, value: str | None) -> dt.datetime | None:
    """deps.parse_time on a form's field: surrounding spaces forgiven, and the error says how a time is written."""
    try:
        return parse_time(field, value.strip() if value else None)
    except DomainError as exc:
        raise PageError(422, f"{exc.message} (e.g. 2026-12-01T10:00:00Z)", field) from None


def audit_filters(q) -> AuditFilters:
    """The query's filters, each bounded; a bad one is a 422 naming it."""
    text = {
        "node": bounded("node", q.get("node"), 128),
        "model": bounded("model", q.get("model")),
        "kind": bounded("kind", q.get("kind"), 48),
        "since": bounded("since", q.get("since"), 40),
        "until": bounded("until", q.get("until"), 40),
    }
    since, until = page_time("since", text["since"]), page_time("until", text["until"])
    if since and until and until < since:
        raise PageError(422, "until: before since", "until")
    before = q.get("before")
    if before is not None and not (before.isdigit() and len(before) < 19):
        raise PageError(422, "before: an event id", "before")
    return AuditFilters(
        {k: text[k] or "" for k in FILTERS}, since, until, int(before) if before else None, q.get("verify") == "1"
    )


def verification(verify_audit: Callable[[], Any]) -> Any:
    try:
        return verify_audit()
    except Busy as exc:
        return {"busy": exc.detail}


def audit_data(db: Database, f: AuditFilters, verify_audit: Callable[[], Any]) -> dict[str, Any]:
    q = select(AuditEvent).order_by(AuditEvent.id.desc()).limit(AUDIT_PAGE)
    for col, key in ((AuditEvent.node, "node"), (AuditEvent.model, "model"), (AuditEvent.kind, "kind")):
        if f.shown[key]:
            q = q.where(col == f.shown[key])
    if f.since:
        q = q.where(AuditEvent.ts >= f.since)
    if f.until:
        q = q.where(AuditEvent.ts < f.until)
    if f.before:
        q = q.where(AuditEvent.id < f.before)
    verified = verification(verify_audit) if f.verify else None
    checkpointer = db.sealer.checkpointer
    assert checkpointer is not None  # create_app gives its database one
    with db.read() as s:
        events = list(s.execute(q).scalars())
        cp = checkpointer.newest_row(s)
        checkpoint = (
            {
                "last_seq": cp.last_seq,
                "events": cp.events,
                "head": cp.head,
                "kid": cp.kid,
                "created_at": iso(cp.created_at),
            }
            if cp is not None
            else None
        )
    items = [
        {
            "id": e.id,
            "ts": iso(e.ts),
            "kind": e.kind,
            "actor": e.actor,
            "node": e.node,
            "model": e.model,
            "plan_id": e.plan_id,
            "subject": e.subject,
            "seq": e.chain_seq,
            "payload": e.payload,
        }
        for e in events
    ]
    return {
        "events": items,
        "checkpoint": checkpoint,
        "verified": verified,
        "older": events[-1].id if len(events) == AUDIT_PAGE else None,
    }


@router.get("/ui/audit")
async def audit_page(request: Request, viewer: Auditor, state: UiState):
    f = audit_filters(request.query_params)
    data = await run_in_threadpool(audit_data, state.db, f, request.app.state.verify_audit)
    older = data.pop("older")
    older_href = (
        "/ui/audit?" + urlencode({**{k: v for k, v in f.shown.items() if v}, "before": older}) if older else None
    )
    return page(
        request, "audit.html", filters=f.shown, kinds=KNOWN_KINDS, older_href=older_href, **data, **viewer.context
    )
