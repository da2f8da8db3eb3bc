"""What a watcher of one job reads: its events after a point, its status, its progress.

One statement, so one snapshot: a status read as terminal comes with every
event committed with it (a settled job's last event shares its transaction).
So "terminal, and nothing after the last event sent" means the watch is over.
Events come from the outbox whatever their delivery state, so watching needs
no Kafka consumer and answers the same on every API replica.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from store.pool import Pool
from store.progress import Progress
from store.states import TERMINAL, Status

# Progress is the running step's: the row outlives the claim that wrote it (a
# retry, a park, a hand-back, the job's end), and is shown only while that
# claim holds the job. A report is fenced on the claim's lease, so one written
# under the current claim was written after it, both on the database clock.
READ_FEED_SQL = f"""
SELECT w.status,
       p.attempt, p.step_name, p.fraction, p.message, p.updated_at,
       coalesce(e.ids, '{{}}'), coalesce(e.payloads, '{{}}'), coalesce(e.created, '{{}}')
  FROM workflow_run AS w
  LEFT JOIN workflow_run_progress AS p
    ON p.job_id = w.job_id AND w.status = '{Status.RUNNING.value}' AND p.updated_at >= w.claimed_at
  LEFT JOIN LATERAL (
      SELECT array_agg(o.id ORDER BY o.id) AS ids,
             array_agg(o.payload ORDER BY o.id) AS payloads,
             array_agg(o.created_at ORDER BY o.id) AS created
        FROM (SELECT id, payload, created_at
                FROM workflow_run_events_outbox
               WHERE job_id = w.job_id AND id > %(after)s
               ORDER BY id
               LIMIT %(limit)s) AS o
  ) AS e ON true
 WHERE w.job_id = %(job_id)s
"""


@dataclass(frozen=True, slots=True)
class FeedEvent:
    """An outbox row as a watcher sees it: its id and the encoded event."""

    id: int
    payload: bytes
    created_at: datetime


@dataclass(frozen=True, slots=True)
class FeedPage:
    status: Status
    progress: Progress | None
    events: tuple[FeedEvent, ...]
    # More events follow the last one here than the page could hold.
    truncated: bool

    @property
    def finished(self) -> bool:
        """The job is terminal and every event it had when read is in this page."""
        return self.status in TERMINAL and not self.truncated


class JobFeed:
    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def read(self, job_id: UUID, *, after: int, limit: int) -> FeedPage | None:
        """The job's state and its events with ids above ``after``; ``None`` if it is gone."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                READ_FEED_SQL, {"job_id": job_id, "after": after, "limit": limit}
            )
            row = await cursor.fetchone()
        if row is None:
            return None
        status, attempt, step_name, fraction, message, updated_at, ids, payloads, created = row
        progress = (
            None
            if step_name is None
            else Progress(attempt, step_name, float(fraction), message, updated_at)
        )
        events = tuple(
            FeedEvent(int(i), bytes(p), c) for i, p, c in zip(ids, payloads, created, strict=True)
        )
        return FeedPage(Status(status), progress, events, truncated=len(events) >= limit)


__all__ = ["FeedEvent", "FeedPage", "JobFeed"]
