"""Staged rollouts, the pure part (service/domain/rollout.py): wave arithmetic, units, gates, the state machine."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.domain import rollout as R
from service.domain.errors import DomainError

W = R.Wave


# -- waves -------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "waves, field",
    [
        ([], "waves"),
        ([W(50), W(50), W(100)], "waves.1.percent"),  # not rising
        ([W(60), W(40), W(100)], "waves.1.percent"),  # falling
        ([W(0), W(100)], "waves.0.percent"),
        ([W(50), W(101)], "waves.1.percent"),
        ([W(10), W(50)], "waves.1.percent"),  # last is not 100
        ([W(10, bake_s=-1), W(100)], "waves.0.bake_s"),
        ([W(10, bake_s=R.MAX_BAKE_S + 1), W(100)], "waves.0.bake_s"),
        ([W(i + 1) for i in range(R.MAX_WAVES)] + [W(100)], "waves"),
    ],
)
def test_bad_waves_name_the_field(waves, field):
    with pytest.raises(DomainError) as e:
        R.check_waves(waves)
    assert e.value.field == field and e.value.rule == "rollout_waves"


def test_good_waves_pass():
    R.check_waves([W(10, 600), W(50, 600), W(100)])
    R.check_waves([W(100)])


def test_four_nodes_25_then_100():
    units = [("a",), ("b",), ("c",), ("d",)]
    assert R.wave_units(units, [W(25), W(100)]) == [[0], [1, 2, 3]]


def test_percent_rounds_up_and_first_wave_never_empty():
    units = [(f"n{i}",) for i in range(200)]
    got = R.wave_units(units, [W(1), W(10), W(50), W(100)])
    assert [len(w) for w in got] == [2, 18, 80, 100]
    tiny = R.wave_units([("a",), ("b",), ("c",)], [W(1), W(100)])
    assert tiny == [[0], [1, 2]]


def test_a_group_is_never_split_and_may_overshoot():
    # a two-node instance first: 25 % of 4 nodes is 1 node, but the unit is 2
    units = [("h", "w"), ("c",), ("d",)]
    assert R.wave_units(units, [W(25), W(50), W(100)]) == [[0], [], [1, 2]]


def test_units_join_target_and_previous_groups_transitively_in_order():
    order = ["a", "b", "c", "d", "e"]
    got = R.units(order, [("b", "c"), ("c", "d"), ("x", "a")])  # x is not in the rollout: ignored
    assert got == [("a",), ("b", "c", "d"), ("e",)]
    assert R.units(order, [("d", "a")]) == [("a", "d"), ("b",), ("c",), ("e",)]


@given(st.lists(st.integers(1, 4), min_size=1, max_size=60), st.lists(st.integers(1, 99), max_size=6, unique=True))
def test_every_unit_in_exactly_one_wave_in_order(sizes, percents):
    unit_list = [tuple(f"u{i}n{j}" for j in range(k)) for i, k in enumerate(sizes)]
    waves = [W(p) for p in sorted(percents)] + [W(100)]
    got = R.wave_units(unit_list, waves)
    flat = [u for w in got for u in w]
    assert flat == list(range(len(unit_list)))
    total = sum(sizes)
    done = 0
    for w, wave in zip(got, waves):
        done += sum(sizes[u] for u in w)
        assert done * 100 >= wave.percent * total  # never below the wave's share
    assert got[0]


# -- gates -------------------------------------------------------------------------------------------------------------

G = R.Gates(ready_timeout_s=300, kv_tolerance=0.2)


def test_failed_report_fails_the_node_with_evidence():
    o = R.node_outcome(R.Observed("a", 1000.0, failure=("failed", 1012.5, "CUDA out of memory")), G, 1020.0)
    assert o.state == "failed" and o.reason == "report_failed"
    assert o.evidence == {"status": "failed", "after_s": 12.5, "message": "CUDA out of memory"}


def test_an_exited_report_keeps_vllms_exit_status():
    o = R.node_outcome(R.Observed("a", 0.0, failure=("exited", 3.0, "vLLM exited"), exit_status=137), G, 4.0)
    assert o.reason == "report_exited" and o.evidence["exit_status"] == 137


def test_refused_and_exited_fail_too():
    for status in ("refused", "exited"):
        assert R.node_outcome(R.Observed("a", 0.0, failure=(status, 1.0, None)), G, 2.0).reason == f"report_{status}"


def test_running_with_kv_inside_tolerance_is_ready():
    o = R.node_outcome(
        R.Observed("a", 0.0, running_at=40.0, predicted_kv_tokens=400_000, measured_kv_tokens=360_000), G, 50.0
    )
    assert o.state == "ready" and o.evidence["kv_relative_error"] == -0.1


def test_running_with_kv_far_below_prediction_fails():
    o = R.node_outcome(
        R.Observed("a", 0.0, running_at=40.0, predicted_kv_tokens=400_000, measured_kv_tokens=200_000), G, 50.0
    )
    assert o.state == "failed" and o.reason == "kv_out_of_range" and o.evidence["kv_relative_error"] == -0.5


def test_kv_gate_off_and_missing_figures_pass():
    off = R.Gates(ready_timeout_s=300, kv_tolerance=None)
    assert (
        R.node_outcome(
            R.Observed("a", 0.0, running_at=1.0, predicted_kv_tokens=400_000, measured_kv_tokens=1), off, 2.0
        ).state
        == "ready"
    )
    missing = R.node_outcome(R.Observed("a", 0.0, running_at=1.0, predicted_kv_tokens=400_000), G, 2.0)
    assert missing.state == "ready"
    assert missing.evidence["kv_gate"] == "not judged: the running report carried no KV cache figure"
    unpredicted = R.node_outcome(R.Observed("a", 0.0, running_at=1.0, measured_kv_tokens=5), G, 2.0)
    assert unpredicted.evidence["kv_gate"] == "not judged: the plan has no KV cache prediction"
    assert R.node_outcome(R.Observed("a", 0.0, running_at=1.0), off, 2.0).evidence["kv_gate"] == (
        "not judged: kv_tolerance is null"
    )


def test_a_headless_worker_never_times_out_and_is_ready_with_its_head():
    assert R.node_outcome(R.Observed("w", 0.0, head_ready=False), G, 10_000.0).state == "pending"
    o = R.node_outcome(R.Observed("w", 0.0, head_ready=True), G, 10_000.0)
    assert o.state == "ready" and o.evidence == {"ready_with_head": True}
    failed = R.node_outcome(R.Observed("w", 0.0, failure=("exited", 5.0, None), head_ready=True), G, 6.0)
    assert failed.state == "failed" and failed.reason == "report_exited"  # its own failure still fails the unit


def test_not_ready_in_time_fails_after_the_timeout_only():
    assert R.node_outcome(R.Observed("a", 0.0), G, 300.0).state == "pending"
    o = R.node_outcome(R.Observed("a", 0.0), G, 300.5)
    assert o.state == "failed" and o.reason == "not_ready" and o.evidence["ready_timeout_s"] == 300


def test_metrics_hook_can_fail_a_running_node():
    hook = lambda o: R.Outcome("failed", "p99_too_high", {"p99_s": 9.0})  # noqa: E731
    o = R.node_outcome(R.Observed("a", 0.0, running_at=1.0), G, 2.0, metrics_gate=hook)
    assert o.state == "failed" and o.reason == "p99_too_high" and o.evidence["p99_s"] == 9.0


def test_unit_outcome_group_head_and_worker():
    ready, pending, failed = R.Outcome("ready"), R.Outcome("pending"), R.Outcome("failed", "report_failed")
    assert R.unit_outcome([ready, pending], [True, False]).state == "ready"  # a headless worker need not report
    assert R.unit_outcome([pending, ready], [True, False]).state == "pending"
    assert R.unit_outcome([ready, failed], [True, False]).state == "failed"  # a worker's failure ends the instance
    assert R.unit_outcome([ready, pending]).state == "pending"


# -- the state machine: one test per transition ------------------------------------------------------------------------

WAVES = (W(25, 60), W(100, 0))


def view(**kw):
    base = dict(state="pending", wave=-1, waves=WAVES, failure_limit=0, failures=0, wave_units=0, wave_settled=0)
    return R.View(**{**base, **kw})


def test_pending_signs_wave_0():
    assert R.step(view(), 0.0) == R.Decision("sign", "waiting", 0)


def test_waiting_stays_until_every_unit_settles():
    assert R.step(view(state="waiting", wave=0, wave_units=2, wave_settled=1), 0.0).action == "none"


def test_waiting_settled_starts_the_bake():
    d = R.step(view(state="waiting", wave=0, wave_units=1, wave_settled=1), 100.0)
    assert (d.action, d.state, d.bake_until) == ("bake", "baking", 160.0)


def test_baking_waits_for_the_bake_then_signs_the_next_wave():
    assert R.step(view(state="baking", wave=0, bake_until=160.0), 159.0).action == "none"
    assert R.step(view(state="baking", wave=0, bake_until=160.0), 160.0) == R.Decision("sign", "waiting", 1)


def test_promote_skips_the_bake():
    assert R.step(view(state="baking", wave=0, bake_until=160.0, promote=True), 0.0).action == "sign"
    assert R.step(view(state="waiting", wave=0, wave_units=1, wave_settled=1, promote=True), 0.0).action == "sign"


def test_last_wave_without_bake_completes():
    d = R.step(view(state="waiting", wave=1, wave_units=3, wave_settled=3), 0.0)
    assert (d.action, d.state) == ("complete", "completed")


def test_failures_over_the_limit_halt_from_waiting_baking_and_paused():
    for state in ("waiting", "baking", "paused"):
        d = R.step(view(state=state, wave=0, failures=1, bake_until=10.0), 0.0)
        assert (d.action, d.state) == ("halt", "halted") and "failure_limit 0" in d.reason


def test_failures_up_to_the_limit_do_not_halt():
    d = R.step(view(state="waiting", wave=0, failures=1, failure_limit=1, wave_units=1, wave_settled=1), 0.0)
    assert d.action == "bake"


def test_paused_does_not_advance():
    assert R.step(view(state="paused", wave=0, wave_units=1, wave_settled=1), 1e9).action == "none"


def test_final_and_halted_states_do_nothing():
    for state in ("completed", "rolled_back", "aborted", "halted"):
        assert R.step(view(state=state, failures=5), 0.0).action == "none"


def test_operator_commands():
    assert R.command("baking", "pause") == "paused"
    assert R.command("paused", "resume") == "resume"
    assert R.command("baking", "promote") == "baking"
    assert R.command("waiting", "abort") == R.command("halted", "abort") == "aborted"
    for state, verb in (
        ("paused", "pause"),
        ("waiting", "resume"),
        ("paused", "promote"),
        ("completed", "abort"),
        ("rolled_back", "pause"),
        ("halted", "pause"),
    ):
        with pytest.raises(DomainError):
            R.command(state, verb)


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.booleans(), st.sampled_from(["tick", "pause", "resume", "promote"])),
        max_size=60,
    ),
    st.integers(0, 2),
)
def test_random_runs_sign_each_wave_once_in_order_and_halt_only_past_the_limit(events, limit):
    """Drive the state machine with random outcomes and operator commands: waves are signed 0, 1, 2 in order, each
    once; it completes only after the last; it halts only when failures pass the limit."""
    waves = (W(25, 10), W(50, 0), W(100, 10))
    state, wave, failures, settled, bake_until, promote, paused_from = "pending", -1, 0, 0, None, False, None
    signed: list[int] = []
    now = 0.0
    for settle, fails, what in events:
        now += 7
        if what in ("pause", "resume", "promote") and state not in R.FINAL and state != "halted":
            try:
                R.command(state, what)
            except DomainError:
                continue
            if what == "pause":
                state, paused_from = "paused", state
            elif what == "resume":
                state = paused_from
            else:
                promote = True
            continue
        if state == "waiting":
            settled = min(2, settled + settle)
            failures += int(fails and settle > 0)
        d = R.step(R.View(state, wave, waves, limit, failures, 2, settled, bake_until, promote), now)
        if d.action == "halt":
            assert failures > limit
        if d.action == "sign":
            signed.append(d.wave)
            settled, promote = 0, False
        if d.action == "complete":
            assert wave == len(waves) - 1 and failures <= limit
        if d.action in ("sign", "bake", "complete", "halt"):
            state, wave, bake_until = d.state, d.wave, d.bake_until
    assert signed == list(range(len(signed)))


# -- edge cases: empty waves, bakes, limits ---------------------------------------------------------------------------


def test_empty_waves_are_skipped_without_a_bake():
    v = R.View(
        state="waiting",
        wave=0,
        waves=(W(25), W(50, bake_s=3600), W(75, bake_s=60), W(100)),
        failure_limit=0,
        failures=0,
        wave_units=1,
        wave_settled=1,
        wave_sizes=(2, 0, 0, 2),
    )
    assert R.step(v, 0) == R.Decision("sign", "waiting", 3)
    done = R.View(
        state="baking",
        wave=1,
        waves=(W(50), W(75), W(100)),
        failure_limit=0,
        failures=0,
        wave_units=1,
        wave_settled=1,
        bake_until=5,
        wave_sizes=(2, 2, 0),
    )
    assert R.step(done, 10).action == "complete"


def test_restoring_states_restore_until_done_and_take_only_abort():
    for state in R.RESTORING:
        v = R.View(state=state, wave=0, waves=(W(100),), failure_limit=0, failures=3, wave_units=1, wave_settled=1)
        assert R.step(v, 0) == R.Decision("restore", state, 0)
        for verb in ("pause", "resume", "promote"):
            with pytest.raises(DomainError):
                R.command(state, verb)
    assert R.command("rolling_back", "abort") == "aborted"
    with pytest.raises(DomainError, match="aborting"):
        R.command("aborting", "abort")


def test_a_second_promote_is_refused_and_pending_takes_one():
    assert R.command("pending", "promote") == "pending"
    with pytest.raises(DomainError, match="already promoted"):
        R.command("pending", "promote", promoted=True)


def test_a_unit_superseded_by_hand_is_settled_not_failed():
    hand = R.Outcome("superseded_by_hand")
    assert R.unit_outcome([hand]).state == "superseded_by_hand"
    assert R.unit_outcome([R.Outcome("ready"), hand]).state == "ready"
    assert R.unit_outcome([hand, R.Outcome("pending")], [True, True]).state == "pending"
