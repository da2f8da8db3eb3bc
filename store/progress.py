"""The latest progress of a job's running step: written in batches, read by watchers.

A report is only stored while the claim that made it still holds the job: the
write is fenced on the lease token, so a segment that lost its lease (or a job
that ended since) cannot overwrite what a later claim reports.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from store.pool import Pool
from store.records import storable_text

# One statement for every report a recorder has gathered. Rows whose claim is
# gone match nothing in ``held`` and are left out; the count says how many went in.
RECORD_PROGRESS_SQL = """
WITH reported AS (
    SELECT * FROM unnest(%(job_ids)s::uuid[], %(tokens)s::bigint[], %(attempts)s::int[],
                         %(steps)s::text[], %(fractions)s::real[], %(messages)s::text[])
        AS r(job_id, lease_token, attempt, step_name, fraction, message)
), held AS (
    SELECT r.*
      FROM reported AS r
      JOIN workflow_run AS w
        ON w.job_id = r.job_id AND w.lease_token = r.lease_token AND w.status = 'RUNNING'
), written AS (
    INSERT INTO workflow_run_progress AS p (job_id, attempt, step_name, fraction, message)
    SELECT job_id, attempt, step_name, fraction, message FROM held
    ON CONFLICT (job_id) DO UPDATE
       SET attempt = excluded.attempt,
           step_name = excluded.step_name,
           fraction = excluded.fraction,
           message = excluded.message,
           updated_at = now()
    RETURNING 1
)
SELECT count(*) FROM written
"""


@dataclass(frozen=True, slots=True)
class ProgressReport:
    """What a step said about how far it has got, under the claim that ran it."""

    job_id: UUID
    lease_token: int
    attempt: int
    step_name: str
    fraction: float
    message: str


@dataclass(frozen=True, slots=True)
class Progress:
    """The latest progress stored for a job."""

    attempt: int
    step_name: str
    fraction: float
    message: str
    updated_at: datetime


class ProgressStore:
    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def record(self, reports: Sequence[ProgressReport]) -> int:
        """Store each job's report if its claim still holds the job; how many were."""
        if not reports:
            return 0
        params = {
            "job_ids": [r.job_id for r in reports],
            "tokens": [r.lease_token for r in reports],
            "attempts": [r.attempt for r in reports],
            "steps": [r.step_name for r in reports],
            "fractions": [_as_real(r.fraction) for r in reports],
            "messages": [storable_text(r.message) for r in reports],
        }
        async with self._pool.connection() as conn:
            cursor = await conn.execute(RECORD_PROGRESS_SQL, params)
            row = await cursor.fetchone()
        return int(row[0]) if row else 0


def _as_real(fraction: float) -> float:
    """``fraction`` rounded as the ``real`` column holds it.

    Postgres refuses a cast that would round a non-zero double to zero (1e-50,
    a valid fraction) rather than store 0, and that would refuse the batch.
    """
    rounded: float = struct.unpack("f", struct.pack("f", fraction))[0]
    return rounded


__all__ = ["Progress", "ProgressReport", "ProgressStore"]
