"""The audit trail: node and plan history, the event log (list, export, verify), signed checkpoints and the KV
calibration summary."""

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy import select

from ... import audit
from ...db.models import AuditEvent
from ...domain.errors import DomainError
from ...errors import Busy, Conflict, NotFound
from ...services import audit_export, calibration, history
from ..deps import Auditor, NodeName, Reader, ReaderOrAgent, Route, SessionDep, TimeQuery, parse_time
from ..schemas import AuditListOut, CalibrationOut, CheckpointOut, HistoryOut, PlacementsOut, RunsOut, VerifyOut

router = APIRouter(route_class=Route)


@router.get("/v1/nodes/{name}/history", operation_id="nodeHistory", tags=["audit"], response_model=HistoryOut)
def node_history(
    name: NodeName,
    session: SessionDep,
    p: Reader,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    before_seq: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
):
    """Plans assigned to the node, newest first: who approved them, what ran, when it was fetched, started,
    running or failed."""
    return history.node_history(session, name, limit=limit, before_seq=before_seq)


@router.get("/v1/nodes/{name}/runs", operation_id="nodeRuns", tags=["audit"], response_model=RunsOut)
def node_runs(
    name: NodeName,
    session: SessionDep,
    p: Reader,
    since: TimeQuery = None,
    until: TimeQuery = None,
    at: TimeQuery = None,
):
    """Which plan ran on the node in ``[since, until)`` (or at the instant ``at``): one item per run of vLLM
    with its plan, seq, manifest and argv, start, running and end times, how it ended (``stopped``,
    ``exited`` with its status, ``interrupted`` by the node's next start, or null: still running, with the last
    heartbeat)."""
    if at is not None and (since is not None or until is not None):
        raise DomainError("at", "give either at or since/until")
    t = parse_time("at", at)
    lo, hi = (t, t + dt.timedelta(microseconds=1)) if t else (parse_time("since", since), parse_time("until", until))
    if lo and hi and hi < lo:
        raise DomainError("until", "until is before since")
    return history.node_runs(session, name, since=lo, until=hi)


@router.get(
    "/v1/plans/{plan_id}/placements", operation_id="planPlacements", tags=["audit"], response_model=PlacementsOut
)
def plan_placements(plan_id: str, session: SessionDep, p: Reader):
    """Where one plan went: per node, when it was assigned, fetched, started, running, stopped or exited."""
    return history.plan_placements(session, plan_id)


def audit_query(node, plan, model, kind, since, until, subject=None):
    since, until = parse_time("since", since), parse_time("until", until)
    q = select(AuditEvent).order_by(AuditEvent.id)
    for col, value in (
        (AuditEvent.node, node),
        (AuditEvent.plan_id, plan),
        (AuditEvent.model, model),
        (AuditEvent.kind, kind),
        (AuditEvent.subject, subject),
    ):
        if value:
            q = q.where(col == value)
    if since:
        q = q.where(AuditEvent.ts >= since)
    if until:
        q = q.where(AuditEvent.ts < until)
    return q


@router.get("/v1/audit", operation_id="listAudit", tags=["audit"], response_model=AuditListOut)
def list_audit(
    request: Request,
    p: Auditor,
    node: str | None = None,
    plan: str | None = None,
    model: str | None = None,
    kind: str | None = None,
    since: TimeQuery = None,
    until: TimeQuery = None,
    after: Annotated[int, Query(ge=0, le=2**62)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    subject: Annotated[
        str | None,
        Query(
            max_length=512,
            description="what an event is about, e.g. ``rollout:<id>``, ``plan:<id>``, ``manifest:<name>@<version>``",
        ),
    ] = None,
):
    """Audit events in the order they were written, filtered; ``next`` is the cursor (pass it as ``after``).
    Each event carries its chain position ``seq`` and ``hash`` (null for the moment before it is sealed)."""
    q = audit_query(node, plan, model, kind, since, until, subject).where(AuditEvent.id > after).limit(limit)
    with request.app.state.db.transaction() as session:
        rows = list(session.execute(q).scalars())
    return {"items": [audit.event_dict(e) for e in rows], "next": rows[-1].id if len(rows) == limit else None}


@router.get(
    "/v1/audit/export",
    operation_id="exportAudit",
    tags=["audit"],
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {
                "application/x-ndjson": {
                    "schema": {
                        "type": "string",
                        "description": "One audit event per line (the fields of listAudit's items).",
                    }
                },
                "text/csv": {
                    "schema": {
                        "type": "string",
                        "description": "A header line, then one audit event per line; the payload as JSON.",
                    }
                },
            }
        }
    },
)
def export_audit(
    request: Request,
    p: Auditor,
    format: Annotated[str, Query(pattern="^(jsonl|csv)$")] = "jsonl",
    node: str | None = None,
    plan: str | None = None,
    model: str | None = None,
    kind: str | None = None,
    since: TimeQuery = None,
    until: TimeQuery = None,
    subject: Annotated[
        str | None,
        Query(
            max_length=512,
            description="what an event is about, e.g. ``rollout:<id>``, ``plan:<id>``, ``manifest:<name>@<version>``",
        ),
    ] = None,
):
    """The filtered audit log as JSON Lines or CSV, streamed in chain order."""
    db = request.app.state.db
    db.sealer.flush()
    q = audit_query(node, plan, model, kind, since, until, subject)
    media = "application/x-ndjson" if format == "jsonl" else "text/csv"
    return StreamingResponse(audit_export.stream(db, q, format), media_type=media)


