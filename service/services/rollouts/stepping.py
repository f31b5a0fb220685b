"""One step of one rollout under its row lock: observe the signed nodes against the gates from their reports, then do
what the state machine (domain/rollout.py) says — sign the next wave, start the bake, complete, halt and restore."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Text, cast, func, or_, select, tuple_
from sqlalchemy.orm import Session

from ...db.models import Plan, Report, Rollout, RolloutNode, RolloutWave, iso
from ...domain import rollout as domain
from ..context import Context
from .common import FAILED, SCHEDULED, at_time, count_by, current_assignments, epoch, event, failed_units
from .restore import finish_restore, halt, halted, restore
from .signing import sign_next

# The hook for a gate over vLLM's metrics (preemptions, P99 from the tuning loop's windows, when it exists): a
# function of domain.Observed returning an Outcome (not "ready": the node fails with its reason) or None. None here:
# no metrics gate.
METRICS_GATE: domain.MetricsGate | None = None


def lock_for_step(session: Session, rollout_id: str) -> Rollout | None:
    """The rollout's row, locked for this transaction; None when another worker holds it (PostgreSQL SKIP LOCKED) or
    it is no longer the scheduler's."""
    q = select(Rollout).where(Rollout.id == rollout_id, Rollout.state.in_(SCHEDULED))
    if session.get_bind().dialect.name == "postgresql":
        q = q.with_for_update(skip_locked=True)
    return session.execute(q).scalar_one_or_none()


def step(session: Session, rollout_id: str, *, ctx: Context, now: float) -> str | None:
    """One step of one rollout, in the caller's transaction: observe the nodes, then do what the state machine says
    (sign the next wave, start the bake, complete, halt and restore). Returns the action taken ("none" when only
    observations changed), or None when the rollout was not available (locked elsewhere, or over)."""
    r = lock_for_step(session, rollout_id)
    if r is None:
        return None
    rows = list(
        session.execute(
            select(RolloutNode).where(RolloutNode.rollout_id == r.id).order_by(RolloutNode.position)
        ).scalars()
    )
    failed_now = [] if r.state in domain.RESTORING else _observe(session, r, rows, now)
    for name in failed_now:
        n = next(x for x in rows if x.node_name == name)
        event(session, r, "node_failed", {"unit": n.unit, "evidence": n.evidence}, node=name, plan_id=n.new_plan_id)
    waves = list(
        session.execute(select(RolloutWave).where(RolloutWave.rollout_id == r.id).order_by(RolloutWave.index)).scalars()
    )
    units = unit_outcomes(rows, r.wave) if r.wave >= 0 else {}
    view = _view(r, rows, waves, units)
    d = domain.step(view, now)
    if (
        d.action == "none"
        and r.state == "waiting"
        and 0 <= r.wave < len(waves)
        and any(n.wave == r.wave and n.new_plan_id is None and n.outcome == "unchanged" for n in rows)
    ):
        r.updated_at = at_time(now)
        return sign_next(session, r, waves[r.wave], rows, ctx=ctx, now=now)
    if d.action == "none":
        if failed_now:
            r.updated_at = at_time(now)
        return "none"
    r.updated_at = at_time(now)
    if d.action == "restore":  # the next chunk of a rollback or an abort
        actor = f"rollout:{r.id}"
        if restore(session, r, rows, ctx=ctx, reason=r.reason or r.state, actor=actor):
            return "restoring"
        finish_restore(session, r, rows)
        return "restore"
    if d.action == "halt":
        halt(session, r, rows, d.reason or "failures", ctx=ctx)
        return halted(r)
    if d.action == "bake":
        assert d.bake_until is not None  # the domain's "bake" decision always says until when
        wave = waves[r.wave]
        wave.state, wave.settled_at = "baking", at_time(now)
        r.state, r.bake_until = "baking", at_time(d.bake_until)
        event(
            session,
            r,
            "wave_settled",
            {"bake_until": iso(r.bake_until), "units": count_by(o.state for o in units.values())},
        )
        return "bake"
    _leave_wave(session, r, waves, units, now)  # leaving the current wave: it is done
    if d.action == "complete":
        for skipped in waves[r.wave + 1 :]:  # left empty (a unit overshot them): nothing to sign or bake
            if skipped.state == "pending":
                skipped.state = "skipped"
                event(session, r, "wave_skipped", {"index": skipped.index, "reason": "no nodes left for this wave"})
        r.state = "completed"
        event(session, r, "completed", {"failures": view.failures, "outcomes": count_by(n.outcome for n in rows)})
        return "complete"
    # sign: a refusal now (the manifest or the vLLM catalogue changed since the rollout was validated) halts it
    for skipped in waves[max(r.wave, -1) + 1 : d.wave]:  # empty (a unit overshot them): nothing to sign or bake
        skipped.state = "skipped"
        event(session, r, "wave_skipped", {"index": skipped.index, "reason": "no nodes left for this wave"})
    r.state, r.wave = "waiting", d.wave
    return sign_next(session, r, waves[d.wave], rows, ctx=ctx, now=now)


