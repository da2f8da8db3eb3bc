"""The outbox's dead letters: list FAILED rows and send them round again.

A row the broker refused for good (a record larger than the topic allows) or
that cannot be serialized becomes FAILED at once and stays there; an outage,
or a schema the registry refuses, never fails a row, however long it lasts.
Once the cause is fixed (the topic's limit raised), an operator redrives it: FAILED goes
back to PENDING with its attempts reset, ``last_error`` kept so the row still
tells what happened, and a NOTIFY wakes the relays at once. Only FAILED rows
are ever touched, so a redrive can neither republish a PUBLISHED row nor
disturb a PENDING one.

Order: a FAILED row holds its job's later PENDING rows back (the relay's
fetch), so a redriven row is still its job's head and reaches the topic before
the job's later events.

Owners: with ``owner`` set, every call reaches only the rows of jobs that
principal owns; other rows are as if they were not there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from schemas.contract import parse_job_id
from schemas.errors import InvalidArgument
from store.channels import OUTBOX_CHANNEL
from store.pool import Pool

DEFAULT_LIST_LIMIT = 50
MAX_LIST_LIMIT = 500
MAX_ROW_ID = 2**63 - 1
# Sending a list of ids costs the driver a quarter of a second per hundred
# thousand, on the event loop; a job's rows, or every row, go by job_id or all.
MAX_REDRIVE_IDS = 1000

_FAILED_COLUMNS = "id, job_id, event_type, attempts, last_error, created_at"

# A NULL owner reaches every row; otherwise only rows of that owner's jobs.
_OWNED = """(%(owner)s::text IS NULL OR EXISTS (
    SELECT FROM workflow_run AS r
     WHERE r.job_id = workflow_run_events_outbox.job_id AND r.owner = %(owner)s))"""

# Oldest first, paged by id: a page token is the last id of the previous page.
LIST_FAILED_SQL = f"""
SELECT {_FAILED_COLUMNS}
  FROM workflow_run_events_outbox
 WHERE status = 'FAILED' AND id > %(after_id)s AND {_OWNED}
 ORDER BY id
 LIMIT %(limit)s
"""

# Served by the (job_id, id) index.
LIST_FAILED_OF_JOB_SQL = f"""
SELECT {_FAILED_COLUMNS}
  FROM workflow_run_events_outbox
 WHERE job_id = %(job_id)s AND status = 'FAILED' AND id > %(after_id)s AND {_OWNED}
 ORDER BY id
 LIMIT %(limit)s
"""

_REDRIVE = f"""
UPDATE workflow_run_events_outbox
   SET status = 'PENDING', attempts = 0
 WHERE status = 'FAILED' AND {_OWNED} AND {{where}}
