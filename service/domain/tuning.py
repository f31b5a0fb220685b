"""The tuning loop's state machine: from vLLM's live metrics to the next launch, as the operators' guide
tunes by hand (docs/operating.md §3, §5, §9).

Pure: plain functions over typed values, no FastAPI, no database. The service (services/tuning.py) hands it the
node's current level (the plan's ``max_num_seqs`` and ``gpu_memory_utilization`` and the tuning memo the plan
carries) and the newest metric windows of that plan; ``decide`` answers what to do next and why.

The procedure (docs/operating.md §9, steps 3, 5, 6):

- ``exploring``: start at the plan Preflight made at stage ``initial`` (0.5 × the KV bound, utilization 0.85) and,
  while the queue is non-empty (the level is really under load), preemptions stay near zero and P99 stays within the
  SLO (if one is given), raise ``max_num_seqs`` by a step (× (1 + ``step_fraction``)). When the KV pool is the
  binding constraint — KV usage at ``kv_high_water`` or above with a queue and no preemptions (docs/operating.md §3: the
  queue grows, the pool is too small) — raise ``gpu_memory_utilization`` by ``util_step`` instead, up to
  ``util_cap`` (the production cap 0.90, never above).
- A level *fails* when preemptions or P99 climb (``fail_windows`` of the last ``windows`` windows are bad). The knee
  lies between the last level that held and the first that failed; while that gap is wider than
  ``refine_tolerance`` the loop tries the midpoint (docs/operating.md §9, step 5: find the knee), then
  ``knee_found``: the knee is the last level that held.
- ``settled``: production = ``production_fraction`` (0.8) × knee, utilization at the last level that held (never
  above 0.90). A settled level that shows a burst of preemptions again is backed off by ``backoff_fraction``
  (``backing_off``), never below the floor ``floor_fraction`` × the starting level.
- The KV pool as the limit: when the pool is full (KV usage ≥ ``kv_high_water``, requests waiting) and
  utilization is at its cap yet fewer than ``loaded_running_fraction`` × ``max_num_seqs`` run, a larger
  ``max_num_seqs`` admits nothing and tests nothing — the knee is where running saturated and the loop settles at
  ``production_fraction`` × that (docs/operating.md §5, §9). With the pool full it never raises ``max_num_seqs`` more
  than a step above what ran, nor ever above the plan's KV bound when the caller passes one (``Level.kv_bound``).
- ``stuck``: a level that keeps preempting at the floor, or a loop that has made ``max_steps`` tuning plans (in any
  state) with nothing left to settle on, proposes nothing more: a person decides (docs/operating.md §4, §5).

Robust to noise: a level is judged on the last ``windows`` windows of its plan (after ``warmup_windows``), and
it takes ``fail_windows`` bad ones to fail it — one outlier window moves nothing. Every decision carries its reasons
and the ids of the windows it was made from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

State = Literal["exploring", "knee_found", "settled", "backing_off", "stuck"]
STATES = ("exploring", "knee_found", "settled", "backing_off", "stuck")
Action = Literal[
    "measure", "hold", "raise_max_num_seqs", "raise_gpu_memory_utilization", "refine", "settle", "back_off"
]


@dataclass(frozen=True)
class TuningSettings:
    """Thresholds and step sizes; the defaults are the guide's values (docs/operating.md §3, §5, §9)."""

    step_fraction: float = 0.25  # raise max_num_seqs × 1.25 per exploring step
    util_step: float = 0.025  # gpu_memory_utilization 0.85 → 0.875 → 0.90
    util_cap: float = 0.90  # docs/operating.md §3: the production upper bound
    kv_high_water: float = 0.85  # KV usage at which the pool, not max_num_seqs, limits
    production_fraction: float = 0.8  # docs/operating.md §5, §9: production = 0.8 × knee
    refine_tolerance: float = 0.05  # stop refining when (failed − held) ≤ 5 % of held
    backoff_fraction: float = 0.2  # a settled level with a preemption burst steps down by 20 %
    preemptions_per_min_max: float = 1.0  # "near zero" (docs/operating.md §5, §9)
    windows: int = 3  # judge a level on its newest 3 windows ...
    fail_windows: int = 2  # ... and fail it only when 2 of them are bad (one outlier moves nothing)
    warmup_windows: int = 1  # the first window of a plan (vLLM starting, caches cold) is not judged
    loaded_running_fraction: float = 0.95  # running ≥ 95 % of max_num_seqs also means "under load"
    max_steps: int = 24  # a loop that has not settled after this many plans settles at what held; in every state
    # the loop proposes no plan beyond it (``stuck``: a person decides)
    floor_fraction: float = 0.25  # never propose max_num_seqs below 0.25 × the starting level (or below 1)

    def __post_init__(self) -> None:
        checks = {
            "step_fraction": 0 < self.step_fraction <= 4,
            "util_step": 0 <= self.util_step <= 0.2,
            "util_cap": 0.1 <= self.util_cap <= 0.90,
            "kv_high_water": 0 < self.kv_high_water <= 1,
            "production_fraction": 0 < self.production_fraction <= 1,
            "refine_tolerance": 0 < self.refine_tolerance < 1,
            "backoff_fraction": 0 < self.backoff_fraction < 1,
            "preemptions_per_min_max": 0 <= self.preemptions_per_min_max,
            "windows": 1 <= self.windows <= 100,
            "fail_windows": 1 <= self.fail_windows <= self.windows,
            "warmup_windows": 0 <= self.warmup_windows <= 100,
            "max_steps": 1 <= self.max_steps <= 1000,
            "floor_fraction": 0 < self.floor_fraction <= 1,
            "loaded_running_fraction": 0 < self.loaded_running_fraction <= 1,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"tuning settings out of range: {', '.join(bad)}")


