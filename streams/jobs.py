"""The verbs themselves, once, for every way in.

``Jobs`` owns what a verb means: admission, definition lookup and compilation,
input validation, the idempotent insert, the complete-step gate, the refusals
of values past the event size limit. The ways in are adapters that only
translate: the HTTP views (``streams.web``) turn a JSON body into arguments and
the result or error into a reply; the request agent (``streams.request_agent``)
turns a Kafka message into arguments and the result into an acknowledgement or
a dead letter. Both reach the same ``Jobs.submit_many`` (``Jobs.submit`` is a
batch of one of it), which decides every submit and writes it with the one
submit statement.

Every verb raises only the project's errors (``schemas.errors``): a store that
cannot be reached is ``Unavailable`` here, translated at the store's edge by
``store.errors.outages_as_unavailable``.

Owners: the verbs that reach jobs take ``owner``, the one principal whose jobs
the caller may reach, or None for every owner's (see ``streams.auth``). A job
of another owner is answered exactly as a job that does not exist.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, TypedDict

from schemas.errors import (
    AlreadyExists,
    EventTooLarge,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    WrongState,
)
from store.control import (
    RESUMABLE,
    BulkCancelResult,
    CancelFilter,
    CancelResult,
    Resumed,
    already_resumed,
    check_reason,
    not_resumable,
    resume_job_id,
)
from store.definitions import DefinitionPage, StoredDefinition, validate_workflow_name
from store.errors import outages_as_unavailable
from store.states import Status
from streams import logs
from streams.explain import ExplainFacts
from streams.tracing import TraceContext
from workflows.failures import StepFailure
from workflows.forms import response_form

if TYPE_CHECKING:
    from datetime import datetime

    from store.dead_letters import FailedEventPage, Redriven
    from store.records import Attempt, CompleteStepResult, Job, JobPage
    from streams.requests_dlq import (
        DeadLetteredRequest,
        DeadLetterListing,
        Position,
        RequestsDeadLetters,
    )
    from streams.runtime import Runtime
    from workflows.steps import CompiledWorkflow, Step

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Submitted:
    """What submit did: the job, whether this call created it, and why it FAILED.

    ``refused`` is set only when ``record_refusals`` turned a refused request
    into a FAILED job; it is the error that job carries.
    """

    job: Job
    created: bool
    refused: str = ""


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """One job to create (``Jobs.submit_many``): the definition inline
    (``workflow``) or the stored one named ``workflow_name``."""

    job_id: uuid.UUID
    input: dict[str, Any]
    workflow_name: str = ""
    owner: str | None = None
    deadline_ms: int | None = None
    workflow: dict[str, Any] | None = None
    max_attempts: int | None = None
    # The W3C context the client sent (checked by ``streams.tracing.incoming``).
    trace: TraceContext | None = None


# A request's definition compiled, with its envelope, or why the request cannot run.
_Definition: TypeAlias = "tuple[CompiledWorkflow, dict[str, Any]] | NotFound | InvalidArgument"


@dataclass(frozen=True, slots=True)
class ResumeRefusal:
    """A job a bulk resume left alone, with the error a single resume would have raised."""

    job_id: uuid.UUID
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class ResumedMany:
    """What a bulk resume did: the runs it made, and the jobs it refused."""

    resumed: tuple[Resumed, ...]
    refused: tuple[ResumeRefusal, ...]


# A bulk resume takes this many jobs unless told otherwise, and never more than
# MAX_BULK_RESUME in one call: each is its own transaction.
DEFAULT_BULK_RESUME = 100
MAX_BULK_RESUME = 1000


# explain counts the claimable jobs ahead of a QUEUED one no further than this.
EXPLAIN_AHEAD_LIMIT = 10_000


class Jobs:
    """The verbs against one process's runtime (which may have no store)."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._requests_dlq: RequestsDeadLetters | None = None

    # ------------------------------------------------------------------ jobs

    async def submit(
        self,
        *,
        job_id: uuid.UUID | None,
        input: dict[str, Any],
        workflow: dict[str, Any] | None = None,
        workflow_name: str = "",
        max_attempts: int | None = None,
        record_refusals: bool = False,
        owner: str | None = None,
        owner_only: bool = False,
        deadline_ms: int | None = None,
        trace: TraceContext | None = None,
        via: str = "http",
    ) -> Submitted:
        """Create the job, owned by ``owner``, or answer the one ``job_id`` already names.

        With ``owner_only`` an existing job of another owner is not answered:
        ``AlreadyExists`` says the id is taken, and nothing of the job.

        The definition is ``workflow`` (inline) or the stored one named
        ``workflow_name``. Without a ``job_id`` a fresh one is made. A request
        that cannot run (no such stored workflow, a definition that does not
        compile, input that does not fit, input past the event size limit)
        raises, unless ``record_refusals``: then it becomes a FAILED job with
        the reason, for callers nobody waits on (the requests topic), so the
        producer can still look the job up by its id.

        ``deadline_ms`` is the whole-job deadline, counted from now; without
        one (None or 0) the definition's ``jobDeadlineMs`` applies, if any.
        ``trace`` is the W3C context the client sent, ``via`` the way in
        (``http``, ``kafka``), as ``submit_many`` records them.

        A batch of one of ``submit_many``, which decides and writes every submit.
        """
        request = SubmitRequest(
            job_id=job_id if job_id is not None else uuid.uuid4(),
            input=input,
            workflow_name=workflow_name,
            owner=owner,
            deadline_ms=deadline_ms,
            workflow=workflow,
            max_attempts=max_attempts,
            trace=trace,
        )
        with logs.about_job(request.job_id):
            [submitted] = await self.submit_many(
                [request], record_refusals=record_refusals, owner_only=owner_only, via=via
            )
        return submitted

    async def submit_many(
        self,
        requests: Sequence[SubmitRequest],
        *,
        record_refusals: bool = False,
        owner_only: bool = False,
        via: str = "http",
    ) -> list[Submitted]:
        """``submit`` for each request, in one statement and one commit; the
        answers are in ``requests`` order.

        Trace context: each job's row stores the context of its ``submit`` span
        when this process traces, else the one its client sent. Stored even
        untraced (a text column, NULL when absent): a relay or worker that
        traces then continues the client's trace, whichever process took the
        submit.

        Each request is decided as it would be alone, in order: a job_id that an
        earlier request of the batch names is answered with that request's job,
        not created twice. Without ``record_refusals`` the first refusal raises
        and nothing is written. Admission is asked once for the batch: a full
        backlog answers the batch only if every job it names already exists,
        and otherwise refuses it whole (``ResourceExhausted``), as it would
        refuse the first new job of the same requests made one by one.
        """
        tracing = self._runtime.tracing
        if tracing is None:
            return await self._submit_many(requests, record_refusals, owner_only)
        spans = []
        traced = []
        for request in requests:
            span, context = tracing.start_submit(via, request.trace)
            spans.append(span)
            traced.append(dataclasses.replace(request, trace=context))
        try:
            answers = await self._submit_many(traced, record_refusals, owner_only)
        except BaseException as exc:
            for span in spans:
                tracing.end_submit(span, error=exc)
            raise
        for span, request, answer in zip(spans, requests, answers, strict=True):
            tracing.end_submit(
                span, job_id=str(request.job_id), created=answer.created, refused=answer.refused
            )
        return answers

    async def _submit_many(
        self, requests: Sequence[SubmitRequest], record_refusals: bool, owner_only: bool
    ) -> list[Submitted]:
        for request in requests:
            if request.deadline_ms is not None and request.deadline_ms < 0:
                raise InvalidArgument(
                    f"deadline_ms must not be negative, got {request.deadline_ms}"
                )
        first: dict[uuid.UUID, int] = {}
        for index, request in enumerate(requests):
            first.setdefault(request.job_id, index)
        unique = [requests[index] for index in first.values()]
        with outages_as_unavailable():
            runs = self._runtime.require_runs()
            # Admission first, so a full backlog costs no compilation.
            existing = await self._admit(unique)
            if existing is not None:
                repeated = {
                    request.job_id: Submitted(
                        _owned_by(existing[request.job_id], request.owner, owner_only),
                        created=False,
                    )
                    for request in unique
                }
                return _in_order(requests, first, repeated)
            definitions = await self._definitions(unique)
            checks = [
                (definition[0], request.input)
                for request, definition in zip(unique, definitions, strict=True)
                if isinstance(definition, tuple)
            ]
            checked = iter(await self._runtime.cache.validate_inputs(checks) if checks else [])
            rows: list[dict[str, Any]] = []
            refusals: list[str] = []
            for request, definition in zip(unique, definitions, strict=True):
                refusal = definition if not isinstance(definition, tuple) else None
                if isinstance(definition, tuple):
                    compiled, envelope = definition
                    normalized = next(checked)
                    if isinstance(normalized, InvalidArgument):
                        refusal = normalized
                    else:
                        try:
                            rows.append(
                                runs.submit_params(
                                    job_id=request.job_id,
                                    workflow_name=compiled.name,
                                    definition=envelope,
                                    definition_hash=compiled.definition_hash,
                                    input=normalized,
                                    max_attempts=request.max_attempts or None,
                                    owner=request.owner,
                                    deadline_ms=request.deadline_ms or compiled.job_deadline_ms,
                                    **_trace_columns(request.trace),
                                )
                            )
                        except EventTooLarge as exc:
                            # Refused the same way on every try, so recorded rather than retried.
                            refusal = exc
                reason = ""
                if refusal is not None:
                    if not record_refusals:
                        raise refusal
                    reason = _refusal_reason(refusal, request)
                    log.warning(
                        "request for job %s recorded as FAILED: %s",
                        request.job_id,
                        reason,
                        extra={"job_id": str(request.job_id)},
                    )
                    rows.append(
                        runs.submit_failed_params(
                            job_id=request.job_id,
                            workflow_name=request.workflow_name,
                            input=request.input,
                            error=reason,
                            owner=request.owner,
                            **_trace_columns(request.trace),
                        )
                    )
                refusals.append(reason)
            results = await runs.write_submits(rows)
        answers: dict[uuid.UUID, Submitted] = {}
        for request, result, reason in zip(unique, results, refusals, strict=True):
            job = result.job
            if result.created:
                if not reason:
                    self._runtime.admission.admitted()
            elif not reason:
                job = _owned_by(job, request.owner, owner_only)
            answers[request.job_id] = Submitted(job, result.created, refused=reason)
        return _in_order(requests, first, answers)

    async def _admit(self, requests: Sequence[SubmitRequest]) -> dict[uuid.UUID, Job] | None:
        """None admits new jobs; under a full backlog, the jobs the requests name,
        when every one exists, so repeated submits are still answered as one."""
        runs = self._runtime.require_runs()
        try:
            await self._runtime.admission.check(runs)
        except ResourceExhausted as full:
            existing: dict[uuid.UUID, Job] = {}
            for request in requests:
                try:
                    existing[request.job_id] = await runs.get(request.job_id)
                except NotFound:
                    raise full from None
            return existing
        return None

    async def _definitions(self, requests: Sequence[SubmitRequest]) -> list[_Definition]:
        """Each request's definition compiled; a stored one is read and compiled
        once for every request of the batch that names it."""
        stored: dict[str, _Definition] = {}
        found: list[_Definition] = []
        for request in requests:
            if request.workflow is not None:
                found.append(await self._compiled(request.workflow))
                continue
            if request.workflow_name not in stored:
                try:
                    envelope = await self._runtime.require_definitions().get(request.workflow_name)
                except (NotFound, InvalidArgument) as exc:
                    stored[request.workflow_name] = exc
                else:
                    stored[request.workflow_name] = await self._compiled(envelope.definition)
            found.append(stored[request.workflow_name])
        return found

    async def _compiled(self, envelope: dict[str, Any]) -> _Definition:
        try:
            return await self._runtime.compile_submitted(envelope), envelope
        except InvalidArgument as exc:
            # The producer's mistake or a broken stored definition, recorded where it is seen.
            return exc

    async def get_job(self, job_id: uuid.UUID, *, owner: str | None = None) -> Job:
        with outages_as_unavailable():
            return _visible(await self._runtime.require_runs().get(job_id), owner)

    async def get_job_with_history(
        self, job_id: uuid.UUID, *, owner: str | None = None
    ) -> tuple[Job, tuple[Attempt, ...]]:
        """The job and its ended attempts, oldest first."""
        with outages_as_unavailable():
            job, history = await self._runtime.require_runs().get_with_history(job_id)
        return _visible(job, owner), history

    async def explain(self, job_id: uuid.UUID, *, owner: str | None = None) -> ExplainFacts:
        """What ``streams.explain`` needs to say why the job is where it is."""
        settings = self._runtime.settings
        with outages_as_unavailable():
            async with self._runtime.require_runs().snapshot() as snapshot:
                job = _visible(await snapshot.job(job_id), owner)
                history = await snapshot.attempts(job.job_id)
                outbox = await snapshot.outbox_state(job.job_id)
                queued = job.status == Status.QUEUED
                now, ahead = await snapshot.queue_position(
                    run_after=job.run_after,
                    created_at=job.created_at,
                    limit=EXPLAIN_AHEAD_LIMIT if queued else 0,
                )
                cap = settings.max_queued_jobs
                depth = await snapshot.count_queued(limit=cap) if cap > 0 else 0
        return ExplainFacts(
            job=job,
            history=history,
            outbox=outbox,
            now=now,
            queued_ahead=ahead if queued else None,
            ahead_limit=EXPLAIN_AHEAD_LIMIT,
            admission_cap=cap,
            queue_depth=depth,
            sweep_interval_s=settings.sweep_interval_s,
        )

    async def list_jobs(
        self,
        *,
        status: str = "",
        workflow_name: str = "",
        limit: int = 0,
        page_token: str = "",
        owner: str | None = None,
    ) -> JobPage:
        """Newest first; ``limit`` 0 means 50, above 500 is clamped to 500."""
        if workflow_name:
            validate_workflow_name(workflow_name)
        if limit < 0:
            raise InvalidArgument(f"limit must not be negative, got {limit}")
        with outages_as_unavailable():
            return await self._runtime.require_runs().list(
                status=status or None,
                workflow_name=workflow_name or None,
                limit=limit,
                page_token=page_token or None,
                owner=owner,
            )

    async def complete_step(
        self,
        *,
        job_id: uuid.UUID,
        step_name: str,
        response: dict[str, Any],
        owner: str | None = None,
    ) -> CompleteStepResult:
        """Answer the external step a job is parked on.

        COMPLETED, ALREADY_DONE and REJECTED (the job FAILED with that verdict)
        are answers; a job that is not WAITING on ``step_name`` (a worker's step
        never is), or a step whose fallback was taken in place of this response,
        raises ``WrongState``; a step the job's workflow lacks, ``NotFound``.
        """
        with outages_as_unavailable():
            runs = self._runtime.require_runs()
            for read in range(2):
                # Read first: a NOT_FOUND needs no lock, and a step whose validate
                # rules read the input or earlier steps is judged against them.
                # Neither changes while the job is WAITING, which the store checks
                # again under the row lock before it calls the verifier. Nor does
                # its owner, ever.
                job = _visible(await runs.get(job_id), owner)
                workflow = None
                if job.definition is not None:
                    # Compiled here, off the loop, so the judge under the row lock finds it cached.
                    workflow = await self._runtime.compile_snapshot(
                        job.definition, job.definition_hash
                    )
                    # A worker's step is never parked on: its checkpoint is not this
                    # caller's answer, which ALREADY_DONE would say it was.
                    if not _named_step(workflow, job_id, step_name).external:
                        raise WrongState(
                            f"step {step_name!r} of job {job_id} is not an external step: "
                            "a worker answers it, not a person"
                        )
                parked_here = job.status == Status.WAITING and job.outstanding_step == step_name
                try:
                    result = await runs.complete_step(
                        job_id=job_id,
                        step_name=step_name,
                        response=response,
                        verify=self._runtime.step_verifier(step_name, job, parked_here=parked_here),
                    )
                    break
                except FailedPrecondition:
                    # The job parked on the step between the read and the lock,
                    # and the step's rules judge by what it holds. A job parks
                    # on a step once: read again, it is judged as it is now.
                    if read:
                        raise
        if result.outcome == "WRONG_STATE":
            raise WrongState(result.message)
        if result.outcome == "ALREADY_DONE" and workflow is not None:
            # A fallback the sweeper took is the step's answer too, but not
            # this caller's: told ALREADY_DONE, a reviewer would think theirs counted.
            recorded = next(
                (e.get("response") for e in result.job.checkpoints if e.get("name") == step_name),
                None,
            )
            if workflow.lost_to_fallback(step_name, recorded, response):
                raise WrongState(
                    f"step {step_name!r} of job {job_id} was not completed before its timeout: "
                    "its fallback response was taken instead, and this response was not used"
                )
        return result

    async def step_form(
        self, *, job_id: uuid.UUID, step_name: str, owner: str | None = None
    ) -> dict[str, Any]:
        """The fields of an external step's response, for a form that answers it.

        Read from the job's own definition snapshot, so the form matches what
        complete-step will judge, whatever the stored workflow says today.
        """
        with outages_as_unavailable():
            job = _visible(await self._runtime.require_runs().get(job_id), owner)
        if job.definition is None:
            raise FailedPrecondition(
                f"job {job_id} was refused at submit and has no definition snapshot to read "
                "its steps from"
            )
        compiled = await self._runtime.compile_snapshot(job.definition, job.definition_hash)
        step = _named_step(compiled, job_id, step_name)
        if not step.external:
            raise InvalidArgument(
                f"step {step_name!r} is not an external step: a worker answers it, not a person"
            )
        return {
            "job_id": str(job.job_id),
            "step_name": step.name,
            "response_type": step.response_type.DESCRIPTOR.full_name,
            "fields": response_form(step.response_type),
            "parked_here": job.status == Status.WAITING and job.outstanding_step == step.name,
        }

    async def fleet(self, *, owner: str | None) -> dict[str, Any]:
        """Jobs by status, the backlog's age and, for a fleet-wide caller (``owner``
        None), the workers and the outbox."""
        with outages_as_unavailable():
            return await self._runtime.require_fleet().overview(owner=owner)

    # ------------------------------------------------------------------ cancel

    async def cancel(
        self, *, job_id: uuid.UUID, reason: str = "", owner: str | None = None
    ) -> CancelResult:
        """Cancel one job: at once when QUEUED or WAITING, by its worker when RUNNING.

        A finished job is answered as it is (ALREADY_CANCELLED, ALREADY_FINISHED).
        """
        check_reason(reason)
        with outages_as_unavailable():
            return await self._runtime.require_control().cancel(job_id, reason=reason, owner=owner)

    async def cancel_many(
        self,
        *,
        status: str = "",
        workflow_name: str = "",
        owner_filter: str = "",
        created_before: datetime | None = None,
        reason: str = "",
        owner: str | None = None,
    ) -> BulkCancelResult:
        """Cancel every live job matching all the conditions given (at least one).

        ``owner_filter`` picks one principal's jobs; ``owner`` is the caller's
        reach, as for every verb: a caller limited to its own jobs who names
        another principal reaches nothing.
        """
        if owner is not None and owner_filter and owner_filter != owner:
            return BulkCancelResult((), ())
        which = CancelFilter(
            status=status,
            workflow_name=workflow_name,
            owner=owner if owner is not None else (owner_filter or None),
            created_before=created_before,
        )
        if not (status or workflow_name or owner_filter or created_before is not None):
            # The caller's own reach is not a condition they chose: a bulk
            # cancel with none would stop everything they can see.
            raise InvalidArgument(
                "a bulk cancel needs at least one of status, workflow_name, owner, created_before"
            )
        with outages_as_unavailable():
            return await self._runtime.require_control().cancel_many(which, reason=reason)

    # ------------------------------------------------------------------ resume

    async def resume(
        self,
        *,
        job_id: uuid.UUID,
        principal: str,
        owner: str | None = None,
        from_step: str = "",
        use_current_definition: bool = False,
        request_key: str = "",
        max_attempts: int | None = None,
    ) -> Resumed:
        """Resume the FAILED, DEAD or CANCELLED job ``job_id`` as a new run, linked both ways.

        The run is owned by ``principal`` (the caller) and takes the job's input
        and checkpoints: all of them, or with ``from_step`` only those before
        that step, so it runs again from there. It keeps the job's definition
        snapshot, or with ``use_current_definition`` takes the stored definition
        of the job's workflow, which the kept checkpoints must still fit (step
        names in order, responses that parse). Its id is derived from the job's
        and ``request_key``: the same resume sent again answers the same run,
        ``created`` false. ``owner``: whose jobs the caller reaches (None: all).
        """
        with outages_as_unavailable():
            runs = self._runtime.require_runs()
            original = _visible(await runs.get(job_id), owner)
            new_id = resume_job_id(original.job_id, request_key)
            if original.resumed_by == new_id:
                return _resumed_before(
                    Resumed(await runs.get(new_id), created=False), original.job_id, owner
                )
            if original.resumed_by is not None:
                raise already_resumed(original.job_id, original.resumed_by)
            if original.status not in RESUMABLE:
                raise not_resumable(original.job_id, original.status, original.cancel_requested_at)
            if use_current_definition:
                definition = await self._current_definition(original)
                compiled = await self._runtime.compile_submitted(definition)
            elif original.definition is None:
                raise FailedPrecondition(
                    f"job {original.job_id} was refused at submit and has no definition "
                    "snapshot to resume with; resume it with the current stored definition "
                    "(use_current_definition)"
                )
            else:
                definition = original.definition
                compiled = await self._runtime.compile_snapshot(
                    definition, original.definition_hash
                )
            keep = len(original.checkpoints)
            if from_step:
                try:
                    step = compiled.step(from_step)
                except InvalidArgument:
                    steps = ", ".join(step.name for step in compiled.steps)
                    raise InvalidArgument(
                        f"from_step: workflow {compiled.name!r} has no step {from_step!r}; "
                        f"its steps are {steps}"
                    ) from None
                keep = min(keep, step.index)
            if use_current_definition:
                await _replay_fits(compiled, original, keep)
            # A resumed run joins the backlog like any new job.
            await self._runtime.admit(None)
            resumed = await self._runtime.require_control().resume(
                original=original,
                job_id=new_id,
                owner=principal,
                keep=keep,
                definition=definition,
                definition_hash=compiled.definition_hash,
                new_definition=use_current_definition,
                max_attempts=max_attempts or None,
                # The run has the time the job was given, counted from now.
                deadline_ms=_deadline_span_ms(original) or compiled.job_deadline_ms,
            )
        resumed = _resumed_before(resumed, original.job_id, owner)
        if resumed.created:
            self._runtime.admission.admitted()
            log.info(
                "job %s resumed as job %s by %s (%d of %d checkpoints kept)",
                original.job_id,
                new_id,
                principal,
                keep,
                len(original.checkpoints),
            )
        return resumed

    async def _current_definition(self, original: Job) -> dict[str, Any]:
        try:
            stored = await self._runtime.require_definitions().get(original.workflow_name)
        except NotFound:
            raise FailedPrecondition(
                f"use_current_definition: workflow {original.workflow_name!r} of job "
                f"{original.job_id} has no stored definition; resume it with its own snapshot"
            ) from None
        return stored.definition

    async def resume_many(
        self,
        *,
        principal: str,
        owner: str | None = None,
        statuses: Sequence[str] = (),
        workflow_name: str = "",
        job_owner: str = "",
        created_before: datetime | None = None,
        use_current_definition: bool = False,
        request_key: str = "",
        limit: int = 0,
    ) -> ResumedMany:
        """Resume every ended job a filter picks that nothing resumes yet, oldest first.

        ``statuses`` (FAILED, DEAD, CANCELLED; none: all three), ``workflow_name``,
        ``job_owner`` and ``created_before`` narrow it; at most ``limit`` jobs
        (0: 100, at most 1000) a call. Each job is resumed as ``resume`` would
        (its whole checkpoint list kept); one that cannot be is reported in
        ``refused`` and the rest go on. ``owner``: whose jobs the caller reaches
        (None: all); naming another owner needs a fleet-wide token.
        """
        if limit < 0 or limit > MAX_BULK_RESUME:
            raise InvalidArgument(f"limit must be within 0..{MAX_BULK_RESUME}, got {limit}")
        if workflow_name:
            validate_workflow_name(workflow_name)
        chosen = [Status(parse_resumable(status)) for status in statuses]
        if owner is not None and job_owner and job_owner != owner:
            raise PermissionDenied(
                f"owner: only a token with the 'fleet' scope resumes the jobs of {job_owner!r}"
            )
        with outages_as_unavailable():
            candidates = await self._runtime.require_control().resumable(
                statuses=chosen,
                workflow_name=workflow_name or None,
                owner=owner if owner is not None else (job_owner or None),
                created_before=created_before,
                # A job that cannot be resumed this way (refused at submit, so
                # without a snapshot; of a workflow no longer stored) is
                # refused every time: picked each call, oldest first, enough
                # of them would hold every other job back for good.
                with_snapshot=not use_current_definition,
                with_stored_definition=use_current_definition,
                limit=limit or DEFAULT_BULK_RESUME,
            )
        resumed: list[Resumed] = []
        refused: list[ResumeRefusal] = []
        for candidate in candidates:
            try:
                resumed.append(
                    await self.resume(
                        job_id=candidate,
                        principal=principal,
                        owner=owner,
                        use_current_definition=use_current_definition,
                        request_key=request_key,
                    )
                )
            except ResourceExhausted as exc:
                # The backlog is full: the rest would be refused the same way.
                refused.append(ResumeRefusal(candidate, exc.code, exc.message))
                break
            except (InvalidArgument, FailedPrecondition, NotFound, AlreadyExists) as exc:
                refused.append(ResumeRefusal(candidate, exc.code, exc.message))
        return ResumedMany(tuple(resumed), tuple(refused))

    # ------------------------------------------------------------------ stored workflows

    async def put_workflow(
        self,
        name: str,
        workflow: dict[str, Any],
        *,
        if_version: int | None = None,
        create_only: bool = False,
    ) -> StoredDefinition:
        """Store ``workflow`` as ``name``; see ``DefinitionStore.put`` for the conditions."""
        validate_workflow_name(name)
        if "name" not in workflow:
            raise InvalidArgument(
                f"workflow.name is missing; the definition must be named {name!r}, as the path is"
            )
        if not isinstance(workflow["name"], str):
            raise InvalidArgument(f"workflow.name must be a string, got {workflow['name']!r}")
        if workflow["name"] != name:
            raise InvalidArgument(
                f"the definition is named {workflow['name']!r} but the path names {name!r}"
            )
        with outages_as_unavailable():
            definitions = self._runtime.require_definitions()
            # A definition that does not compile would only fail later, at every submit.
            await self._runtime.compile_submitted(workflow)
            return await definitions.put(
                name, workflow, if_version=if_version, create_only=create_only
            )

    async def get_workflow(self, name: str) -> StoredDefinition:
        validate_workflow_name(name)
        with outages_as_unavailable():
            return await self._runtime.require_definitions().get(name)

    async def list_workflows(self, *, limit: int = 0, page_token: str = "") -> DefinitionPage:
        """By name; ``limit`` 0 means 50, above 500 is clamped to 500."""
        if limit < 0:
            raise InvalidArgument(f"limit must not be negative, got {limit}")
        with outages_as_unavailable():
            return await self._runtime.require_definitions().list(
                limit=limit, page_token=page_token
            )

    # ------------------------------------------------------------------ dead letters

    async def failed_events(
        self,
        *,
        job_id: uuid.UUID | None = None,
        limit: int = 0,
        page_token: str = "",
        owner: str | None = None,
    ) -> FailedEventPage:
        """FAILED outbox rows (the relay's dead letters), oldest first; of a
        ``job_id`` that names no job the caller may see, ``NotFound``."""
        with outages_as_unavailable():
            if job_id is not None:
                await self.get_job(job_id, owner=owner)
            return await self._runtime.require_dead_letters().list_failed(
                job_id=job_id, limit=limit, page_token=page_token, owner=owner
            )

    async def redrive_events(
        self,
        *,
        ids: Sequence[int] | None = None,
        job_id: uuid.UUID | None = None,
        owner: str | None = None,
    ) -> Redriven:
        """FAILED outbox rows back to PENDING: those ``ids``, one job's, or (neither) all."""
        with outages_as_unavailable():
            dead_letters = self._runtime.require_dead_letters()
            if ids is not None:
                return await dead_letters.redrive_ids(ids, owner=owner)
            if job_id is not None:
                # Another owner's job is a job that does not exist: either is
                # told so, not that it had nothing to redrive.
                await self.get_job(job_id, owner=owner)
                return await dead_letters.redrive_job(job_id, owner=owner)
            return await dead_letters.redrive_all(owner=owner)

    def _dead_lettered_requests(self) -> RequestsDeadLetters:
        if self._requests_dlq is None:
            # Imported here: the Kafka clients load only where this is used.
            from streams.requests_dlq import RequestsDeadLetters

            self._requests_dlq = RequestsDeadLetters.from_settings(self._runtime.settings)
        return self._requests_dlq

    @property
    def requests_topic(self) -> str:
        return self._runtime.settings.requests_topic

    async def dead_lettered_requests(self, max_messages: int, page_token: str) -> DeadLetterListing:
        """What the request agent dead-lettered, with the reasons, a page at a time."""
        return await self._dead_lettered_requests().list_messages(
            max_messages=max_messages, page_token=page_token
        )

    async def redrive_requests(
        self, positions: Sequence[Position] | None
    ) -> list[DeadLetteredRequest]:
        """Dead-lettered requests back to the requests topic: those at ``positions``, or all."""
        return await self._dead_lettered_requests().redrive(positions)


