"""One small helper for the service's background loops (the audit sealer, the cache-epoch poller, the rollout
scheduler): a daemon thread that runs a step every ``interval`` seconds or soon after it is woken, survives a failing
step, and can be waited on for a whole pass. The agent's loops (heartbeat, metrics sampler) wait through
``agent/waiting.py`` on the clock they are given instead, so a test moves a ManualClock through them."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable


class PeriodicWorker:
    """Runs ``step()`` in a daemon thread named ``name``: every ``interval`` seconds, and ``gather`` seconds after a
    ``wake()`` (so a burst of wake-ups becomes one pass). A step that raises is logged (its class only: messages
    may hold data) and the loop goes on. With ``final_pass``, ``stop()`` runs one last step, so nothing handed to
    the worker before the stop is left undone."""

    def __init__(
        self,
        name: str,
        step: Callable[[], object],
        interval: float,
        *,
        log: logging.Logger,
        gather: float = 0.0,
        final_pass: bool = False,
        log_level: int = logging.WARNING,
    ):
        self.name, self.step, self.interval, self.gather = name, step, interval, gather
        self.final_pass, self.log, self.log_level = final_pass, log, log_level
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._passes = 0
        self._in_pass = False  # a step is running (it may have read its input before a wake-up that came later)
        self._passed = threading.Condition()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._stop.clear()
        if not self.running:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            self._thread = None
        with self._passed:
            self._passed.notify_all()

    def wake(self) -> None:
        self._wake.set()

    def wait_for_pass(self, timeout: float) -> bool:
        """Wake the worker and wait (at most ``timeout`` seconds) until a pass that started after this call has
        completed. False on timeout or when the worker is not running."""
        if not self.running:
            return False
        with self._passed:
            target = self._passes + (2 if self._in_pass else 1)
            self._wake.set()
            return (
                self._passed.wait_for(lambda: self._passes >= target or not self.running, timeout)
                and self._passes >= target
            )

    def _run(self) -> None:
        while True:
            woken = self._wake.wait(self.interval)
            if woken and self.gather > 0 and not self._stop.is_set():
                self._stop.wait(self.gather)
            stopping = self._stop.is_set()
            if not stopping or self.final_pass:
                self._one_pass()
            if stopping:
                return

    def _one_pass(self) -> None:
        with self._passed:
            self._wake.clear()
            self._in_pass = True
        try:
            self.step()
        except Exception as exc:  # noqa: BLE001 - a database that is down: the next pass tries again
            self.log.log(self.log_level, "%s: %s", self.name, exc.__class__.__name__)
        finally:
            with self._passed:
                self._in_pass = False
                self._passes += 1
                self._passed.notify_all()