DEFAULTS = TuningSettings()


@dataclass(frozen=True)
class Window:
    """One metrics window an agent posted (``POST /v1/nodes/{name}/metrics``): gauges at the window's end, counter
    deltas over it, P99s from histogram bucket deltas (None when no request finished in it)."""

    id: int
    plan: str
    window_s: float
    num_requests_running: float
    num_requests_waiting: float
    kv_cache_usage_perc: float
    num_preemptions: float
    ttft_p99_s: float | None = None
    e2e_p99_s: float | None = None
    generation_tokens_per_s: float = 0.0


@dataclass(frozen=True)
class Slo:
    """The workload's latency objective, if one is given (P99, seconds)."""

    ttft_p99_s: float | None = None
    e2e_p99_s: float | None = None


@dataclass(frozen=True)
class Point:
    """A tuning level: the two knobs the loop moves, and the plan that ran it (None for a proposal)."""

    max_num_seqs: int
    gpu_memory_utilization: float
    plan: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_num_seqs": self.max_num_seqs,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "plan": self.plan,
        }

    @classmethod
    def from_dict(cls, d: Any) -> Point | None:
        if not isinstance(d, dict):
            return None
        try:
            return cls(int(d["max_num_seqs"]), float(d["gpu_memory_utilization"]), d.get("plan"))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Memo:
    """What a tuning plan carries forward (stored with the plan, ``plans.tuning``): the state it was made in, the
    last level that held and the first that failed, the knee once found, how many tuning plans led here, the
    utilization the loop may no longer exceed (a level failed right after a utilization raise) and the SLO."""

    state: State = "exploring"
    held: Point | None = None
    failed: Point | None = None
    knee: int | None = None
    steps: int = 0
    util_ceiling: float | None = None
    slo: Slo = field(default_factory=Slo)
    auto_apply: bool = False
    initial: int | None = None  # the max_num_seqs the loop started from (the floor is a fraction of it)
    saturation: int | None = None  # the most requests that ran while the KV pool was full (the pool's real bound)

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "held": self.held.as_dict() if self.held else None,
            "failed": self.failed.as_dict() if self.failed else None,
            "knee": self.knee,
            "steps": self.steps,
            "util_ceiling": self.util_ceiling,
            "slo": asdict(self.slo),
            "auto_apply": self.auto_apply,
            "initial": self.initial,
            "saturation": self.saturation,
        }

    @classmethod
    def from_dict(cls, d: Any) -> Memo:
        """A memo from a stored plan (None or anything unusable: the start of the loop)."""
        if not isinstance(d, dict):
            return cls()
        raw_slo = d.get("slo")
        slo: dict[str, Any] = raw_slo if isinstance(raw_slo, dict) else {}
        state: State = d["state"] if d.get("state") in STATES else "exploring"
        return cls(
            state=state,
            held=Point.from_dict(d.get("held")),
            failed=Point.from_dict(d.get("failed")),
            knee=_whole(d.get("knee")),
            steps=_whole(d.get("steps")) or 0,
            util_ceiling=_real(d.get("util_ceiling")),
            slo=Slo(_real(slo.get("ttft_p99_s")), _real(slo.get("e2e_p99_s"))),
            auto_apply=d.get("auto_apply") is True,
            initial=_positive(_whole(d.get("initial"))),
            saturation=_positive(_whole(d.get("saturation"))),
        )


