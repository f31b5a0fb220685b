"""What the services that sign plans and stamp times take beside the database session: the settings, the signing
keys and the clock (one per app, ``app.state.context``; a test moves a ManualClock instead of sleeping)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from ..clock import SYSTEM, Clock, utc
from ..settings import Settings
from ..signing import KeyStore


@dataclass(frozen=True)
class Context:
    settings: Settings
    keys: KeyStore
    clock: Clock = SYSTEM

    def now(self) -> dt.datetime:
        """The clock's wall time as an aware UTC datetime (what rows and audit payloads are stamped with)."""
        return utc(self.clock)
