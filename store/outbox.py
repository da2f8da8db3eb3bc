"""The outbox side of the store: lease PENDING events to a publisher, record the outcome.

Ordering: one job's events must reach the topic in the order they committed,
even with several relays draining at once. A job's oldest PENDING row is its
head; a relay locks heads (``FOR UPDATE SKIP LOCKED``) and leases each head it
won together with the job's later PENDING rows. A row that is not a head is
only ever handed out behind its leased head, so the head's lease is the job's
mutex: no two relays hold events of the same job at once, and a relay working
from an older snapshot merely sees fewer heads, never a newer row ahead of an
older one.

No transaction is open while the rows are published: the lease is taken in one
short transaction and the outcome is recorded in one statement fenced on the
lease (``lease_owner`` names one pass of one relay and never repeats). A relay
that dies mid-publish leaves its lease to expire, and another relay takes the
rows again: delivery is at least once.

Outcomes: an acked row goes PUBLISHED. A row refused for good (the broker will
never take it) goes FAILED at once with the reason, and a FAILED row holds back
every later row of its job: they stay PENDING and are not handed out until an
operator redrives the FAILED row, so the job's events keep their order. A row
that met a transient fault (broker or registry unreachable, timeouts) spends no
attempt: it is handed back with the error noted, not to be tried again before
the delay the publisher asks for. Within a batch, once a job's row did not go
out, its later rows are held back (handed back untouched), so they cannot
overtake it.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
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
# oldest first) and must not be leased by someone else, and the batch is the
# window's rows of the jobs whose heads were won, cut at the batch size; the
# cut only ever drops a job's newest rows, which wait for the next pass. The
# batch is leased in the same statement, and the statement's transaction
# commits at once, before anything is published.
#
# Rows held back by an older FAILED row of their job are left out of the
# window (one probe of the small FAILED index per row read), so however many
# of them pile up they never fill the window and starve the other jobs. The
# window stays a prefix per job: of a held job, every row after its FAILED row
# is left out. Rows of a job whose head is paused after a transient fault
# (``paused_until``, migration 0015) are left out the same way, the paused
# row included, until the pause has passed: during an outage of some
# partitions their rows pile up as dead letters' would. The probes are scalar
# subqueries, not NOT EXISTS: an anti join may be planned as a hash join,
# which reads every PENDING row and sorts them before the LIMIT can stop it; a
# subquery is probed row by row as the index is walked in order.
#
# Why the plan cannot go wrong: the statistics of a caught-up outbox say there
# are no PENDING rows, which once made the planner re-read the whole PENDING
# index for every candidate head. Here every access to the table is bounded by
# the window. The window is a LIMIT in id order over the PENDING index (the one
# plan left once bulk reads are off, see RELAY_SESSION). The lock
# step looks up at most a window's worth of ids (``= ANY``) and is also fenced
# by the window's last id, so even a scan of the PENDING index that filters
# instead of probing stops at the window's end. The rest works on the
# materialized window alone, and the lease looks the batch up by id.
#
# Ordering: a row lock, not a filter with side effects, decides what is taken.
# A locked head is re-checked on its newest version, so a head another relay
# published, dead-lettered or leased since this statement's snapshot is not
# taken. The head's lease is the job's mutex: a row that is not a head is only
# ever handed out behind its leased head.
LEASE_PENDING_SQL = """
WITH oldest AS MATERIALIZED (
    SELECT o.id, o.job_id
      FROM workflow_run_events_outbox AS o
     WHERE o.status = 'PENDING'
       AND (SELECT f.id
              FROM workflow_run_events_outbox AS f
             WHERE f.status = 'FAILED' AND f.job_id = o.job_id AND f.id < o.id
             LIMIT 1) IS NULL
       AND (SELECT p.id
              FROM workflow_run_events_outbox AS p
             WHERE p.paused_until IS NOT NULL AND p.paused_until > now()
               AND p.job_id = o.job_id AND p.id <= o.id
             LIMIT 1) IS NULL
     ORDER BY o.id
     LIMIT %(window)s
), head AS MATERIALIZED (
    SELECT o.id, o.job_id
      FROM workflow_run_events_outbox AS o
     WHERE o.id = ANY (ARRAY(SELECT DISTINCT ON (job_id) id FROM oldest ORDER BY job_id, id))
       AND o.id <= (SELECT max(id) FROM oldest)
       AND o.status = 'PENDING'
       AND (o.lease_until IS NULL OR o.lease_until <= now())
     ORDER BY o.id
     LIMIT %(limit)s
     FOR UPDATE OF o SKIP LOCKED
), batch AS MATERIALIZED (
    SELECT r.id
      FROM oldest AS r
     WHERE r.job_id = ANY (ARRAY(SELECT job_id FROM head))
     ORDER BY r.id
     LIMIT %(limit)s
)
UPDATE workflow_run_events_outbox AS o
   SET lease_owner = %(owner)s,
       lease_until = now() + make_interval(secs => %(lease_s)s)
 WHERE o.id = ANY (ARRAY(SELECT id FROM batch))
   AND o.status = 'PENDING'
