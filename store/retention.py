"""Retention: what the store lets go of, and when.

Three things would otherwise grow forever, and one pass deletes, in small
batches of short transactions:

* terminal jobs (``states.TERMINAL``) settled longer ago than their status's
  age, and only once every outbox row of the job is PUBLISHED: a job whose
  events are still on their way (PENDING) or dead-lettered (FAILED) stays;
* PUBLISHED outbox rows published longer ago than the outbox age; PENDING and
  FAILED rows are never deleted, whatever their age;
* definition snapshots no job names any more.

Nothing that is not terminal is ever a candidate: a QUEUED, RUNNING or WAITING
job stays whatever its age. Every statement re-checks its conditions on the
row it deletes, so a pass racing the claim loops or the relay deletes nothing
they still work on. Ages are measured against the database clock, or against
``now`` when a caller (a test) hands one in.

One pass at a time in the whole fleet: a pass holds a session advisory lock
for as long as it runs, and a process that finds it taken skips its turn.
Passes only ever overlap harmlessly anyway; the lock keeps a fleet from doing
the same work N times.

A snapshot is deleted under the exclusive form of the per-hash lock each
submit holds in shared form (see ``store.run_sql.SNAPSHOT_LOCK_CLASS``): taken
without waiting, so retention never holds up a submit, and followed by a fresh
check that no job names the snapshot.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import TupleRow

from store.pool import Pool
from store.run_sql import SNAPSHOT_LOCK_CLASS
from store.states import TERMINAL, Status

# A session lock key of its own; the migration runner's is ...0001.
RETENTION_LOCK_KEY = 0x77666A6F62730008

DEFAULT_BATCH = 500

# The outbox row's own state (not a job's): the only one retention deletes.
PUBLISHED = "PUBLISHED"

TRY_PASS_LOCK_SQL = "SELECT pg_try_advisory_lock(%(key)s)"
PASS_UNLOCK_SQL = "SELECT pg_advisory_unlock(%(key)s)"

# The moment before which something is old enough to go.
_CUTOFF = "(coalesce(%(now)s::timestamptz, now()) - %(age_s)s * interval '1 second')"

# The outbox is walked in id order, a batch at a time, from the last id the
# previous batch saw, so rows that must stay (PENDING, FAILED, published too
# recently) are read once per pass, not once per batch. Ids grow with time, so
# the walk stops at the first batch that reaches rows written after the cutoff:
# everything beyond is younger still (give or take a transaction's length,
# which the next pass picks up).
DELETE_OUTBOX_BATCH_SQL = f"""
WITH scanned AS MATERIALIZED (
    SELECT id, created_at FROM workflow_run_events_outbox
     WHERE id > %(after_id)s
     ORDER BY id
     LIMIT %(limit)s
), deleted AS (
    DELETE FROM workflow_run_events_outbox AS o
     USING scanned
     WHERE o.id = scanned.id AND o.status = '{PUBLISHED}' AND o.published_at < {_CUTOFF}
    RETURNING o.id
)
SELECT (SELECT count(*) FROM deleted),
       (SELECT count(*) FROM scanned),
       (SELECT max(id) FROM scanned),
       (SELECT coalesce(bool_or(created_at >= {_CUTOFF}), false) FROM scanned)
"""


def delete_jobs_batch_sql(status: Status) -> str:
    """One batch of ``status`` jobs settled before the cutoff, oldest first.

    The walk goes by ``(created_at, job_id)`` over the (status, created_at)
    index: a job settles after it is created, so one settled before the cutoff
    was also created before it, and the walk ends at the cutoff. A job that
    must stay (its events are not all PUBLISHED, or it settled after the
    cutoff) is passed over once per pass.

    A terminal job gains an event only when it is resumed, in the transaction
    that sets its ``resumed_by``. The statement's look at the job's events
    cannot see an event whose transaction commits while the delete waits for
    the row's lock, so the delete also asks that ``resumed_by`` is still what
    the walk read: a job resumed meanwhile is left to a later pass, which sees
    its RESUMED event on its way.
    """
    if status not in TERMINAL:
        raise ValueError(f"{status} is not a terminal status; retention never deletes it")
    literal = f"'{status.value}'"
    return f"""
