"""How late the event loop runs: a timed sleep, and by how much its wake-up overshot.

Everything in a worker (claims, heartbeats, the relay, the HTTP verbs) shares
one event loop, so a callback that holds it (a slow rule, a large JSON body
parsed in place) delays all of them. The probe asks to be woken after
``interval_s`` and reports how much later than that it actually ran; on an
idle, healthy loop that is well under a millisecond. One timer per interval is
the whole cost.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import mode

DEFAULT_INTERVAL_S = 0.5


class LoopLagProbe(mode.Service):
    def __init__(
        self,
        report: Callable[[float], None],
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        **kwargs: Any,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        super().__init__(**kwargs)
        self._report = report
        self._interval_s = interval_s
        self._clock = clock

    async def probe_once(self) -> float:
        """Sleep one interval and report the overshoot, in seconds."""
        asked_at = self._clock()
        await asyncio.sleep(self._interval_s)
        lag = max(self._clock() - asked_at - self._interval_s, 0.0)
        self._report(lag)
        return lag

    @mode.Service.task
    async def _run(self) -> None:
        # Nothing here is expected to fail: an error is a defect, and it
        # crashes the service and the process with it.
        while not self.should_stop:
            await self.probe_once()


__all__ = ["DEFAULT_INTERVAL_S", "LoopLagProbe"]