def _observe(session: Session, r: Rollout, rows: list[RolloutNode], now: float) -> list[str]:
    """Judge every signed, not yet restored node against the gates from its reports on the rollout's plan; update
    outcomes and evidence. Returns the names of nodes that failed in this step."""
    signed = [n for n in rows if n.new_plan_id and n.outcome in ("pending", "ready")]
    if not signed:
        return []
    gates = domain.Gates(**r.gates)
    pairs = sorted({(n.node_name, n.new_plan_id) for n in signed})
    seen = _seen(session, pairs)
    budgets: dict[str, dict[str, Any] | None] = dict(
        session.execute(select(Plan.id, Plan.budget).where(Plan.id.in_(sorted({n.new_plan_id for n in signed})))).all()
    )
    failed_now = []
    current = current_assignments(session, [n.node_name for n in signed])
    for n in sorted(signed, key=lambda n: not n.head):  # heads first: a headless worker is ready with its head
        cur = current.get(n.node_name)
        if cur is None or cur.plan_id != n.new_plan_id:
            # planned (or revoked) by hand during its wave: someone else's decision, not the rollout's failure
            n.outcome, n.updated_at = "superseded_by_hand", at_time(now)
            n.evidence = {
                "reason": "superseded_by_hand",
                "current_plan_id": cur.plan_id if cur else None,
                "current_seq": cur.seq if cur else None,
            }
            event(
                session,
                r,
                "node_superseded_by_hand",
                {"unit": n.unit, "evidence": n.evidence},
                node=n.node_name,
                plan_id=n.new_plan_id,
            )
            continue
        s = seen.get((n.node_name, n.new_plan_id), {})
        running = s.get("running")
        predicted = (budgets.get(n.new_plan_id) or {}).get("kv_cache_tokens")
        o = domain.node_outcome(
            domain.Observed(
                node=n.node_name,
                signed_at=epoch(n.signed_at) or now,
                running_at=running[0] if running else None,
                failure=s.get("failure"),
                exit_status=s.get("exit_status"),
                predicted_kv_tokens=predicted if isinstance(predicted, int) else None,
                measured_kv_tokens=running[1] if running else None,
                head_ready=None if n.head else all(m.outcome == "ready" for m in rows if m.unit == n.unit and m.head),
            ),
            gates,
            now,
            metrics_gate=METRICS_GATE,
        )
        evidence = {**o.evidence, **({"reason": o.reason} if o.reason else {})}
        if o.state != n.outcome or (o.state != "pending" and evidence != n.evidence):
            if o.state == "failed":
                failed_now.append(n.node_name)
                n.failed = True
            n.outcome, n.evidence, n.updated_at = o.state, evidence, at_time(now)
    return failed_now