def _refusal_reason(refusal: NotFound | InvalidArgument, request: SubmitRequest) -> str:
    """The error a refused request's FAILED job carries."""
    if isinstance(refusal, NotFound):
        return f"unknown workflow {request.workflow_name!r}: no stored definition"
    return refusal.message


class _TraceColumns(TypedDict):
    traceparent: str | None
    tracestate: str | None


def _trace_columns(trace: TraceContext | None) -> _TraceColumns:
    if trace is None:
        return {"traceparent": None, "tracestate": None}
    return {"traceparent": trace.traceparent, "tracestate": trace.tracestate}


def _in_order(
    requests: Sequence[SubmitRequest],
    first: Mapping[uuid.UUID, int],
    answers: Mapping[uuid.UUID, Submitted],
) -> list[Submitted]:
    """One answer per request; a repeat of an earlier request's job_id did not create it."""
    return [
        answers[request.job_id]
        if first[request.job_id] == index
        else Submitted(answers[request.job_id].job, created=False)
        for index, request in enumerate(requests)
    ]


def parse_resumable(status: str) -> str:
    """A status filter of a bulk resume: FAILED, DEAD or CANCELLED."""
    if status not in {resumable.value for resumable in RESUMABLE}:
        raise InvalidArgument(
            f"statuses: only FAILED, DEAD or CANCELLED jobs can be resumed, got {status!r}"
        )
    return status


