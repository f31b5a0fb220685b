"""One clock, passed in: wall time, monotonic time and sleep.

The agent, the audit sealer and checkpointer, the cache epochs, the rollout scheduler and the tuning loop read time
through a ``Clock`` they are given (``SYSTEM`` in production), so a test ages a plan, a freshness statement, an epoch
or a rollout's bake by moving a ``ManualClock`` instead of sleeping or patching ``time.time`` for the whole process.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Seconds since the epoch (what is signed, stored and compared with other machines)."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary start, never going back (intervals, deadlines)."""
        ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The machine's clocks."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM = SystemClock()


def utc(clock: Clock) -> dt.datetime:
    """The clock's wall time as an aware UTC datetime."""
    return dt.datetime.fromtimestamp(clock.time(), dt.UTC)


class ManualClock:
    """A clock that moves only when told: ``advance`` (or ``sleep``, which advances instead of waiting). Both of its
    readings move together. Thread-safe, so a background loop and a test can share it."""

    def __init__(self, start: float = 1_800_000_000.0):
        self._lock = threading.Lock()
        self._now = float(start)
        self._mono = 0.0

    def time(self) -> float:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
            self._mono += seconds