def _real(v: object) -> float | None:
    """A stored number (not a boolean), if finite."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _whole(v: object) -> int | None:
    return int(v) if isinstance(v, (int, float)) and _real(v) is not None else None


def _positive(v: int | None) -> int | None:
    return v if v is not None and 1 <= v <= 10_000_000 else None


@dataclass(frozen=True)
class Level:
    """The node's current plan as the loop sees it: its knobs, its memo, and the largest ``max_num_seqs`` the rest
    of the launch allows (vLLM refuses max_num_seqs above max_num_batched_tokens: none when unknown) and, when the
    caller knows it, the KV bound of the plan's budget (how many sequences of the workload the KV pool holds at once;
    the loop never proposes more, docs/operating.md §5)."""

    plan: str
    max_num_seqs: int
    gpu_memory_utilization: float
    memo: Memo = field(default_factory=Memo)
    max_num_seqs_cap: int | None = None
    kv_bound: int | None = None

    @property
    def point(self) -> Point:
        return Point(self.max_num_seqs, self.gpu_memory_utilization, self.plan)


@dataclass(frozen=True)
class Verdict:
    """How the windows judge a level: ``held``, ``failed`` or ``untested`` (too few windows, or no load)."""

    outcome: Literal["held", "failed", "untested"]
    reasons: tuple[str, ...]
    evidence: tuple[int, ...]
    kv_usage: float | None = None
    preempting: int = 0
    slow: int = 0


@dataclass(frozen=True)
class Decision:
    """What to do next: the state, the action, the proposed knobs (None: keep the current plan), the memo the next
    plan carries, the reasons and the ids of the windows they come from."""

    state: State
    action: Action
    next: Point | None
    memo: Memo
    reasons: tuple[str, ...]
    evidence: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "action": self.action,
            "next": self.next.as_dict() if self.next else None,
            "memo": self.memo.as_dict(),
            "reasons": list(self.reasons),
            "evidence": list(self.evidence),
        }


def _median(values: Sequence[float]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def preempting(w: Window, s: TuningSettings) -> bool:
    """A window whose preemption rate is above "near zero" (docs/operating.md §5: watch the preemption count)."""
    return w.num_preemptions / max(w.window_s, 1e-9) * 60.0 > s.preemptions_per_min_max


def too_slow(w: Window, slo: Slo) -> bool:
    """A window whose P99 is beyond the SLO (never, without one)."""
    return bool(
        (slo.ttft_p99_s is not None and w.ttft_p99_s is not None and w.ttft_p99_s > slo.ttft_p99_s)
        or (slo.e2e_p99_s is not None and w.e2e_p99_s is not None and w.e2e_p99_s > slo.e2e_p99_s)
    )


def loaded(w: Window, max_num_seqs: int, s: TuningSettings) -> bool:
    """The level is under load in this window: requests wait, or the batch is (nearly) full."""
    return w.num_requests_waiting >= 1 or w.num_requests_running >= s.loaded_running_fraction * max_num_seqs


def judge(level: Level, windows: Sequence[Window], s: TuningSettings = DEFAULTS) -> Verdict:
    """Judge the level on its newest ``s.windows`` windows (the first ``warmup_windows`` of its plan skipped):
    ``failed`` when at least ``fail_windows`` preempt or are beyond the SLO, ``held`` when fewer do and at least
    ``fail_windows`` were under load, else ``untested``. Windows of other plans are ignored."""
    mine = sorted((w for w in windows if w.plan == level.plan), key=lambda w: w.id)[s.warmup_windows :]
    recent = mine[-s.windows :]
    ids = tuple(w.id for w in recent)
    if len(recent) < s.windows:
        return Verdict(
            "untested",
            (
                f"{len(recent)} of the {s.windows} windows needed to judge max_num_seqs "
                f"{level.max_num_seqs} (after {s.warmup_windows} warm-up window(s))",
            ),
            ids,
        )
    pre = [w for w in recent if preempting(w, s)]
    slow = [w for w in recent if too_slow(w, level.memo.slo)]
    bad = {w.id for w in pre} | {w.id for w in slow}
    kv = _median([w.kv_cache_usage_perc for w in recent])
    rates = [round(w.num_preemptions / max(w.window_s, 1e-9) * 60.0, 2) for w in recent]
    if len(bad) >= s.fail_windows:
        why = []
        if pre:
            why.append(
                f"preemptions climb: {len(pre)} of the last {len(recent)} windows above "
                f"{s.preemptions_per_min_max:g}/min (rates {rates} per min; docs/operating.md §5)"
            )
        if slow:
            p99 = [(w.ttft_p99_s, w.e2e_p99_s) for w in slow]
            why.append(
                f"P99 beyond the SLO in {len(slow)} of the last {len(recent)} windows "
                f"(ttft, e2e: {p99}; SLO {asdict(level.memo.slo)})"
            )
        return Verdict("failed", tuple(why), ids, kv, len(pre), len(slow))
    busy = [w for w in recent if loaded(w, level.max_num_seqs, s)]
    if len(busy) < s.fail_windows:
        return Verdict(
            "untested",
            (
                f"not under load: requests waited (or the batch was full) in only {len(busy)} "
                f"of the last {len(recent)} windows; max_num_seqs {level.max_num_seqs} is not "
                f"tested until the queue grows",
            ),
            ids,
            kv,
        )
    why = [
        f"held: preemption rates {rates} per min (at most {len(bad)} bad window(s) of {len(recent)}), "
        f"median waiting {_median([w.num_requests_waiting for w in recent]):g}, "
        f"median KV usage {kv:.2f}"
    ]
    if bad:
        why.append(f"{len(bad)} outlier window(s) ({sorted(bad)}) below the {s.fail_windows} needed to fail a level")
    return Verdict("held", tuple(why), ids, kv, len(pre), len(slow))


def _raise_mns(current: int, s: TuningSettings, cap: int | None) -> int:
    nxt = max(current + 1, math.floor(current * (1 + s.step_fraction)))
    return min(nxt, cap) if cap is not None else nxt


def floor_of(initial: int, s: TuningSettings = DEFAULTS) -> int:
    """The lowest max_num_seqs the loop proposes: ``floor_fraction`` × the starting level, at least 1."""
    return max(1, math.ceil(s.floor_fraction * initial))


_NEEDS_A_PERSON = (
    "needs a person: a smaller max_model_len, more GPUs or less traffic per replica (docs/operating.md §4, §5)"
)


@dataclass
class _Step:
    """One call of ``decide``: the level and its verdict, and what every decision built from them shares."""

    level: Level
    s: TuningSettings
    v: Verdict
    reasons: list[str]
    initial: int  # the max_num_seqs the loop started from
    floor: int
    saturation: int | None
    run_max: float  # the most requests that ran in the judged windows
    kv_full: bool  # the KV pool is full and requests wait: the pool, not max_num_seqs, decides how many run

    @property
    def memo(self) -> Memo:
        return self.level.memo

    @property
    def here(self) -> Point:
        return self.level.point

    def memo_for(
        self,
        state: State,
        held: Point | None,
        failed: Point | None,
        knee: int | None,
        steps: int,
        ceiling: float | None,
    ) -> Memo:
        m = self.memo
        return Memo(state, held, failed, knee, steps, ceiling, m.slo, m.auto_apply, self.initial, self.saturation)

    def out(self, state: State, action: Action, nxt: Point | None, new_memo: Memo, *extra: str) -> Decision:
        level, here = self.level, self.here
        if nxt is not None and level.max_num_seqs_cap is not None and nxt.max_num_seqs > level.max_num_seqs_cap:
            nxt = replace(nxt, max_num_seqs=level.max_num_seqs_cap)  # vLLM refuses more (max_num_batched_tokens)
        if nxt is not None and level.kv_bound is not None and nxt.max_num_seqs > level.kv_bound:
            nxt = replace(nxt, max_num_seqs=max(1, level.kv_bound))  # the pool holds no more (docs/operating.md §5)
        if (
            nxt is not None
            and action != "settle"
            and (nxt.max_num_seqs, nxt.gpu_memory_utilization) == (here.max_num_seqs, here.gpu_memory_utilization)
        ):
            return Decision(
                state,
                "hold",
                None,
                self.memo,
                tuple(self.reasons + list(extra) + ["the step lands on the current level: nothing to change"]),
                self.v.evidence,
            )
        return Decision(state, action, nxt, new_memo, tuple(self.reasons + list(extra)), self.v.evidence)

    def stuck(self, why: str) -> Decision:
        m = self.memo
        return self.out(
            "stuck",
            "hold",
            None,
            self.memo_for("stuck", m.held, m.failed, m.knee, m.steps, m.util_ceiling),
            why,
            _NEEDS_A_PERSON,
        )


@dataclass(frozen=True)
class _Progress:
    """What the exploring loop knows after this verdict: the last level that held, the first that failed, the
    tuning plans made (this one included) and the utilization it may no longer exceed."""

    held: Point | None
    failed: Point | None
    steps: int
    ceiling: float | None


def _begin(level: Level, windows: Sequence[Window], s: TuningSettings) -> _Step:
    memo = level.memo
    v = judge(level, windows, s)
    initial = memo.initial if memo.initial is not None else level.max_num_seqs
    saturation = memo.saturation
    judged = [w for w in windows if w.plan == level.plan and w.id in v.evidence]
    run_max = max((w.num_requests_running for w in judged), default=0.0)
    # the KV pool is full and requests wait: the pool, not max_num_seqs, decides how many run (docs/operating.md §3)
    kv_full = (
        v.outcome == "held"
        and v.kv_usage is not None
        and v.kv_usage >= s.kv_high_water
        and _median([w.num_requests_waiting for w in judged]) >= 1
    )
    if kv_full and run_max >= 1:
        saturation = max(saturation or 0, math.floor(run_max))
    return _Step(level, s, v, list(v.reasons), initial, floor_of(initial, s), saturation, run_max, kv_full)


def decide(level: Level, windows: Sequence[Window], s: TuningSettings = DEFAULTS) -> Decision:
    """The next step of the loop for the node's current level (see the module docstring)."""
    st = _begin(level, windows, s)
    memo = level.memo
    if memo.state == "stuck":
        return st.stuck(
            f"the loop stopped at max_num_seqs {level.max_num_seqs}, gpu_memory_utilization "
            f"{level.gpu_memory_utilization:g}: it proposes no further plan"
        )
    if memo.state in ("settled", "backing_off"):
        return _settled(st, [w for w in windows if w.plan == level.plan and w.id in st.v.evidence])
    if st.v.outcome == "untested":
        return st.out("exploring", "measure", None, memo, "keep the current plan and keep measuring")
    p = _progress(st)
    if p.steps > s.max_steps:
        return _settle(st, p, f"{memo.steps} tuning plans without settling (limit {s.max_steps}): settle at what held")
    if p.failed is not None:
        lo = p.held.max_num_seqs if p.held is not None else 0
        hi = p.failed.max_num_seqs
        if p.held is None or hi - lo <= max(1, s.refine_tolerance * lo):
            return _settle(st, p, f"the knee lies between max_num_seqs {lo} (held) and {hi} (failed)")
        mid = (lo + hi) // 2
        if mid <= lo:
            return _settle(st, p, f"no level between {lo} (held) and {hi} (failed)")
        return st.out(
            "exploring",
            "refine",
            Point(mid, p.held.gpu_memory_utilization),
            st.memo_for("exploring", p.held, p.failed, None, p.steps, p.ceiling),
            f"the knee lies between {lo} (held) and {hi} (failed), {hi - lo} apart (> "
            f"{s.refine_tolerance:.0%} of {lo}): try the midpoint {mid}",
        )
    return _step_up(st, p)