@router.get("/v1/audit/verify", operation_id="verifyAudit", tags=["audit"], response_model=VerifyOut)
def verify_audit(request: Request, p: Auditor):
    """Recompute the whole chain, read-only (verify never seals): every link, hash and MAC, rows not in the chain
    (``pending``; ``forged`` for rows the service did not write, ``copies`` for copies of a row), the chain's end
    against the recorded head (``cut``: events deleted after the newest checkpoint; ``head_record``: the head row
    deleted or edited), the chain against the newest signed checkpoint (stored, and the data-dir copy), and the
    tokens, plans, assignments and rollouts against the events that created them (``orphans``):
    ``{"ok", "events", "head", "pending", "checkpoint"}``, or ``ok`` false with ``first_broken``, ``forged``,
    ``copies``, ``cut``, ``head_record``, ``orphans`` or ``checkpoint.reason`` (an emptied table, swapped ids).
    Waits up to 2 s for this process's sealer to chain what was just written."""
    return verify_chain_now(request.app.state)


def verify_chain_now(state) -> dict:
    """One read-only pass over the whole chain (the API's and the operators' page's verify, ``app.state``'s
    ``verify_audit``). Raises Busy."""
    db, verifying = state.db, state.audit_verifying
    if not verifying.acquire(blocking=False):  # one whole-chain pass per process at a time: bounded work
        raise Busy("a verification of the audit chain is already running in this process; retry shortly", retry_after=5)
    try:
        db.sealer.flush()
        # what this process had sealed before the snapshot opens: all of it is in the snapshot (a seal raises
        # high_water only after it committed), while seals that commit during the read are not — reading it
        # afterwards called those "deleted"
        seen = db.sealer.high_water
        with db.read() as session:  # one snapshot, no write lock: agents and deploys go on while it reads
            found, problems = audit.known_checkpoints(session, state.keys.jwks(), [state.settings.checkpoint_file])
            out = audit.verify_chain(session, checkpoints=found)
    finally:
        verifying.release()
    # the recorded head (audit_head) reports a cut to every process; this process's memory also catches an old,
    # genuinely signed head row put back together with a tail cut to match it
    if out["ok"] and out["last_seq"] < seen:
        out["ok"] = False
        out["cut"] = {
            "seen_seq": seen,
            "last_seq": out["last_seq"],
            "first_missing": out["last_seq"] + 1,
            "reason": f"this service sealed the chain up to seq {seen}, it now ends "
            f"at {out['last_seq']}: events were deleted",
        }
    if problems:
        out["warnings"] = problems
    out.pop("last_seq", None)
    return out


def checkpoint_body(keys, row) -> dict:
    from ...agent.verify import VerificationError, verify_jws

    try:
        claims, _ = verify_jws(row.signed, keys.jwks(), typ=audit.CHECKPOINT_TYPE)
    except VerificationError:  # signed with a key retired since: still served, the caller judges it
        claims = None
    return {"checkpoint": row.signed, "claims": claims}


@router.post(
    "/v1/audit/checkpoints",
    status_code=201,
    operation_id="createAuditCheckpoint",
    tags=["audit"],
    response_model=CheckpointOut,
)
def create_checkpoint(request: Request, p: Auditor):
    """A signed checkpoint of the chain now (compact JWS, typ audit-checkpoint: its length, head hash and id
    digest), stored and written to the data dir like the automatic ones: keep it, and later check any copy of
    the database against it (``preflight audit verify --checkpoint FILE``)."""
    db, keys = request.app.state.db, request.app.state.keys
    db.sealer.flush()
    try:
        with db.transaction() as session:
            audit.chain_lock(session, wait=True)
            row = db.sealer.checkpointer.make(session) or db.sealer.checkpointer.newest_row(session)
            if row is None:
                raise Conflict("the audit chain is empty: nothing to checkpoint")
            body = checkpoint_body(keys, row)
    except ValueError as exc:
        raise Conflict(str(exc)) from None
    db.sealer.checkpointer.publish(row)
    return body


@router.get(
    "/v1/audit/checkpoints/latest", operation_id="latestAuditCheckpoint", tags=["audit"], response_model=CheckpointOut
)
def latest_checkpoint(request: Request, p: ReaderOrAgent, session: SessionDep):
    """The newest signed checkpoint (any token but an enroller's: agents and auditors keep copies, so that a later cut of the
    chain shows against them)."""
    row = request.app.state.db.sealer.checkpointer.newest_row(session)
    if row is None:
        raise NotFound("no audit checkpoint yet", field="checkpoint")
    return checkpoint_body(request.app.state.keys, row)


@router.get("/v1/calibration", operation_id="calibration", tags=["audit"], response_model=CalibrationOut)
def calibration_summary(
    session: SessionDep,
    p: Reader,
    model: str | None = None,
    gpu: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
):
    """Predicted vs printed KV cache tokens over the fleet (agents send vLLM's start-up figures)."""
    return calibration.summary(session, model=model, gpu=gpu, limit=limit)
