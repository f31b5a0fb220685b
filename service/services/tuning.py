"""The tuning loop's storage and decisions: metric windows from the agents, the node's tuning status
(domain/tuning.py decides; this module reads the plan and its windows and validates the proposal), and applying
the next plan through the same path ``POST /v1/plans`` uses (validated, signed, audited, superseding)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, desc, insert, select
from sqlalchemy.orm import Session

from .. import audit
from ..api.schemas import MetricsWindowIn, PlanIn, TuningIn
from ..clock import Clock, utc
from ..db.models import Assignment, MetricWindow, Plan, iso, table_of
from ..domain import tuning as dt_
from ..domain.engine_args import parse_engine_args
from ..domain.errors import DomainError
from ..domain.policy_profile import Profile
from ..domain.versions import resolve_version
from ..errors import ApiError, Conflict, Invalid, NotFound
from . import manifests as manifest_service
from . import nodes as node_service
from . import plans as plan_service
from .context import Context
from .plan_layout import engine_args_with

WINDOWS = table_of(MetricWindow)
RETENTION = 240  # windows kept per node (an hour at 15 s): a tuning step needs a handful of its plan's newest
PRUNE_EVERY = 16  # a node holds at most RETENTION + PRUNE_EVERY windows: cut back to RETENTION in one delete
RECENT_PLANS = 3  # a window may name the node's current plan or one of its 2 previous (in flight at a switch)
VALIDATION_TRIES = 3  # proposals tried (each halfway back) before the loop says it cannot propose one
READ_WINDOWS = 16


def window_dict(row) -> dict[str, Any]:
    return {
        "id": row.id,
        "plan": row.plan_id,
        "at": iso(row.created_at),
        "window_s": row.window_s,
        "num_requests_running": row.running,
        "num_requests_waiting": row.waiting,
        "kv_cache_usage_perc": row.kv_usage,
        "num_preemptions": row.preemptions,
        "ttft_p99_s": row.ttft_p99_s,
        "e2e_p99_s": row.e2e_p99_s,
        "generation_tokens_per_s": row.gen_tokens_per_s,
    }


@dataclass(frozen=True)
class Recorded:
    """A window stored: its id, whether its plan is the node's current one, and whether that plan's memo asks the
    service to apply the loop's next plan itself (``auto_apply``)."""

    id: int
    node: str
    plan: str
    current: bool
    auto_apply: bool

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "node": self.node, "plan": self.plan, "current": self.current}


def record_window(session: Session, *, node: str, window: MetricsWindowIn, clock: Clock) -> Recorded:
    """Store one window (one read of the node's newest assignments, one INSERT, one indexed look-up; a node that
    holds ``RETENTION + PRUNE_EVERY`` windows has those beyond ``RETENTION`` deleted). The plan must be the node's current plan or one of its
    recent ones, else NotFound (field ``plan``)."""
    rows = session.execute(
        select(Assignment.plan_id, Assignment.status, Plan.tuning, Assignment.role)
        .join(Plan, Plan.id == Assignment.plan_id)
        .where(Assignment.node_name == node)
        .order_by(desc(Assignment.seq))
        .limit(RECENT_PLANS)
    ).all()
    recent = [r[0] for r in rows]
    if window.plan not in recent:
        if not recent:
            node_service.get(session, node)  # NotFound for an unregistered node
        raise NotFound(f"plan {window.plan!r} is not the current or a recent plan of node {node!r}", field="plan")
    if next(r[3] for r in rows if r[0] == window.plan) == "worker":
        # a multi-node instance is served (and measured) by its head: a worker's windows would steer the whole
        # group's plan from a node that serves nothing
        raise Invalid(
            f"node {node!r} is a worker of plan {window.plan!r}: a multi-node instance's metrics come from its head",
            errors=[
                {"field": "plan", "rule": "metrics_from_head", "message": "post the windows from the group's head"}
            ],
        )
    new_id = session.execute(
        insert(WINDOWS).returning(WINDOWS.c.id),
        [
            {
                "node_name": node,
                "plan_id": window.plan,
                "created_at": utc(clock),
                "window_s": window.window_s,
                "running": window.num_requests_running,
                "waiting": window.num_requests_waiting,
                "kv_usage": window.kv_cache_usage_perc,
                "preemptions": window.num_preemptions,
                "ttft_p99_s": window.ttft_p99_s,
                "e2e_p99_s": window.e2e_p99_s,
                "gen_tokens_per_s": window.generation_tokens_per_s,
            }
        ],
    ).scalar_one()
    # the node's own count decides (ids are global: nodes posting in turn would never see a multiple of 16): once it
    # holds RETENTION + PRUNE_EVERY windows, the oldest are cut back to RETENTION — one indexed look-up per insert, a
    # delete every PRUNE_EVERY inserts of that node
    over = session.scalar(
        select(WINDOWS.c.id)
        .where(WINDOWS.c.node_name == node)
        .order_by(desc(WINDOWS.c.id))
        .offset(RETENTION + PRUNE_EVERY - 1)
        .limit(1)
    )
    if over is not None:
        prune(session, node)
    current = rows[0][0] == window.plan and rows[0][1] == "active"
    auto = current and isinstance(rows[0][2], dict) and rows[0][2].get("auto_apply") is True
    return Recorded(new_id, node, window.plan, current, auto)