RETURNING id, job_id
"""
REDRIVE_IDS_SQL = _REDRIVE.format(where="id = ANY(%(ids)s::bigint[])")
REDRIVE_JOB_SQL = _REDRIVE.format(where="job_id = %(job_id)s")
REDRIVE_ALL_SQL = _REDRIVE.format(where="true")

# Sent in the redrive's transaction, so the relays wake when it commits.
WAKE_RELAYS_SQL = f"SELECT pg_notify('{OUTBOX_CHANNEL}', '')"


@dataclass(frozen=True, slots=True)
class FailedEvent:
    """A FAILED outbox row, as an operator needs to see it."""

    id: int
    job_id: UUID
    event_type: str
    attempts: int
    last_error: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class FailedEventPage:
    events: tuple[FailedEvent, ...]
    # Empty when there is no further page.
    next_page_token: str


@dataclass(frozen=True, slots=True)
class Redriven:
    """What a redrive moved back to PENDING, in id order."""

    events: tuple[tuple[int, UUID], ...]
    # Ids that were asked for by name but name no FAILED row (unknown, or
    # PENDING or PUBLISHED by now); nothing was done to them.
    not_failed: tuple[int, ...] = ()

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(event_id for event_id, _ in self.events)


def parse_page_token(token: str) -> int:
    """A page token of the FAILED listing is the last row id of the previous page."""
    if not token:
        return 0
    # str.isdigit also takes digits int() cannot read, such as superscripts; a
    # row id is a bigint, which Postgres would refuse to compare past its range.
    if not (token.isascii() and token.isdigit()) or len(token) > 19 or int(token) > MAX_ROW_ID:
        raise InvalidArgument(
            f"page_token {token!r} is malformed; pass the next_page_token of a previous answer"
        )
    return int(token)


class OutboxDeadLetters:
    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def list_failed(
        self,
        *,
        job_id: UUID | str | None = None,
        limit: int = 0,
        page_token: str = "",
        owner: str | None = None,
    ) -> FailedEventPage:
        """FAILED rows oldest first; ``limit`` 0 means 50, above 500 is clamped."""
        if limit < 0:
            raise InvalidArgument(f"limit must not be negative, got {limit}")
        limit = DEFAULT_LIST_LIMIT if limit == 0 else min(limit, MAX_LIST_LIMIT)
        params: dict[str, Any] = {
            "after_id": parse_page_token(page_token),
            "limit": limit + 1,
            "owner": owner,
        }
        statement = LIST_FAILED_SQL
        if job_id is not None:
            params["job_id"] = parse_job_id(job_id)
            statement = LIST_FAILED_OF_JOB_SQL
        async with self._pool.connection() as conn:
            rows = await (await conn.execute(statement, params)).fetchall()
        events = tuple(FailedEvent(*row) for row in rows[:limit])
        token = str(events[-1].id) if len(rows) > limit else ""
        return FailedEventPage(events=events, next_page_token=token)

    async def redrive_ids(self, ids: Sequence[int], *, owner: str | None = None) -> Redriven:
        """Redrive the named rows; ids that name no FAILED row are reported, not errors."""
        wanted = sorted(set(ids))
        if not wanted:
            raise InvalidArgument("ids must name at least one outbox row")
        if len(wanted) > MAX_REDRIVE_IDS:
            raise InvalidArgument(
                f"ids names {len(wanted)} outbox rows; a redrive takes at most "
                f"{MAX_REDRIVE_IDS} (redrive a job's rows by job_id, or every row with all)"
            )
        # Row ids are bigint: Postgres refuses to compare one past its range.
        if wanted[0] < 1 or wanted[-1] > MAX_ROW_ID:
            raise InvalidArgument(f"ids must be outbox row ids, 1 to {MAX_ROW_ID}, got {wanted}")
        done = await self._redrive(REDRIVE_IDS_SQL, {"ids": wanted, "owner": owner})
        moved = {event_id for event_id, _ in done}
        return Redriven(done, tuple(event_id for event_id in wanted if event_id not in moved))

    async def redrive_job(self, job_id: UUID | str, *, owner: str | None = None) -> Redriven:
        """Redrive every FAILED row of one job."""
        params = {"job_id": parse_job_id(job_id), "owner": owner}
        return Redriven(await self._redrive(REDRIVE_JOB_SQL, params))

    async def redrive_all(self, *, owner: str | None = None) -> Redriven:
        """Redrive every FAILED row."""
        return Redriven(await self._redrive(REDRIVE_ALL_SQL, {"owner": owner}))

    async def _redrive(
        self, statement: str, params: dict[str, Any]
    ) -> tuple[tuple[int, UUID], ...]:
        async with self._pool.connection() as conn, conn.transaction():
            rows = await (await conn.execute(statement, params)).fetchall()
            if rows:
                await conn.execute(WAKE_RELAYS_SQL)
        return tuple(sorted((int(event_id), job_id) for event_id, job_id in rows))


__all__ = [
    "FailedEvent",
    "FailedEventPage",
    "OutboxDeadLetters",
    "Redriven",
    "parse_page_token",
]
