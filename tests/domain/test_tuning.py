"""The tuning loop's state machine (service/domain/tuning.py): each transition with the windows that cause it."""

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from service.domain.tuning import DEFAULTS, Level, Memo, Point, Slo, TuningSettings, Window, decide, judge, step_back

PLAN = "plan-a"


def win(i, *, running=64, waiting=20, kv=0.5, pre=0, ttft=0.3, e2e=4.0, plan=PLAN, window_s=15.0):
    return Window(i, plan, window_s, running, waiting, kv, pre, ttft, e2e, 900.0)


def windows(n=4, **kw):
    return [win(i, **kw) for i in range(1, n + 1)]  # window 1 is the warm-up, 2..n judged


def level(mns=64, util=0.85, memo=None, cap=None, plan=PLAN):
    return Level(plan, mns, util, memo or Memo(), cap)


def test_too_few_windows_measure_and_keep_the_plan():
    d = decide(level(), windows(3))  # warm-up + 2 judged: 3 are needed
    assert (d.state, d.action, d.next) == ("exploring", "measure", None)
    assert d.evidence == (2, 3)
    assert "2 of the 3 windows" in d.reasons[0]


def test_windows_of_other_plans_are_not_evidence():
    ws = windows(4) + [win(9, plan="plan-old", pre=50)]
    d = decide(level(), ws)
    assert 9 not in d.evidence and d.action == "raise_max_num_seqs"


def test_no_load_is_not_a_test_of_the_level():
    d = decide(level(), windows(4, running=10, waiting=0))
    assert (d.action, d.next) == ("measure", None)
    assert "not under load" in d.reasons[0]


def test_held_under_load_raises_max_num_seqs_by_a_step():
    d = decide(level(64), windows(4))
    assert (d.state, d.action) == ("exploring", "raise_max_num_seqs")
    assert d.next == Point(80, 0.85)  # 64 × 1.25
    assert d.memo.held == Point(64, 0.85, PLAN) and d.memo.failed is None
    assert d.evidence == (2, 3, 4)


def test_a_full_batch_without_a_queue_counts_as_load():
    d = decide(level(64), windows(4, running=62, waiting=0))  # 62 ≥ 0.95 × 64
    assert d.action == "raise_max_num_seqs"


def test_pool_at_high_water_raises_utilization_first_up_to_the_cap():
    d = decide(level(64, 0.85), windows(4, kv=0.9))
    assert (d.action, d.next) == ("raise_gpu_memory_utilization", Point(64, 0.875))
    d = decide(level(64, 0.875), windows(4, kv=0.9))
    assert d.next == Point(64, 0.9)
    d = decide(level(64, 0.90), windows(4, kv=0.95))  # at the cap: max_num_seqs again
    assert d.action == "raise_max_num_seqs" and d.next == Point(80, 0.9)


def test_one_outlier_window_does_not_fail_a_level():
    ws = windows(4)
    ws[2] = win(3, pre=40)  # one burst among three judged windows
    d = decide(level(64), ws)
    assert d.action == "raise_max_num_seqs"
    assert any("outlier" in r for r in d.reasons)


def test_preemptions_in_two_of_three_windows_find_the_knee_between_held_and_failed():
    memo = Memo(held=Point(80, 0.9, "p80"))
    d = decide(level(100, 0.9, memo), windows(4, pre=5))  # 5 per 15 s = 20/min
    assert (d.state, d.action) == ("exploring", "refine")
    assert d.next == Point(90, 0.9)  # the midpoint of 80 (held) and 100 (failed)
    assert d.memo.failed == Point(100, 0.9, PLAN) and d.memo.held == Point(80, 0.9, "p80")
    assert any("preemptions climb" in r for r in d.reasons)


def test_refining_keeps_the_bracket_and_settles_when_it_is_narrow():
    memo = Memo(held=Point(80, 0.9, "p80"), failed=Point(100, 0.9, "p100"))
    d = decide(level(90, 0.9, memo), windows(4))  # 90 held: bracket 90..100
    assert d.action == "refine" and d.next == Point(95, 0.9)
    memo = Memo(held=Point(92, 0.9, "p92"), failed=Point(100, 0.9, "p100"))
    d = decide(level(96, 0.9, memo), windows(4, pre=3))  # 96 fails: 92..96 is within 5 % of 92
    assert (d.state, d.action) == ("knee_found", "settle")
    assert d.next == Point(73, 0.9)  # 0.8 × 92
    assert d.memo.state == "settled" and d.memo.knee == 92 and d.memo.failed == Point(96, 0.9, PLAN)


