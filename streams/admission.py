"""Admission control: new jobs wait while the backlog of QUEUED jobs is at a cap.

The rule is deliberately simple. With ``WFJOBS_MAX_QUEUED_JOBS`` at N (0, the
default, turns it off), a process refuses to create a job while N or more jobs
are QUEUED: submit-workflow answers 429 RESOURCE_EXHAUSTED, and the request
agent leaves the request on the topic and tries again later, which is Kafka's
own back-pressure. A submit that names an existing job id is still answered
with that job, since it creates nothing.

The count is read from the store at most once per ``refresh_s`` per process and
counts no further than the cap, so the check costs little under load. It is
approximate: submits in flight across the fleet may pass the cap by their
number, and a drained backlog admits again within ``refresh_s``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from schemas.errors import ResourceExhausted


class QueueDepth(Protocol):
    """The store's side (``store.runs.RunStore``)."""

    async def count_queued(self, *, limit: int) -> int: ...


class Admission:
    def __init__(
        self,
        cap: int,
        *,
        refresh_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if cap < 0:
            raise ValueError("cap must not be negative")
        self.cap = cap
        self._refresh_s = refresh_s
        self._clock = clock
        self._depth = 0
        self._read_at: float | None = None
        # Creations refused so far (exported as wfjobs_admission_rejections_total).
        self.rejections = 0

    @property
    def enabled(self) -> bool:
        return self.cap > 0

    async def check(self, runs: QueueDepth) -> None:
        """Raise ``ResourceExhausted`` when the backlog is at the cap."""
        if not self.enabled:
            return
        now = self._clock()
        if self._read_at is None or now - self._read_at >= self._refresh_s:
            self._depth = await runs.count_queued(limit=self.cap)
            self._read_at = now
        if self._depth >= self.cap:
            self.rejections += 1
            raise ResourceExhausted(
                f"{self.cap} or more jobs are QUEUED, the most this deployment accepts "
                "(WFJOBS_MAX_QUEUED_JOBS); retry later"
            )

    def admitted(self) -> None:
        """Count a job this process just created, until the next read of the store."""
        self._depth += 1


__all__ = ["Admission", "QueueDepth"]
