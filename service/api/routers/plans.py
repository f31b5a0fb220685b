"""Launch validation and plans: validate inline, upgrade impact, create (or dry-run), list, read, revoke, reissue."""

from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import JSONResponse

from ... import metrics
from ...db.session import after_commit
from ...domain.errors import DomainError
from ...domain.posted_argv import add_notes, request_with_argv
from ...domain.validate import validate
from ...services import fleet, idempotency
from ...services import plans as plan_service
from ...services import rollouts as rollout_service
from ...services import upgrade as upgrade_service
from ..deps import ContextDep, Deployer, Reader, Route, SessionDep, TimeQuery, parse_time, replayable
from ..schemas import (
    DryRunOut,
    JudgementOut,
    PlanCreatedOut,
    PlanIn,
    PlanListOut,
    PlanOut,
    UpgradeImpactOut,
    ValidateIn,
)

router = APIRouter(route_class=Route)


@router.post("/v1/validate", operation_id="validateLaunch", tags=["plans"], response_model=JudgementOut)
def validate_launch(request: Request, body: ValidateIn, p: Reader):
    """Judge a launch given inline (config.json object, hardware, engine args or an argv, workload): the verdict,
    findings with remedies, the budget, recommendations and the argv. Stores nothing (see createPlan ``dry_run`` to
    judge by manifest and node names). Judged under the service's policy profile (``policy`` names it)."""
    if body.model.path is not None:
        raise DomainError("model.path", "model.path is for the CLI; send config (the config.json object)")
    launch, read = request_with_argv(body, body.argv) if body.argv is not None else (body, None)
    result = validate(launch, policy=request.app.state.settings.policy)
    add_notes(result, read)
    out = result.as_dict()
    metrics.observe_result("validate", out["verdict"], out["findings"])
    return out


@router.get("/v1/upgrade-impact", operation_id="upgradeImpact", tags=["plans"], response_model=UpgradeImpactOut)
def upgrade_impact(
    request: Request, session: SessionDep, p: Reader, vllm_version: Annotated[str, Query(min_length=1, max_length=32)]
):
    """Every active plan and every manifest's newest plan re-validated against ``vllm_version``: what would
    break on upgrade (or downgrade), with findings and remedies. Breaking plans first."""
    return upgrade_service.upgrade_impact(session, vllm_version, policy=request.app.state.settings.policy)


@router.post(
    "/v1/plans",
    status_code=201,
    operation_id="createPlan",
    tags=["plans"],
    response_model=PlanCreatedOut,
    responses={
        200: {"description": "dry run: the verdict, findings, budget and argv; nothing stored", "model": DryRunOut}
    },
)
def create_plan(
    request: Request,
    response: Response,
    body: PlanIn,
    p: Deployer,
    ctx: ContextDep,
    idempotency_key: Annotated[str | None, Header(max_length=256)] = None,
    dry_run: Annotated[
        bool, Query(description="validate and render only: no plan, no seq, no audit event (200, or 422 when rejected)")
    ] = False,
):
    """Validate a launch for a registered manifest on registered nodes, sign one plan per node and make it each
    node's current plan (the previous one is superseded). 422 with findings and remedies when vLLM would refuse
    it; nothing is stored then. With ``dry_run=true`` nothing is ever stored."""
    state = request.app.state
    if dry_run:  # the 200 (not the route's 201 model): validated against its own model here
        with state.db.read() as session:
            dry = DryRunOut.model_validate(fleet.dry_run(session, body, policy=state.settings.policy))
        return JSONResponse(dry.model_dump(mode="json", by_alias=True, exclude_unset=True))
    status, out, replayed = idempotency.run(
        state.db,
        route="POST /v1/plans",
        principal=p.name,
        key=idempotency_key,
        request=body,
        status_code=201,
        action=lambda s: _created(s, plan_service.create(s, ctx, actor=p.name, plan=body)),
    )
    state.plan_cache.clear()
    return replayable(response, status, out, replayed)


def _created(session, signed: plan_service.Signed) -> dict:
    """A plan for nodes an unfinished rollout holds is signed, with a ``rollout_in_progress`` warning naming it."""
    out = plan_service.created_dict(signed)
    warnings = rollout_service.plan_warnings(session, [a.node_name for a in signed.assignments])
    return {**out, "warnings": warnings} if warnings else out


@router.get("/v1/plans", operation_id="listPlans", tags=["plans"], response_model=PlanListOut)
def list_plans(
    request: Request,
    session: SessionDep,
    p: Reader,
    node: Annotated[str | None, Query(max_length=128)] = None,
    model: Annotated[str | None, Query(max_length=256)] = None,
    status: Annotated[Literal["active", "superseded", "revoked"] | None, Query()] = None,
    since: TimeQuery = None,
    until: TimeQuery = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    after: Annotated[str | None, Query(max_length=36, description="the previous page's next")] = None,
):
    """Plans, newest first, filtered by node (assigned to it), model (manifest name), status and creation time
    (``since`` inclusive, ``until`` exclusive); ``next`` is the cursor (pass it as ``after``). Env values are
    redacted and the JWS left out for auditors."""
    """Rollouts, newest first (state, waves, failures; no per-node detail); ``next`` is the cursor."""
    lo, hi = parse_time("since", since), parse_time("until", until)
    if lo and hi and hi < lo:
        raise DomainError("until", "until is before since")
    return fleet.list_plans(
        session,
        node=node,
        model=model,
        status=status,
        since=lo,
        until=hi,
        limit=limit,
        after=after,
        secrets=p.role in ("admin", "deployer"),
    )


@router.get("/v1/plans/{plan_id}", operation_id="getPlan", tags=["plans"], response_model=PlanOut)
def get_plan(plan_id: str, session: SessionDep, p: Reader):
    """One plan with its findings, budget, argv and command, and its assignments (node, seq, status, last
    report). Env values and the signed JWS only for admins and deployers."""
    plan, assignments = plan_service.get(session, plan_id)
    # env values may be secrets: only admins and deployers see them (and the signed JWS, which carries them)
    return plan_service.plan_dict(plan, assignments, secrets=p.role in ("admin", "deployer"))


@router.post("/v1/plans/{plan_id}/revoke", operation_id="revokePlan", tags=["plans"], response_model=PlanOut)
def revoke_plan(request: Request, plan_id: str, session: SessionDep, p: Deployer, ctx: ContextDep):
    """Withdraw a plan: its nodes' next heartbeat answer says it is no longer current and the agents stop it."""
    out = plan_service.plan_dict(plan_service.revoke(session, actor=p.name, plan_id=plan_id, clock=ctx.clock))
    after_commit(session, request.app.state.plan_cache.clear)
    return out


@router.post(
    "/v1/plans/{plan_id}/reissue",
    status_code=201,
    operation_id="reissuePlan",
    tags=["plans"],
    response_model=PlanCreatedOut,
)
def reissue_plan(request: Request, plan_id: str, session: SessionDep, p: Deployer, ctx: ContextDep):
    """Rollback: re-validate an earlier plan's content and issue it as a new plan with a new seq per node
    (an old JWS is never re-served)."""
    out = plan_service.created_dict(plan_service.reissue(session, ctx, actor=p.name, plan_id=plan_id))
    after_commit(session, request.app.state.plan_cache.clear)
    return out