def _settled(st: _Step, judged: list[Window]) -> Decision:
    """A settled (or backing-off) level holds, or steps down after a burst of preemptions (never below the floor)."""
    level, memo, s = st.level, st.memo, st.s
    if st.v.outcome == "failed" and any(preempting(w, s) for w in judged):
        if memo.steps + 1 > s.max_steps:
            return st.stuck(
                f"a burst of preemptions at max_num_seqs {level.max_num_seqs}, but {memo.steps} "
                f"tuning plans already made (limit max_steps {s.max_steps})"
            )
        mns = max(st.floor, math.floor(level.max_num_seqs * (1 - s.backoff_fraction)))
        if mns >= level.max_num_seqs:
            return st.stuck(
                f"max_num_seqs {level.max_num_seqs} is the floor ({s.floor_fraction:g} × the starting "
                f"level {st.initial}) and still preempts: lowering it further does not help"
            )
        return st.out(
            "backing_off",
            "back_off",
            Point(mns, level.gpu_memory_utilization),
            replace(memo, state="backing_off", failed=st.here, steps=memo.steps + 1, initial=st.initial),
            f"a burst of preemptions at the settled max_num_seqs {level.max_num_seqs}: back off "
            f"{s.backoff_fraction:.0%} to {mns} (docs/operating.md §3: a climbing preemption count → lower "
            f"max_num_seqs; never below the floor {st.floor})",
        )
    return st.out(
        memo.state,
        "hold",
        None,
        memo,
        f"settled at max_num_seqs {level.max_num_seqs}, gpu_memory_utilization "
        f"{level.gpu_memory_utilization:g}" + (f" (knee {memo.knee})" if memo.knee else ""),
    )


