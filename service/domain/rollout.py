"""Staged rollouts, the pure part: waves as node counts, the units that move together, the gates judged
over what the agents reported, the failure count against ``failure_limit``, and the rollout's state machine.

No database and no clock here: the service (services/rollouts.py) reads the rows and the reports, passes ``now``,
and carries out the decision this module returns.

States::

    pending ─sign wave 0─▶ waiting ─every unit settled─▶ baking ─bake over─▶ waiting (next wave, signed) … ─▶ completed
       │                     │ ▲                          │
       │                     ▼ │ resume                   ▼
       └──────────────────▶ paused            failures > failure_limit (in waiting, baking or paused)
                                                          ▼
                                                        halted ─every changed unit restored─▶ rolled_back
    abort (any state not final) ─▶ aborted (changed units restored first)

A *unit* is what moves as one: a node alone, or every node of a multi-node instance — of the target's topology and
of the node's previous plan (a worker never keeps a plan whose head moved on). A unit that fails counts once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import DomainError

MAX_WAVES = 20
MAX_BAKE_S = 7 * 86400
MAX_ROLLOUT_NODES = 1024

FINAL = ("completed", "rolled_back", "aborted")
ACTIVE = ("pending", "waiting", "baking", "paused", "halted", "rolling_back", "aborting")
# restores left to do, a chunk per step (halted with more to restore; aborted with more to restore)
RESTORING = ("rolling_back", "aborting")
FAILED_REPORTS = ("failed", "refused", "exited")  # a report on the new plan that fails its unit
# settled without failing: ready, or planned by hand during its wave (someone else's decision: not the rollout's
# failure, not restored)
SETTLED_OK = ("ready", "superseded_by_hand")


@dataclass(frozen=True)
class Wave:
    percent: int
    bake_s: int = 0


@dataclass(frozen=True)
class Gates:
    """``ready_timeout_s``: every unit of a wave reports ``running`` within this many seconds of its signing.
    ``kv_tolerance``: the KV cache tokens vLLM printed may differ from the prediction by at most this fraction of
    the prediction (None: not judged). A report without the figures passes the KV gate (nothing to compare; the
    node's evidence says ``kv_gate: not judged …``)."""

    ready_timeout_s: int = 600
    kv_tolerance: float | None = 0.2


def check_waves(waves: Sequence[Wave]) -> None:
    """Raise DomainError naming the field unless the percents rise strictly, each 1..100, the last 100, and every
    bake is 0..MAX_BAKE_S seconds."""
    if not waves:
        raise DomainError("waves", "give at least one wave (the last at 100 percent)", rule="rollout_waves")
    if len(waves) > MAX_WAVES:
        raise DomainError("waves", f"{len(waves)} waves: at most {MAX_WAVES}", rule="rollout_waves")
    previous = 0
    for i, w in enumerate(waves):
        if not 1 <= w.percent <= 100:
            raise DomainError(
                f"waves.{i}.percent", f"wave {i} percent {w.percent} is not between 1 and 100", rule="rollout_waves"
            )
        if w.percent <= previous:
            raise DomainError(
                f"waves.{i}.percent",
                f"wave {i} percent {w.percent} does not rise above the wave "
                f"before ({previous}): percents are cumulative shares of the nodes",
                rule="rollout_waves",
            )
        if not 0 <= w.bake_s <= MAX_BAKE_S:
            raise DomainError(
                f"waves.{i}.bake_s",
                f"wave {i} bake_s {w.bake_s} is not between 0 and {MAX_BAKE_S}",
                rule="rollout_waves",
            )
        previous = w.percent
    if waves[-1].percent != 100:
        raise DomainError(
            f"waves.{len(waves) - 1}.percent",
            f"the last wave is at {waves[-1].percent} percent: it must be 100 (a rollout ends with every node changed)",
            rule="rollout_waves",
        )


def units(order: Sequence[str], together: Iterable[Iterable[str]]) -> list[tuple[str, ...]]:
    """The nodes of ``order`` joined into units: nodes that share a set of ``together`` (a target group, a previous
    plan's group) are one unit, transitively. Units in the order of their first node; nodes inside a unit in
    ``order``. Names in ``together`` that are not in ``order`` are ignored."""
    index = {n: i for i, n in enumerate(order)}
    parent = list(range(len(order)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for members in together:
        ids = [index[n] for n in members if n in index]
        for other in ids[1:]:
            a, b = find(ids[0]), find(other)
            if a != b:
                parent[max(a, b)] = min(a, b)
    out: dict[int, list[str]] = {}
    for i, n in enumerate(order):
        out.setdefault(find(i), []).append(n)
    return [tuple(v) for _, v in sorted(out.items())]


def wave_units(unit_list: Sequence[tuple[str, ...]], waves: Sequence[Wave]) -> list[list[int]]:
    """Which units (indices into ``unit_list``, in order) each wave changes. Percents are cumulative shares of the
    nodes: wave i brings the changed nodes to at least ⌈percent × N / 100⌉ (so the first wave changes at least one
    unit); a unit is never split, so a wave may overshoot (and a later one then have nothing left to change); the
    last wave (100) takes whatever is left."""
    total = sum(len(u) for u in unit_list)
    out: list[list[int]] = []
    taken = done = 0
    for w in waves:
        target = math.ceil(w.percent * total / 100)  # percent >= 1: the first wave changes at least one unit
        mine: list[int] = []
        while taken < len(unit_list) and done < target:
            mine.append(taken)
            done += len(unit_list[taken])
            taken += 1
        out.append(mine)
    return out


# -- gates ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    """What one node said about the rollout's plan for it since it was signed (``at`` in seconds, any epoch)."""

    node: str
    signed_at: float
    running_at: float | None = None
    failure: tuple[str, float, str | None] | None = None  # (status, at, message): the first failed/refused/exited
    exit_status: int | None = None  # vLLM's exit status, on an exited report
    predicted_kv_tokens: int | None = None
    measured_kv_tokens: int | None = None
    # a headless worker of a multi-node instance (it never reports ``running``): ``head_ready`` says whether its
    # instance's head is ready; None for a head or a replica (judged on its own reports)
    head_ready: bool | None = None


@dataclass(frozen=True)
class Outcome:
    state: str  # pending | ready | failed
    reason: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


MetricsGate = Callable[[Observed], Outcome | None]  # the hook for windows of vLLM's metrics (None: no opinion)


def node_outcome(o: Observed, gates: Gates, now: float, metrics_gate: MetricsGate | None = None) -> Outcome:
    """One node's outcome: ``failed`` on a failed/refused/exited report, a KV figure out of tolerance, or no
    ``running`` report ``ready_timeout_s`` after signing; ``ready`` once it reports ``running`` and the gates pass;
    else ``pending``. A headless worker (``head_ready`` not None) fails only on its own failure report (its head's
    timeout and gates judge the instance) and is ready when its head is. The evidence says what was seen."""
    if o.failure is not None:
        status, at, message = o.failure
        return Outcome(
            "failed",
            f"report_{status}",
            {
                "status": status,
                "after_s": round(at - o.signed_at, 3),
                **({"exit_status": o.exit_status} if o.exit_status is not None else {}),
                **({"message": message[:500]} if message else {}),
            },
        )
    if o.head_ready is not None:
        return Outcome("ready", None, {"ready_with_head": True}) if o.head_ready else Outcome("pending")
    if o.running_at is not None:
        ev: dict[str, Any] = {"running_after_s": round(o.running_at - o.signed_at, 3)}
        if o.measured_kv_tokens is not None and o.predicted_kv_tokens:
            err = o.measured_kv_tokens / o.predicted_kv_tokens - 1
            ev.update(
                predicted_kv_tokens=o.predicted_kv_tokens,
                measured_kv_tokens=o.measured_kv_tokens,
                kv_relative_error=round(err, 4),
            )
            if gates.kv_tolerance is not None and abs(err) > gates.kv_tolerance:
                ev["kv_tolerance"] = gates.kv_tolerance
                return Outcome("failed", "kv_out_of_range", ev)
        if gates.kv_tolerance is None:
            ev["kv_gate"] = "not judged: kv_tolerance is null"
        elif "kv_relative_error" not in ev:  # said, so that a gate that judged nothing is not read as passed
            ev["kv_gate"] = (
                "not judged: the running report carried no KV cache figure"
                if o.predicted_kv_tokens
                else "not judged: the plan has no KV cache prediction"
            )
        if metrics_gate is not None:
            verdict = metrics_gate(o)
            if verdict is not None and verdict.state != "ready":
                return Outcome(verdict.state, verdict.reason, {**ev, **verdict.evidence})
        return Outcome("ready", None, ev)
    waited = now - o.signed_at
    if waited > gates.ready_timeout_s:
        return Outcome("failed", "not_ready", {"waited_s": round(waited, 3), "ready_timeout_s": gates.ready_timeout_s})
    return Outcome("pending", None, {"waited_s": round(max(waited, 0.0), 3)})


def unit_outcome(members: Sequence[Outcome], heads: Sequence[bool] | None = None) -> Outcome:
    """A unit's outcome from its nodes': failed when any node failed (a worker's failure ends its instance), ready
    when every head is ready (``heads``: which nodes head an instance — the workers of a multi-node instance run
    headless and need not report ``running``; by default every node), else pending."""
    failed = [m for m in members if m.state == "failed"]
    if failed:
        return Outcome("failed", failed[0].reason, failed[0].evidence)
    heads = list(heads) if heads is not None else [True] * len(members)
    judged = [m for m, h in zip(members, heads) if h]
    if judged and all(m.state == "superseded_by_hand" for m in judged):
        return Outcome("superseded_by_hand", None, judged[0].evidence)
    if judged and all(m.state in SETTLED_OK for m in judged):
        return Outcome("ready", None, judged[0].evidence)
    return Outcome("pending")


# -- the state machine ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class View:
    """The rollout as the scheduler sees it at one step."""

    state: str
    wave: int  # the current wave (index into ``waves``); -1 before the first is signed
    waves: tuple[Wave, ...]
    failure_limit: int
    failures: int  # units failed so far, over every signed wave
    wave_units: int  # units in the current wave
    wave_settled: int  # of those, ready or failed
    bake_until: float | None = None
    promote: bool = False
    wave_sizes: tuple[int, ...] | None = None  # nodes per wave (None: none empty); an empty wave is skipped


@dataclass(frozen=True)
class Decision:
    """What to do: ``action`` one of ``none``, ``sign`` (the wave ``wave``), ``bake`` (until ``bake_until``),
    ``halt``, ``complete``; ``state`` the state after it."""

    action: str
    state: str
    wave: int
    reason: str | None = None
    bake_until: float | None = None


def step(v: View, now: float) -> Decision:
    """The next step of a rollout. Failures beyond the limit halt it from any state but a final one (a paused
    rollout still protects the fleet); a halted rollout stays halted until the service has restored it."""
    if v.state in FINAL or v.state == "halted":
        return Decision("none", v.state, v.wave)
    if v.state in RESTORING:
        return Decision("restore", v.state, v.wave)
    if v.failures > v.failure_limit:
        return Decision(
            "halt", "halted", v.wave, f"{v.failures} unit(s) failed, more than failure_limit {v.failure_limit}"
        )
    if v.state == "paused":
        return Decision("none", "paused", v.wave)
    if v.state == "pending":
        first = _next_wave(v, -1)
        return Decision("sign", "waiting", first) if first < len(v.waves) else Decision("complete", "completed", -1)
    if v.state == "waiting":
        if v.wave_settled < v.wave_units:
            return Decision("none", "waiting", v.wave)
        bake = v.waves[v.wave].bake_s
        if v.promote or bake == 0:
            return _after_bake(v)
        return Decision("bake", "baking", v.wave, bake_until=now + bake)
    if v.state == "baking":
        if v.promote or v.bake_until is None or now >= v.bake_until:
            return _after_bake(v)
        return Decision("none", "baking", v.wave, bake_until=v.bake_until)
    raise ValueError(f"unknown rollout state {v.state!r}")


def _next_wave(v: View, after: int) -> int:
    """The first wave after ``after`` with nodes to change (waves a multi-node unit overshot are empty: skipped, no
    bake); ``len(v.waves)`` when none is left."""
    i = after + 1
    while v.wave_sizes is not None and i < len(v.waves) and v.wave_sizes[i] == 0:
        i += 1
    return i


def _after_bake(v: View) -> Decision:
    nxt = _next_wave(v, v.wave)
    if nxt >= len(v.waves):
        return Decision("complete", "completed", v.wave)
    return Decision("sign", "waiting", nxt)


def command(state: str, verb: str, promoted: bool = False) -> str:
    """The state an operator's ``pause``/``resume``/``promote``/``abort`` leads to; raises DomainError (the service
    answers 409) when the verb does not apply. ``resume`` returns ``resume`` (the service restores the state the
    rollout was paused in), ``promote`` returns the state unchanged (the flag skips the bake of the current wave, or
    in ``pending`` of wave 0); a second promote before the flag is used (``promoted``) is refused."""
    if state in FINAL:
        raise DomainError("state", f"the rollout is {state}: nothing to {verb}", rule="rollout_final")
    if state == "aborting" or (state == "rolling_back" and verb != "abort"):
        raise DomainError(
            "state", f"the rollout is {state} (its nodes are being restored): nothing to {verb}", rule="rollout_state"
        )
    if verb == "pause":
        if state == "paused":
            raise DomainError("state", "the rollout is already paused", rule="rollout_state")
        if state == "halted":
            raise DomainError(
                "state", "the rollout is halted (being rolled back): nothing to pause", rule="rollout_state"
            )
        return "paused"
    if verb == "resume":
        if state != "paused":
            raise DomainError("state", f"the rollout is {state}, not paused: nothing to resume", rule="rollout_state")
        return "resume"
    if verb == "promote":
        if state not in ("waiting", "baking", "pending"):
            raise DomainError(
                "state",
                f"the rollout is {state}: promote skips the bake of a running wave (resume a paused rollout first)",
                rule="rollout_state",
            )
        if promoted:
            raise DomainError(
                "state", "already promoted: the current wave's bake is skipped once it settles", rule="rollout_state"
            )
        return state
    if verb == "abort":
        return "aborted"
    raise ValueError(verb)