def test_p99_beyond_the_slo_fails_a_level_like_preemptions():
    slo = Slo(e2e_p99_s=10.0)
    d = decide(level(64, memo=Memo(slo=slo, held=Point(62, 0.85, "p62"))), windows(4, e2e=12.0))
    assert d.action == "settle" and d.next == Point(49, 0.85)  # 62..64 is narrow: 0.8 × 62
    assert not decide(level(64, memo=Memo(slo=slo)), windows(4, e2e=9.0)).action == "settle"


def test_p99_slo_refines_a_wide_bracket():
    slo = Slo(e2e_p99_s=10.0)
    d = decide(level(64, memo=Memo(slo=slo, held=Point(40, 0.85, "p40"))), windows(4, e2e=12.0))
    assert d.action == "refine" and d.next == Point(52, 0.85)
    assert any("beyond the SLO" in r for r in d.reasons)


def test_settled_holds_and_backs_off_after_a_preemption_burst():
    memo = Memo(state="settled", held=Point(90, 0.9, "p90"), knee=90)
    d = decide(level(72, 0.9, memo), windows(4))
    assert (d.state, d.action, d.next) == ("settled", "hold", None)
    d = decide(level(72, 0.9, memo), windows(4, pre=4))
    assert (d.state, d.action) == ("backing_off", "back_off")
    assert d.next == Point(57, 0.9)  # 72 × 0.8
    assert d.memo.state == "backing_off" and d.memo.knee == 90


def test_settled_ignores_one_burst_window():
    memo = Memo(state="settled", knee=90)
    ws = windows(4)
    ws[-1] = win(4, pre=30)
    assert decide(level(72, 0.9, memo), ws).action == "hold"


def test_the_starting_level_failing_halves():
    d = decide(level(64), windows(4, pre=9))
    assert (d.state, d.action, d.next) == ("exploring", "back_off", Point(32, 0.85))


def test_max_num_batched_tokens_caps_the_step_and_is_then_the_knee():
    d = decide(level(100, 0.9, cap=110), windows(4))
    assert d.next == Point(110, 0.9)
    d = decide(level(110, 0.9, memo=Memo(held=Point(100, 0.9)), cap=110), windows(4))
    assert d.action == "settle" and d.memo.knee == 110 and d.next == Point(88, 0.9)


def test_failure_right_after_a_utilization_raise_pins_the_utilization():
    memo = Memo(held=Point(64, 0.85, "p1"))
    d = decide(level(64, 0.875, memo), windows(4, pre=6))
    assert d.memo.util_ceiling == 0.85
    assert d.next == Point(51, 0.85) and d.action == "settle"


def test_step_back_goes_halfway_and_ends():
    lv = level(64, 0.85)
    assert step_back(lv, Point(80, 0.85)) == Point(72, 0.85)
    assert step_back(lv, Point(65, 0.85)) is None
    assert step_back(lv, Point(32, 0.85)) == Point(16, 0.85)


def test_judge_uses_only_the_newest_windows():
    ws = [win(i, pre=20) for i in range(1, 5)] + [win(i) for i in range(5, 8)]
    v = judge(level(), ws)
    assert v.outcome == "held" and v.evidence == (5, 6, 7)


def test_memo_round_trips_and_survives_garbage():
    m = Memo(
        state="settled",
        held=Point(9, 0.9, "x"),
        failed=Point(12, 0.9, "y"),
        knee=9,
        steps=4,
        util_ceiling=0.875,
        slo=Slo(1.0, 20.0),
        auto_apply=True,
    )
    assert Memo.from_dict(m.as_dict()) == m
    assert Memo.from_dict({"state": "nonsense", "held": {"max_num_seqs": "x"}, "knee": float("nan")}) == Memo()
    assert Memo.from_dict(None) == Memo()


def test_settings_are_checked():
    with pytest.raises(ValueError, match="util_cap"):
        TuningSettings(util_cap=0.95)  # never above the production cap
    with pytest.raises(ValueError, match="fail_windows"):
        TuningSettings(windows=3, fail_windows=4)
    assert DEFAULTS.production_fraction == 0.8 and DEFAULTS.util_cap == 0.90


def test_preflight_tuning_refuses_a_fraction_for_a_count(tmp_path):
    from service.settings import Settings

    # windows slices the newest windows: 2.5 passed the range checks at start-up, then judge() raised TypeError
    with pytest.raises(ValueError, match="PREFLIGHT_TUNING: fail_windows, windows must be a whole number"):
        Settings(data_dir=tmp_path, tuning={"windows": 2.5, "fail_windows": 2.0})
    s = Settings(data_dir=tmp_path, tuning={"windows": 5, "fail_windows": 3, "step_fraction": 1})
    assert (s.tuning_settings.windows, s.tuning_settings.fail_windows, s.tuning_settings.step_fraction) == (5, 3, 1)