WITH scanned AS MATERIALIZED (
    SELECT job_id, created_at, resumed_by FROM workflow_run
     WHERE status = {literal} AND created_at < {_CUTOFF}
       AND (created_at, job_id) > (%(after_created_at)s, %(after_job_id)s)
     ORDER BY created_at, job_id
     LIMIT %(limit)s
), deleted AS (
    DELETE FROM workflow_run AS r
     USING scanned
     WHERE r.job_id = scanned.job_id AND r.status = {literal} AND r.updated_at < {_CUTOFF}
       AND r.resumed_by IS NOT DISTINCT FROM scanned.resumed_by
       AND NOT EXISTS (
           SELECT FROM workflow_run_events_outbox AS o
            WHERE o.job_id = r.job_id AND o.status <> '{PUBLISHED}')
    RETURNING r.job_id
), last AS (
    SELECT created_at, job_id FROM scanned ORDER BY created_at DESC, job_id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM deleted),
       (SELECT count(*) FROM scanned),
       (SELECT created_at FROM last),
       (SELECT job_id FROM last)
"""


# Candidates first, in a statement of their own: each is then locked without
# waiting (a submit holding its hash keeps it), and only the locked ones are
# deleted, after a second look at whether a job names them. That second look
# is a new statement, so it sees every submit that held the lock before.
# MATERIALIZED keeps the lock calls off snapshots a job still names.
UNREFERENCED_SNAPSHOTS_SQL = f"""
WITH unreferenced AS MATERIALIZED (
    SELECT s.hash FROM workflow_definition_snapshot AS s
     WHERE s.hash > %(after_hash)s
       AND NOT EXISTS (SELECT FROM workflow_run AS r WHERE r.definition_hash = s.hash)
     ORDER BY s.hash
     LIMIT %(limit)s
)
SELECT hash, pg_try_advisory_xact_lock({SNAPSHOT_LOCK_CLASS}, hashtext(hash)) FROM unreferenced
"""

DELETE_SNAPSHOTS_SQL = """
DELETE FROM workflow_definition_snapshot AS s
 WHERE s.hash = ANY(%(hashes)s::text[])
   AND NOT EXISTS (SELECT FROM workflow_run AS r WHERE r.definition_hash = s.hash)
"""

_BEFORE_EVERY_JOB = (datetime.fromisoformat("0001-01-01T00:00:00+00:00"), UUID(int=0))


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How long things are kept; ``None`` keeps them forever."""

    # PUBLISHED outbox rows, counted from their publication.
    outbox: timedelta | None
    # Terminal jobs by status, counted from when they settled; a terminal
    # status missing here is kept forever.
    jobs: Mapping[Status, timedelta | None]

    def __post_init__(self) -> None:
        for status, age in self.jobs.items():
            if status not in TERMINAL:
                raise ValueError(f"{status} is not a terminal status; retention never deletes it")
            if age is not None and age <= timedelta(0):
                raise ValueError(f"the retention of {status} jobs must be positive, got {age}")
        if self.outbox is not None and self.outbox <= timedelta(0):
            raise ValueError(f"the outbox retention must be positive, got {self.outbox}")


@dataclass(slots=True)
class PassResult:
    """What one pass deleted."""

    # False when another process was running a pass; nothing was done.
    ran: bool
    outbox_rows: int = 0
    jobs: dict[Status, int] = field(default_factory=dict)
    snapshots: int = 0
    batches: int = 0

    @property
    def deleted(self) -> int:
        return self.outbox_rows + sum(self.jobs.values()) + self.snapshots


