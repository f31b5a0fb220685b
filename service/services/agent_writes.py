"""Group commit for the agents' hot path: fetches that must touch the database and reports, from many concurrent
requests, run as one transaction per batch.

A fleet booting at once sends each of its agents' first fetch (authenticate, read the node's assignment, record the
fetch) and report (record it) at the same moment. One transaction per request costs a commit, a connection checkout
and a handful of statements each; here the requests of one process queue up while the previous batch commits, and
the next batch runs them together: one token query, one assignment query, one UPDATE, one audit INSERT, one commit
(services/agent_serving.py ``serve_to_agents``, services/reports.py ``report_many``). A quiet service does not wait to fill a batch: a lone
request runs at once as a batch of one.

Each request gets its own outcome: a request that fails its own checks (unknown token, another node's token, an
unregistered node, a plan never assigned to the node) gets its error and writes nothing, without failing the others.
A request is answered only after its batch has committed, so an acknowledged fetch record or report is durable.
When a batch fails in the database for a reason that could be one request's data (an integrity or data error), its
requests are retried one per transaction so only the offending one fails; a connection failure fails the batch
(503, the agents retry).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import InterfaceError, OperationalError

from ..clock import SYSTEM, Clock
from ..errors import ApiError, Unauthorized
from . import tokens as token_service
from .agent_serving import AgentFetch, serve_to_agents
from .reports import AgentReport, report_many

log = logging.getLogger("preflight.agent_writes")
MAX_BATCH = 256  # requests per transaction
THREADS = 2  # batches in flight per process (one preparing while another commits)


@dataclass(frozen=True)
class Fetch:
    """A fetch the plan cache could not answer: ``principal`` is None when the token must be looked up."""

    secret: str
    principal: token_service.Principal | None
    node: str
    etags: tuple[str, ...]


@dataclass(frozen=True)
class Report:
    principal: token_service.Principal
    node: str
    plan_id: str | None  # None: a refused or reset report naming no plan
    status: str
    message: str | None
    details: dict[str, Any]


class AgentWrites:
    """The per-process batcher. ``fetch`` and ``report`` are awaited from the event loop; ``THREADS`` daemon threads
    (started on first use) run the batches with the service's ``Database``."""

    def __init__(self, db, *, clock: Clock = SYSTEM, threads: int = THREADS, max_batch: int = MAX_BATCH):
        self.db, self.clock, self.threads, self.max_batch = db, clock, threads, max_batch
        self._queue: collections.deque[tuple[Fetch | Report, asyncio.Future]] = collections.deque()
        self._cv = threading.Condition()
        self._workers: list[threading.Thread] = []
        self._stopping = False

    async def fetch(self, item: Fetch) -> tuple[token_service.Principal, dict | None, bool]:
        """(principal, the node's current assignment dict or None, served). Raises Unauthorized, Forbidden,
        NotFound (unregistered node), or the database's error."""
        return await self._submit(item)

    async def report(self, item: Report) -> dict[str, Any]:
        """The stored report ``{"id", "plan_id", "node", "status"}``. Raises NotFound or the database's error."""
        return await self._submit(item)

    async def _submit(self, item: Fetch | Report):
        fut = asyncio.get_running_loop().create_future()
        with self._cv:
            if self._stopping or len(self._workers) < self.threads or not all(w.is_alive() for w in self._workers):
                self._start()
            self._queue.append((item, fut))
            self._cv.notify()
        return await fut

    def _start(self) -> None:
        self._stopping = False
        self._workers = [w for w in self._workers if w.is_alive()]
        while len(self._workers) < self.threads:
            w = threading.Thread(target=self._run, name=f"agent-writes-{len(self._workers)}", daemon=True)
            w.start()
            self._workers.append(w)

    def stop(self, timeout: float = 10.0) -> None:
        """Finish what is queued, then stop the threads (service shutdown)."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        for w in self._workers:
            w.join(timeout)
        self._workers = []

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stopping:
                    self._cv.wait()
                if not self._queue:
                    return
                batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
            # a request whose client went away (its future cancelled) is dropped; the rest is written even if its
            # client goes away meanwhile (the answer is then discarded)
            batch = [(item, fut) for item, fut in batch if not fut.done()]
            if not batch:
                continue
            try:
                outcomes = self._outcomes([item for item, _ in batch])
            except BaseException as exc:  # noqa: BLE001 - never leave a request waiting, never lose the thread
                log.exception("agent writes: batch failed")
                outcomes = [exc] * len(batch)
            _deliver_all([fut for _, fut in batch], outcomes)

    def _outcomes(self, items: list[Fetch | Report]) -> list[Any]:
        """Per item its result or its error, from one transaction (or one per item, see the module docstring)."""
        try:
            with self.db.transaction() as session:
                return run_batch(session, items, clock=self.clock)
        except (OperationalError, InterfaceError) as exc:  # the database is unreachable: every request gets 503
            return [exc] * len(items)
        except Exception as exc:  # noqa: BLE001 - one request's data may have failed the batch: retry one by one
            if len(items) > 1:
                return [self._outcomes([one])[0] for one in items]
            return [exc]


def _deliver_all(futures: list[asyncio.Future], outcomes: list[Any]) -> None:
    """Hand a batch's outcomes to the waiting requests: one call into each event loop per batch (not a wake-up per
    request), where each future gets its result or error."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, Any]]] = {}
    for fut, outcome in zip(futures, outcomes):
        by_loop.setdefault(fut.get_loop(), []).append((fut, outcome))
    for loop, pairs in by_loop.items():
        try:
            loop.call_soon_threadsafe(_deliver, pairs)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass


def _deliver(pairs: list[tuple[asyncio.Future, Any]]) -> None:
    for fut, outcome in pairs:
        if fut.done():  # cancelled: its client went away
            continue
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)


def run_batch(session, items: list[Fetch | Report], *, clock: Clock) -> list[Any]:
    """Run a batch in the caller's transaction; per item its result or its error (an exception instance)."""
    outcomes: list[Any] = [None] * len(items)
    lookups = [it.secret for it in items if isinstance(it, Fetch) and it.principal is None]
    principals = token_service.authenticate_many(session, lookups) if lookups else {}
    fetches: list[tuple[int, token_service.Principal, Fetch]] = []
    reports: list[tuple[int, AgentReport]] = []
    for i, it in enumerate(items):
        if isinstance(it, Report):
            reports.append(
                (
                    i,
                    AgentReport(
                        actor=it.principal.name,
                        node=it.node,
                        plan_id=it.plan_id,
                        status=it.status,
                        message=it.message,
                        details=it.details,
                    ),
                )
            )
            continue
        p = it.principal or principals.get(it.secret)
        try:
            if p is None:
                raise Unauthorized("unknown or revoked token")
            fetches.append((i, token_service.authorize_node(it.node, p), it))
        except ApiError as exc:
            outcomes[i] = exc
    if fetches:
        served = serve_to_agents(
            session, [AgentFetch(p.name, f.node, f.etags, record=p.role == "agent") for _, p, f in fetches], clock=clock
        )
        for (i, p, _), out in zip(fetches, served):
            outcomes[i] = out if isinstance(out, ApiError) else (p, *out)
    if reports:
        for (i, _), answer in zip(reports, report_many(session, [r for _, r in reports], clock=clock)):
            outcomes[i] = answer
    return outcomes
