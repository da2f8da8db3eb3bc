"""The fleet's figures on ``/metrics``: read from the database at scrape time, cached.

A scrape reads ``store.fleet`` only when the last reading is older than
``WFJOBS_METRICS_DB_CACHE_S``; scrapes in between (several Prometheus servers,
a dashboard's refresh) are answered from that reading, and scrapes that arrive
while a read is under way wait for it rather than starting their own. So the
database sees at most one such read per process per interval, however often
the process is scraped.

When the read fails the figures are left out of that scrape (Prometheus then
marks them stale) rather than repeated from an old reading, and
``wfjobs_fleet_read_failures_total`` counts it; the process's own metrics are
still served.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from store.fleet import FleetCounts
from streams.metrics import counter, gauge, labelled

log = logging.getLogger(__name__)


class FleetGauges(Collector):
    def __init__(
        self,
        read: Callable[[], Awaitable[FleetCounts]],
        *,
        cache_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if cache_s <= 0:
            raise ValueError("cache_s must be positive")
        self._read = read
        self._cache_s = cache_s
        self._clock = clock
        self._lock = asyncio.Lock()
        self._counts: FleetCounts | None = None
        self._read_at: float | None = None
        self.reads = 0
        self.failures = 0

    async def refresh(self) -> None:
        """Read the figures again if the cached ones are older than the interval."""
        async with self._lock:
            now = self._clock()
            if self._read_at is not None and now - self._read_at < self._cache_s:
                return
            # A failed read also waits out the interval: a database in trouble
            # is not asked again by every scrape.
            self._read_at = now
            self.reads += 1
            try:
                self._counts = await self._read()
            except Exception as exc:
                self._counts = None
                self.failures += 1
                log.warning("metrics: fleet figures not read: %s: %s", type(exc).__name__, exc)

    def collect(self) -> Iterator[Metric]:
        yield counter("wfjobs_fleet_read_failures_total", self.failures)
        counts = self._counts
        if counts is None:
            return
        yield labelled("wfjobs_jobs", dict(counts.jobs_by_status))
        # 0 when nothing waits: an absent series would read as "no data".
        yield gauge("wfjobs_queued_oldest_age_seconds", counts.oldest_queued_age_s or 0.0)
        yield gauge("wfjobs_outbox_pending_events", counts.outbox_pending)
        yield gauge("wfjobs_outbox_pending_oldest_age_seconds", counts.oldest_pending_age_s or 0.0)
        yield gauge("wfjobs_outbox_failed_events", counts.outbox_failed)


__all__ = ["FleetGauges"]