RETURNING o.id, o.job_id, o.event_type, o.payload, o.attempts
"""

# The same lease with each row's job's stored trace context (migration 0013):
# one primary-key probe of workflow_run per row, paid only by a relay that
# traces. A job deleted by retention has no rows left to lease.
LEASE_PENDING_TRACED_SQL = LEASE_PENDING_SQL.replace(
    "RETURNING o.id, o.job_id, o.event_type, o.payload, o.attempts",
    "RETURNING o.id, o.job_id, o.event_type, o.payload, o.attempts,"
    " (SELECT array[r.traceparent, r.tracestate] FROM workflow_run AS r"
    " WHERE r.job_id = o.job_id)",
)


def lease_pending_params(
    limit: int, *, owner: str = "relay", lease_s: float = 60.0
) -> dict[str, object]:
    """The parameters of ``LEASE_PENDING_SQL`` for a batch of ``limit`` rows."""
    return {"limit": limit, "window": limit * WINDOW_BATCHES, "owner": owner, "lease_s": lease_s}


# What a relay's connection holds for its session (``Outbox(relay_pool=...)``);
# a store without such a connection sets them in each lease's transaction
# (``RELAY_SETTINGS_SQL``, pipelined with the lease: one round trip).
#
# Bulk reads off: with the statistics of an outbox analyzed while empty, the
# planner guesses dozens of PENDING rows where there are thousands, and
# reading every PENDING row through a bitmap and sorting them looks cheaper
# than walking the PENDING index in id order and stopping after the window.
# Nothing the relay does ever needs to read the table in bulk: the lease walks
# an index in order and looks rows up by id, the settle looks rows up by id.
# Switching bulk reads off leaves only those plans (Postgres picks a
# switched-off plan only when no other exists), so the cost of a pass no
# longer depends on guesses.
#
# No wait for the WAL flush at commit: a lease or a settle that a server crash
# loses leaves its rows PENDING, to be published again, as after a relay that
# dies between its publish and its settle: delivery stays at least once. A
# lost lease cannot be mistaken for a live one (its owner names one pass and
# never repeats), and the server loses only the newest commits, so what goes
# out again of a job is the tail of what went, in order. The relay's passes
# then add no flush waits of their own beside the workers' group commits
# (benchmarks/README.md, Relay).
RELAY_SESSION: dict[str, str] = {
    "enable_seqscan": "off",
    "enable_bitmapscan": "off",
    "synchronous_commit": "off",
}
RELAY_SETTINGS_SQL = "SELECT " + ", ".join(
    f"set_config('{name}', '{value}', true)" for name, value in RELAY_SESSION.items()
)

# Every row of a pass is settled in one statement, fenced on the pass's lease:
# a relay whose lease ran out (and whose rows another relay may have taken)
# changes nothing. Acked rows go PUBLISHED; rows refused for good go FAILED
# with the reason, the dead letter only an operator's redrive moves again;
# the rest are handed back: their lease cleared, and paused until the moment
# they may be tried again when the publisher asks for one (their job's later
# rows wait behind them), with the transient error noted and no attempt spent.
SETTLE_BATCH_SQL = """
WITH published AS (
    UPDATE workflow_run_events_outbox
       SET status = 'PUBLISHED', published_at = now(), attempts = attempts + 1,
           lease_owner = NULL, lease_until = NULL, paused_until = NULL
     WHERE id = ANY (%(published)s::bigint[])
       AND lease_owner = %(owner)s AND status = 'PENDING'
    RETURNING id
), failed AS (
    UPDATE workflow_run_events_outbox AS o
       SET status = 'FAILED', attempts = o.attempts + 1, last_error = f.error,
           lease_owner = NULL, lease_until = NULL, paused_until = NULL
      FROM unnest(%(failed)s::bigint[], %(failed_errors)s::text[]) AS f(id, error)
     WHERE o.id = f.id AND o.lease_owner = %(owner)s AND o.status = 'PENDING'
    RETURNING o.id, o.job_id, o.last_error
), handed_back AS (
    UPDATE workflow_run_events_outbox AS o
       SET last_error = coalesce(b.error, o.last_error),
           lease_owner = NULL,
           lease_until = NULL,
           paused_until = CASE WHEN b.retry_after_s > 0
                               THEN now() + make_interval(secs => b.retry_after_s) END
      FROM unnest(%(back)s::bigint[], %(back_errors)s::text[], %(back_after)s::float8[])
           AS b(id, error, retry_after_s)
     WHERE o.id = b.id AND o.lease_owner = %(owner)s AND o.status = 'PENDING'
    RETURNING o.id
)
SELECT (SELECT count(*) FROM published),
       (SELECT count(*) FROM handed_back),
       coalesce((SELECT array_agg(id ORDER BY id) FROM failed), '{}'),
       coalesce((SELECT array_agg(job_id ORDER BY id) FROM failed), '{}'),
       coalesce((SELECT array_agg(last_error ORDER BY id) FROM failed), '{}')
