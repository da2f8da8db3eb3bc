"""The operator verbs that act on a job's life: cancel (below) and resume.

Statements are in ``store.control_sql``. Each verb locks the rows it decides
about, builds their events from what it read, and changes the rows with their
events in one statement, as every commit point does.

Cancel. A QUEUED or WAITING job has no worker: it is CANCELLED at once, with
its CANCELLED event. A RUNNING job belongs to its worker: the request is
recorded (``cancel_requested_at``), from then on no checkpoint or other settle
of that worker lands, its next renewal answers with the request, and the
worker stops the segment and settles CANCELLED (``settle_cancelled``). A
worker that cannot do so leaves it to the sweeper (``sweep_cancelled``), once
the lease has passed. A terminal job is answered as it is; nothing changes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg.types.json import Jsonb

from schemas.contract import (
    DEFAULT_MAX_EVENT_BYTES,
    EventType,
    build_event,
    encode_event_within,
    timestamp_json,
)
from schemas.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from store.control_sql import (
    CANCEL_NOW_SQL,
    LOCK_CANCEL_REQUESTED_SQL,
    LOCK_RESUMABLE_SQL,
    REQUEST_CANCEL_SQL,
    RESUME_SQL,
    SELECT_CANCEL_ABANDONED_SQL,
    SETTLE_CANCELLED_SQL,
    SWEEP_CANCELLED_SQL,
    cancel_candidates_sql,
    resumable_jobs_sql,
)
from store.definitions import validate_workflow_name
from store.pool import Pool
from store.records import Job, Lease, job_from_row
from store.run_sql import LOCK_JOB_SQL, SELECT_JOB_SQL
from store.runs import RunStore
from store.states import TERMINAL, Status, parse_status

# =========================================================================== cancel

CancelOutcome = Literal["CANCELLED", "CANCEL_REQUESTED", "ALREADY_CANCELLED", "ALREADY_FINISHED"]

# A reason is a short note for people; the event carries it.
MAX_REASON_CHARS = 1000
# Rows a bulk cancel locks and changes per transaction.
CANCEL_BATCH = 500
_CANCELLED = EventType.Name(EventType.TYPE_CANCELLED).removeprefix("TYPE_")


@dataclass(frozen=True, slots=True)
class CancelResult:
    """What a cancel did to one job, and the job as it now stands."""

    outcome: CancelOutcome
    job: Job
    message: str


@dataclass(frozen=True, slots=True)
class CancelFilter:
    """Which jobs a bulk cancel reaches; at least one condition is required."""

    status: str = ""
    workflow_name: str = ""
    owner: str | None = None
    created_before: datetime | None = None


@dataclass(frozen=True, slots=True)
class BulkCancelResult:
    # QUEUED and WAITING jobs, CANCELLED at once.
    cancelled: tuple[UUID, ...]
    # RUNNING jobs whose workers were asked to stop.
    cancel_requested: tuple[UUID, ...]


def check_reason(reason: str) -> str:
    """The reason as stored; too long, or holding U+0000, is refused naming ``reason``."""
    if len(reason) > MAX_REASON_CHARS:
        raise InvalidArgument(
            f"reason is {len(reason)} characters; at most {MAX_REASON_CHARS} are kept"
        )
    if "\x00" in reason:
        raise InvalidArgument("reason must not contain U+0000")
    return reason


def _now() -> datetime:
    return datetime.now(UTC)


class ControlStore:
    """Cancel (and resume) against the run store's database."""

    def __init__(self, pool: Pool, *, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._pool = pool
        self.max_event_bytes = max_event_bytes

    @classmethod
    def beside(cls, runs: RunStore) -> ControlStore:
        """The control store sharing ``runs``'s pool and event limit."""
        return cls(runs.pool, max_event_bytes=runs.max_event_bytes)

    def _cancelled_event(
        self, job_id: UUID, workflow_name: str, attempt: int, reason: str | None
    ) -> bytes:
        event = build_event(
            job_id=job_id,
            event_type=EventType.TYPE_CANCELLED,
            workflow_name=workflow_name,
            attempt=attempt,
            occurred_at=_now(),
            reason=reason or "",
        )
        return encode_event_within(event, self.max_event_bytes)

    # ------------------------------------------------------------------- cancel

    async def cancel(
        self, job_id: UUID, *, reason: str = "", owner: str | None = None
    ) -> CancelResult:
        """Cancel one job; ``owner`` (when given) must own it, else ``NotFound``."""
        reason = check_reason(reason)
        async with self._pool.connection() as conn, conn.transaction():
            job = await _locked(conn, job_id, owner)
            if job.status in TERMINAL:
                return _terminal(job)
            if job.status == Status.RUNNING:
                if job.cancel_requested_at is not None:
                    return CancelResult(
                        "CANCEL_REQUESTED",
                        job,
                        f"job {job_id} was already asked to cancel at "
                        f"{timestamp_json(job.cancel_requested_at)}; its worker settles it",
                    )
                rows = await (
                    await conn.execute(
                        REQUEST_CANCEL_SQL, {"job_ids": [job_id], "reason": reason or None}
                    )
                ).fetchall()
                return CancelResult(
                    "CANCEL_REQUESTED",
                    job_from_row(rows[0]),
                    f"job {job_id} is RUNNING on {job.lease_owner}; it stops within a "
                    "heartbeat and is settled CANCELLED",
                )
            payload = self._cancelled_event(job_id, job.workflow_name, job.attempt, reason)
            rows = await (
                await conn.execute(
                    CANCEL_NOW_SQL,
                    {
                        "job_ids": [job_id],
                        "payloads": [payload],
                        "reason": reason or None,
                        "event_type": _CANCELLED,
                    },
                )
            ).fetchall()
        was = job.status.value
        return CancelResult(
            "CANCELLED", job_from_row(rows[0]), f"job {job_id} was {was}; now CANCELLED"
        )

    async def cancel_many(self, which: CancelFilter, *, reason: str = "") -> BulkCancelResult:
        """Cancel every live job ``which`` names, ``CANCEL_BATCH`` rows per transaction."""
        reason = check_reason(reason)
        params: dict[str, Any] = {"limit": CANCEL_BATCH}
        if which.status:
            status = parse_status(which.status)
            if status in TERMINAL:
                live = ", ".join(s.value for s in Status if s not in TERMINAL)
                raise InvalidArgument(
                    f"status {status.value} is terminal: nothing to cancel; give one of {live}"
                )
            params["status"] = status.value
        if which.workflow_name:
            params["workflow_name"] = validate_workflow_name(which.workflow_name)
        if which.owner is not None:
            params["owner"] = which.owner
        if which.created_before is not None:
            if which.created_before.tzinfo is None:
                raise InvalidArgument("created_before must carry a time zone")
            params["created_before"] = which.created_before
        if set(params) == {"limit"}:
            raise InvalidArgument(
                "a bulk cancel needs at least one of status, workflow_name, owner, created_before"
            )
        statement = cancel_candidates_sql(
            by_status="status" in params,
            by_name="workflow_name" in params,
            by_owner="owner" in params,
            before="created_before" in params,
        )
        cancelled: list[UUID] = []
        requested: list[UUID] = []
        while True:
            async with self._pool.connection() as conn, conn.transaction():
                rows = await (await conn.execute(statement, params)).fetchall()
                now_ids = [row[0] for row in rows if row[2] != Status.RUNNING]
                payloads = [
                    self._cancelled_event(job_id, name, attempt, reason)
                    for job_id, name, status, attempt in rows
                    if status != Status.RUNNING
                ]
                running = [row[0] for row in rows if row[2] == Status.RUNNING]
                if now_ids:
                    changed = await (
                        await conn.execute(
                            CANCEL_NOW_SQL,
                            {
                                "job_ids": now_ids,
                                "payloads": payloads,
                                "reason": reason or None,
                                "event_type": _CANCELLED,
                            },
                        )
                    ).fetchall()
                    cancelled.extend(row[0] for row in changed)
                if running:
                    changed = await (
                        await conn.execute(
                            REQUEST_CANCEL_SQL, {"job_ids": running, "reason": reason or None}
                        )
                    ).fetchall()
                    requested.extend(row[0] for row in changed)
            if len(rows) < CANCEL_BATCH:
                return BulkCancelResult(tuple(cancelled), tuple(requested))

    async def settle_cancelled(self, lease: Lease) -> bool:
        """The worker's settle of a job it was asked to cancel: CANCELLED, with its
        event and the attempt's history row. False when the row is not (or no
        longer) the lease's, or nobody asked to cancel it; nothing is written then."""
        fence = _fence(lease)
        async with self._pool.connection() as conn, conn.transaction():
            row = await (await conn.execute(LOCK_CANCEL_REQUESTED_SQL, fence)).fetchone()
            if row is None:
                return False
            workflow_name, reason = row
            payload = self._cancelled_event(lease.job_id, workflow_name, lease.attempt, reason)
            settled = await (
                await conn.execute(
                    SETTLE_CANCELLED_SQL,
                    {**fence, "payload": payload, "event_type": _CANCELLED},
                )
            ).fetchone()
        return settled is not None

    async def sweep_cancelled(self, *, limit: int = 1000, now: datetime | None = None) -> int:
        """Settle CANCELLED the RUNNING jobs asked to cancel whose lease passed
        (judged at ``now`` instead of the database clock, when given); how many."""
        async with self._pool.connection() as conn, conn.transaction():
            rows = await (
                await conn.execute(SELECT_CANCEL_ABANDONED_SQL, {"limit": limit, "now": now})
            ).fetchall()
            if not rows:
                return 0
            settled = await (
                await conn.execute(
                    SWEEP_CANCELLED_SQL,
                    {
                        "job_ids": [row[0] for row in rows],
                        "payloads": [
                            self._cancelled_event(job_id, name, attempt, reason)
                            for job_id, name, attempt, reason in rows
                        ],
                        "event_type": _CANCELLED,
                    },
                )
            ).fetchall()
        return len(settled)

    # ------------------------------------------------------------------- resume

    async def resume(
        self,
        *,
        original: Job,
        job_id: UUID,
        owner: str | None,
        keep: int,
        definition: dict[str, Any],
        definition_hash: str,
        new_definition: bool,
        max_attempts: int | None = None,
        deadline_ms: int | None = None,
    ) -> Resumed:
        """A new QUEUED run ``job_id`` of the ended job ``original``, linked both ways.

        The run takes the original's input and its first ``keep`` checkpoints,
        ``owner`` as its owner, ``max_attempts`` (None: the original's), a
        whole-job deadline ``deadline_ms`` from now (None: none), and
        names the snapshot ``definition_hash``: the original's, or (with
        ``new_definition``) ``definition``, stored once under that hash. The
        original gets only ``resumed_by``. The run's ACCEPTED event (with
        ``resumed_from``) and the original's RESUMED event (with ``resumed_by``)
        are written with the rows.

        The state is checked again under the original's row lock: a job that is
        not FAILED, DEAD or CANCELLED, or that another run already resumes, is
        refused (``FailedPrecondition``); when the run ``job_id`` names already
        resumes it, that run is answered with ``created`` false.
        """
        if keep < 0:
            raise InvalidArgument(f"keep must not be negative, got {keep}")
        now = _now()
        accepted = build_event(
            job_id=job_id,
            event_type=EventType.TYPE_ACCEPTED,
            workflow_name=original.workflow_name,
            attempt=0,
            occurred_at=now,
            resumed_from=original.job_id,
        )
        resumed = build_event(
            job_id=original.job_id,
            event_type=EventType.TYPE_RESUMED,
            workflow_name=original.workflow_name,
            attempt=original.attempt,
            occurred_at=now,
            resumed_by=job_id,
        )
        async with self._pool.connection() as conn, conn.transaction():
            cursor = await conn.execute(LOCK_RESUMABLE_SQL, {"original_id": original.job_id})
            locked = await cursor.fetchone()
            if locked is None:
                raise NotFound(f"job {original.job_id} not found")
            status, resumed_by, cancel_requested_at = locked
            if resumed_by is not None:
                if resumed_by != job_id:
                    raise already_resumed(original.job_id, resumed_by)
                cursor = await conn.execute(SELECT_JOB_SQL, {"job_id": job_id})
                existing = await cursor.fetchone()
                if existing is None:
                    raise NotFound(f"job {job_id}, which resumed job {original.job_id}, is gone")
                return Resumed(job_from_row(existing), created=False)
            if Status(status) not in RESUMABLE:
                raise not_resumable(original.job_id, status, cancel_requested_at)
            cursor = await conn.execute(
                RESUME_SQL,
                {
                    "original_id": original.job_id,
                    "job_id": job_id,
                    "owner": owner,
                    "keep": keep,
                    "max_attempts": max_attempts,
                    "deadline_ms": deadline_ms,
                    "definition_hash": definition_hash,
                    "definition": Jsonb(definition) if new_definition else None,
                    "accepted_payload": encode_event_within(accepted, self.max_event_bytes),
                    "resumed_payload": encode_event_within(resumed, self.max_event_bytes),
                },
            )
            row = await cursor.fetchone()
            if row is None:
                raise AlreadyExists(
                    f"job id {job_id} (made from job {original.job_id} and the request key) "
                    "is taken by a job that does not resume it; resume with another request key"
                )
        return Resumed(replace(job_from_row(row), definition=definition), created=True)

    async def resumable(
        self,
        *,
        statuses: Iterable[Status],
        workflow_name: str | None = None,
        owner: str | None = None,
        created_before: datetime | None = None,
        with_snapshot: bool = False,
        with_stored_definition: bool = False,
        limit: int,
    ) -> list[UUID]:
        """Ended jobs nothing resumes yet, oldest first, at most ``limit``;
        ``with_snapshot``: only those with a definition snapshot of their own;
        ``with_stored_definition``: only those whose workflow is stored now."""
        chosen = sorted(set(statuses))
        wrong = [status.value for status in chosen if status not in RESUMABLE]
        if wrong:
            raise InvalidArgument(
                f"statuses: only {RESUMABLE_NAMES} jobs can be resumed, got {', '.join(wrong)}"
            )
        if created_before is not None and created_before.tzinfo is None:
            raise InvalidArgument("created_before must carry a time zone")
        params: dict[str, Any] = {
            "statuses": [status.value for status in chosen or sorted(RESUMABLE)],
            "workflow_name": workflow_name,
            "owner": owner,
            "created_before": created_before,
            "limit": limit,
        }
        statement = resumable_jobs_sql(
            by_name=workflow_name is not None,
            by_owner=owner is not None,
            before=created_before is not None,
            with_snapshot=with_snapshot,
            with_stored_definition=with_stored_definition,
        )
        async with self._pool.connection() as conn:
            rows = await (await conn.execute(statement, params)).fetchall()
        return [row[0] for row in rows]


def _terminal(job: Job) -> CancelResult:
    if job.status == Status.CANCELLED:
        return CancelResult("ALREADY_CANCELLED", job, f"job {job.job_id} is already CANCELLED")
    return CancelResult(
        "ALREADY_FINISHED",
        job,
        f"job {job.job_id} already finished {job.status.value}; nothing to cancel",
    )


async def _locked(conn: AsyncConnection[TupleRow], job_id: UUID, owner: str | None) -> Job:
    row = await (await conn.execute(LOCK_JOB_SQL, {"job_id": job_id})).fetchone()
    job = job_from_row(row) if row is not None else None
    if job is None or (owner is not None and job.owner != owner):
        raise NotFound(f"job {job_id} not found")
    return job


def _fence(lease: Lease) -> dict[str, Any]:
    return {
        "job_id": lease.job_id,
        "worker_id": lease.worker_id,
        "attempt": lease.attempt,
        "token": lease.token,
    }


__all__ = [
    "CANCEL_BATCH",
    "MAX_REASON_CHARS",
    "RESUMABLE",
    "BulkCancelResult",
    "CancelFilter",
    "CancelOutcome",
    "CancelResult",
    "ControlStore",
    "Resumed",
    "check_reason",
    "resume_job_id",
]

# =========================================================================== resume

# What may be resumed: a job that ended without completing.
RESUMABLE: frozenset[Status] = frozenset({Status.FAILED, Status.DEAD, Status.CANCELLED})
RESUMABLE_NAMES = ", ".join(sorted(RESUMABLE))


def resume_job_id(original_id: UUID, request_key: str) -> UUID:
    """The id of the run that resumes ``original_id`` for ``request_key``.

    Derived, not drawn: a resume sent again with the same key names the same
    run, so it creates nothing the second time.
    """
    return uuid.uuid5(original_id, request_key)


def not_resumable(
    job_id: UUID, status: str, cancel_requested_at: datetime | None = None
) -> FailedPrecondition:
    """The refusal of a resume of a job in ``status``, saying what to do instead;
    ``cancel_requested_at``: when it was asked to cancel, if it was."""
    if status == Status.COMPLETED:
        advice = "it completed; submit a new job to run the workflow again"
    elif cancel_requested_at is not None:
        advice = (
            f"it was asked to cancel at {timestamp_json(cancel_requested_at)} and is CANCELLED "
            "once its worker (or the sweeper) settles it: resume it then"
        )
    else:
        advice = f"it has not ended; cancel it first (wfjobs cancel {job_id})"
    return FailedPrecondition(
        f"job {job_id} is {status}: only a {RESUMABLE_NAMES} job can be resumed, and {advice}"
    )


def already_resumed(job_id: UUID, resumed_by: UUID) -> FailedPrecondition:
    return FailedPrecondition(
        f"job {job_id} was already resumed by job {resumed_by}; a job is resumed once: "
        f"resume {resumed_by} instead once it has ended"
    )


@dataclass(frozen=True, slots=True)
class Resumed:
    """What a resume did: the run that resumes the job, and whether this call made it."""

    job: Job
    created: bool
