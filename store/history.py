"""Reading what happened to a job: its attempts, its events' delivery, its place in line.

The history is written by the statements that end attempts (``store.run_sql``,
through ``store.history_sql.attempt_insert``); this module only reads it, and
the other facts ``explain`` sets beside it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import TupleRow

from store.history_sql import (
    SELECT_ATTEMPTS_SQL,
    SELECT_OUTBOX_STATE_SQL,
    SELECT_QUEUE_POSITION_SQL,
)
from store.pool import Pool
from store.records import Attempt, OutboxState


def _attempt(row: tuple[Any, ...]) -> Attempt:
    attempt, worker, claimed_at, ended_at, outcome, steps, error, error_class, next_run_at = row
    return Attempt(
        attempt=attempt,
        worker=worker,
        claimed_at=claimed_at,
        ended_at=ended_at,
        outcome=outcome,
        steps=tuple(steps or ()),
        error=error,
        error_class=error_class,
        next_run_at=next_run_at,
    )


async def read_attempts(conn: AsyncConnection[TupleRow], job_id: UUID) -> tuple[Attempt, ...]:
    """The job's ended attempts, oldest first, on ``conn`` (in its transaction, if any)."""
    rows = await (await conn.execute(SELECT_ATTEMPTS_SQL, {"job_id": job_id})).fetchall()
    return tuple(_attempt(row) for row in rows)


async def read_outbox_state(conn: AsyncConnection[TupleRow], job_id: UUID) -> OutboxState:
    """How many of the job's events wait, failed, or went out, on ``conn``."""
    cursor = await conn.execute(SELECT_OUTBOX_STATE_SQL, {"job_id": job_id})
    row = await cursor.fetchone()
    assert row is not None  # an aggregate always answers one row
    pending, failed, published, oldest_unsent_at, last_error = row
    return OutboxState(
        pending=pending,
        failed=failed,
        published=published,
        oldest_unsent_at=oldest_unsent_at,
        last_error=last_error,
    )


async def read_queue_position(
    conn: AsyncConnection[TupleRow], *, run_after: datetime, created_at: datetime, limit: int
) -> tuple[datetime, int]:
    """The database's now, and how many claimable jobs a claim takes before a
    QUEUED job with these times (counted no further than ``limit``), on ``conn``."""
    cursor = await conn.execute(
        SELECT_QUEUE_POSITION_SQL,
        {"run_after": run_after, "created_at": created_at, "limit": limit},
    )
    row = await cursor.fetchone()
    assert row is not None  # a SELECT without FROM always answers one row
    return row[0], int(row[1])


class HistoryStore:
    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def attempts(self, job_id: UUID) -> tuple[Attempt, ...]:
        """The job's ended attempts, oldest first (none for an unknown job)."""
        async with self._pool.connection() as conn:
            return await read_attempts(conn, job_id)


__all__ = ["HistoryStore", "read_attempts", "read_outbox_state", "read_queue_position"]