class RetentionStore:
    def __init__(self, pool: Pool, *, batch: int = DEFAULT_BATCH, pause_s: float = 0.0) -> None:
        if batch < 1:
            raise ValueError("batch must be at least 1")
        if pause_s < 0:
            raise ValueError("pause_s must not be negative")
        self._pool = pool
        self.batch = batch
        # Between two batches, so a pass over a long history trickles instead
        # of competing with the hot path for the disk and the WAL.
        self.pause_s = pause_s

    async def run_pass(self, policy: RetentionPolicy, *, now: datetime | None = None) -> PassResult:
        """Delete everything ``policy`` lets go of, unless another process is at it."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute(TRY_PASS_LOCK_SQL, {"key": RETENTION_LOCK_KEY})
            row = await cursor.fetchone()
            if row is None or not row[0]:
                return PassResult(ran=False)
            try:
                return await self._pass(conn, policy, now)
            finally:
                await _unlock(conn)

    async def _pass(
        self, conn: AsyncConnection[TupleRow], policy: RetentionPolicy, now: datetime | None
    ) -> PassResult:
        result = PassResult(ran=True)
        for status in sorted(policy.jobs):
            age = policy.jobs[status]
            if age is not None:
                result.jobs[status] = await self._delete_jobs(conn, result, status, age, now)
        if policy.outbox is not None:
            result.outbox_rows = await self._delete_outbox(conn, result, policy.outbox, now)
        result.snapshots = await self._delete_snapshots(conn, result)
        return result

    async def _delete_jobs(
        self,
        conn: AsyncConnection[TupleRow],
        result: PassResult,
        status: Status,
        age: timedelta,
        now: datetime | None,
    ) -> int:
        statement = delete_jobs_batch_sql(status)
        after_created_at, after_job_id = _BEFORE_EVERY_JOB
        deleted = 0
        while True:
            cursor = await conn.execute(
                statement,
                {
                    "now": now,
                    "age_s": age.total_seconds(),
                    "after_created_at": after_created_at,
                    "after_job_id": after_job_id,
                    "limit": self.batch,
                },
            )
            row = await cursor.fetchone()
            assert row is not None
            count, scanned, last_created_at, last_job_id = row
            deleted += int(count)
            result.batches += 1
            if scanned < self.batch:
                return deleted
            after_created_at, after_job_id = last_created_at, last_job_id
            await self._pause()

    async def _delete_outbox(
        self,
        conn: AsyncConnection[TupleRow],
        result: PassResult,
        age: timedelta,
        now: datetime | None,
    ) -> int:
        after_id = 0
        deleted = 0
        while True:
            cursor = await conn.execute(
                DELETE_OUTBOX_BATCH_SQL,
                {
                    "now": now,
                    "age_s": age.total_seconds(),
                    "after_id": after_id,
                    "limit": self.batch,
                },
            )
            row = await cursor.fetchone()
            assert row is not None
            count, scanned, last_id, reached_young = row
            deleted += int(count)
            result.batches += 1
            if scanned < self.batch or reached_young:
                return deleted
            after_id = last_id
            await self._pause()

    async def _delete_snapshots(self, conn: AsyncConnection[TupleRow], result: PassResult) -> int:
        after_hash = ""
        deleted = 0
        while True:
            async with conn.transaction():
                cursor = await conn.execute(
                    UNREFERENCED_SNAPSHOTS_SQL, {"after_hash": after_hash, "limit": self.batch}
                )
                candidates = await cursor.fetchall()
                locked = [str(hash_) for hash_, got in candidates if got]
                if locked:
                    cursor = await conn.execute(DELETE_SNAPSHOTS_SQL, {"hashes": locked})
                    deleted += cursor.rowcount
            result.batches += 1
            if len(candidates) < self.batch:
                return deleted
            after_hash = str(candidates[-1][0])
            await self._pause()

    async def _pause(self) -> None:
        if self.pause_s:
            await asyncio.sleep(self.pause_s)


async def _unlock(conn: AsyncConnection[TupleRow]) -> None:
    try:
        await conn.execute(PASS_UNLOCK_SQL, {"key": RETENTION_LOCK_KEY})
    except BaseException:
        # The lock must not outlive the pass on a connection the pool hands
        # out again; a closed connection takes its session locks with it.
        await conn.close()
        raise


__all__ = [
    "DEFAULT_BATCH",
    "RETENTION_LOCK_KEY",
    "PassResult",
    "RetentionPolicy",
    "RetentionStore",
    "delete_jobs_batch_sql",
]
