"""The tuning loop: the agents' metric windows, the loop's state for a node, and applying its next plan."""

from fastapi import APIRouter, Request

from ...db.session import after_commit
from ...services import tuning as tuning_service
from ..deps import ContextDep, Deployer, NodeAgent, NodeName, Reader, Route, SessionDep
from ..schemas import MetricsWindowIn, TuningPlanOut, TuningStatusOut, WindowRecordedOut

router = APIRouter(route_class=Route)


@router.post(
    "/v1/nodes/{name}/metrics",
    status_code=201,
    operation_id="postNodeMetrics",
    tags=["tuning"],
    response_model=WindowRecordedOut,
)
def post_node_metrics(
    request: Request, name: NodeName, body: MetricsWindowIn, session: SessionDep, p: NodeAgent, ctx: ContextDep
):
    """One window of vLLM's live metrics from the node's agent (its own node only): gauges at the window's end,
    counter deltas over it, P99s from histogram bucket deltas. ``plan`` must be the node's current plan or one of its
    recent ones. Stored compactly, a bounded number per node. When the node's current plan has
    ``tuning.auto_apply`` (benchmark only) and the windows decide a next plan, the service applies it."""
    recorded = tuning_service.record_window(session, node=name, window=body, clock=ctx.clock)
    out = recorded.as_dict()
    if recorded.auto_apply:
        applied = tuning_service.auto_apply(session, ctx, node=name, plan_id=body.plan)
        if applied is not None:
            out["applied"] = applied
            after_commit(session, request.app.state.plan_cache.clear)
    return out


@router.get("/v1/nodes/{name}/tuning", operation_id="getNodeTuning", tags=["tuning"], response_model=TuningStatusOut)
def get_node_tuning(request: Request, name: NodeName, session: SessionDep, p: Reader):
    """The tuning loop for the node's current plan (docs/operating.md §9): ``state`` (exploring, knee_found,
    settled, backing_off, stuck — a level that still preempts at the floor, or no steps left: needs a person),
    ``action``, ``current`` and ``next`` engine args (``next`` null: keep the current plan),
    ``reasons`` and ``evidence`` (the windows the decision was made from). Nothing is written."""
    settings = request.app.state.settings
    return tuning_service.status(session, name, settings.tuning_settings, policy=settings.policy)


@router.post(
    "/v1/nodes/{name}/tuning/apply",
    status_code=201,
    operation_id="applyNodeTuning",
    tags=["tuning"],
    response_model=TuningPlanOut,
)
def apply_node_tuning(request: Request, name: NodeName, session: SessionDep, p: Deployer, ctx: ContextDep):
    """Create the loop's next plan for the node (the current plan's content with the proposed max_num_seqs and
    gpu_memory_utilization, on all its nodes): validated, signed, audited (``plan.created`` and ``tuning.applied``
    with the reasons and window ids), superseding the current plan. 409 when the loop proposes nothing now."""
    out = tuning_service.apply(session, ctx, actor=p.name, node=name)
    after_commit(session, request.app.state.plan_cache.clear)
    return out.as_dict()