"""

SELECT_JOB_EVENTS_SQL = """
SELECT id, job_id, event_type, payload, status, attempts, last_error, created_at, published_at
  FROM workflow_run_events_outbox
 WHERE job_id = %(job_id)s
 ORDER BY id
"""

COUNT_PENDING_SQL = "SELECT count(*) FROM workflow_run_events_outbox WHERE status = 'PENDING'"

# When the oldest PENDING row a relay may publish was written (NULL when there
# is none): the PENDING index walked past the rows an older FAILED row of their
# job holds back, one probe of the FAILED index each, as the lease's window
# does. Those rows wait for an operator's redrive, not for a relay.
OLDEST_WAITING_CREATED_SQL = """(
    SELECT o.created_at FROM workflow_run_events_outbox AS o
     WHERE o.status = 'PENDING'
       AND (SELECT f.id
              FROM workflow_run_events_outbox AS f
             WHERE f.status = 'FAILED' AND f.job_id = o.job_id AND f.id < o.id
             LIMIT 1) IS NULL
     ORDER BY o.id LIMIT 1)"""

# What the relay reports as its backlog, read at most every few seconds: the
# age of the oldest PENDING row (the first entry of the PENDING index), the
# FAILED rows, counted on their small partial index and capped, so a pile of
# dead letters never makes this slow, and the age of the oldest PENDING row a
# relay may publish.
BACKLOG_SQL = f"""
SELECT extract(epoch FROM now() - (
           SELECT created_at FROM workflow_run_events_outbox
            WHERE status = 'PENDING' ORDER BY id LIMIT 1)),
       (SELECT count(*) FROM (
           SELECT 1 FROM workflow_run_events_outbox
            WHERE status = 'FAILED' LIMIT %(cap)s) AS capped),
       extract(epoch FROM now() - {OLDEST_WAITING_CREATED_SQL})
