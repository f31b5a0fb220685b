"""One plan or one rollout by its id. A plan: the ``vllm serve`` command, findings with remedies, recommendations,
the per-GPU memory bar, its nodes and their reports, the tuning loop's charts. A rollout: its waves and units,
and for auditors the steps and their reasons as the audit holds them."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from ...db.models import AuditEvent, Manifest, Report, iso
from ...db.session import Database
from ...services import fleet, history
from ...services import plans as plan_service
from ...services import rollouts as rollout_service
from ...services import tuning as tuning_service
from ...services.tokens import Principal
from .auth import AUDITORS, SECRETS, Reader
from .present import memory_bar, tuning_charts
from .render import PageError, PageRoute, page
from .state import UiState

ROLLOUT_EVENTS = 200  # the newest audit events shown on a rollout's page
ID_LENGTH = 36  # a uuid: a longer id is a 404 before any read

router = APIRouter(route_class=PageRoute)


def known_id(what: str, key: str) -> str:
    if len(key) > ID_LENGTH:
        raise PageError(404, f"no such {what}", f"{what}_id")
    return key


def plan_data(db: Database, plan_id: str, p: Principal) -> dict[str, Any]:
    with db.read() as s:
        plan, assignments = plan_service.get(s, plan_id)
        manifest = s.get(Manifest, plan.manifest_id)
        out = plan_service.plan_dict(plan, assignments, secrets=p.role in SECRETS)
        placements = history.plan_placements(s, plan_id)["placements"]
        states = fleet.node_states(s, [a.node_name for a in assignments])
        reports = [
            {"node": r.node_name, "status": r.status, "message": r.message, "at": iso(r.created_at)}
            for r in s.execute(
                select(Report).where(Report.plan_id == plan_id).order_by(Report.id.desc()).limit(50)
            ).scalars()
        ]
        tuning = {
            a.node_name: tuning_charts(w) for a in assignments[:8] if (w := tuning_service.trajectory(s, a.node_name))
        }
    return {
        "plan": out,
        "manifest": manifest,
        "placements": placements,
        "states": states,
        "reports": reports,
        "recommendations": plan.recommendations,
        "bar": memory_bar(plan.budget),
        "tuning": tuning,
    }


def rollout_data(db: Database, rollout_id: str, p: Principal) -> dict[str, Any]:
    with db.read() as s:
        r = rollout_service.rollout_dict(s, rollout_service.get(s, rollout_id), secrets=p.role in SECRETS)
        events = (
            []
            if p.role not in AUDITORS
            else [  # the steps and their reasons, as the audit holds them
                {
                    "id": e.id,
                    "at": iso(e.ts),
                    "kind": e.kind,
                    "actor": e.actor,
                    "node": e.node,
                    "plan_id": e.plan_id,
                    "payload": e.payload,
                }
                for e in s.execute(
                    select(AuditEvent)
                    .where(AuditEvent.subject == f"rollout:{rollout_id}")
                    .order_by(AuditEvent.id.desc())
                    .limit(ROLLOUT_EVENTS)
                ).scalars()
            ]
        )
    return {"r": r, "events": events}


@router.get("/ui/plans/{plan_id}")
async def plan_page(request: Request, plan_id: str, viewer: Reader, state: UiState):
    data = await run_in_threadpool(plan_data, state.db, known_id("plan", plan_id), viewer.principal)
    return page(request, "plan.html", **data, **viewer.context)


@router.get("/ui/rollouts/{rollout_id}")
async def rollout_page(request: Request, rollout_id: str, viewer: Reader, state: UiState):
    data = await run_in_threadpool(rollout_data, state.db, known_id("rollout", rollout_id), viewer.principal)
    return page(request, "rollout.html", **data, **viewer.context)
