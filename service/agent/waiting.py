"""Waiting on the agent's clock: a heartbeat or a metrics window is due when the injected clock says so, while a stop
still ends the wait at once."""

from __future__ import annotations

import threading

from ..clock import Clock

POLL_SECONDS = 1.0  # how often a wait looks at the clock again (a ManualClock moved by a test is seen this soon)


def wait(stop: threading.Event, clock: Clock, seconds: float, *, poll: float = POLL_SECONDS) -> bool:
    """Wait until ``seconds`` of ``clock``'s monotonic time have passed (False) or ``stop`` is set (True)."""
    until = clock.monotonic() + seconds
    while True:
        left = until - clock.monotonic()
        if left <= 0:
            return stop.is_set()
        if stop.wait(min(left, poll)):
            return True