"""

# FAILED rows counted beyond this are reported as this many.
FAILED_COUNT_CAP = 10_000


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """A PENDING event handed to the publisher."""

    id: int
    job_id: UUID
    event_type: str
    # The encoded WorkflowRunEvent without event_id; see schemas.contract.with_event_id.
    payload: bytes
    attempts: int
    # The job's W3C trace context, read only by an Outbox made with ``traced``.
    traceparent: str | None = None
    tracestate: str | None = None


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
class PublishFailure:
    """Why a row did not go out, and whether trying again can ever help."""

    reason: str
    # True: the row can never be published (FAILED at once). False: a
    # transient fault; the row is handed back without spending an attempt.
    permanent: bool
    # For a transient fault: the soonest the row may be tried again.
    retry_after_s: float = 0.0


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A row this pass moved to FAILED."""

    id: int
    job_id: UUID
    reason: str


@dataclass(frozen=True, slots=True)
class RelayResult:
    # Rows leased and handed to the publisher.
    fetched: int
    published: int
    # Rows refused for good, now FAILED.
    failed: int
    # Rows that met a transient fault and were handed back, no attempt spent.
    transient: int
    # Rows handed back untouched, so they cannot overtake an older row of their job.
    held_back: int
    dead_letters: tuple[DeadLetter, ...] = ()
    # Rows whose lease had run out by the settle (another relay may have them):
    # their outcome was not recorded here.
    lost: int = 0


# Called with the batch in id order, with no transaction open; answers one
# entry per row: None when the broker acked it, else why it did not go out.
Publisher = Callable[[list[OutboxRow]], Awaitable[Sequence[PublishFailure | None]]]


@dataclass(frozen=True, slots=True)
class Backlog:
    # Seconds since the oldest PENDING row was written; None when there is none.
    oldest_pending_age_s: float | None
    # FAILED rows, up to FAILED_COUNT_CAP.
    failed_rows: int
    # Seconds since the oldest PENDING row that no FAILED row holds back was
    # written: the oldest a relay could be publishing. None when there is none.
    oldest_waiting_age_s: float | None = None