def _progress(st: _Step) -> _Progress:
    """The held / failed levels after this verdict; a level that failed right after a utilization raise makes that
    utilization the limit, not max_num_seqs."""
    level, memo = st.level, st.memo
    held, failed, ceiling = memo.held, memo.failed, memo.util_ceiling
    if st.v.outcome == "held":
        held = st.here
    else:
        if (
            held is not None
            and held.max_num_seqs == level.max_num_seqs
            and level.gpu_memory_utilization > held.gpu_memory_utilization
        ):
            ceiling = held.gpu_memory_utilization
            st.reasons.append(
                f"failed right after raising gpu_memory_utilization to "
                f"{level.gpu_memory_utilization:g}: it stays at {ceiling:g} from here on"
            )
        failed = st.here if failed is None or level.max_num_seqs <= failed.max_num_seqs else failed
    return _Progress(held, failed, memo.steps + 1, ceiling)


def _settle(st: _Step, p: _Progress, why: str, knee: int | None = None) -> Decision:
    """Settle at ``production_fraction`` × the knee (the last level that held, unless given); with nothing held,
    halve and explore again (never below the floor)."""
    level, memo, s = st.level, st.memo, st.s
    held = p.held
    if held is None:  # nothing held, not even the start: halve (not below the floor) and explore again
        if p.steps > s.max_steps:
            return st.stuck(f"{memo.steps} tuning plans (limit max_steps {s.max_steps}) and no level held")
        mns = max(st.floor, level.max_num_seqs // 2)
        if mns >= level.max_num_seqs:
            return st.stuck(
                f"max_num_seqs {level.max_num_seqs} fails and is the floor ({s.floor_fraction:g} × the "
                f"starting level {st.initial}, at least 1): the launch does not serve this traffic"
            )
        return st.out(
            "exploring",
            "back_off",
            Point(mns, level.gpu_memory_utilization),
            st.memo_for("exploring", None, st.here, None, p.steps, p.ceiling),
            f"the starting level failed: no level held yet; halve max_num_seqs to {mns} (never below the "
            f"floor {st.floor})",
        )
    knee = held.max_num_seqs if knee is None else knee
    prod = max(1, math.floor(knee * s.production_fraction))
    util = min(held.gpu_memory_utilization, s.util_cap)
    return st.out(
        "knee_found",
        "settle",
        Point(prod, util),
        st.memo_for("settled", held, p.failed, knee, p.steps, p.ceiling),
        why,
        f"knee = {knee} (plan {held.plan}); production max_num_seqs = "
        f"{s.production_fraction:g} × {knee} = {prod}, gpu_memory_utilization {util:g} (the last level that "
        f"held, never above {s.util_cap:g}; docs/operating.md §5, §9)",
    )


def _step_up(st: _Step, p: _Progress) -> Decision:
    """Held, no failure yet: raise gpu_memory_utilization when the full KV pool limits, settle where running
    saturates, else raise max_num_seqs by a step (capped by the pool, the KV bound and max_num_batched_tokens)."""
    level, s, v, run_max = st.level, st.s, st.v, st.run_max
    cap = level.max_num_seqs_cap
    util_limit = min(s.util_cap, p.ceiling) if p.ceiling is not None else s.util_cap
    if st.kv_full and level.gpu_memory_utilization + 1e-9 < util_limit:
        util = round(min(util_limit, level.gpu_memory_utilization + s.util_step), 4)
        return st.out(
            "exploring",
            "raise_gpu_memory_utilization",
            Point(level.max_num_seqs, util),
            st.memo_for("exploring", p.held, None, None, p.steps, p.ceiling),
            f"KV usage {v.kv_usage:.2f} ≥ {s.kv_high_water:g} with requests waiting and no preemptions: the "
            f"pool limits — raise gpu_memory_utilization to {util:g} (docs/operating.md §3; cap "
            f"{util_limit:g})",
        )
    if st.kv_full and run_max < s.loaded_running_fraction * level.max_num_seqs:
        # the pool is full, requests wait, yet fewer than max_num_seqs run: a larger max_num_seqs admits nothing
        # more and tests nothing — the knee is where running saturates (docs/operating.md §5, §9)
        return _settle(
            st,
            p,
            f"KV usage {v.kv_usage:.2f} ≥ {s.kv_high_water:g} with requests waiting, yet at most "
            f"{run_max:g} of max_num_seqs {level.max_num_seqs} run and gpu_memory_utilization is at "
            f"its cap {util_limit:g}: the KV pool is the limit, raising max_num_seqs admits nothing "
            f"more; the knee is where running saturates (docs/operating.md §5, §9)",
            max(1, math.floor(run_max)),
        )
    mns = _raise_mns(level.max_num_seqs, s, cap)
    limits = []
    if st.kv_full:  # the pool is full: go no further than a step past what ran
        sat_cap = max(level.max_num_seqs, math.floor(run_max * (1 + s.step_fraction)))
        if mns > sat_cap:
            mns = sat_cap
            limits.append(
                f"capped at {s.step_fraction:.0%} above the {run_max:g} requests that ran with the KV pool "
                f"full (KV usage {v.kv_usage:.2f}; docs/operating.md §5)"
            )
    if level.kv_bound is not None and mns > level.kv_bound:
        mns = max(level.max_num_seqs, level.kv_bound)
        limits.append(f"capped at the plan's KV bound {level.kv_bound} (docs/operating.md §5)")
    if mns <= level.max_num_seqs:
        what = (
            f"max_num_batched_tokens {cap}"
            if cap is not None and level.max_num_seqs >= cap
            else f"the KV bound {level.kv_bound}"
            if level.kv_bound is not None and level.max_num_seqs >= level.kv_bound
            else "the KV pool"
        )
        return _settle(
            st, p, f"max_num_seqs {level.max_num_seqs} is the most the launch allows ({what}): it is the knee"
        )
    return st.out(
        "exploring",
        "raise_max_num_seqs",
        Point(mns, level.gpu_memory_utilization),
        st.memo_for("exploring", p.held, None, None, p.steps, p.ceiling),
        f"raise max_num_seqs by {s.step_fraction:.0%}: {level.max_num_seqs} → {mns} (docs/operating.md §9)",
        *limits,
    )


def step_back(level: Level, proposed: Point, s: TuningSettings = DEFAULTS) -> Point | None:
    """A smaller proposal when ``proposed`` fails validation: halfway back towards the current level (the service
    re-validates it), a back-off never below the floor; None when nothing lies between."""
    mns = (level.max_num_seqs + proposed.max_num_seqs) // 2
    util = round((level.gpu_memory_utilization + proposed.gpu_memory_utilization) / 2, 4)
    if proposed.max_num_seqs < level.max_num_seqs:  # a back-off that fails validation: keep going down
        mns = max(floor_of(level.memo.initial or level.max_num_seqs, s), proposed.max_num_seqs // 2)
    cand = Point(mns, util)
    if (cand.max_num_seqs, cand.gpu_memory_utilization) in (
        (proposed.max_num_seqs, proposed.gpu_memory_utilization),
        (level.max_num_seqs, level.gpu_memory_utilization),
    ):
        return None
    return cand
