"""The fleet in numbers: jobs by status, the backlog's age, the outbox, the workers.

What ``/metrics`` exports and the dashboard's first page shows, in one
statement (and one more for the workers holding jobs, and whether they live).
Each part rides an index: the status count the ``(status, created_at,
job_id)`` index (or, for one owner, the owner's), the oldest claimable job the
claim's partial index in claim order, PENDING and FAILED outbox rows their
partial indexes. The status
count still visits every row the table holds (terminal jobs until retention
deletes them), which is why callers cache the answer rather than ask per
request. Ages are on the database's clock, like everything else that compares
times.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from store.outbox import OLDEST_WAITING_CREATED_SQL
from store.pool import Pool
from store.states import STATUSES, Status
from store.worker_ids import held_by_a_session

# Jobs per status, and how many of them reached it in the last five minutes
# (their throughput): when a job last changed is when it reached its status,
# but for a RUNNING one, whose every renewal and checkpoint changes it, that
# is its claim. The claimable QUEUED job that has waited longest (the
# claim's own condition: run_after passed, attempts left, deadline ahead); the
# outbox, which belongs to no owner, only when no owner is asked for. Its age
# is the oldest row a relay may publish: rows a dead letter holds back are the
# FAILED count's business, and must not make a relay look stuck.
FLEET_SQL = f"""
WITH counted AS (
    SELECT status,
           count(*) AS jobs,
           count(*) FILTER (
               WHERE CASE WHEN status = '{Status.RUNNING.value}' THEN claimed_at ELSE updated_at END
                     > now() - interval '5 minutes'
           ) AS recent
      FROM workflow_run
     WHERE %(owner)s::text IS NULL OR owner = %(owner)s
     GROUP BY status
)
SELECT
    coalesce((SELECT jsonb_object_agg(status, jobs) FROM counted), '{{}}'::jsonb),
    coalesce((SELECT jsonb_object_agg(status, recent) FROM counted), '{{}}'::jsonb),
    (SELECT extract(epoch FROM now() - run_after)
       FROM workflow_run
      WHERE status = '{Status.QUEUED.value}' AND run_after <= now() AND attempt < max_attempts
        AND (deadline_at IS NULL OR deadline_at > now())
        AND (%(owner)s::text IS NULL OR owner = %(owner)s)
      ORDER BY run_after, created_at
      LIMIT 1),
    CASE WHEN %(owner)s::text IS NULL THEN
        (SELECT count(*) FROM workflow_run_events_outbox WHERE status = 'PENDING') END,
    CASE WHEN %(owner)s::text IS NULL THEN
        extract(epoch FROM now() - {OLDEST_WAITING_CREATED_SQL}) END,
    CASE WHEN %(owner)s::text IS NULL THEN
        (SELECT count(*) FROM workflow_run_events_outbox WHERE status = 'FAILED') END,
    now()
"""

# The workers holding jobs now, from the sweeper's index of RUNNING rows, and
# whether each is alive: a live worker's process holds its id's lock.
FLEET_WORKERS_SQL = f"""
SELECT r.lease_owner, count(*), min(r.lease_until), max(r.lease_until),
       EXISTS (SELECT FROM pg_locks AS l WHERE {held_by_a_session("r.lease_owner")})
  FROM workflow_run AS r
 WHERE r.status = 'RUNNING'
 GROUP BY r.lease_owner
 ORDER BY r.lease_owner
"""


def _ages(value: Any) -> float | None:
    return None if value is None else max(float(value), 0.0)


@dataclass(frozen=True, slots=True)
class FleetCounts:
    # Every status, zero included, so a drained status reads 0 rather than vanishing.
    jobs_by_status: Mapping[str, int] = field(default_factory=dict)
    # Jobs that reached each status in the last five minutes.
    recent_by_status: Mapping[str, int] = field(default_factory=dict)
    # Seconds the longest-waiting claimable QUEUED job has waited; None when none waits.
    oldest_queued_age_s: float | None = None
    # The outbox: counted only when every owner's jobs were (it belongs to no owner).
    outbox_pending: int = 0
    # Seconds since the oldest PENDING outbox row that no FAILED row holds back
    # was written; None when none is.
    oldest_pending_age_s: float | None = None
    # Dead letters: rows the relay gave up on.
    outbox_failed: int = 0
    as_of: datetime | None = None


@dataclass(frozen=True, slots=True)
class WorkerLeases:
    worker: str
    running: int
    # The soonest and latest lease expiries among its jobs.
    first_lease_until: datetime
    last_lease_until: datetime
    # Whether its process is alive (holds its worker id): a killed worker's
    # jobs stay its own until their leases pass, and only this tells.
    live: bool


class FleetStore:
    def __init__(self, pool: Pool, *, timeout_s: float = 2.0, read_timeout_s: float = 8.0) -> None:
        """``timeout_s``: longest wait for a pooled connection; ``read_timeout_s``:
        longest a whole read may take (``TimeoutError``, an outage, past it).

        A scrape must not hang, nor the fleet page: a statement the database
        does not answer (behind a lock, or on a connection whose server went
        without a word) would hold them for ever. The bound is below
        Prometheus's default scrape timeout (10 s), so the scrape still gets
        the process's own figures.
        """
        self._pool = pool
        self._timeout_s = timeout_s
        self._read_timeout_s = read_timeout_s

    async def read(self, owner: str | None = None) -> FleetCounts:
        """The figures of ``owner``'s jobs, or of every job (and the outbox) for ``None``."""
        async with (
            asyncio.timeout(self._read_timeout_s),
            self._pool.connection(timeout=self._timeout_s) as conn,
        ):
            cursor = await conn.execute(FLEET_SQL, {"owner": owner})
            row = await cursor.fetchone()
        assert row is not None  # a SELECT without FROM always answers one row
        by_status, recent, queued_age, pending, pending_age, failed, as_of = row
        return FleetCounts(
            jobs_by_status=dict.fromkeys(STATUSES, 0) | _counts(by_status),
            recent_by_status=dict.fromkeys(STATUSES, 0) | _counts(recent),
            oldest_queued_age_s=_ages(queued_age),
            outbox_pending=int(pending or 0),
            oldest_pending_age_s=_ages(pending_age),
            outbox_failed=int(failed or 0),
            as_of=as_of,
        )

    async def workers(self) -> list[WorkerLeases]:
        async with (
            asyncio.timeout(self._read_timeout_s),
            self._pool.connection(timeout=self._timeout_s) as conn,
        ):
            rows = await (await conn.execute(FLEET_WORKERS_SQL)).fetchall()
        return [
            WorkerLeases(str(w), int(n), first, last, bool(live))
            for w, n, first, last, live in rows
        ]


def _counts(by_status: Mapping[str, Any]) -> dict[str, int]:
    return {str(status): int(jobs) for status, jobs in by_status.items()}


__all__ = ["FLEET_SQL", "FleetCounts", "FleetStore", "WorkerLeases"]
