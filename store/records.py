"""What the run store reads and answers: one frozen value per kind of answer.

Plain values, no SQL: the statements are in ``store.run_sql``, the methods that
run them in ``store.runs``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NotRequired, TypedDict
from uuid import UUID

from schemas.verdicts import StepVerdict
from store.states import Status

StepOutcome = Literal["COMPLETED", "ALREADY_DONE", "WRONG_STATE", "REJECTED"]


@dataclass(frozen=True, slots=True)
class Job:
    """One ``workflow_run`` row, every column, with the definition snapshot it names."""

    job_id: UUID
    workflow_name: str
    # None only for a job refused at submit (its stored workflow did not exist).
    # Read from ``workflow_definition_snapshot`` through ``definition_hash``.
    definition: dict[str, Any] | None
    definition_hash: str
    input: dict[str, Any]
    status: Status
    attempt: int
    max_attempts: int
    run_after: datetime
    outstanding_step: str | None
    checkpoints: tuple[dict[str, Any], ...]
    result: dict[str, Any] | None
    verdict: str | None
    error: str | None
    lease_owner: str | None
    lease_until: datetime | None
    created_at: datetime
    updated_at: datetime
    # The principal that submitted it; None for jobs recorded before owners
    # existed (only a fleet-wide token reaches those).
    owner: str | None = None
    # RUNNING: an operator asked to cancel it; its worker settles it CANCELLED.
    cancel_requested_at: datetime | None = None
    cancel_reason: str | None = None
    # The whole-job deadline, counted from submission.
    deadline_at: datetime | None = None
    # WAITING: when the parked step's timeout passes, and what its rules built
    # for the reviewer.
    step_deadline_at: datetime | None = None
    review_request: dict[str, Any] | None = None
    # The terminal job this run resumes; the run that resumed this job.
    resumed_from: UUID | None = None
    resumed_by: UUID | None = None
    # When the current (or last) claim took it.
    claimed_at: datetime | None = None
    # The W3C trace context it was submitted with (migration 0013), if any.
    traceparent: str | None = None
    tracestate: str | None = None


@dataclass(frozen=True, slots=True)
class Lease:
    """What a worker holds while a job is RUNNING; every fenced write names it."""

    job_id: UUID
    worker_id: str
    attempt: int
    # Carried so commit points can build their event without reading the row.
    workflow_name: str
    # The row's fencing token for this claim; unlike ``attempt`` it never repeats.
    token: int
    # The database clock minus this process's, in seconds, as the claim read it
    # (the row's claimed_at against the local time it arrived): a retry's next
    # run time is counted on the database clock without asking it again.
    clock_offset_s: float = 0.0

    def __hash__(self) -> int:
        # The claim loops key their books by lease several times a job; the
        # token alone tells claims apart (equality still compares every field),
        # and hashing it is a fraction of hashing the job id's UUID and the rest.
        return hash(self.token)


@dataclass(frozen=True, slots=True)
class SegmentProgress:
    """What a lease renewal says about the segment it renews the lease for."""

    # Steps this segment started or checkpointed so far; the database only
    # moves the row's progress time when this changes.
    mark: int
    # Seconds since the segment last made progress, on the worker's clock: the
    # first report of a segment dates its progress back by this much.
    idle_s: float
    # The workflow's deadlineMs, in seconds. A segment without progress for this
    # plus the lease is stalled: no renewal extends it, the sweeper requeues it.
    deadline_s: float


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    job: Job
    lease: Lease
    # The definition snapshot, never None for a claimable job.
    definition: dict[str, Any]

    @property
    def job_id(self) -> UUID:
        return self.job.job_id


class Submission(TypedDict):
    """What a submit names: the keyword arguments of ``RunStore.submit``."""

    job_id: UUID
    workflow_name: str
    definition: dict[str, Any]
    definition_hash: str
    input: dict[str, Any]
    # 0 or absent: the store's default.
    max_attempts: NotRequired[int | None]
    # The submitting principal; absent for a job nobody owns.
    owner: NotRequired[str | None]
    # The whole-job deadline, from now on the database's clock; absent: none.
    deadline_ms: NotRequired[int | None]
    # The W3C trace context to store with the job; absent: none.
    traceparent: NotRequired[str | None]
    tracestate: NotRequired[str | None]


class FailedSubmission(TypedDict):
    """A request that cannot run, recorded as FAILED: the keywords of ``RunStore.submit_failed``."""

    job_id: UUID
    workflow_name: str
    input: dict[str, Any]
    error: str
    owner: NotRequired[str | None]
    traceparent: NotRequired[str | None]
    tracestate: NotRequired[str | None]


@dataclass(frozen=True, slots=True)
class SubmitResult:
    job: Job
    # False when a job with this job_id already existed; nothing was written.
    created: bool


@dataclass(frozen=True, slots=True)
class RetryOutcome:
    # QUEUED (retry later), DEAD (no attempt left) or FAILED (the retry would
    # have started after the job's whole-job deadline).
    status: Status
    attempt: int
    max_attempts: int
    # When the job becomes claimable again (QUEUED); unchanged otherwise.
    run_after: datetime

    @property
    def dead(self) -> bool:
        return self.status is Status.DEAD

    @property
    def retried(self) -> bool:
        return self.status is Status.QUEUED


@dataclass(frozen=True, slots=True)
class SweepResult:
    requeued: int
    dead: int
    # Of those requeued or DEAD, how many were taken for a stalled segment
    # (renewed, but without progress past deadline plus lease) rather than an
    # expired lease.
    stalled: int = 0


@dataclass(frozen=True, slots=True)
class DeadlineSweep:
    """What one deadline pass settled: FAILED for a whole-job deadline or a step
    timeout, or requeued with the timed-out step's fallback as its response."""

    job_deadlines: int = 0
    step_timeouts: int = 0
    fallbacks: int = 0


