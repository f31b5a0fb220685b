"""When a worker of a multi-node group may take its plan: only once the group's head runs that same plan.

vLLM's multi-node start-up is head-first. In the multiprocessing form (``--nnodes k --node-rank r --master-addr
HEAD``, docs/serving/parallelism_scaling.md "Running vLLM with MultiProcessing": the head node is chosen and started,
the other nodes add ``--headless``) every worker joins the torch.distributed store the head serves at
``--master-addr:--master-port``. In the data-parallel form a headless node's engine cores connect to the head's
handshake socket at ``--data-parallel-address:--data-parallel-rpc-port`` without binding it, send HELLO and wait for
the head's init message at most ``HANDSHAKE_TIMEOUT_MINS`` (5) minutes, then fail with "Did not receive response
from front-end process within 5 minutes" (vllm/v1/engine/core.py, ``EngineCoreProc._perform_handshake`` →
``make_zmq_socket(..., bind=False)`` and ``startup_handshake`` → ``handshake_socket.poll(timeout=
HANDSHAKE_TIMEOUT_MINS * 60_000)``, vllm-project/vllm 00080ee13c7a). So a worker tolerates a head that starts a
little after it, but nothing tells it that what listens at the head's address is the head of *its* plan: a head still
on the previous plan (it learns of the new one at its next heartbeat) would be joined by, or refuse, a worker of
another configuration.

Hence the gate: a worker's plan is delivered only after the head has reported the *same* assignment (the same plan
and group, so the same group digest and the head's seq for it) ``started`` or ``running``. Not ``running`` alone: in a
multi-node instance the head's API server is ready only after every rank joined, so waiting for it would deadlock.
Not ``fetched``: the head may still refuse the plan (its node checks) before vLLM starts. A head that reported this
plan ``stopped`` or ``exited`` is not serving it (its supervisor may start it again: the worker waits); one that
``refused`` it, or whose run ``failed``, will not start it: the worker does not either, and says why.

Pure: the service (services/plans.py ``heads_of``) reads the head's assignment and last report, this decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

STARTED = ("started", "running")  # the head's vLLM of this plan is up (or coming up): workers may join it
NOT_RUNNING = ("stopped", "exited")  # it ran and ended: it may be started again
REFUSED = ("refused", "failed")  # the head will not run this plan


@dataclass(frozen=True)
class Hold:
    """Why a worker may not take its plan yet. ``final``: the head refused the plan (it will not start it unless its
    agent boots again); otherwise waiting may end it."""

    reason: str  # head_pending | head_fetched | head_not_running | head_refused | head_missing
    message: str
    final: bool
    head: str
    head_report: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "message": self.message,
            "final": self.final,
            "head": self.head,
            "head_report": self.head_report,
        }


def group_hold(
    *,
    role: str | None,
    plan_id: str,
    group: int | None,
    head: str | None,
    head_assigned: bool,
    head_digest: str | None,
    own_digest: str | None,
    head_report: str | None,
) -> Hold | None:
    """None when the node may take its plan now; else why it waits.

    ``role``: the node's role in its plan (replica | head | worker; None for plans before topologies). ``head``: the
    group's rank-0 node; ``head_assigned``: it holds an active assignment of the same plan and group, whose group
    digest is ``head_digest`` and whose last report is ``head_report`` (None: nothing reported yet). A head whose
    digest differs from ``own_digest`` is not held here: the plan is delivered and the agent refuses it against the
    signed ``head_group_digest`` of its freshness statement (agent/verify.py), the check that needs no trust in this
    answer."""
    if role != "worker":
        return None
    name = head or "the head"
    where = f"plan {plan_id} (group {group})"
    if not head_assigned:
        return Hold(
            "head_missing",
            f"the head {name} holds no current assignment of {where}: this worker waits for it",
            False,
            name,
            None,
        )
    if head_digest != own_digest:
        return None
    if head_report in STARTED:
        return None
    if head_report in REFUSED:
        return Hold(
            "head_refused",
            f"the head {name} reported {where} {head_report}: this worker does not start it",
            True,
            name,
            head_report,
        )
    if head_report in NOT_RUNNING:
        return Hold(
            "head_not_running",
            f"the head {name} reported {where} {head_report}: this worker waits until the head starts it again",
            False,
            name,
            head_report,
        )
    if head_report == "fetched":
        return Hold(
            "head_fetched",
            f"the head {name} has fetched {where} but not started vLLM yet: this worker waits for it",
            False,
            name,
            head_report,
        )
    return Hold(
        "head_pending",
        f"the head {name} has not started {where} yet (it may still run an earlier plan): this worker waits for it",
        False,
        name,
        head_report,
    )


def _stage(head_report: str | None) -> str:
    return (
        "started"
        if head_report in STARTED
        else "refused"
        if head_report in REFUSED
        else "not_running"
        if head_report in NOT_RUNNING
        else "fetched"
        if head_report == "fetched"
        else "pending"
    )


def changes_hold(before: str | None, after: str | None) -> bool:
    """Whether a head's report moving its last report from ``before`` to ``after`` changes what its workers are
    answered (``started`` → ``running`` does not: both let them start). The service refreshes the agents' caches
    only then."""
    return _stage(before) != _stage(after)