def prune(session: Session, node: str, keep: int | None = None) -> None:
    """Delete the node's windows beyond the newest ``keep`` (default ``RETENTION``)."""
    keep = RETENTION if keep is None else keep
    edge = session.scalar(
        select(WINDOWS.c.id).where(WINDOWS.c.node_name == node).order_by(desc(WINDOWS.c.id)).offset(keep).limit(1)
    )
    if edge is not None:
        session.execute(delete(WINDOWS).where(WINDOWS.c.node_name == node, WINDOWS.c.id <= edge))


def current_plan(session: Session, node: str) -> tuple[Plan, list[Assignment]]:
    """The node's current plan (its active assignment with the highest seq). NotFound when it has none."""
    node_service.get(session, node)
    plan_id = session.scalar(
        select(Assignment.plan_id)
        .where(Assignment.node_name == node, Assignment.status == "active")
        .order_by(desc(Assignment.seq))
        .limit(1)
    )
    if plan_id is None:
        raise NotFound(f"node {node!r} has no current plan: nothing to tune", field="name")
    return plan_service.get(session, plan_id)


def _level(plan: Plan) -> tuple[dt_.Level | None, str | None]:
    req = plan.request or {}
    _, line = resolve_version(plan.vllm_version)
    args = parse_engine_args(req.get("engine_args") or {}, line)
    mns, util = args.get("max_num_seqs"), args.get("gpu_memory_utilization")
    if mns is None or util is None:
        return None, (
            "the plan sets no max_num_seqs or gpu_memory_utilization (vLLM's defaults run): make a plan "
            "with a workload (stage initial fills both from the KV bound, docs/operating.md §9) to start the loop"
        )
    cap = args.get("max_num_batched_tokens")
    # no kv_bound ceiling: the plan's bound (pool ÷ KV per request at its full average length, docs/operating.md §5)
    # is below the real knee — a running request holds its prompt and part of its output, not its final length —,
    # so the loop finds the knee from what ran (the pool-limit rule in domain/tuning.py) instead
    return dt_.Level(
        plan.id, int(mns), float(util), dt_.Memo.from_dict(plan.tuning), int(cap) if cap is not None else None
    ), None


def windows_of(session: Session, node: str, plan_id: str, limit: int = READ_WINDOWS) -> list:
    rows = (
        session.execute(
            select(MetricWindow)
            .where(MetricWindow.node_name == node, MetricWindow.plan_id == plan_id)
            .order_by(desc(MetricWindow.id))
            .limit(limit)
        )
        .scalars()
        .all()
    )
    return list(reversed(rows))


def _engine_args(plan: Plan, point: dt_.Point | None) -> dict[str, Any]:
    raw = dict((plan.request or {}).get("engine_args") or {})
    if point is None:
        return raw
    _, line = resolve_version(plan.vllm_version)
    return engine_args_with(
        raw, {"max_num_seqs": point.max_num_seqs, "gpu_memory_utilization": point.gpu_memory_utilization}, line
    )


def _nodes(assignments: list[Assignment]) -> list[str]:
    """The plan's active nodes in the order it was given (groups in order, by rank within each)."""
    ordered = sorted(
        (a for a in assignments if a.status == "active"), key=lambda a: (a.group_index or 0, a.rank or 0, a.id)
    )
    return [a.node_name for a in ordered]


def _body(plan: Plan, assignments: list[Assignment], engine_args: dict[str, Any]) -> PlanIn:
    """The plan body of the next plan: the current plan's content (as a reissue takes it) with new engine args."""
    req = plan.request or {}
    topo = plan.topology or {}
    return plan_service.plan_in(
        {
            "manifest": plan.manifest_id,
            "nodes": _nodes(assignments),
            "engine_args": engine_args,
            "env": dict(plan.env or {}),
            "environment": req.get("environment") or "production",
            "workload": req.get("workload"),
            "vllm_version": req.get("vllm_version"),
            "multi_node_form": topo.get("multi_node_form"),
            "group_env": topo.get("group_env"),
        }
    )


