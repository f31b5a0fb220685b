"""The agent's reports about one plan (``POST /v1/nodes/{name}/reports``): in order, queued while the service is away,
kept in the state file at exit and sent by the next boot."""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Callable

from ..clock import SYSTEM, Clock

MAX_KEPT = 200  # undelivered reports kept for the next boot (the newest)


def say_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Reporter:
    """The agent's reports about one plan (or none): each carries the run id, the time it was made (``at``, read
    from ``clock``) and, after an offline boot, says so. Reports the service cannot take yet are queued (kept in the
    state file at exit) and sent, in order, as soon as it answers again. Calling it sends at once; ``enqueue`` (used
    while vLLM runs) hands the report to a sender thread, so reading vLLM's output never waits on the network (a
    full pipe would stall vLLM)."""

    def __init__(
        self,
        client,
        state,
        *,
        plan_id: str | None,
        seq: int | None,
        offline: dict | None = None,
        send_pending: bool = False,
        placement: dict | None = None,
        clock: Clock = SYSTEM,
        say: Callable[[str], None] = say_stderr,
    ):
        self.client, self.state, self.plan_id, self.seq, self.offline = client, state, plan_id, seq, offline
        self.clock, self.say = clock, say
        self.placement = placement  # group, rank, role of a node in a plan with placement claims
        self.audit_checkpoint: dict | None = None  # what the node witnessed of the audit log (agent/witness.py)
        self.run_id = str(uuid.uuid4())
        self.send_lock = threading.Lock()  # one sender at a time: reports stay in order
        self.cv = threading.Condition()
        self.sender: threading.Thread | None = None
        self.closing = False
        # reports queued by an earlier (offline) boot go only to a service that has just proved itself genuine
        # (a queued entry without a string status is no report: a damaged or hand-edited state file)
        self.queue: list[dict] = (
            [q for q in state.pending if isinstance(q, dict) and isinstance(q.get("status"), str)][-MAX_KEPT:]
            if send_pending
            else []
        )

    def _body(self, status: str, message: str | None, details: dict | None) -> dict:
        body_details = {**(details or {}), "run_id": self.run_id, "at": round(self.clock.time(), 3)}
        if self.seq is not None:
            body_details["seq"] = self.seq
        if self.placement:
            body_details.update(self.placement)
        if self.offline:
            body_details["offline_boot"] = self.offline
        if self.audit_checkpoint is not None:  # carried by the first report of this boot
            body_details["audit_checkpoint"], self.audit_checkpoint = self.audit_checkpoint, None
        return {"plan_id": self.plan_id, "status": status, "message": message, "details": body_details}

    def __call__(self, status: str, message: str | None = None, details: dict | None = None) -> None:
        with self.cv:
            self.queue.append(self._body(status, message, details))
        self.flush()

    def enqueue(self, status: str, message: str | None = None, details: dict | None = None) -> None:
        with self.cv:
            self.queue.append(self._body(status, message, details))
            if self.sender is None:
                self.sender = threading.Thread(target=self._send_loop, name="preflight-reports", daemon=True)
                self.sender.start()
            self.cv.notify()

    def _send_loop(self) -> None:
        while True:
            with self.cv:
                while not self.queue and not self.closing:
                    self.cv.wait()
                if self.closing:
                    return
            if not self.flush():
                with self.cv:
                    if not self.closing:
                        self.cv.wait(5.0)  # the service is away: try again later (or at the next report)

    def flush(self) -> bool:
        """Send what is queued, in order. False when the service cannot take it now."""
        import httpx

        with self.send_lock:
            while True:
                with self.cv:
                    if not self.queue:
                        return True
                    body = self.queue[0]
                try:
                    r = self.client.post_report(body)
                except httpx.HTTPError:
                    return False
                if r.status_code >= 500 or r.status_code == 429:
                    return False
                if r.status_code >= 400:
                    self.say(f"preflight agent: the service refused a {body['status']} report: HTTP {r.status_code}")
                with self.cv:
                    self.queue.pop(0)

    def heartbeat(self) -> bool | None:
        """Heartbeats are not queued: only the latest matters. Returns the service's ``current`` (False: the plan
        was superseded or revoked), None without an answer."""
        import httpx

        if not self.flush():
            return None
        try:
            r = self.client.post_report(
                {"plan_id": self.plan_id, "status": "heartbeat", "message": None, "details": {"run_id": self.run_id}}
            )
            body = r.json() if r.status_code == 201 else None
        except (httpx.HTTPError, ValueError, RecursionError):
            return None
        return False if isinstance(body, dict) and body.get("current") is False else None

    def close(self) -> None:
        """Stop the sender, try once more, and keep what could not be sent in the state file (the next boot sends
        it)."""
        with self.cv:
            self.closing = True
            self.cv.notify_all()
        if self.sender is not None:
            self.sender.join(60)
        self.flush()
        self.keep_undelivered()

    def keep_undelivered(self) -> None:
        with self.cv:
            pending = list(self.queue)[-MAX_KEPT:]
        if pending != self.state.pending:
            self.state.pending = pending
            self.state.save()
