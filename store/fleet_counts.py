"""What the whole fleet's jobs and outbox look like, in numbers, for ``/metrics``.

One statement reads every figure at once: jobs per status, how long the
longest-waiting claimable QUEUED job has waited, and the outbox's PENDING and
FAILED rows. Each part rides an index: the status count the
``(status, created_at, job_id)`` index, the oldest claimable job the claim's
partial index in claim order, PENDING rows their partial index, FAILED rows
theirs. The status count still visits every row the table holds (terminal
jobs until retention deletes them), which is why callers cache the answer
(``WFJOBS_METRICS_DB_CACHE_S``) instead of asking on every scrape.

Ages are on the database's clock, like everything else that compares times.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from store.pool import Pool
from store.states import STATUSES, Status

# A QUEUED job is claimable once its run_after has passed and attempts remain:
# the claim's own condition, so the age is how late the claims are running.
FLEET_COUNTS_SQL = f"""
SELECT
    (SELECT coalesce(jsonb_object_agg(status, jobs), '{{}}'::jsonb)
       FROM (SELECT status, count(*) AS jobs FROM workflow_run GROUP BY status) AS by_status),
    (SELECT extract(epoch FROM now() - run_after)
       FROM workflow_run
      WHERE status = '{Status.QUEUED.value}' AND run_after <= now() AND attempt < max_attempts
      ORDER BY run_after, created_at
      LIMIT 1),
    (SELECT count(*) FROM workflow_run_events_outbox WHERE status = 'PENDING'),
    (SELECT extract(epoch FROM now() - created_at)
       FROM workflow_run_events_outbox
      WHERE status = 'PENDING'
      ORDER BY id
      LIMIT 1),
    (SELECT count(*) FROM workflow_run_events_outbox WHERE status = 'FAILED')
"""


@dataclass(frozen=True, slots=True)
class FleetCounts:
    # Every status, zero included, so a drained status reads 0 rather than vanishing.
    jobs_by_status: Mapping[str, int] = field(default_factory=dict)
    # Seconds the longest-waiting claimable QUEUED job has waited; 0 when none waits.
    oldest_queued_age_s: float = 0.0
    outbox_pending: int = 0
    # Seconds since the oldest PENDING outbox row was written; 0 when none is.
    oldest_pending_age_s: float = 0.0
    # Dead letters: rows the relay gave up on.
    outbox_failed: int = 0


class FleetCountsStore:
    def __init__(self, pool: Pool, *, timeout_s: float = 2.0) -> None:
        """``timeout_s``: longest wait for a pooled connection; a scrape must not hang."""
        self._pool = pool
        self._timeout_s = timeout_s

    async def read(self) -> FleetCounts:
        async with self._pool.connection(timeout=self._timeout_s) as conn:
            cursor = await conn.execute(FLEET_COUNTS_SQL)
            row = await cursor.fetchone()
        assert row is not None
        by_status, queued_age, pending, pending_age, failed = row
        counts = dict.fromkeys(STATUSES, 0)
        counts.update({str(status): int(jobs) for status, jobs in by_status.items()})
        return FleetCounts(
            jobs_by_status=counts,
            oldest_queued_age_s=max(float(queued_age or 0), 0.0),
            outbox_pending=int(pending),
            oldest_pending_age_s=max(float(pending_age or 0), 0.0),
            outbox_failed=int(failed),
        )


__all__ = ["FLEET_COUNTS_SQL", "FleetCounts", "FleetCountsStore"]
