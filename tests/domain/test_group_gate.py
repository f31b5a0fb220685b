"""The worker's gate (domain/group_gate.py): a worker of a multi-node group takes its plan only once the head has
reported the same plan (same assignment: plan, group, digest) started or running."""

from __future__ import annotations

import pytest

from service.domain.group_gate import changes_hold, group_hold

D = "a" * 64


def hold(**kw):
    args = dict(
        role="worker",
        plan_id="p-new",
        group=0,
        head="head-1",
        head_assigned=True,
        head_digest=D,
        own_digest=D,
        head_report=None,
    )
    return group_hold(**{**args, **kw})


@pytest.mark.parametrize("role", ["head", "replica", None])
def test_heads_replicas_and_plans_without_topology_are_never_held(role):
    assert hold(role=role, head_report=None) is None
    assert hold(role=role, head_report="refused") is None


@pytest.mark.parametrize("report", ["started", "running"])
def test_a_worker_goes_once_its_head_started_the_same_plan(report):
    assert hold(head_report=report) is None


def test_a_worker_waits_while_its_head_has_not_reported_the_new_plan():
    # the head still runs the old plan: its reports land on the old assignment, the new one has none
    h = hold(head_report=None)
    assert (h.reason, h.final, h.head, h.head_report) == ("head_pending", False, "head-1", None)
    assert "head-1" in h.message and "p-new" in h.message and "group 0" in h.message


def test_fetched_is_not_enough_the_head_may_still_refuse():
    h = hold(head_report="fetched")
    assert (h.reason, h.final) == ("head_fetched", False)


@pytest.mark.parametrize("report", ["stopped", "exited"])
def test_a_head_that_ran_and_ended_holds_its_workers_until_it_starts_again(report):
    h = hold(head_report=report)
    assert (h.reason, h.final, h.head_report) == ("head_not_running", False, report)


@pytest.mark.parametrize("report", ["refused", "failed"])
def test_a_head_that_refused_or_failed_the_plan_holds_its_workers_for_good(report):
    h = hold(head_report=report)
    assert (h.reason, h.final, h.head_report) == ("head_refused", True, report)
    assert f"reported plan p-new (group 0) {report}" in h.message and "does not start it" in h.message
    assert h.as_dict() == {
        "reason": "head_refused",
        "message": h.message,
        "final": True,
        "head": "head-1",
        "head_report": report,
    }


def test_no_active_head_assignment_holds():
    h = hold(head_assigned=False, head=None, head_digest=None, head_report=None)
    assert (h.reason, h.final, h.head) == ("head_missing", False, "the head")


def test_a_digest_mismatch_is_left_to_the_agents_signed_check():
    # delivered: the freshness statement's head_group_digest makes the agent refuse it (agent/verify.py)
    assert hold(head_digest="f" * 64, head_report=None) is None


def test_only_reports_that_change_the_answer_refresh_the_caches():
    assert changes_hold(None, "fetched") and changes_hold("fetched", "started") and changes_hold("running", "exited")
    assert changes_hold("started", "refused") and changes_hold("exited", "started")
    assert not changes_hold("started", "running") and not changes_hold("stopped", "exited")
    assert not changes_hold("refused", "failed") and not changes_hold(None, "heartbeat")
