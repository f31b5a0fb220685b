"""The fleet page: one row per node (or per multi-node group) — hardware, agent last seen, desired vs running plan,
drift, status, model, predicted vs measured KV tokens — filtered by status and model, and the newest staged
rollouts."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from ...db.models import Node
from ...db.session import Database
from ...services import fleet
from ...services import nodes as node_service
from ...services import rollouts as rollout_service
from .auth import Reader
from .render import PageError, PageRoute, bounded, page
from .state import UiState

ROLLOUTS_SHOWN = 10  # the newest staged rollouts listed on the fleet page
MAX_NODES = 10_000  # the fleet page reads the inventory in pages of 500 up to this many

router = APIRouter(route_class=PageRoute)


def fleet_rows(db: Database) -> list[dict[str, Any]]:
    with db.read() as s:
        nodes: list[Node] = []
        after: str | None = None
        while len(nodes) < MAX_NODES:
            page_ = node_service.list_nodes(s, limit=500, after=after)
            nodes += page_
            if len(page_) < 500:
                break
            after = page_[-1].name
        states = fleet.node_states(s, [n.name for n in nodes])
    return [{**fleet.node_view(n, states[n.name]), "address": getattr(n, "address", None)} for n in nodes]


def rollout_rows(db: Database) -> list[dict[str, Any]]:
    """The newest staged rollouts."""
    with db.read() as s:
        return rollout_service.list_rollouts(s, state=None, limit=ROLLOUTS_SHOWN, after=None, secrets=False)["items"]


@router.get("/ui/")
async def fleet_page(request: Request, viewer: Reader, state: UiState):
    q = request.query_params
    status = bounded("status", q.get("status"), 16)
    model = bounded("model", q.get("model"))
    if status and status not in fleet.NODE_STATUSES:
        raise PageError(422, f"status: one of {', '.join(fleet.NODE_STATUSES)}", "status")
    nodes = await run_in_threadpool(fleet_rows, state.db)
    rows = fleet.group_rows(nodes)  # one row per node, or per multi-node group
    rollouts = await run_in_threadpool(rollout_rows, state.db)
    models = sorted({r["plan"]["model"] for r in rows if r["plan"]})
    counts = {st: sum(1 for r in nodes if r["status"] == st) for st in fleet.NODE_STATUSES}  # nodes, not rows
    shown = [
        r
        for r in rows
        if (not status or r["status"] == status) and (not model or (r["plan"] and r["plan"]["model"] == model))
    ]
    return page(
        request,
        "fleet.html",
        rows=shown,
        total=len(nodes),
        models=models,
        statuses=fleet.NODE_STATUSES,
        counts=counts,
        drifted=sum(1 for r in nodes if r["drift"]),
        status=status or "",
        model=model or "",
        rollouts=rollouts,
        **viewer.context,
    )
