"""The fleet at a glance: jobs by status, the backlog's age, recent throughput, workers.

What an operator's first screen shows, in two statements. Counting by status
reads every job row (an index-only scan when the visibility map allows), so
callers cache the answer for a few seconds rather than count per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from store.pool import Pool
from store.states import STATUSES

# One pass over the jobs (an owner's, or everyone's): how many are in each
# status, and how many of those reached it in the last five minutes; plus the
# oldest claimable QUEUED job, from the claim index.
FLEET_COUNTS_SQL = """
WITH counted AS (
    SELECT status,
           count(*) AS jobs,
           count(*) FILTER (WHERE updated_at > now() - interval '5 minutes') AS recent
      FROM workflow_run
     WHERE %(owner)s::text IS NULL OR owner = %(owner)s
     GROUP BY status
)
SELECT coalesce((SELECT array_agg(status ORDER BY status) FROM counted), '{}'),
       coalesce((SELECT array_agg(jobs ORDER BY status) FROM counted), '{}'),
       coalesce((SELECT array_agg(recent ORDER BY status) FROM counted), '{}'),
       extract(epoch FROM now() - (
           SELECT run_after FROM workflow_run
            WHERE status = 'QUEUED' AND run_after <= now()
              AND (%(owner)s::text IS NULL OR owner = %(owner)s)
            ORDER BY run_after, created_at LIMIT 1)),
       now()
"""

# The workers holding jobs now, from the sweeper's index of RUNNING rows.
FLEET_WORKERS_SQL = """
SELECT lease_owner, count(*), min(lease_until), max(lease_until)
  FROM workflow_run
 WHERE status = 'RUNNING'
 GROUP BY lease_owner
 ORDER BY lease_owner
"""


@dataclass(frozen=True, slots=True)
class WorkerLeases:
    worker: str
    running: int
    # The soonest and latest lease expiries among its jobs.
    first_lease_until: datetime
    last_lease_until: datetime


@dataclass(frozen=True, slots=True)
class FleetCounts:
    # Every status, zero included.
    by_status: dict[str, int]
    # Jobs that reached each status in the last five minutes.
    recent_by_status: dict[str, int]
    # Seconds since the oldest claimable QUEUED job could have run; None with none.
    oldest_queued_age_s: float | None
    as_of: datetime


class FleetStore:
    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def counts(self, *, owner: str | None) -> FleetCounts:
        """Jobs by status: ``owner``'s, or everyone's when ``None``."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute(FLEET_COUNTS_SQL, {"owner": owner})
            row: Any = await cursor.fetchone()
        assert row is not None  # a SELECT without FROM always answers one row
        statuses, jobs, recent, oldest, as_of = row
        by_status = dict.fromkeys(STATUSES, 0) | dict(zip(statuses, map(int, jobs), strict=True))
        recent_by_status = dict.fromkeys(STATUSES, 0) | dict(
            zip(statuses, map(int, recent), strict=True)
        )
        return FleetCounts(
            by_status=by_status,
            recent_by_status=recent_by_status,
            oldest_queued_age_s=None if oldest is None else max(float(oldest), 0.0),
            as_of=as_of,
        )

    async def workers(self) -> list[WorkerLeases]:
        async with self._pool.connection() as conn:
            rows = await (await conn.execute(FLEET_WORKERS_SQL)).fetchall()
        return [WorkerLeases(str(w), int(n), first, last) for w, n, first, last in rows]


__all__ = ["FleetCounts", "FleetStore", "WorkerLeases"]
