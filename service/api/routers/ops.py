"""Health, readiness and metrics (no token)."""

from fastapi import APIRouter, Request, Response
from sqlalchemy import text

from ... import metrics
from ...errors import Unavailable
from ..deps import Route
from ..schemas import HealthOut, ReadyOut

router = APIRouter(route_class=Route)


@router.get("/healthz", operation_id="healthz", tags=["ops"], response_model=HealthOut)
def healthz():
    """The process is up (no database check: see /readyz)."""
    return {"status": "ok"}


@router.get("/readyz", operation_id="readyz", tags=["ops"], response_model=ReadyOut)
def readyz(request: Request):
    """Ready when the database answers and a signing key is loaded (else 503 problem+json)."""
    state = request.app.state
    with state.db.sessions() as s:
        s.execute(text("SELECT 1"))
    if not state.keys.active_kid:
        raise Unavailable("no signing key loaded")
    return {"status": "ready", "database": "ok", "signing_key": state.keys.active_kid}


@router.get(
    "/metrics",
    operation_id="metrics",
    tags=["ops"],
    response_class=Response,
    responses={
        200: {
            "content": {
                "text/plain": {"schema": {"type": "string", "description": "The Prometheus text exposition format."}}
            }
        }
    },
)
def metrics_endpoint():
    """Prometheus metrics: requests and latency per route, verdicts, findings by rule, agent fetches and
    reports, audit appends."""
    body, ctype = metrics.exposition()
    return Response(body, media_type=ctype)
