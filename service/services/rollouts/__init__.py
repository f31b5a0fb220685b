"""Staged rollouts: create a rollout (the target validated once per hardware shape, nothing stored on a
rejection), advance it one step at a time under a row lock (``tick``; the scheduler thread calls it), restore every
node it changed when failures pass the limit, and the operators' pause / resume / promote / abort.

Steps are idempotent: a wave's plans are signed in the same transaction that records them on the wave and its nodes
and moves the rollout on, so a scheduler that dies before the commit signed nothing, and one that dies after it
left a state the next scheduler (in any process) continues from. On PostgreSQL each step takes the rollout's row
with ``SELECT … FOR UPDATE SKIP LOCKED``: two workers or replicas never step the same rollout at once (the second
skips it); on SQLite the single write lock serializes them and a process-local lock keeps one tick per process.

The parts: creation.py (nodes, checks, the target judged and pinned), signing.py (a wave's chunks), stepping.py (one
step: observe, decide, act), restore.py (halt, rollback, abort's restores), commands.py (the operators' verbs),
views.py (what the API shows), scheduler.py (``tick`` and the thread); common.py holds what they share.
"""

from .commands import command
from .common import get
from .creation import create, plan_warnings
from .scheduler import RolloutScheduler, due, tick
from .stepping import step
from .views import list_rollouts, rollout_dict

__all__ = [
    "RolloutScheduler",
    "command",
    "create",
    "due",
    "get",
    "list_rollouts",
    "plan_warnings",
    "rollout_dict",
    "step",
    "tick",
]
