"""The run store: one method per commit point of a job.

The values it answers with are in ``store.records``, the statements it sends in
``store.run_sql``.

A commit point changes the job row and writes its one outbox row in the same
statement (a data-modifying CTE), so the event can never drift from the state it
describes and the hot path costs one round trip. Event bytes are encoded here,
at write time, so the relay only ships them.

Fencing: every write a worker makes to a RUNNING row names its ``Lease``
(owner and attempt). When the row no longer matches, the statement changes
nothing, inserts no event, and ``LeaseLost`` is raised.

Attempts count claims. A claim adds one; a voluntary hand-off (``hand_back`` at
shutdown, the resume after an accepted ``complete_step``) gives it back, so
parking on a human or restarting a fleet never pushes a job towards DEAD. The
claim never takes a QUEUED row whose attempts are used up; the sweeper settles
such rows DEAD (they only appear when an operator lowers ``max_attempts``).

Size: every event is encoded through ``RunStore._encode``, which refuses one
above ``max_event_bytes`` with ``EventTooLarge`` before anything is written (the
broker would refuse it on every try, leaving a FAILED outbox row). Error and
verdict texts are cut to a fraction of the limit, so the FAILED or DEAD event
that reports such a refusal always fits.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Unpack
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg.types.json import Jsonb

from schemas.contract import (
    DEFAULT_MAX_EVENT_BYTES,
    MIN_EVENT_BYTES,
    EventType,
    WorkflowRunEvent,
    build_event,
    encode_event_within,
    parse_job_id,
    refuse_oversize,
    timestamp_json,
)
from schemas.errors import EventTooLarge, InvalidArgument, LeaseLost, NotFound
from schemas.event_wire import accepted_bytes, completed_bytes, step_checkpoint_bytes
from store.deadline_sql import (
    DEADLINE_FAIL_SQL,
    SELECT_JOB_DEADLINES_SQL,
    SELECT_STEP_DEADLINES_SQL,
    STEP_FALLBACK_SQL,
)
from store.definitions import validate_workflow_name
from store.errors import refused_value
from store.group_commit import Answer, GroupCommit
from store.group_commit_sql import Kind
from store.history import (
    HistoryStore,
    read_attempts,
    read_outbox_state,
    read_queue_position,
)
from store.history_sql import ONE_SNAPSHOT_SQL, ErrorClass
from store.pool import Pool
from store.records import (
    Attempt,
    ClaimedJob,
    CompleteStepResult,
    DeadlineSweep,
    FailedSubmission,
    FallbackLookup,
    Job,
    JobPage,
    JobSummary,
    Lease,
    OutboxState,
    RetryOutcome,
    SegmentProgress,
    StepOutcome,
    StepVerifier,
    Submission,
    SubmitResult,
    SweepResult,
    job_from_row,
    storable_text,
)
from store.run_sql import (
    ACCEPT_STEP_SQL,
    CHECKPOINT_SQL,
    CLAIM_SETTINGS_SQL,
    CLAIM_SQL,
    CLAIM_WITHOUT_DEFINITIONS_SQL,
    COMPLETE_SQL,
    COUNT_QUEUED_SQL,
    EXTEND_LEASE_SQL,
    FAIL_SQL,
    HAND_BACK_SQL,
    LOCK_JOB_SQL,
    PARK_SQL,
    REJECT_STEP_SQL,
    RENEW_SEGMENT_SQL,
    RETRY_OR_DIE_SQL,
    SELECT_EXHAUSTED_SQL,
    SELECT_EXPIRED_SQL,
    SELECT_JOB_SQL,
    SELECT_SNAPSHOTS_SQL,
    SUMMARY_COLUMNS,
    SWEEP_DEAD_SQL,
    SWEEP_REQUEUE_SQL,
    TRANSACTION_NOW_SQL,
    list_jobs_sql,
)
from store.states import Status, parse_status
from store.submit_batch import submit_rows
from store.submit_group import SubmitGroup

DEFAULT_LIST_LIMIT = 50
MAX_LIST_LIMIT = 500
MAX_ATTEMPTS_CEILING = 100
# The longest a retry's backoff may be configured to wait: a year, far below
# the last date a row's run_after (or a Python datetime) can hold.
RETRY_MAX_CEILING_S = 365 * 86_400.0
# Error and verdict texts in rows and events are cut to this many UTF-8 bytes
# (or a quarter of the event limit, if smaller): a FAILED event carries the
# text twice at most, and must fit.
MAX_EVENT_TEXT_BYTES = 16_384


# --------------------------------------------------------------------------- helpers


def _summary(row: Sequence[Any]) -> JobSummary:
    fields = dict(zip(SUMMARY_COLUMNS, row, strict=True))
    fields["status"] = Status(fields["status"])
    return JobSummary(**fields)


def _now() -> datetime:
    return datetime.now(UTC)


# Read once: each attribute of the enum wrapper is a Python-level lookup.
_ACCEPTED = EventType.TYPE_ACCEPTED
_STEP_CHECKPOINT = EventType.TYPE_STEP_CHECKPOINT
_COMPLETED = EventType.TYPE_COMPLETED


def _event_name(event_type: int) -> str:
    return EventType.Name(event_type).removeprefix("TYPE_")


_ACCEPTED_NAME = _event_name(_ACCEPTED)


def _as_uuid(job_id: UUID | str) -> UUID:
    return job_id if isinstance(job_id, UUID) else parse_job_id(job_id)


def _check_entry(entry: Mapping[str, Any]) -> tuple[str, bool, dict[str, Any]]:
    name, skipped, response = entry.get("name"), entry.get("skipped"), entry.get("response")
    if (
        set(entry) != {"name", "skipped", "response"}
        or not isinstance(name, str)
        or not name
        or not isinstance(skipped, bool)
        or not isinstance(response, dict)
    ):
        raise InvalidArgument(
            "a checkpoint entry is exactly {'name': non-empty str, 'skipped': bool, "
            f"'response': dict}}, got {dict(entry)!r}"
        )
    return name, skipped, response


def encode_page_token(created_at: datetime, job_id: UUID) -> str:
    raw = f"{created_at.isoformat()}|{job_id}".encode()
    return base64.urlsafe_b64encode(raw).decode("ascii")


def decode_page_token(token: str) -> tuple[datetime, UUID]:
    try:
        # Strictly: the lenient decoder skips what is not base64, so a token
        # with a space or a character added would be taken as the one it was.
        raw = base64.b64decode(token.encode("ascii"), altchars=b"-_", validate=True)
        created_text, job_text = raw.decode().split("|")
        created_at = datetime.fromisoformat(created_text)
        if created_at.tzinfo is None:
            raise ValueError("naive timestamp")
        return created_at, UUID(job_text)
    except (ValueError, UnicodeError, binascii.Error):
        raise InvalidArgument(
            f"page_token {token!r} is malformed; pass the next_page_token of a previous answer"
        ) from None


# --------------------------------------------------------------------------- the store


class RunStore:
    def __init__(
        self,
        pool: Pool,
        *,
        retry_base_s: float = 5.0,
        retry_max_s: float = 3600.0,
        default_max_attempts: int = 3,
        lease_s: float = 300.0,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        group_commit: bool = True,
        claim_pool: Pool | None = None,
        commit_pool: Pool | None = None,
        submit_pool: Pool | None = None,
    ) -> None:
        """``group_commit``: send the commit points of a running job (checkpoint,
        complete, park, fail, retry-or-die) through one ``GroupCommit``, which
        writes those of concurrent runners in one statement, and concurrent
        submits through one ``SubmitGroup`` likewise; off, each is its own
        statement.

        ``claim_pool``: where claims go, a pool whose connections hold
        ``store.run_sql.CLAIM_SESSION`` (see there); without one, claims use
        ``pool`` and set those for each claim's transaction.

        ``commit_pool`` and ``submit_pool``: where the group commit and the
        grouped submits write; without them, ``pool``. Each writer sends one
        statement at a time, so a pool of one connection serves it, and every
        statement then finds the same backend still warm: the shared pool
        hands out the connection idle longest, a cold backend each time."""
        if retry_base_s <= 0 or lease_s <= 0:
            raise ValueError("retry_base_s and lease_s must be positive")
        if not 0 < retry_max_s <= RETRY_MAX_CEILING_S:
            raise ValueError(f"retry_max_s must be within 0..{RETRY_MAX_CEILING_S:.0f} seconds")
        if max_event_bytes < MIN_EVENT_BYTES:
            raise ValueError(f"max_event_bytes must be at least {MIN_EVENT_BYTES}")
        if not 1 <= default_max_attempts <= MAX_ATTEMPTS_CEILING:
            raise ValueError(f"default_max_attempts must be within 1..{MAX_ATTEMPTS_CEILING}")
        self._pool = pool
        self._claim_pool = claim_pool
        self.retry_base_s = retry_base_s
        self.retry_max_s = retry_max_s
        self.default_max_attempts = default_max_attempts
        self.lease_s = lease_s
        self.max_event_bytes = max_event_bytes
        self._max_text_bytes = min(MAX_EVENT_TEXT_BYTES, max_event_bytes // 4)
        self.history = HistoryStore(pool)
        self.group: GroupCommit | None = None
        self.submits: SubmitGroup | None = (
            SubmitGroup(submit_pool or pool) if group_commit else None
        )
        if group_commit:
            self.group = GroupCommit(
                commit_pool or pool,
                {
                    "checkpoint_type": _event_name(EventType.TYPE_STEP_CHECKPOINT),
                    "complete_type": _event_name(EventType.TYPE_COMPLETED),
                    "park_type": _event_name(EventType.TYPE_WAITING),
                    "fail_type": _event_name(EventType.TYPE_FAILED),
                    "dead_type": _event_name(EventType.TYPE_DEAD),
                    "retry_type": _event_name(EventType.TYPE_RETRY_SCHEDULED),
                },
            )

    @property
    def pool(self) -> Pool:
        """The pool this store sends through, for the stores that share it."""
        return self._pool

    # ----------------------------------------------------------------- event size

    def _encode(self, event: WorkflowRunEvent) -> bytes:
        """The event's outbox bytes; ``EventTooLarge`` past ``max_event_bytes``."""
        return encode_event_within(event, self.max_event_bytes)

    def _event_text(self, text: str) -> str:
        """An error or verdict as rows and events keep it: storable, and cut to fit."""
        text = storable_text(text)
        if len(text) <= self._max_text_bytes // 4:
            return text
        raw = text.encode()
        if len(raw) <= self._max_text_bytes:
            return text
        marker = f" [... {len(raw):,} bytes in all, cut]"
        kept = raw[: self._max_text_bytes - len(marker.encode())]
        return kept.decode(errors="ignore") + marker

    # ----------------------------------------------------------------- submit

    async def submit(self, **submission: Unpack[Submission]) -> SubmitResult:
        """Insert a QUEUED job and its ACCEPTED event, unless ``job_id`` exists.

        ``definition_hash`` must identify ``definition`` (the engine's
        ``definition_hash``): the snapshot is stored once under it, and a later
        job naming the same hash reads the snapshot stored first. ``owner`` is
        the submitting principal; an existing job keeps its own. ``deadline_ms``
        sets the whole-job deadline, counted from now on the database's clock.
        """
        [result] = await self.write_submits([self.submit_params(**submission)])
        return result

    async def write_submits(self, rows: Sequence[Mapping[str, Any]]) -> list[SubmitResult]:
        """Write rows that ``submit_params`` and ``submit_failed_params`` built, each
        unless its job exists; answers in ``rows`` order (``store.submit_batch``).

        With group commit, concurrent callers' rows share one statement.
        """
        if self.submits is not None:
            return await self.submits.write(rows)
        return await submit_rows(self._pool, rows)

    def submit_params(self, **submission: Unpack[Submission]) -> dict[str, Any]:
        """The checked row and encoded event ``submit`` writes, for one or a batch
        (``store.submit_batch``); raises what ``submit`` raises before writing."""
        job_id, workflow_name = submission["job_id"], submission["workflow_name"]
        input = submission["input"]
        max_attempts = submission.get("max_attempts")
        validate_workflow_name(workflow_name)
        if not submission["definition_hash"]:
            raise InvalidArgument("definition_hash must not be empty: it names the snapshot")
        if max_attempts is None or max_attempts == 0:
            max_attempts = self.default_max_attempts
        if not 1 <= max_attempts <= MAX_ATTEMPTS_CEILING:
            raise InvalidArgument(
                f"max_attempts must be within 1..{MAX_ATTEMPTS_CEILING} (0 for the default "
                f"{self.default_max_attempts}), got {max_attempts}"
            )
        # The ACCEPTED event does not carry the input, but the request that
        # submits the same job through the requests topic does: what the API
        # accepts must fit there too.
        refuse_oversize(
            len(json.dumps(input, ensure_ascii=False, separators=(",", ":")).encode()),
            self.max_event_bytes,
            f"the input of job {job_id} (as JSON)",
        )
        occurred_at = _now()
        payload = accepted_bytes(
            job_id=job_id, workflow_name=workflow_name, occurred_at=occurred_at
        )
        if payload is None or len(payload) > self.max_event_bytes:
            # The message decides, and words any refusal.
            event = build_event(
                job_id=job_id,
                event_type=_ACCEPTED,
                workflow_name=workflow_name,
                attempt=0,
                occurred_at=occurred_at,
            )
            payload = self._encode(event)
        return {
            "job_id": job_id,
            "workflow_name": workflow_name,
            "definition": Jsonb(submission["definition"]),
            "definition_hash": submission["definition_hash"],
            "input": Jsonb(input),
            "status": Status.QUEUED.value,
            "max_attempts": max_attempts,
            "error": None,
            "event_type": _ACCEPTED_NAME,
            "payload": payload,
            "owner": submission.get("owner"),
            "deadline_ms": submission.get("deadline_ms") or None,
            "traceparent": submission.get("traceparent"),
            "tracestate": submission.get("tracestate"),
        }

    async def submit_failed(self, **failed: Unpack[FailedSubmission]) -> SubmitResult:
        """Record a request that cannot run (e.g. an unknown stored workflow) as FAILED."""
        [result] = await self.write_submits([self.submit_failed_params(**failed)])
        return result

    def submit_failed_params(self, **failed: Unpack[FailedSubmission]) -> dict[str, Any]:
        """The FAILED row and event ``submit_failed`` writes, as ``submit_params``."""
        job_id, workflow_name = failed["job_id"], failed["workflow_name"]
        error = self._event_text(failed["error"])
        event = build_event(
            job_id=job_id,
            event_type=EventType.TYPE_FAILED,
            workflow_name=workflow_name,
            attempt=0,
            occurred_at=_now(),
            error=error,
        )
        return {
            "job_id": job_id,
            "workflow_name": workflow_name,
            "definition": None,
            "definition_hash": "",
            "input": Jsonb(failed["input"]),
            "status": Status.FAILED.value,
            "max_attempts": self.default_max_attempts,
            "error": error,
            "event_type": _event_name(EventType.TYPE_FAILED),
            "payload": self._encode(event),
            "owner": failed.get("owner"),
            "deadline_ms": None,
            "traceparent": failed.get("traceparent"),
            "tracestate": failed.get("tracestate"),
        }

    # ----------------------------------------------------------------- claim

    async def claim(self, worker_id: str) -> ClaimedJob | None:
        """Take the oldest eligible QUEUED job, or None when there is none."""
        claimed = await self.claim_batch(worker_id, 1)
        return claimed[0] if claimed else None

    async def claim_batch(
        self, worker_id: str, limit: int, *, compiled: Callable[[str], bool] | None = None
    ) -> list[ClaimedJob]:
        """Take up to ``limit`` eligible QUEUED jobs, oldest first, in one statement.

        ``compiled`` says which definition hashes the caller has compiled: the
        claim then reads no snapshot per job, only, by hash, those it lacks,
        and a job whose hash it has comes with an empty ``definition``.
        """
        if not worker_id or not worker_id.strip():
            raise InvalidArgument("worker_id must not be blank: it is written into lease_owner")
        if limit < 1:
            raise InvalidArgument(f"claim limit must be at least 1, got {limit}")
        params = {"limit": limit, "worker_id": worker_id, "lease_s": self.lease_s}
        statement = CLAIM_SQL if compiled is None else CLAIM_WITHOUT_DEFINITIONS_SQL
        # Prepared from the first claim on each connection, as the group
        # commit's statement is.
        if self._claim_pool is not None:
            async with self._claim_pool.connection() as conn:
                cursor = await conn.execute(statement, params, prepare=True)
                rows = await cursor.fetchall()
        else:
            async with self._pool.connection() as conn:
                # One round trip: BEGIN, the claim's settings, the claim, COMMIT.
                async with conn.pipeline(), conn.transaction():
                    await conn.execute(CLAIM_SETTINGS_SQL, prepare=True)
                    cursor = await conn.execute(statement, params, prepare=True)
                rows = await cursor.fetchall()
        arrived_at = _now()
        jobs = sorted(
            ((job_from_row(row[:-1]), row[-1]) for row in rows),
            key=lambda pair: (pair[0].run_after, pair[0].created_at),
        )
        snapshots: dict[str, dict[str, Any]] = {}
        if compiled is not None:
            lacking = {
                job.definition_hash
                for job, _ in jobs
                if job.definition_hash and not compiled(job.definition_hash)
            }
            if lacking:
                snapshots = await self.definition_snapshots(lacking)
        return [
            ClaimedJob(
                job=job,
                lease=Lease(
                    job.job_id,
                    worker_id,
                    job.attempt,
                    job.workflow_name,
                    token,
                    clock_offset_s=_clock_offset_s(job.claimed_at, arrived_at),
                ),
                definition=job.definition or snapshots.get(job.definition_hash or "", {}),
            )
            for job, token in jobs
        ]

    async def definition_snapshots(self, hashes: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The stored definition snapshots of ``hashes``, by hash; unknown ones are absent."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute(SELECT_SNAPSHOTS_SQL, {"hashes": list(hashes)})
            return {str(digest): definition for digest, definition in await cursor.fetchall()}

    # ----------------------------------------------------------------- fenced writes

    async def extend_lease(
        self, lease: Lease, progress: SegmentProgress | None = None
    ) -> datetime | None:
        """Push ``lease_until`` to now + lease; LeaseLost if the lease is gone.

        With ``progress`` the renewal is for that segment: it records the
        segment's progress, and is refused (LeaseLost) once the segment went
        without progress for its deadline plus the lease.

        Answers when an operator asked to cancel the job, or None: a worker
        told so stops the segment and settles the job CANCELLED.
        """
        params: dict[str, Any] = {**_fence(lease), "lease_s": self.lease_s}
        statement = EXTEND_LEASE_SQL
        if progress is not None:
            statement = RENEW_SEGMENT_SQL
            params.update(
                mark=progress.mark,
                idle_s=max(progress.idle_s, 0.0),
                deadline_s=progress.deadline_s,
            )
        async with self._pool.connection() as conn:
            cursor = await conn.execute(statement, params)
            row = await cursor.fetchone()
        if row is None:
            raise _lease_lost(lease, "extend its lease (gone, or its segment stalled)")
        cancel_requested_at: datetime | None = row[1]
        return cancel_requested_at

    async def checkpoint(self, lease: Lease, entry: Mapping[str, Any]) -> None:
        """Append one step's entry to ``checkpoints`` with its STEP_CHECKPOINT event."""
        stored, payload = self._checkpoint_of(lease, entry)
        what = f"checkpoint step {stored.obj['name']!r}"
        if self.group is not None:
            values = {"entry": stored, "payload": payload}
            await self._grouped(Kind.CHECKPOINT, lease, values, what)
            return
        await self._commit_point(
            CHECKPOINT_SQL, lease, _STEP_CHECKPOINT, payload, {"entry": stored}, what
        )

    def _checkpoint_of(self, lease: Lease, entry: Mapping[str, Any]) -> tuple[Jsonb, bytes]:
        """A checkpoint entry as the row keeps it, and its STEP_CHECKPOINT event's bytes."""
        name, skipped, response = _check_entry(entry)
        occurred_at = _now()
        payload = step_checkpoint_bytes(
            job_id=lease.job_id,
            workflow_name=lease.workflow_name,
            attempt=lease.attempt,
            occurred_at=occurred_at,
            step_name=name,
            response=response,
            skipped=skipped,
        )
        if payload is None or len(payload) > self.max_event_bytes:
            # The message decides, and words any refusal.
            event = _lease_event(
                lease,
                _STEP_CHECKPOINT,
                occurred_at=occurred_at,
                step_name=name,
                response=response,
                skipped=skipped,
            )
            payload = self._encode(event)
        return Jsonb({"name": name, "skipped": skipped, "response": response}), payload

    async def park(
        self,
        lease: Lease,
        step_name: str,
        *,
        request: Mapping[str, Any] | None = None,
        timeout_ms: int | None = None,
    ) -> None:
        """WAITING on the external step ``step_name``, with its WAITING event.

        ``request`` is what the step's rules built for whoever completes it:
        kept on the row and carried on the event. ``timeout_ms`` sets the
        step's deadline, counted from now on the database's clock.
        """
        event = _lease_event(
            lease,
            EventType.TYPE_WAITING,
            step_name=step_name,
            review_request=request,
        )
        values = {
            "step_name": step_name,
            "review_request": Jsonb(dict(request)) if request is not None else None,
            "timeout_ms": timeout_ms,
        }
        if self.group is not None:
            await self._grouped(
                Kind.PARK, lease, {**values, "payload": self._encode(event)}, "park"
            )
            return
        await self._commit_point(PARK_SQL, lease, event.type, self._encode(event), values, "park")

    async def complete(
        self,
        lease: Lease,
        *,
        result: dict[str, Any],
        verdict: str,
        last_checkpoint: Mapping[str, Any] | None = None,
    ) -> None:
        """COMPLETED with its verdict and result, with the COMPLETED event.

        ``last_checkpoint`` is the segment's last step, when its runner held the
        entry back because nothing runs after it: appended with its
        STEP_CHECKPOINT event before the COMPLETED one, in the same statement
        under group commit (without it, as a checkpoint of its own first).
        """
        what = "store the job's result"
        stored: Jsonb | None = None
        entry_payload: bytes | None = None
        if last_checkpoint is not None:
            stored, entry_payload = self._checkpoint_of(lease, last_checkpoint)
            if self.group is None:
                await self.checkpoint(lease, last_checkpoint)
        payload = self._completed_payload(lease, verdict, result)
        if self.group is not None:
            values = {
                "entry": stored,
                "entry_payload": entry_payload,
                "result": Jsonb(result),
                "verdict": verdict,
                "payload": payload,
            }
            await self._grouped(Kind.COMPLETE, lease, values, what)
            return
        await self._commit_point(
            COMPLETE_SQL,
            lease,
            _COMPLETED,
            payload,
            {"result": Jsonb(result), "verdict": verdict},
            what,
        )

    def _completed_payload(self, lease: Lease, verdict: str, result: dict[str, Any]) -> bytes:
        """The COMPLETED event's bytes."""
        occurred_at = _now()
        payload = completed_bytes(
            job_id=lease.job_id,
            workflow_name=lease.workflow_name,
            attempt=lease.attempt,
            occurred_at=occurred_at,
            verdict=verdict,
            result=result,
        )
        if payload is None or len(payload) > self.max_event_bytes:
            event = _lease_event(
                lease, _COMPLETED, occurred_at=occurred_at, verdict=verdict, result=result
            )
            payload = self._encode(event)
        return payload

    async def fail(self, lease: Lease, *, error: str = "", verdict: str = "") -> None:
        """FAILED: a verdict (the violations) or a non-retryable error, recorded verbatim.

        The FAILED event must carry an error, so a verdict failure also uses the
        violations as its error; the row's ``verdict`` tells the two apart.
        """
        error, verdict = self._event_text(error), self._event_text(verdict)
        message = error or verdict
        event = _lease_event(lease, EventType.TYPE_FAILED, verdict=verdict, error=message)
        error_class = ErrorClass.NON_RETRYABLE if error else ErrorClass.VERDICT
        values: dict[str, Any] = {
            "verdict": verdict or None,
            "error": message,
            "error_class": error_class.value,
        }
        if self.group is not None:
            values["payload"] = self._encode(event)
            await self._grouped(Kind.FAIL, lease, values, "fail")
            return
        await self._commit_point(FAIL_SQL, lease, event.type, self._encode(event), values, "fail")

    async def retry_or_die(
        self, lease: Lease, error: str, *, error_class: ErrorClass = ErrorClass.RETRYABLE
    ) -> RetryOutcome:
        """Requeue with backoff while attempts remain, else DEAD with ``error`` verbatim.

        Either way the attempt joins the history with ``error_class``; a
        requeue publishes RETRY_SCHEDULED with its next run time, DEAD its DEAD.
        A retry that would start after the job's whole-job deadline is not
        scheduled: the job is FAILED at once, as the deadline would fail it,
        with ``error`` and why it was not retried. The backoff
        (``retry_delay_s``) is counted from now on the database clock, as the
        claim measured it against this process's (``Lease.clock_offset_s``), so
        the row and the event name the same instant.
        """
        next_run_at = (
            _now()
            + timedelta(seconds=lease.clock_offset_s)
            + timedelta(seconds=self.retry_delay_s(lease.attempt))
        )
        late_error = self._event_text(
            f"{error}; not retried: the job's deadline passes before its next attempt, "
            f"due at {timestamp_json(next_run_at)}"
        )
        error = self._event_text(error)
        dead_event = _lease_event(lease, EventType.TYPE_DEAD, error=error)
        late_event = _lease_event(lease, EventType.TYPE_FAILED, error=late_error, deadline="job")
        retry_event = _lease_event(
            lease, EventType.TYPE_RETRY_SCHEDULED, error=error, next_run_at=next_run_at
        )
        if self.group is not None:
            values = {
                "next_run_at": next_run_at,
                "error": error,
                "late_error": late_error,
                "error_class": error_class.value,
                "payload": self._encode(dead_event),
                "late_payload": self._encode(late_event),
                "retry_payload": self._encode(retry_event),
            }
            answer = await self._grouped(Kind.RETRY_OR_DIE, lease, values, "settle a retry")
            status, attempt, max_attempts, run_after = answer
            assert status is not None and attempt is not None and max_attempts is not None
            assert run_after is not None
            return RetryOutcome(
                status=Status(status),
                attempt=attempt,
                max_attempts=max_attempts,
                run_after=run_after,
            )
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                RETRY_OR_DIE_SQL,
                {
                    **_fence(lease),
                    "next_run_at": next_run_at,
                    "error": error,
                    "error_class": error_class.value,
                    "late_error": late_error,
                    "event_type": _event_name(EventType.TYPE_DEAD),
                    "payload": self._encode(dead_event),
                    "late_event_type": _event_name(EventType.TYPE_FAILED),
                    "late_payload": self._encode(late_event),
                    "retry_event_type": _event_name(EventType.TYPE_RETRY_SCHEDULED),
                    "retry_payload": self._encode(retry_event),
                },
            )
            row = await cursor.fetchone()
        if row is None:
            raise _lease_lost(lease, "settle a retry")
        status, attempt, max_attempts, run_after = row
        return RetryOutcome(
            status=Status(status), attempt=attempt, max_attempts=max_attempts, run_after=run_after
        )

    def retry_delay_s(self, attempt: int) -> float:
        """The backoff after ``attempt`` failed: ``base x 2^(attempt-1)``, capped.

        Uncapped, the default base doubled past attempt 36 lands beyond the
        last date a row can hold; the float product of a large base can only
        reach infinity, which the cap takes in."""
        return min(self.retry_max_s, self.retry_base_s * 2.0 ** max(attempt - 1, 0))

    async def hand_back(self, lease: Lease) -> None:
        """QUEUED now, the attempt given back, no event: for shutdown or a store failure.

        The history keeps the attempt, HANDED_BACK."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute(HAND_BACK_SQL, _fence(lease))
            if await cursor.fetchone() is None:
                raise _lease_lost(lease, "hand the job back")

    async def _grouped(
        self, kind: Kind, lease: Lease, values: Mapping[str, Any], what: str
    ) -> Answer:
        """One commit point through the group commit; LeaseLost when its row did not match."""
        assert self.group is not None
        try:
            answer = await self.group.write(kind, lease, values)
        except Exception as exc:
            refused = refused_value(exc, what)
            if refused is None:
                raise
            raise refused from exc
        if answer is None:
            raise _lease_lost(lease, what)
        return answer

    async def _commit_point(
        self,
        statement: str,
        lease: Lease,
        event_type: int,
        payload: bytes,
        params: dict[str, Any],
        what: str,
    ) -> None:
        async with self._pool.connection() as conn:
            try:
                cursor = await conn.execute(
                    statement,
                    {
                        **_fence(lease),
                        **params,
                        "event_type": _event_name(event_type),
                        "payload": payload,
                    },
                )
            except Exception as exc:
                refused = refused_value(exc, what)
                if refused is None:
                    raise
                raise refused from exc
            if await cursor.fetchone() is None:
                raise _lease_lost(lease, what)

    # ----------------------------------------------------------------- sweeper

    async def sweep_expired(self, *, limit: int = 1000, now: datetime | None = None) -> SweepResult:
        """Requeue RUNNING rows whose lease passed or whose segment stalled, or DEAD
        them when no attempt is left.

        Also settles DEAD any QUEUED row whose attempts are already used up.
        ``now`` judges leases and stalls at that instant instead of the
        database's ``now()``.
        """
        requeue_ids: list[UUID] = []
        requeue_errors: list[str] = []
        # The history's side of each row: who held it, why it was taken.
        requeue_classes: list[str] = []
        requeue_workers: list[str | None] = []
        requeue_events: list[tuple[str, int]] = []
        dead_ids: list[UUID] = []
        dead_errors: list[str] = []
        dead_payloads: list[bytes] = []
        dead_classes: list[str | None] = []
        dead_workers: list[str | None] = []
        stalled_count = 0
        async with self._pool.connection() as conn, conn.transaction():
            expired = await (
                await conn.execute(SELECT_EXPIRED_SQL, {"limit": limit, "now": now})
            ).fetchall()
            exhausted = await (
                await conn.execute(SELECT_EXHAUSTED_SQL, {"limit": limit})
            ).fetchall()
            stalled_ids = {row[0] for row in expired if row[-1]}
            stalled_count = len(stalled_ids)
            occurred_at = _now()
            for job_id, name, status, attempt, max_attempts, owner, last_error in (
                *(row[:-1] for row in expired),
                *exhausted,
            ):
                error_class: str | None = None
                if status == Status.RUNNING:
                    if job_id in stalled_ids:
                        error = (
                            f"segment made no progress for longer than its deadline plus the "
                            f"lease on attempt {attempt}/{max_attempts} (worker {owner})"
                        )
                        error_class = ErrorClass.STALL.value
                    else:
                        error = (
                            f"lease expired on attempt {attempt}/{max_attempts} (worker {owner})"
                        )
                        error_class = ErrorClass.LEASE.value
                    if attempt < max_attempts:
                        requeue_ids.append(job_id)
                        requeue_errors.append(error)
                        requeue_classes.append(error_class)
                        requeue_workers.append(owner)
                        requeue_events.append((name, attempt))
                        continue
                else:
                    error = f"attempts exhausted ({attempt}/{max_attempts}) while queued"
                    if last_error:
                        error += f"; last error: {last_error}"
                    error = self._event_text(error)
                event = build_event(
                    job_id=job_id,
                    event_type=EventType.TYPE_DEAD,
                    workflow_name=name,
                    attempt=attempt,
                    occurred_at=occurred_at,
                    error=error,
                )
                dead_ids.append(job_id)
                dead_errors.append(error)
                dead_payloads.append(self._encode(event))
                dead_classes.append(error_class)
                dead_workers.append(owner)
            if requeue_ids:
                # A requeued job may run again at once: at this transaction's now().
                next_run_at = (await (await conn.execute(TRANSACTION_NOW_SQL)).fetchall())[0][0]
                retry_payloads = [
                    self._encode(
                        build_event(
                            job_id=job_id,
                            event_type=EventType.TYPE_RETRY_SCHEDULED,
                            workflow_name=name,
                            attempt=attempt,
                            occurred_at=occurred_at,
                            error=error,
                            next_run_at=next_run_at,
                        )
                    )
                    for job_id, error, (name, attempt) in zip(
                        requeue_ids, requeue_errors, requeue_events, strict=True
                    )
                ]
                await conn.execute(
                    SWEEP_REQUEUE_SQL,
                    {
                        "job_ids": requeue_ids,
                        "errors": requeue_errors,
                        "error_classes": requeue_classes,
                        "workers": requeue_workers,
                        "payloads": retry_payloads,
                        "event_type": _event_name(EventType.TYPE_RETRY_SCHEDULED),
                    },
                )
            if dead_ids:
                await conn.execute(
                    SWEEP_DEAD_SQL,
                    {
                        "job_ids": dead_ids,
                        "errors": dead_errors,
                        "payloads": dead_payloads,
                        "error_classes": dead_classes,
                        "workers": dead_workers,
                        "event_type": _event_name(EventType.TYPE_DEAD),
                    },
                )
        return SweepResult(requeued=len(requeue_ids), dead=len(dead_ids), stalled=stalled_count)

    async def sweep_deadlines(
        self,
        *,
        limit: int = 1000,
        now: datetime | None = None,
        fallback_of: FallbackLookup | None = None,
    ) -> DeadlineSweep:
        """FAIL live jobs past their whole-job deadline and WAITING jobs past their
        step's timeout, or give a timed-out step its declared fallback.

        Judged against the database's clock, or at ``now`` when given. A RUNNING
        job fails even though a worker holds it: that worker's next fenced write
        finds the lease gone. ``fallback_of`` tells a step's fallback from the
        job's definition snapshot; without it every timed-out step fails its job.
        """
        failed_ids: list[UUID] = []
        failed_was: list[str] = []
        failed_errors: list[str] = []
        failed_payloads: list[bytes] = []
        fallback_ids: list[UUID] = []
        fallback_entries: list[str] = []
        fallback_payloads: list[bytes] = []
        job_deadlines = step_timeouts = 0
        params = {"limit": limit, "now": now}
        async with self._pool.connection() as conn, conn.transaction():
            occurred_at = _now()
            for job_id, name, status, attempt, deadline_at, step in await (
                await conn.execute(SELECT_JOB_DEADLINES_SQL, params)
            ).fetchall():
                where = f" while parked on step {step!r}" if status == Status.WAITING else ""
                error = self._event_text(
                    f"the job's deadline passed at {timestamp_json(deadline_at)} while it was "
                    f"{status}{where} (attempt {attempt})"
                )
                event = build_event(
                    job_id=job_id,
                    event_type=EventType.TYPE_FAILED,
                    workflow_name=name,
                    attempt=attempt,
                    occurred_at=occurred_at,
                    error=error,
                    deadline="job",
                )
                failed_ids.append(job_id)
                failed_was.append(status)
                failed_errors.append(error)
                failed_payloads.append(self._encode(event))
                job_deadlines += 1
            passed = set(failed_ids)
            timed_out = await (await conn.execute(SELECT_STEP_DEADLINES_SQL, params)).fetchall()
            snapshots: dict[str, dict[str, Any]] = {}
            if fallback_of is not None and timed_out:
                # Once per snapshot: a burst of timeouts mostly shares one.
                cursor = await conn.execute(
                    SELECT_SNAPSHOTS_SQL, {"hashes": list({row[-1] for row in timed_out})}
                )
                snapshots = {str(digest): found for digest, found in await cursor.fetchall()}
            for job_id, name, attempt, step_deadline_at, step, digest in timed_out:
                if job_id in passed:
                    continue
                fallback = (
                    await fallback_of(snapshots.get(digest, {}), digest, step)
                    if fallback_of
                    else None
                )
                not_taken = ""
                if fallback is not None:
                    event = build_event(
                        job_id=job_id,
                        event_type=EventType.TYPE_STEP_CHECKPOINT,
                        workflow_name=name,
                        attempt=attempt,
                        occurred_at=occurred_at,
                        step_name=step,
                        response=fallback,
                    )
                    try:
                        payload = self._encode(event)
                    except EventTooLarge as exc:
                        # Refused on every pass: raised, it would stop every
                        # sweep. The job fails as a step's oversized response does.
                        not_taken = f"; its fallback was not taken: {exc.message}"
                    else:
                        entry = {"name": step, "skipped": False, "response": dict(fallback)}
                        fallback_ids.append(job_id)
                        fallback_entries.append(json.dumps(entry, separators=(",", ":")))
                        fallback_payloads.append(payload)
                        continue
                error = self._event_text(
                    f"step {step!r} was not completed before its timeout passed at "
                    f"{timestamp_json(step_deadline_at)}{not_taken}"
                )
                event = build_event(
                    job_id=job_id,
                    event_type=EventType.TYPE_FAILED,
                    workflow_name=name,
                    attempt=attempt,
                    occurred_at=occurred_at,
                    step_name=step,
                    error=error,
                    deadline="step",
                )
                failed_ids.append(job_id)
                failed_was.append(Status.WAITING.value)
                failed_errors.append(error)
                failed_payloads.append(self._encode(event))
                step_timeouts += 1
            if failed_ids:
                await conn.execute(
                    DEADLINE_FAIL_SQL,
                    {
                        "job_ids": failed_ids,
                        "was": failed_was,
                        "errors": failed_errors,
                        "payloads": failed_payloads,
                        "event_type": _event_name(EventType.TYPE_FAILED),
                    },
                )
            if fallback_ids:
                await conn.execute(
                    STEP_FALLBACK_SQL,
                    {
                        "job_ids": fallback_ids,
                        "entries": fallback_entries,
                        "payloads": fallback_payloads,
                        "event_type": _event_name(EventType.TYPE_STEP_CHECKPOINT),
                    },
                )
        return DeadlineSweep(
            job_deadlines=job_deadlines, step_timeouts=step_timeouts, fallbacks=len(fallback_ids)
        )

    # ----------------------------------------------------------------- complete-step

    async def complete_step(
        self,
        *,
        job_id: UUID | str,
        step_name: str,
        response: dict[str, Any],
        verify: StepVerifier,
    ) -> CompleteStepResult:
        """Answer a parked external step, gated again under the row lock.

        ``verify(response)`` judges the response by the job's definition
        (parse against the step's output type, run its validate rules); it
        runs while the row is locked, so it must be free of I/O. It runs on a
        worker thread: what it costs is the sender's and the rules' author's
        choice, and the event loop serves everyone else meanwhile. The job
        answered holds no definition.
        """
        job_id = _as_uuid(job_id)
        if not step_name:
            raise InvalidArgument("step_name must not be empty")
        async with self._pool.connection() as conn, conn.transaction():
            job = await _fetch_job(conn, LOCK_JOB_SQL, job_id)
            if job.status != Status.WAITING or job.outstanding_step != step_name:
                if any(entry.get("name") == step_name for entry in job.checkpoints):
                    return CompleteStepResult(
                        "ALREADY_DONE", job, f"step {step_name!r} of job {job_id} is already done"
                    )
                waiting = (
                    f" on step {job.outstanding_step!r}" if job.status == Status.WAITING else ""
                )
                return CompleteStepResult(
                    "WRONG_STATE",
                    job,
                    f"job {job_id} is {job.status}{waiting}, not WAITING on step {step_name!r}",
                )
            verdict = await asyncio.to_thread(verify, response)
            outcome: StepOutcome
            if verdict.accepted:
                entry = {"name": step_name, "skipped": False, "response": verdict.response}
                event = build_event(
                    job_id=job_id,
                    event_type=EventType.TYPE_STEP_CHECKPOINT,
                    workflow_name=job.workflow_name,
                    attempt=job.attempt,
                    occurred_at=_now(),
                    step_name=step_name,
                    response=verdict.response,
                )
                params: dict[str, Any] = {"entry": Jsonb(entry)}
                statement, outcome = ACCEPT_STEP_SQL, "COMPLETED"
                message = f"step {step_name!r} accepted; job {job_id} is queued to resume"
            else:
                violations = self._event_text(
                    "; ".join(verdict.violations) or "the response was rejected"
                )
                event = build_event(
                    job_id=job_id,
                    event_type=EventType.TYPE_FAILED,
                    workflow_name=job.workflow_name,
                    attempt=job.attempt,
                    occurred_at=_now(),
                    step_name=step_name,
                    verdict=violations,
                    error=violations,
                )
                params = {"verdict": violations, "error": violations}
                statement, outcome = REJECT_STEP_SQL, "REJECTED"
                message = f"step {step_name!r} response rejected: {violations}"
            changed = await _fetch_job(
                conn,
                statement,
                job_id,
                {
                    **params,
                    "event_type": _event_name(event.type),
                    "payload": self._encode(event),
                },
            )
        return CompleteStepResult(outcome, changed, message)

    # ----------------------------------------------------------------- reads

    async def get(self, job_id: UUID | str) -> Job:
        """The job row; NotFound when there is none."""
        job_id = _as_uuid(job_id)
        async with self._pool.connection() as conn:
            return await _fetch_job(conn, SELECT_JOB_SQL, job_id)

    @contextlib.asynccontextmanager
    async def snapshot(self) -> AsyncIterator[JobSnapshot]:
        """Reads that all see one moment (a read-only REPEATABLE READ transaction)."""
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(ONE_SNAPSHOT_SQL)
            yield JobSnapshot(conn)

    async def get_with_history(self, job_id: UUID | str) -> tuple[Job, tuple[Attempt, ...]]:
        """The job row and its ended attempts, oldest first, as of one moment."""
        async with self.snapshot() as snapshot:
            job = await snapshot.job(job_id)
            return job, await snapshot.attempts(job.job_id)

    async def count_queued(self, *, limit: int) -> int:
        """How many jobs are QUEUED, counting no further than ``limit``."""
        async with self._pool.connection() as conn:
            return await _count_queued(conn, limit)

    async def list(
        self,
        *,
        status: str | None = None,
        workflow_name: str | None = None,
        limit: int = 0,
        page_token: str | None = None,
        owner: str | None = None,
    ) -> JobPage:
        """Jobs newest first; 0 means 50, above 500 is clamped, negative is refused.

        With ``owner``, only the jobs that principal submitted.
        """
        if limit < 0:
            raise InvalidArgument(f"limit must not be negative, got {limit}")
        limit = DEFAULT_LIST_LIMIT if limit == 0 else min(limit, MAX_LIST_LIMIT)
        params: dict[str, Any] = {"limit": limit + 1}
        if status:
            params["status"] = parse_status(status).value
        if workflow_name:
            params["workflow_name"] = validate_workflow_name(workflow_name)
        if page_token:
            params["after_created_at"], params["after_job_id"] = decode_page_token(page_token)
        if owner is not None:
            params["owner"] = owner
        statement = list_jobs_sql(
            by_status=bool(status),
            by_name=bool(workflow_name),
            after=bool(page_token),
            by_owner=owner is not None,
        )
        async with self._pool.connection() as conn:
            rows = await (await conn.execute(statement, params)).fetchall()
        jobs = tuple(_summary(row) for row in rows[:limit])
        token = ""
        if len(rows) > limit:
            token = encode_page_token(jobs[-1].created_at, jobs[-1].job_id)
        return JobPage(jobs=jobs, next_page_token=token)


def _lease_event(
    lease: Lease, event_type: int, *, occurred_at: datetime | None = None, **fields: Any
) -> WorkflowRunEvent:
    """The event of a commit point made under ``lease``, stamped now unless told when."""
    return build_event(
        job_id=lease.job_id,
        event_type=event_type,
        workflow_name=lease.workflow_name,
        attempt=lease.attempt,
        occurred_at=occurred_at or _now(),
        **fields,
    )


def _clock_offset_s(database_time: datetime | None, local_time: datetime) -> float:
    """The database clock minus this process's, from a time the database just stamped."""
    if database_time is None:
        return 0.0
    return (database_time - local_time).total_seconds()


def _fence(lease: Lease) -> dict[str, Any]:
    return {
        "job_id": lease.job_id,
        "worker_id": lease.worker_id,
        "attempt": lease.attempt,
        "token": lease.token,
    }


def _lease_lost(lease: Lease, what: str) -> LeaseLost:
    return LeaseLost(
        f"worker {lease.worker_id!r} no longer holds job {lease.job_id} (attempt "
        f"{lease.attempt}); could not {what}, nothing was written"
    )


class JobSnapshot:
    """Reads of one job and what surrounds it, all as of one moment.

    Read apart, an attempt that ends between two reads would show as ended
    beside a row still read as running it.
    """

    def __init__(self, conn: AsyncConnection[TupleRow]) -> None:
        self._conn = conn

    async def job(self, job_id: UUID | str) -> Job:
        """The job row; NotFound when there is none."""
        return await _fetch_job(self._conn, SELECT_JOB_SQL, _as_uuid(job_id))

    async def attempts(self, job_id: UUID) -> tuple[Attempt, ...]:
        return await read_attempts(self._conn, job_id)

    async def outbox_state(self, job_id: UUID) -> OutboxState:
        return await read_outbox_state(self._conn, job_id)

    async def queue_position(
        self, *, run_after: datetime, created_at: datetime, limit: int
    ) -> tuple[datetime, int]:
        return await read_queue_position(
            self._conn, run_after=run_after, created_at=created_at, limit=limit
        )

    async def count_queued(self, *, limit: int) -> int:
        return await _count_queued(self._conn, limit)


async def _count_queued(conn: AsyncConnection[TupleRow], limit: int) -> int:
    if limit < 1:
        raise ValueError("limit must be at least 1")
    cursor = await conn.execute(COUNT_QUEUED_SQL, {"limit": limit})
    row = await cursor.fetchone()
    return int(row[0]) if row is not None else 0


async def _fetch_job(
    conn: AsyncConnection[TupleRow],
    statement: str,
    job_id: UUID,
    params: Mapping[str, Any] | None = None,
) -> Job:
    cursor = await conn.execute(statement, {"job_id": job_id, **(params or {})})
    row = await cursor.fetchone()
    if row is None:
        raise NotFound(f"job {job_id} not found")
    return job_from_row(row)