def _validated(
    session: Session,
    plan: Plan,
    assignments,
    level: dt_.Level,
    proposed: dt_.Point,
    reasons: list[str],
    policy: Profile | None,
) -> dt_.Point | None:
    """The proposal, or a smaller one (``domain.tuning.step_back``) when vLLM would refuse it; None when none of
    ``VALIDATION_TRIES`` passes. Each refusal is added to ``reasons``."""
    manifest = manifest_service.resolve_ref(session, plan.manifest_id)
    nodes = [node_service.get(session, n) for n in _nodes(assignments)]
    point: dt_.Point | None = proposed
    for _ in range(VALIDATION_TRIES):
        if point is None:
            break
        try:
            body = _body(plan, assignments, _engine_args(plan, point))
            j = plan_service.judge(session, manifest, nodes, body, policy=policy)
            errors = [f for f in j.findings if f.get("severity") == "error"]
            verdict = j.result.verdict
        except DomainError as exc:
            errors, verdict = [{"rule": exc.rule or "invalid", "message": exc.message}], "reject"
        except ApiError as exc:  # the plan's nodes no longer make one launch (facts changed since), ...
            errors, verdict = [{"rule": "invalid", "message": exc.detail}], "reject"
        if verdict != "reject":
            return point
        reasons.append(
            f"max_num_seqs {point.max_num_seqs}, gpu_memory_utilization {point.gpu_memory_utilization:g} "
            f"fails validation ("
            + "; ".join(f"{e.get('rule')}: {e.get('message')}" for e in errors[:3])
            + "): step back"
        )
        point = dt_.step_back(level, point)
    return None


def status(
    session: Session, node: str, settings: dt_.TuningSettings = dt_.DEFAULTS, *, policy: Profile | None = None
) -> dict[str, Any]:
    """``GET /v1/nodes/{name}/tuning``: the loop's state for the node's current plan, the current and the next
    engine args (next null: keep the current plan; each proposal judged under the policy profile), the reasons and
    the windows they come from."""
    plan, assignments = current_plan(session, node)
    out, _ = _status(session, node, plan, assignments, settings, policy)
    return out


def _status(
    session: Session, node: str, plan: Plan, assignments, settings: dt_.TuningSettings, policy: Profile | None
) -> tuple[dict[str, Any], dt_.Decision | None]:
    level, why_not = _level(plan)
    rows = windows_of(session, node, plan.id)
    evidence = [window_dict(r) for r in rows]
    base = {
        "node": node,
        "plan": plan.id,
        "current": {"engine_args": _engine_args(plan, None)},
        "memo": dt_.Memo.from_dict(plan.tuning).as_dict(),
    }
    if level is None:
        return {
            **base,
            "state": "exploring",
            "action": "measure",
            "next": None,
            "reasons": [why_not],
            "evidence": evidence,
        }, None
    windows = [
        dt_.Window(
            r.id,
            r.plan_id,
            r.window_s,
            r.running,
            r.waiting,
            r.kv_usage,
            r.preemptions,
            r.ttft_p99_s,
            r.e2e_p99_s,
            r.gen_tokens_per_s,
        )
        for r in rows
    ]
    d = dt_.decide(level, windows, settings)
    reasons = list(d.reasons)
    nxt = d.next
    if nxt is not None:
        nxt = _validated(session, plan, assignments, level, nxt, reasons, policy)
        if nxt is None:
            reasons.append("no proposal passes validation: keep the current plan")
        elif nxt != d.next:
            d = dt_.Decision(d.state, d.action, nxt, d.memo, d.reasons, d.evidence)
    used = set(d.evidence)
    return {
        **base,
        "state": d.state,
        "action": d.action if nxt is not None or d.next is None else "hold",
        "next": {
            "engine_args": _engine_args(plan, nxt),
            "max_num_seqs": nxt.max_num_seqs,
            "gpu_memory_utilization": nxt.gpu_memory_utilization,
            "memo": d.memo.as_dict(),
        }
        if nxt is not None
        else None,
        "reasons": reasons,
        "evidence": [e for e in evidence if e["id"] in used],
    }, (d if nxt is not None else None)


def initial_memo(tuning: TuningIn | None, environment: str) -> dict[str, Any] | None:
    """The memo of a plan made with a ``tuning`` block (``POST /v1/plans``): the start of the loop with its SLO and
    ``auto_apply`` — refused (422, field ``tuning.auto_apply``) outside the ``benchmark`` environment."""
    if tuning is None:
        return None
    if tuning.auto_apply and environment != "benchmark":
        why = (
            "tuning.auto_apply is allowed only in the benchmark environment: in production a person or a deploy "
            "script applies each step (POST /v1/nodes/{name}/tuning/apply)"
        )
        raise Invalid(why, errors=[{"field": "tuning.auto_apply", "rule": "auto_apply_benchmark_only", "message": why}])
    return dt_.Memo(slo=dt_.Slo(tuning.slo_ttft_p99_s, tuning.slo_e2e_p99_s), auto_apply=tuning.auto_apply).as_dict()