async def _replay_fits(compiled: Any, original: Job, keep: int) -> None:
    """Refuse a resume whose kept checkpoints the new definition cannot replay."""
    try:
        await asyncio.to_thread(compiled.replay, original.input, original.checkpoints[:keep])
    except StepFailure as failure:
        raise InvalidArgument(
            f"use_current_definition: the checkpoints of job {original.job_id} do not fit the "
            f"current definition of workflow {compiled.name!r}: {failure}"
        ) from None


def _deadline_span_ms(job: Job) -> int | None:
    """The whole-job deadline ``job`` was submitted with, in ms; None when it had none."""
    if job.deadline_at is None:
        return None
    return round((job.deadline_at - job.created_at).total_seconds() * 1000)


def _resumed_before(resumed: Resumed, original_id: uuid.UUID, owner: str | None) -> Resumed:
    """``resumed``, unless it is a run made before by someone else whom ``owner``
    may not see: that one is refused as a resume with another key would be,
    naming the run and showing nothing of it."""
    if resumed.created or owner is None or resumed.job.owner == owner:
        return resumed
    raise already_resumed(original_id, resumed.job.job_id)


def _named_step(workflow: CompiledWorkflow, job_id: uuid.UUID, step_name: str) -> Step:
    """The step a completion or a form names; one the job's workflow lacks is
    no resource to answer, so ``NotFound``."""
    try:
        return workflow.step(step_name)
    except InvalidArgument:
        raise NotFound(
            f"job {job_id}: workflow {workflow.name!r} has no step {step_name!r}"
        ) from None


def _visible(job: Job, owner: str | None) -> Job:
    """``job``, unless ``owner`` may not see it: then, as for no job, ``NotFound``."""
    if owner is not None and job.owner != owner:
        raise NotFound(f"job {job.job_id} not found")
    return job


def _owned_by(job: Job, owner: str | None, owner_only: bool) -> Job:
    """An existing job a submit named: answered only to whoever may see it."""
    if owner_only and job.owner != owner:
        raise AlreadyExists(
            f"job id {job.job_id} is taken; submit with another job_id (or none, for a new one)"
        )
    return job


__all__ = ["Jobs", "ResumeRefusal", "ResumedMany", "SubmitRequest", "Submitted"]
