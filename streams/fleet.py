"""The fleet overview the dashboard's first page shows, cached for a few seconds.

Counting jobs by status reads every job row, so a page that refreshes every
few seconds in several browsers must not count per request: each process keeps
each owner's answer for ``ttl_s`` (one entry per owner asked, fleet-wide
callers sharing one). Workers and the outbox belong to no owner: only a
fleet-wide caller sees them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from store.fleet import FleetStore
from streams.convert import timestamp_json

# Owners whose answers are kept at once; past it the oldest entry goes.
_CACHED_OWNERS = 1024


class FleetOverview:
    def __init__(
        self,
        fleet: FleetStore,
        *,
        ttl_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fleet = fleet
        self._ttl_s = ttl_s
        self._clock = clock
        self._cached: dict[str | None, tuple[float, dict[str, Any]]] = {}

    async def overview(self, *, owner: str | None) -> dict[str, Any]:
        """``owner``'s jobs, or (``None``, a fleet-wide caller) every job, the outbox and
        the workers."""
        now = self._clock()
        cached = self._cached.get(owner)
        if cached is not None and now - cached[0] < self._ttl_s:
            return cached[1]
        answer = await self._read(owner)
        if len(self._cached) >= _CACHED_OWNERS:
            self._cached.pop(next(iter(self._cached)))
        self._cached[owner] = (now, answer)
        return answer

    async def _read(self, owner: str | None) -> dict[str, Any]:
        counts = await self._fleet.read(owner)
        answer: dict[str, Any] = {
            "as_of": timestamp_json(counts.as_of) if counts.as_of else None,
            "jobs_by_status": dict(counts.jobs_by_status),
            "jobs_by_status_last_5m": dict(counts.recent_by_status),
            "oldest_queued_age_s": counts.oldest_queued_age_s,
        }
        if owner is None:
            answer["outbox"] = {
                "pending": counts.outbox_pending,
                "oldest_pending_age_s": counts.oldest_pending_age_s,
                "failed": counts.outbox_failed,
            }
            answer["workers"] = [
                {
                    "worker": held.worker,
                    "running": held.running,
                    "first_lease_until": timestamp_json(held.first_lease_until),
                    "last_lease_until": timestamp_json(held.last_lease_until),
                    "live": held.live,
                }
                for held in await self._fleet.workers()
            ]
        return answer


__all__ = ["FleetOverview"]