@dataclass
class Applied:
    """The loop's next plan, signed (``apply``), and the decision it carries out: from which plan, the state and
    action, the reasons, the windows (``evidence``) and the memo."""

    signed: plan_service.Signed
    tuning: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """As ``POST /v1/nodes/{name}/tuning/apply`` answers: the plan created, its ``tuning`` the decision."""
        return {**plan_service.created_dict(self.signed), "tuning": self.tuning}


def apply(session: Session, ctx: Context, *, actor: str, node: str) -> Applied:
    """``POST /v1/nodes/{name}/tuning/apply``: create the loop's next plan (validated, signed, audited, superseding
    the current one on all its nodes, as ``POST /v1/plans`` does) carrying the decision's memo; audit
    ``tuning.applied`` with the reasons and the windows it was decided from (their figures: windows are pruned, the
    audit keeps them). Conflict (409) when the loop proposes nothing now."""
    plan, assignments = current_plan(session, node)
    node_service.lock(session, sorted({a.node_name for a in assignments if a.status == "active"}))
    if current_plan(session, node)[0].id != plan.id:  # another apply (or a plan) got there first
        raise Conflict(
            f"node {node!r} got a new plan while this one was being applied: read GET /v1/nodes/{node}/tuning again",
            field="name",
        )
    out, d = _status(session, node, plan, assignments, ctx.settings.tuning_settings, ctx.settings.policy)
    if d is None or d.next is None:
        raise Conflict("the tuning loop proposes no new plan now: " + "; ".join(out["reasons"])[:1500], field="name")
    created = plan_service.create(
        session, ctx, actor=actor, plan=_body(plan, assignments, out["next"]["engine_args"]), tuning=d.memo.as_dict()
    )
    new_id = created.plan.id
    audit.append(
        session,
        actor=actor,
        kind="tuning.applied",
        subject=f"plan:{new_id}",
        plan_id=new_id,
        node=node,
        model=plan_service.model_of(session, new_id),
        payload={
            "from": plan.id,
            "state": out["state"],
            "action": out["action"],
            "max_num_seqs": d.next.max_num_seqs,
            "gpu_memory_utilization": d.next.gpu_memory_utilization,
            "reasons": out["reasons"],
            # the windows themselves, not only their ids: they are pruned (RETENTION), the audit stays
            "windows": out["evidence"],
        },
    )
    return Applied(
        created,
        {
            "from": plan.id,
            "state": out["state"],
            "action": out["action"],
            "reasons": out["reasons"],
            "evidence": out["evidence"],
            "memo": d.memo.as_dict(),
        },
    )


def auto_apply(session: Session, ctx: Context, *, node: str, plan_id: str) -> dict[str, Any] | None:
    """After a window of the node's current plan whose memo has ``auto_apply`` (only a benchmark plan can): when the
    loop proposes a next plan, apply it as the actor ``tuning:auto``. Returns ``{"plan", "action"}`` of the new plan,
    or None."""
    plan, assignments = plan_service.get(session, plan_id)
    if (plan.request or {}).get("environment") != "benchmark":
        return None  # never outside benchmark, whatever the memo says
    _, d = _status(session, node, plan, assignments, ctx.settings.tuning_settings, ctx.settings.policy)
    if d is None:
        return None
    try:  # what create refuses, it refuses before writing anything: the window stays stored either way
        out = apply(session, ctx, actor="tuning:auto", node=node)
    except (ApiError, DomainError):
        return None
    return {"plan": out.signed.plan.id, "action": out.tuning["action"]}


def trajectory(session: Session, node: str, limit: int = RETENTION) -> list[dict[str, Any]]:
    """The node's retained windows, oldest first, each with the ``max_num_seqs`` and ``gpu_memory_utilization`` of
    the plan it came from (the fleet page draws them: the loop's walk over time)."""
    rows = list(
        reversed(
            session.execute(
                select(MetricWindow).where(MetricWindow.node_name == node).order_by(desc(MetricWindow.id)).limit(limit)
            )
            .scalars()
            .all()
        )
    )
    knobs: dict[str, tuple[int | None, float | None]] = {}
    for plan in session.execute(select(Plan).where(Plan.id.in_({r.plan_id for r in rows}))).scalars():
        level, _ = _level(plan)
        knobs[plan.id] = (level.max_num_seqs, level.gpu_memory_utilization) if level else (None, None)
    return [
        {
            **window_dict(r),
            "max_num_seqs": knobs.get(r.plan_id, (None, None))[0],
            "gpu_memory_utilization": knobs.get(r.plan_id, (None, None))[1],
        }
        for r in rows
    ]