def test_every_reason_cites_what_a_user_can_open():
    from tests.support.sources import unresolved

    memo = Memo(held=Point(80, 0.9, "p80"))
    decisions = [
        decide(level(), windows(3)),
        decide(level(), windows(4, running=1, waiting=0)),
        decide(level(64), windows(4)),
        decide(level(64, 0.85), windows(4, kv=0.9)),
        decide(level(100, 0.9, memo), windows(4, pre=5)),
        decide(level(96, 0.9, Memo(held=Point(92, 0.9), failed=Point(100, 0.9))), windows(4, pre=3)),
        decide(level(72, 0.9, Memo(state="settled", knee=90)), windows(4, pre=4)),
        decide(level(64, memo=Memo(slo=Slo(e2e_p99_s=1.0), held=Point(40, 0.85))), windows(4, e2e=9.0)),
        decide(level(110, 0.9, memo=Memo(held=Point(100, 0.9)), cap=110), windows(4)),
    ]
    assert {d.action for d in decisions} == {
        "measure",
        "raise_max_num_seqs",
        "raise_gpu_memory_utilization",
        "refine",
        "settle",
        "back_off",
    }
    for d in decisions:
        for r in d.reasons:
            assert not unresolved(r), r
    assert any("docs/operating.md §" in r for d in decisions for r in d.reasons)


finite = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)


@hsettings(max_examples=400, deadline=None)
@given(
    mns=st.integers(1, 5000),
    util=st.sampled_from([0.5, 0.8, 0.85, 0.875, 0.9]),
    cap=st.one_of(st.none(), st.integers(1, 8192)),
    state=st.sampled_from(["exploring", "settled", "backing_off"]),
    held=st.one_of(st.none(), st.integers(1, 5000)),
    failed=st.one_of(st.none(), st.integers(1, 5000)),
    ws=st.lists(st.tuples(finite, finite, st.floats(0, 1), finite, st.one_of(st.none(), finite)), max_size=8),
)
def test_any_windows_give_a_bounded_proposal(mns, util, cap, state, held, failed, ws):
    memo = Memo(state=state, held=Point(held, util) if held else None, failed=Point(failed, util) if failed else None)
    lv = Level(PLAN, mns, util, memo, cap)
    windows_ = [Window(i + 1, PLAN, 15.0, r, w, kv, p, None, e) for i, (r, w, kv, p, e) in enumerate(ws)]
    d = decide(lv, windows_)
    assert set(d.evidence) <= {w.id for w in windows_}
    if d.next is not None:
        assert d.next.max_num_seqs >= 1 and d.next.gpu_memory_utilization <= max(util, DEFAULTS.util_cap)
        assert cap is None or d.next.max_num_seqs <= max(cap, mns)
        assert (d.next.max_num_seqs, d.next.gpu_memory_utilization) != (mns, util) or d.action == "settle"
    assert Memo.from_dict(d.memo.as_dict()) == d.memo


def _drive(start, ws_of, *, cap=None, kv_bound=None, limit=60):
    """Apply every proposal as the service would (a new plan per step) and return the decisions in order."""
    lvl, out = Level("p0", start.max_num_seqs, start.gpu_memory_utilization, Memo(), cap, kv_bound), []
    for i in range(limit):
        d = decide(lvl, [win(j, plan=lvl.plan, **ws_of(lvl)) for j in range(1, 5)])
        out.append(d)
        if d.next is None:
            break
        lvl = Level(f"p{i + 1}", d.next.max_num_seqs, d.next.gpu_memory_utilization, d.memo, cap, kv_bound)
    return out


def test_kv_pool_limit_settles_where_running_saturates_instead_of_walking_max_num_seqs_up():
    # Llama-70B TP8 initial plan 312 @ 0.85, max_num_batched_tokens 8192; the pool is full,
    # 50 wait, only 300 ever run, no preemptions. The old loop raised max_num_seqs 13 times to 8192.
    ds = _drive(Point(312, 0.85), lambda lvl: dict(running=300, waiting=50, kv=0.95, pre=0), cap=8192)
    actions = [d.action for d in ds]
    assert actions == [
        "raise_gpu_memory_utilization",
        "raise_gpu_memory_utilization",
        "raise_max_num_seqs",
        "settle",
        "hold",
    ]
    assert max(d.next.max_num_seqs for d in ds if d.next) == 375  # 300 ran × 1.25, never 8192
    settle = ds[3]
    assert settle.next == Point(240, 0.9)  # 0.8 × 300 (where running saturated), utilization at the cap
    assert settle.memo.knee == 300 and settle.memo.saturation == 300 and settle.memo.state == "settled"
    assert any("KV pool is the limit" in r and "§5, §9" in r for r in settle.reasons)