# A parked step's declared fallback, if any:
# (definition snapshot, its hash, step name) -> response. Awaited, so that a
# snapshot not yet compiled is compiled off the event loop.
FallbackLookup = Callable[[Mapping[str, Any], str, str], Awaitable[Mapping[str, Any] | None]]


@dataclass(frozen=True, slots=True)
class CompleteStepResult:
    outcome: StepOutcome
    job: Job
    message: str


@dataclass(frozen=True, slots=True)
class JobSummary:
    """What list-jobs shows of a job: its state, none of its payloads.

    No definition, input, checkpoints or result: those can be megabytes per
    job, and a page of summaries must stay small. ``RunStore.get`` has them.
    """

    job_id: UUID
    workflow_name: str
    status: Status
    attempt: int
    max_attempts: int
    run_after: datetime
    outstanding_step: str | None
    verdict: str | None
    error: str | None
    lease_owner: str | None
    lease_until: datetime | None
    created_at: datetime
    updated_at: datetime
    owner: str | None = None
    deadline_at: datetime | None = None
    step_deadline_at: datetime | None = None
    cancel_requested_at: datetime | None = None
    resumed_from: UUID | None = None
    resumed_by: UUID | None = None


@dataclass(frozen=True, slots=True)
class JobPage:
    jobs: tuple[JobSummary, ...]
    # Empty when there is no further page.
    next_page_token: str


@dataclass(frozen=True, slots=True)
class Attempt:
    """One ended attempt of a job (``workflow_run_attempt``), as the history shows it."""

    attempt: int
    # The worker that held it; None only for an attempt no worker held.
    worker: str | None
    claimed_at: datetime | None
    ended_at: datetime
    # A ``store.history_sql.Outcome`` value.
    outcome: str
    # The steps checkpointed during the attempt, in order.
    steps: tuple[str, ...]
    error: str | None
    # A ``store.history_sql.ErrorClass`` value, with ``error``.
    error_class: str | None
    # RETRY_SCHEDULED and SWEPT: when the job may be claimed again.
    next_run_at: datetime | None


@dataclass(frozen=True, slots=True)
class OutboxState:
    """Where one job's events stand in the outbox."""

    pending: int
    failed: int
    published: int
    # The oldest event not yet published, and the last delivery error met.
    oldest_unsent_at: datetime | None
    last_error: str | None


# ``RunStore.complete_step``'s gate: response -> verdict, judged by the job's
# definition, which the caller binds (the store does not read it).
StepVerifier = Callable[[dict[str, Any]], StepVerdict]


def job_from_row(row: Sequence[Any]) -> Job:
    """A ``Job`` from a row of ``store.run_sql.JOB_COLUMNS``, in that order."""
    (
        job_id,
        workflow_name,
        definition,
        definition_hash,
        input_,
        status,
        attempt,
        max_attempts,
        run_after,
        outstanding_step,
        checkpoints,
        result,
        verdict,
        error,
        lease_owner,
        lease_until,
        created_at,
        updated_at,
        owner,
        cancel_requested_at,
        cancel_reason,
        deadline_at,
        step_deadline_at,
        review_request,
        resumed_from,
        resumed_by,
        claimed_at,
        traceparent,
        tracestate,
    ) = row
    return Job(
        job_id=job_id,
        workflow_name=workflow_name,
        definition=definition,
        definition_hash=definition_hash,
        input=input_,
        status=Status(status),
        attempt=attempt,
        max_attempts=max_attempts,
        run_after=run_after,
        outstanding_step=outstanding_step,
        checkpoints=tuple(checkpoints),
        result=result,
        verdict=verdict,
        error=error,
        lease_owner=lease_owner,
        lease_until=lease_until,
        created_at=created_at,
        updated_at=updated_at,
        owner=owner,
        cancel_requested_at=cancel_requested_at,
        cancel_reason=cancel_reason,
        deadline_at=deadline_at,
        step_deadline_at=step_deadline_at,
        review_request=review_request,
        resumed_from=resumed_from,
        resumed_by=resumed_by,
        claimed_at=claimed_at,
        traceparent=traceparent,
        tracestate=tracestate,
    )


def storable_text(text: str) -> str:
    """``text`` as a text column can hold it: U+0000 and lone surrogates escaped.

    An error message or a progress report quoting a handler's bytes may hold
    either (a file name from ``os.fsdecode`` keeps undecodable bytes as lone
    surrogates, which UTF-8 cannot encode); Postgres, or the encoding before
    it, refuses the whole statement for one. Escaped, the text still says
    what it said.
    """
    if "\x00" in text:
        text = text.replace("\x00", "\\u0000")
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode(errors="backslashreplace").decode()
    return text
