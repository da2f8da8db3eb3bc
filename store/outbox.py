"""The outbox side of the store: hand PENDING events to a publisher, record the outcome.

Ordering: one job's events must reach the topic in the order they committed,
even with several relays draining at once. A job's oldest PENDING row is its
head; a relay locks heads (``FOR UPDATE SKIP LOCKED``) and takes each locked
head together with the job's later PENDING rows. A row that is not a
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

# How many batches' worth of the oldest PENDING rows one pass looks at. More
# than one, so that a relay still finds work while other relays hold the
# oldest batches (their heads are skipped, their other rows are no heads);
# the price is reading this many rows per pass instead of one batch.
WINDOW_BATCHES = 4

# One pass reads a window: the oldest PENDING rows in id order, a fixed number
# of them, straight from the partial PENDING index. The window is a prefix of
# the backlog, so a job's first row in it is that job's oldest PENDING row, its
# head, and every other row of the job in the window comes after that head:
# heads and followers are found inside the window, without looking at the rest
# of the backlog. The heads are locked by id (``FOR UPDATE SKIP LOCKED``,
# oldest first), and the batch is the window's rows of the jobs whose heads
# were won, cut at the batch size; the cut only ever drops a job's newest rows,
# which wait for the next pass.
#
# Why the plan cannot go wrong: the statistics of a caught-up outbox say there
# are no PENDING rows, which once made the planner re-read the whole PENDING
# index for every candidate head. Here every access to the table is bounded by
# the window. The window is a LIMIT in id order over the PENDING index (the one
# plan left once bulk reads are off, see RELAY_PLANNER_SETTINGS_SQL). The lock
# step looks up at most a window's worth of ids (``= ANY``) and is also fenced
# by the window's last id, so even a scan of the PENDING index that filters
# instead of probing stops at the window's end. The rest works on the
# materialized window alone.
#
# Ordering: a row lock, not a filter with side effects, decides what is taken.
# A locked head is re-checked on its newest version, so a head another relay
# published or dead-lettered since this statement's snapshot is not taken. The
# head's lock is the job's mutex: a row that is not a head is only ever handed
# out behind its locked head. The rows handed out are read in the statement's
# snapshot (``attempts`` is for the publisher's information only; the settle
# counts attempts on the stored row).
FETCH_PENDING_SQL = """
WITH oldest AS MATERIALIZED (
    SELECT id, job_id, event_type, payload, attempts
      FROM workflow_run_events_outbox
     WHERE status = 'PENDING'
     ORDER BY id
     LIMIT %(window)s
), head AS MATERIALIZED (
    SELECT o.id, o.job_id
      FROM workflow_run_events_outbox AS o
     WHERE o.id = ANY (ARRAY(SELECT DISTINCT ON (job_id) id FROM oldest ORDER BY job_id, id))
       AND o.id <= (SELECT max(id) FROM oldest)
       AND o.status = 'PENDING'
     ORDER BY o.id
     LIMIT %(limit)s
     FOR UPDATE OF o SKIP LOCKED
)
SELECT r.id, r.job_id, r.event_type, r.payload, r.attempts
  FROM oldest AS r
 WHERE r.job_id = ANY (ARRAY(SELECT job_id FROM head))
 ORDER BY r.id
 LIMIT %(limit)s
"""


def fetch_pending_params(limit: int) -> dict[str, int]:
    """The parameters of ``FETCH_PENDING_SQL`` for a batch of ``limit`` rows."""
    return {"limit": limit, "window": limit * WINDOW_BATCHES}


# Set at the start of the relay's transaction, for its statements only. With
# the statistics of an outbox analyzed while empty, the planner guesses dozens
# of PENDING rows where there are thousands, and reading every PENDING row
# through a bitmap and sorting them looks cheaper than walking the PENDING
# index in id order and stopping after the window. Nothing in the relay's
# transaction ever needs to read the table in bulk: the fetch walks an index in
# order and looks rows up by id, the settle looks rows up by id. Switching bulk
# reads off leaves only those plans (Postgres picks a switched-off plan only
# when no other exists), so the cost of a pass no longer depends on guesses.
RELAY_PLANNER_SETTINGS_SQL = "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off"

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
            await conn.execute(RELAY_PLANNER_SETTINGS_SQL)
            cursor = await conn.execute(FETCH_PENDING_SQL, fetch_pending_params(limit))
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