def test_pool_full_at_the_utilization_cap_settles_at_once_when_few_run():
    d = decide(level(600, 0.9, Memo(initial=312)), windows(4, running=300, waiting=50, kv=0.95))
    assert (d.state, d.action, d.next) == ("knee_found", "settle", Point(240, 0.9))
    assert d.memo.knee == 300


def test_the_plans_kv_bound_is_a_ceiling():
    lv = Level(PLAN, 90, 0.9, Memo(), None, 100)
    d = decide(lv, windows(4, running=90))
    assert (d.action, d.next) == ("raise_max_num_seqs", Point(100, 0.9))  # not 112
    assert any("KV bound 100" in r for r in d.reasons)
    d = decide(Level(PLAN, 100, 0.9, Memo(), None, 100), windows(4, running=100))
    assert (d.action, d.next, d.memo.knee) == ("settle", Point(80, 0.9), 100)


def test_a_level_that_keeps_preempting_stops_at_the_floor_as_stuck():
    # noisy windows at every level: the old loop halved 64 → 32 → ... → 1
    ds = _drive(Point(64, 0.85), lambda lvl: dict(pre=5))
    assert [d.next.max_num_seqs for d in ds if d.next] == [32, 16]  # floor 0.25 × 64 = 16
    assert (ds[-1].state, ds[-1].action, ds[-1].next) == ("stuck", "hold", None)
    assert any("floor" in r for r in ds[-1].reasons) and any("needs a person" in r for r in ds[-1].reasons)


def test_floor_is_a_setting_and_at_least_one():
    s = TuningSettings(floor_fraction=0.5)
    d = decide(level(64, memo=Memo(initial=64)), windows(4, pre=5), s)
    assert d.next == Point(32, 0.85)
    d = decide(level(32, memo=Memo(initial=64, failed=Point(64, 0.85))), windows(4, pre=5), s)
    assert (d.state, d.next) == ("stuck", None)
    d = decide(level(1, memo=Memo(initial=1)), windows(4, pre=5, running=1))
    assert (d.state, d.next) == ("stuck", None)
    with pytest.raises(ValueError, match="floor_fraction"):
        TuningSettings(floor_fraction=0)


def test_settled_back_off_honours_max_steps_and_the_floor():
    burst = windows(4, pre=5)
    d = decide(level(80, memo=Memo("settled", Point(100, 0.9, "p"), None, 100, 24, initial=64)), burst)
    assert (d.state, d.action, d.next) == ("stuck", "hold", None)  # 24 plans made: no 25th
    assert any("max_steps 24" in r for r in d.reasons)
    d = decide(level(16, memo=Memo("backing_off", Point(20, 0.9, "p"), None, 20, 5, initial=64)), burst)
    assert (d.state, d.next) == ("stuck", None)  # 16 is 0.25 × 64: no lower
    d = decide(level(20, memo=Memo("backing_off", Point(25, 0.9, "p"), None, 25, 5, initial=64)), burst)
    assert (d.action, d.next) == ("back_off", Point(16, 0.85))  # 0.8 × 20 = 16, the floor
    assert d.memo.initial == 64 and d.memo.steps == 6


def test_exploring_without_a_held_level_stops_at_max_steps():
    memo = Memo(failed=Point(128, 0.85), steps=24, initial=256)
    d = decide(level(128, memo=memo), windows(4, pre=5))
    assert (d.state, d.next) == ("stuck", None)


def test_a_stuck_memo_holds():
    d = decide(level(64, memo=Memo("stuck", steps=3)), windows(4, pre=5))
    assert (d.state, d.action, d.next) == ("stuck", "hold", None)


def test_step_back_of_a_back_off_keeps_the_floor():
    lv = level(20, memo=Memo(initial=64))
    assert step_back(lv, Point(17, 0.85)) == Point(16, 0.85)
    assert step_back(lv, Point(16, 0.85)) is None


def test_memo_carries_initial_and_saturation():
    m = Memo("stuck", initial=312, saturation=300)
    assert Memo.from_dict(m.as_dict()) == m
    assert Memo.from_dict({"initial": -3, "saturation": float("nan")}).initial is None
