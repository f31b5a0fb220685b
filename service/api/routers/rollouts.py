"""Staged rollouts: create, list, read, and the operators' pause / resume / promote / abort. The steps
themselves are made by the scheduler (services/rollouts/), not by these routes."""

from typing import Annotated, Literal

from fastapi import APIRouter, Header, Path, Query, Request, Response

from ...db.session import after_commit
from ...services import idempotency
from ...services import rollouts as rollout_service
from ..deps import ContextDep, Deployer, Reader, Route, SessionDep, replayable
from ..schemas import RolloutCommandIn, RolloutCreatedOut, RolloutIn, RolloutListOut, RolloutOut

router = APIRouter(route_class=Route)
RolloutId = Annotated[str, Path(min_length=1, max_length=36, description="Rollout id.")]
STATES = Literal[
    "pending",
    "waiting",
    "baking",
    "paused",
    "halted",
    "rolling_back",
    "aborting",
    "completed",
    "rolled_back",
    "aborted",
]


@router.post(
    "/v1/rollouts", status_code=201, operation_id="createRollout", tags=["rollouts"], response_model=RolloutCreatedOut
)
def create_rollout(
    request: Request,
    response: Response,
    body: RolloutIn,
    p: Deployer,
    ctx: ContextDep,
    idempotency_key: Annotated[str | None, Header(max_length=256)] = None,
):
    """Change a target launch config over nodes (names, or a selector over inventory fields) in waves that advance
    by themselves: each wave's plans are signed, its nodes must report ``running`` within ``gates.ready_timeout_s``
    with the KV cache tokens within ``gates.kv_tolerance`` of the prediction, then it bakes ``bake_s`` seconds. More
    failed units than ``failure_limit`` halt the rollout and restore every node it changed to its previous plan's
    content (a new plan, a higher seq). The target is validated once per hardware shape first: a rejection is the
    plan's 422 with findings, and nothing is stored. ``Idempotency-Key`` makes a retry safe."""
    status, out, replayed = idempotency.run(
        request.app.state.db,
        route="POST /v1/rollouts",
        principal=p.name,
        key=idempotency_key,
        request=body,
        status_code=201,
        action=lambda s: _created(s, *rollout_service.create(s, ctx, actor=p.name, rollout=body)),
    )
    return replayable(response, status, out, replayed)


def _created(session, r, warnings: list[dict]) -> dict:
    out = rollout_service.rollout_dict(session, r)
    return {**out, "warnings": warnings} if warnings else out


@router.get("/v1/rollouts", operation_id="listRollouts", tags=["rollouts"], response_model=RolloutListOut)
def list_rollouts(
    session: SessionDep,
    p: Reader,
    state: Annotated[STATES | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    after: Annotated[str | None, Query(max_length=36, description="the previous page's next")] = None,
):
    """Rollouts, newest first (state, waves, failures; no per-node detail); ``next`` is the cursor."""
    return rollout_service.list_rollouts(
        session, state=state, limit=limit, after=after, secrets=p.role in ("admin", "deployer")
    )


@router.get("/v1/rollouts/{rollout_id}", operation_id="getRollout", tags=["rollouts"], response_model=RolloutOut)
def get_rollout(rollout_id: RolloutId, session: SessionDep, p: Reader):
    """One rollout: state, waves (share, bake, state, plans signed), per node its unit, wave, outcome, the plans
    before, of and after the rollout, and the evidence for each decision."""
    return rollout_service.rollout_dict(
        session, rollout_service.get(session, rollout_id), secrets=p.role in ("admin", "deployer")
    )


def _command(verb: str, doc: str):
    def run(
        request: Request,
        rollout_id: RolloutId,
        session: SessionDep,
        p: Deployer,
        ctx: ContextDep,
        body: RolloutCommandIn | None = None,
    ):
        r = rollout_service.command(session, ctx, rollout_id, verb, actor=p.name, reason=body.reason if body else None)
        after_commit(session, request.app.state.plan_cache.clear)
        return rollout_service.rollout_dict(session, r)

    run.__name__ = f"{verb}_rollout"
    router.post(
        f"/v1/rollouts/{{rollout_id}}/{verb}",
        operation_id=f"{verb}Rollout",
        tags=["rollouts"],
        description=doc,
        response_model=RolloutOut,
    )(run)


for _verb, _doc in (
    ("pause", "Stop advancing (failures past the limit still halt and restore)."),
    ("resume", "Continue a paused rollout (a paused bake starts over)."),
    ("promote", "Skip the current wave's bake: the next wave starts once this one is settled."),
    ("abort", "Stop for good and restore every node the rollout changed to its previous plan."),
):
    _command(_verb, _doc)