def _view(
    r: Rollout, rows: list[RolloutNode], waves: list[RolloutWave], units: dict[int, domain.Outcome]
) -> domain.View:
    """What the state machine sees of the rollout: its state, waves, failures and the current wave's units."""
    return domain.View(
        state=r.state,
        wave=r.wave,
        waves=tuple(domain.Wave(w.percent, w.bake_s) for w in waves),
        failure_limit=r.failure_limit,
        failures=failed_units(rows),
        wave_units=len(units),
        wave_settled=sum(1 for o in units.values() if o.state != "pending"),
        bake_until=epoch(r.bake_until),
        promote=r.promote,
        wave_sizes=tuple(sum(1 for n in rows if n.wave == w.index) for w in waves),
    )


def _leave_wave(
    session: Session, r: Rollout, waves: list[RolloutWave], units: dict[int, domain.Outcome], now: float
) -> None:
    """Mark the current wave done (settled now if it was not) and clear the promote flag and the bake."""
    if 0 <= r.wave < len(waves):
        w = waves[r.wave]
        if w.settled_at is None:
            w.settled_at = at_time(now)
        w.state, w.done_at = "done", at_time(now)
        event(session, r, "wave_done", {"units": count_by(o.state for o in units.values()), "promoted": r.promote})
    if r.wave >= 0:  # a promote given in pending skips wave 0's bake: kept until wave 0 is left
        r.promote = False
    r.bake_until = None


def _seen(session: Session, pairs: list[tuple[str, str | None]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (node, plan): when it first ran and its newest KV figure, its first failure and vLLM's exit status."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    # per (node, plan) the first report of each status, and the newest "running" that carries vLLM's KV figure (a
    # vLLM that restarted prints its pool again: the gate judges what runs now; a later report without the figure
    # hides nothing): at most five rows per node, however much it reported
    mine = tuple_(Report.node_name, Report.plan_id).in_(pairs)
    firsts = (
        select(func.min(Report.id))
        .where(mine, Report.status.in_(("running",) + FAILED))
        .group_by(Report.node_name, Report.plan_id, Report.status)
    )
    figured = set(
        session.scalars(
            select(func.max(Report.id))
            .where(mine, Report.status == "running", cast(Report.details, Text).like('%"kv_cache_tokens"%'))
            .group_by(Report.node_name, Report.plan_id)
        )
    )
    for _rid, node, plan_id, status, message, details, created in session.execute(
        select(
            Report.id,
            Report.node_name,
            Report.plan_id,
            Report.status,
            Report.message,
            Report.details,
            Report.created_at,
        )
        .where(or_(Report.id.in_(firsts), Report.id.in_(figured)))
        .order_by(Report.id)
    ):
        s = seen.setdefault((node, plan_id), {})
        at = epoch(created)
        if status == "running":
            vllm = (details or {}).get("vllm") if isinstance(details, dict) else None
            tokens = vllm.get("kv_cache_tokens") if isinstance(vllm, dict) else None
            first = s.get("running", (at, None))[0]  # when it first ran; the figure of the newest that has one
            s["running"] = (
                first,
                tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else s.get("running", (at, None))[1],
            )
        elif "failure" not in s:
            d = details if isinstance(details, dict) else {}
            said = message or d.get("reason") or d.get("tail")  # what the agent said it was: evidence
            s["failure"] = (status, at, said if isinstance(said, str) else None)
            code = d.get("status")  # vLLM's exit status on an "exited" report
            s["exit_status"] = code if isinstance(code, int) and not isinstance(code, bool) else None
    return seen


def _units_of(rows: list[RolloutNode], wave: int) -> dict[int, list[RolloutNode]]:
    out: dict[int, list[RolloutNode]] = {}
    for n in rows:
        if n.wave == wave:
            out.setdefault(n.unit, []).append(n)
    return out


def unit_outcomes(rows: list[RolloutNode], wave: int) -> dict[int, domain.Outcome]:
    return {
        u: domain.unit_outcome(
            [
                domain.Outcome(
                    m.outcome if m.outcome in ("pending", "ready", "failed", "superseded_by_hand") else "pending"
                )
                for m in members
            ],
            [m.head for m in members],
        )
        for u, members in _units_of(rows, wave).items()
    }
