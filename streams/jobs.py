"""The verbs themselves, once, for every way in.

``Jobs`` owns what a verb means: admission, definition lookup and compilation,
input validation, the idempotent insert, the complete-step gate, the refusals
of values past the event size limit. The ways in are adapters that only
translate: the HTTP views (``streams.web``) turn a JSON body into arguments and
the result or error into a reply; the request agent (``streams.request_agent``)
turns a Kafka message into arguments and the result into an acknowledgement or
a dead letter. Both reach the same ``Jobs.submit``.

Every verb raises only the project's errors (``schemas.errors``): a store that
cannot be reached is ``Unavailable`` here, translated at the store's edge by
``store.errors.outages_as_unavailable``.

Owners: the verbs that reach jobs take ``owner``, the one principal whose jobs
the caller may reach, or None for every owner's (see ``streams.auth``). A job
of another owner is answered exactly as a job that does not exist.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from schemas.errors import AlreadyExists, EventTooLarge, InvalidArgument, NotFound, WrongState
from store.definitions import StoredDefinition, validate_workflow_name
from store.errors import outages_as_unavailable
from store.states import Status

if TYPE_CHECKING:
    from store.dead_letters import FailedEventPage, Redriven
    from store.records import CompleteStepResult, Job, JobPage
    from streams.requests_dlq import (
        DeadLetteredRequest,
        DeadLetterListing,
        Position,
        RequestsDeadLetters,
    )
    from streams.runtime import Runtime

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
        """
        with outages_as_unavailable():
            runs = self._runtime.require_runs()
            given_id = job_id
            job_id = job_id if job_id is not None else uuid.uuid4()
            # Admission first, so a full backlog costs no compilation. A full
            # backlog raises ResourceExhausted; a repeat of an existing job is
            # still answered with that job.
            existing = await self._runtime.admit(given_id)
            if existing is not None:
                return Submitted(_owned_by(existing, owner, owner_only), created=False)
            try:
                if workflow is not None:
                    envelope = workflow
                else:
                    stored = await self._runtime.require_definitions().get(workflow_name)
                    envelope = stored.definition
                compiled = await self._runtime.compile_submitted(envelope)
                normalized = await self._runtime.cache.validate_input(compiled, input)
            except NotFound:
                if not record_refusals:
                    raise
                reason = f"unknown workflow {workflow_name!r}: no stored definition"
                return await self._refused(job_id, workflow_name, input, reason, owner)
            except InvalidArgument as exc:
                # The producer's mistake or a broken stored definition,
                # recorded where it is seen.
                if not record_refusals:
                    raise
                return await self._refused(job_id, workflow_name, input, exc.message, owner)
            try:
                result = await runs.submit(
                    job_id=job_id,
                    workflow_name=compiled.name,
                    definition=envelope,
                    definition_hash=compiled.definition_hash,
                    input=normalized,
                    max_attempts=max_attempts or None,
                    owner=owner,
                )
            except EventTooLarge as exc:
                # Refused the same way on every try, so recorded rather than retried.
                if not record_refusals:
                    raise
                return await self._refused(job_id, workflow_name, input, exc.message, owner)
            if result.created:
                self._runtime.admission.admitted()
                return Submitted(result.job, created=True)
            return Submitted(_owned_by(result.job, owner, owner_only), created=False)

    async def _refused(
        self,
        job_id: uuid.UUID,
        workflow_name: str,
        input: dict[str, Any],
        reason: str,
        owner: str | None,
    ) -> Submitted:
        log.warning("request for job %s recorded as FAILED: %s", job_id, reason)
        result = await self._runtime.require_runs().submit_failed(
            job_id=job_id, workflow_name=workflow_name, input=input, error=reason, owner=owner
        )
        return Submitted(result.job, result.created, refused=reason)

    async def get_job(self, job_id: uuid.UUID, *, owner: str | None = None) -> Job:
        with outages_as_unavailable():
            return _visible(await self._runtime.require_runs().get(job_id), owner)

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
        are answers; a job that is not WAITING on ``step_name`` raises
        ``WrongState``.
        """
        with outages_as_unavailable():
            runs = self._runtime.require_runs()
            # Read first: a NOT_FOUND needs no lock, and a step whose validate
            # rules read the input or earlier steps is judged against them.
            # Neither changes while the job is WAITING, which the store checks
            # again under the row lock before it calls the verifier. Nor does
            # its owner, ever.
            job = _visible(await runs.get(job_id), owner)
            parked_here = job.status == Status.WAITING and job.outstanding_step == step_name
            result = await runs.complete_step(
                job_id=job_id,
                step_name=step_name,
                response=response,
                verify=self._runtime.step_verifier(
                    step_name,
                    input=job.input if parked_here else None,
                    checkpoints=job.checkpoints if parked_here else (),
                ),
            )
        if result.outcome == "WRONG_STATE":
            raise WrongState(result.message)
        return result

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
        if workflow.get("name") != name:
            raise InvalidArgument(
                f"the definition is named {workflow.get('name')!r} but the path names {name!r}"
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

    async def list_workflows(self) -> list[StoredDefinition]:
        with outages_as_unavailable():
            return await self._runtime.require_definitions().list()

    # ------------------------------------------------------------------ dead letters

    async def failed_events(
        self,
        *,
        job_id: uuid.UUID | None = None,
        limit: int = 0,
        page_token: str = "",
        owner: str | None = None,
    ) -> FailedEventPage:
        """FAILED outbox rows (the relay's dead letters), oldest first."""
        with outages_as_unavailable():
            if job_id is not None and owner is not None:
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
                if owner is not None:
                    # Another owner's job is a job that does not exist.
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

    async def dead_lettered_requests(self, max_messages: int) -> DeadLetterListing:
        """What the request agent dead-lettered, with the reasons."""
        return await self._dead_lettered_requests().list_messages(max_messages=max_messages)

    async def redrive_requests(
        self, positions: Sequence[Position] | None
    ) -> list[DeadLetteredRequest]:
        """Dead-lettered requests back to the requests topic: those at ``positions``, or all."""
        return await self._dead_lettered_requests().redrive(positions)


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


__all__ = ["Jobs", "Submitted"]