class Outbox:
    def __init__(
        self,
        pool: Pool,
        *,
        lease_s: float = 60.0,
        traced: bool = False,
        relay_pool: Pool | None = None,
    ) -> None:
        """``traced``: lease each row with its job's trace context (``OutboxRow.traceparent``).

        ``relay_pool``: where leases and settles go, a pool whose connections
        hold ``RELAY_SESSION``; without one they use ``pool``, and each lease
        sets those for its own transaction."""
        if lease_s <= 0:
            raise ValueError("lease_s must be positive")
        self._pool = pool
        self._relay_pool = relay_pool
        self._lease_sql = LEASE_PENDING_TRACED_SQL if traced else LEASE_PENDING_SQL
        # Longer than any publish may take: a lease that runs out mid-publish
        # lets another relay send the same rows again.
        self.lease_s = lease_s

    async def relay_batch(
        self, publish: Publisher, limit: int = 100, *, owner: str = "relay"
    ) -> RelayResult:
        """Lease up to ``limit`` PENDING rows, ``publish`` them, record what it answers.

        ``publish`` runs with no transaction open and no connection held. If it
        raises, every row is handed back as after a transient fault and the
        exception propagates; if it answers the wrong number of outcomes, every
        row is handed back untouched and ``ValueError`` is raised.
        """
        if limit < 1:
            raise ValueError("limit must be at least 1")
        # One pass of one relay: the fence of the settle, never reused.
        lease_owner = f"{owner}/{secrets.token_hex(8)}"
        rows = await self._lease(limit, lease_owner)
        if not rows:
            return RelayResult(0, 0, 0, 0, 0)
        try:
            outcomes = list(await publish(rows))
        except BaseException as exc:
            failure = PublishFailure(f"{type(exc).__name__}: {exc}", permanent=False)
            await self._settle(lease_owner, rows, [failure] * len(rows))
            raise
        if len(outcomes) != len(rows):
            await self._settle(lease_owner, rows, [None] * len(rows), hand_back_all=True)
            raise ValueError(f"publish answered {len(outcomes)} outcomes for {len(rows)} rows")
        return await self._settle(lease_owner, rows, outcomes)

    async def _lease(self, limit: int, lease_owner: str) -> list[OutboxRow]:
        params = lease_pending_params(limit, owner=lease_owner, lease_s=self.lease_s)
        if self._relay_pool is not None:
            async with self._relay_pool.connection() as conn:
                cursor = await conn.execute(self._lease_sql, params)
                fetched = await cursor.fetchall()
        else:
            async with self._pool.connection() as conn:
                # One round trip: BEGIN, the settings, the lease, COMMIT.
                async with conn.pipeline(), conn.transaction():
                    await conn.execute(RELAY_SETTINGS_SQL)
                    cursor = await conn.execute(self._lease_sql, params)
                fetched = await cursor.fetchall()
        return sorted((_outbox_row(row) for row in fetched), key=lambda row: row.id)

    async def _settle(
        self,
        lease_owner: str,
        rows: list[OutboxRow],
        outcomes: Sequence[PublishFailure | None],
        *,
        hand_back_all: bool = False,
    ) -> RelayResult:
        published: list[int] = []
        failed: list[int] = []
        failed_errors: list[str] = []
        back: list[int] = []
        back_errors: list[str | None] = []
        back_after: list[float] = []
        broken_jobs: set[UUID] = set()
        transient = held_back = 0
        for row, outcome in zip(rows, outcomes, strict=True):
            if hand_back_all or row.job_id in broken_jobs:
                back.append(row.id)
                back_errors.append(None)
                back_after.append(0.0)
                held_back += 1
            elif outcome is None:
                published.append(row.id)
            elif outcome.permanent:
                failed.append(row.id)
                failed_errors.append(outcome.reason or "publish refused")
                broken_jobs.add(row.job_id)
            else:
                back.append(row.id)
                back_errors.append(outcome.reason or "publish failed")
                back_after.append(max(outcome.retry_after_s, 0.0))
                broken_jobs.add(row.job_id)
                transient += 1
        async with (self._relay_pool or self._pool).connection() as conn:
            cursor = await conn.execute(
                SETTLE_BATCH_SQL,
                {
                    "owner": lease_owner,
                    "published": published,
                    "failed": failed,
                    "failed_errors": failed_errors,
                    "back": back,
                    "back_errors": back_errors,
                    "back_after": back_after,
                },
            )
            counts = await cursor.fetchone()
        assert counts is not None
        dead_letters = tuple(
            DeadLetter(id=int(i), job_id=j, reason=str(e))
            for i, j, e in zip(counts[2], counts[3], counts[4], strict=True)
        )
        settled = int(counts[0]) + int(counts[1]) + len(dead_letters)
        return RelayResult(
            fetched=len(rows),
            published=int(counts[0]),
            failed=len(dead_letters),
            transient=transient,
            held_back=held_back,
            dead_letters=dead_letters,
            lost=len(rows) - settled,
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

    async def backlog(self) -> Backlog:
        """The oldest PENDING row's age, the FAILED rows and the oldest publishable row's age."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute(BACKLOG_SQL, {"cap": FAILED_COUNT_CAP})
            row = await cursor.fetchone()
        assert row is not None
        return Backlog(
            oldest_pending_age_s=_age(row[0]),
            failed_rows=int(row[1]),
            oldest_waiting_age_s=_age(row[2]),
        )


def _age(seconds: Any) -> float | None:
    return None if seconds is None else max(float(seconds), 0.0)


def _outbox_row(row: Sequence[Any]) -> OutboxRow:
    if len(row) == 5:
        return OutboxRow(*row)
    id_, job_id, event_type, payload, attempts, trace = row
    traceparent, tracestate = trace or (None, None)
    return OutboxRow(id_, job_id, event_type, payload, attempts, traceparent, tracestate)
