"""Progress that steps report, stored at most once per interval, in one statement.

``StepContext.progress`` hands a report to ``ProgressRecorder.report``, which
only keeps the latest report per job in memory: a step that reports a thousand
times a second costs a dict assignment each time, never an await and never a
commit. The recorder writes what it holds every ``interval_s`` (one statement
for every job that reported) and wakes no one: watchers read progress when
they next poll. Progress is advisory: a report lost to a store outage or a
crash is replaced by the next one, so the recorder retries nothing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import mode

from store.errors import is_outage
from store.progress import ProgressReport, ProgressStore
from store.records import Lease

log = logging.getLogger(__name__)


class ProgressRecorder(mode.Service):
    def __init__(self, store: ProgressStore, *, interval_s: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._store = store
        self._interval_s = interval_s
        self._latest: dict[Any, ProgressReport] = {}
        self._reported = asyncio.Event()
        self.written = 0

    def report(self, lease: Lease, step_name: str, fraction: float, message: str) -> None:
        """Keep this as the job's latest progress; it is written within ``interval_s``.

        ``StepContext.progress`` has checked the fraction and cut the message.
        """
        self._latest[lease.job_id] = ProgressReport(
            job_id=lease.job_id,
            lease_token=lease.token,
            attempt=lease.attempt,
            step_name=step_name,
            fraction=fraction,
            message=message,
        )
        self._reported.set()

    @mode.Service.task
    async def _write(self) -> None:
        while not self.should_stop:
            await self._reported.wait()
            self._reported.clear()
            await self.flush()
            await self.sleep(self._interval_s)

    async def flush(self) -> None:
        """Write what is held now (the newest report of each job)."""
        held, self._latest = self._latest, {}
        if not held:
            return
        try:
            self.written += await self._store.record(list(held.values()))
        except Exception as exc:
            if not is_outage(exc):
                raise
            log.debug("progress of %d jobs not stored: %s", len(held), exc)


__all__ = ["ProgressRecorder"]
