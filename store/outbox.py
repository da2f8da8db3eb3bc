"""The outbox side of the store: hand PENDING events to a publisher, record the outcome.

Ordering: one job's events must reach the topic in the order they committed,
even with several relays draining at once. A job's oldest PENDING row is its
head; a relay locks heads (``FOR UPDATE SKIP LOCKED``) and takes each locked
head together with the rest of that job's PENDING rows. A row that is not a
head is only ever handed out behind its locked head, so the head's row lock is
the job's mutex: no two relays hold events of the same job at once, and a
relay working from an older snapshot merely sees fewer heads, never a newer
row ahead of an older one.

Within a batch, once a job's row fails, its later rows are held back (left
PENDING, attempts untouched), so they cannot overtake it on the next pass.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from store.pool import Pool

# Heads first (oldest first, skipping heads another relay holds), then every
# PENDING row of the jobs whose heads were won, cut at the batch size: the cut
# only ever drops a job's newest rows, which wait for the next pass. A row
# locking, not a filter with side effects, decides what is taken, so the plan
# the server picks cannot change the outcome.
FETCH_PENDING_SQL = """
WITH head AS MATERIALIZED (
    SELECT o.id, o.job_id
      FROM workflow_run_events_outbox AS o
     WHERE o.status = 'PENDING'
       AND NOT EXISTS (SELECT FROM workflow_run_events_outbox AS older
                        WHERE older.job_id = o.job_id AND older.status = 'PENDING'
                          AND older.id < o.id)
     ORDER BY o.id
     LIMIT %(limit)s
     FOR UPDATE OF o SKIP LOCKED
)
SELECT o.id, o.job_id, o.event_type, o.payload, o.attempts
  FROM workflow_run_events_outbox AS o
  JOIN head ON head.job_id = o.job_id AND o.id >= head.id
 WHERE o.status = 'PENDING'
 ORDER BY o.id
 LIMIT %(limit)s
"""

# Acked rows go PUBLISHED in one statement; failed ones count an attempt and
# stop at FAILED, the dead letter nothing retries.
SETTLE_BATCH_SQL = """
WITH published AS (
    UPDATE workflow_run_events_outbox
       SET status = 'PUBLISHED', published_at = now(), attempts = attempts + 1
     WHERE id = ANY(%(published)s::bigint[])
    RETURNING id
), failed AS (
    UPDATE workflow_run_events_outbox AS o
       SET attempts = o.attempts + 1,
           last_error = f.error,
           status = CASE WHEN o.attempts + 1 >= %(max_attempts)s THEN 'FAILED' ELSE 'PENDING' END
      FROM unnest(%(failed)s::bigint[], %(errors)s::text[]) AS f(id, error)
     WHERE o.id = f.id
    RETURNING o.status
)
SELECT (SELECT count(*) FROM published),
       (SELECT count(*) FROM failed WHERE status = 'FAILED')
"""

SELECT_JOB_EVENTS_SQL = """
SELECT id, job_id, event_type, payload, status, attempts, last_error, created_at, published_at
  FROM workflow_run_events_outbox
 WHERE job_id = %(job_id)s
 ORDER BY id
"""

COUNT_PENDING_SQL = "SELECT count(*) FROM workflow_run_events_outbox WHERE status = 'PENDING'"


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """A PENDING event handed to the publisher."""

    id: int
    job_id: UUID
    event_type: str
    # The encoded WorkflowRunEvent without event_id; see schemas.contract.with_event_id.
    payload: bytes
    attempts: int


@dataclass(frozen=True, slots=True)
class OutboxRecord:
    """An outbox row as stored, for reading a job's history."""

    id: int
    job_id: UUID
    event_type: str
    payload: bytes
    status: str
    attempts: int
    last_error: str | None
    created_at: datetime
    published_at: datetime | None


@dataclass(frozen=True, slots=True)
class RelayResult:
    # Rows handed to the publisher.
    fetched: int
    published: int
    # Rows whose publish failed this time (an attempt was recorded).
    failed: int
    # Of those, rows that reached the attempt limit and are now FAILED.
    dead_lettered: int
    # Rows left PENDING, untouched, so they cannot overtake an older row of their job.
    held_back: int


# Called with the batch in id order; answers one entry per row: None when the
# broker acked it, else the error text.
Publisher = Callable[[list[OutboxRow]], Awaitable[list[str | None]]]


class Outbox:
    def __init__(self, pool: Pool, *, max_attempts: int = 10) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self._pool = pool
        self.max_attempts = max_attempts

    async def relay_batch(self, publish: Publisher, limit: int = 100) -> RelayResult:
        """Hand up to ``limit`` PENDING rows to ``publish`` and record what it answers.

        Everything happens in one transaction, so the rows stay locked while
        they are in flight. An exception from ``publish`` counts as a failed
        attempt for every row, so one poison batch cannot stall the relay.
        """
        if limit < 1:
            raise ValueError("limit must be at least 1")
        async with self._pool.connection() as conn, conn.transaction():
            cursor = await conn.execute(FETCH_PENDING_SQL, {"limit": limit})
            rows = [OutboxRow(*row) for row in await cursor.fetchall()]
            if not rows:
                return RelayResult(0, 0, 0, 0, 0)
            try:
                outcomes = await publish(rows)
            except Exception as exc:
                outcomes = [f"{type(exc).__name__}: {exc}"] * len(rows)
            if len(outcomes) != len(rows):
                raise ValueError(f"publish answered {len(outcomes)} outcomes for {len(rows)} rows")
            published: list[int] = []
            failed: list[int] = []
            errors: list[str] = []
            broken_jobs: set[UUID] = set()
            held_back = 0
            for row, outcome in zip(rows, outcomes, strict=True):
                if row.job_id in broken_jobs:
                    held_back += 1
                elif outcome is None:
                    published.append(row.id)
                else:
                    failed.append(row.id)
                    errors.append(outcome or "publish failed")
                    broken_jobs.add(row.job_id)
            cursor = await conn.execute(
                SETTLE_BATCH_SQL,
                {
                    "published": published,
                    "failed": failed,
                    "errors": errors,
                    "max_attempts": self.max_attempts,
                },
            )
            counts = await cursor.fetchone()
        assert counts is not None
        return RelayResult(
            fetched=len(rows),
            published=int(counts[0]),
            failed=len(failed),
            dead_lettered=int(counts[1]),
            held_back=held_back,
        )

    async def events_for(self, job_id: UUID) -> list[OutboxRecord]:
        """Every outbox row of one job, in commit order, whatever its status."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute(SELECT_JOB_EVENTS_SQL, {"job_id": job_id})
            return [OutboxRecord(*row) for row in await cursor.fetchall()]

    async def pending_count(self) -> int:
        async with self._pool.connection() as conn:
            cursor = await conn.execute(COUNT_PENDING_SQL)
            row = await cursor.fetchone()
        return int(row[0]) if row else 0
