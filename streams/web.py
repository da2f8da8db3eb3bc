"""The verbs over HTTP, served by the Faust web server.

Routes (JSON bodies in the proto3 JSON mapping of ``workflowjobs.v1`` messages,
field names as in the ``.proto``):

=======  ==================================================  ==========================
method   path                                                body / answer
=======  ==================================================  ==========================
POST     /v1/workflow-runs                                   SubmitWorkflowRequest ->
                                                             SubmitWorkflowResponse
                                                             (201 created, 200 existed)
GET      /v1/workflow-runs/{job_id}                          GetJobResponse (with its
                                                             attempt history)
GET      /v1/workflow-runs/{job_id}/events?after=            the job's events as
                                                             Server-Sent Events
                                                             (``streams.watch``)
GET      /v1/workflow-runs/{job_id}/steps/{step_name}:form   an external step's response
                                                             fields
GET      /v1/workflow-runs/{job_id}:explain                  ExplainJobResponse
GET      /v1/workflow-runs?status=&workflow_name=&limit=     ListJobsResponse
         &page_token=
POST     /v1/workflow-runs/{job_id}/steps/{step_name}:complete
                                                             CompleteStepRequest (job_id
                                                             and step_name may be left
                                                             out) -> CompleteStepResponse
POST     /v1/workflow-runs/{job_id}:resume                   ResumeJobRequest (job_id may
                                                             be left out) ->
                                                             ResumeJobResponse (201 made,
                                                             200 made before)
POST     /v1/workflow-runs:resume                            ResumeJobsRequest (a filter) ->
                                                             ResumeJobsResponse
POST     /v1/workflow-runs/{job_id}:cancel                   CancelJobRequest, optional
                                                             (job_id may be left out) ->
                                                             CancelJobResponse
POST     /v1/workflow-runs:cancel                            CancelJobsRequest (a filter) ->
                                                             CancelJobsResponse
PUT      /v1/workflows/{name}                                PutWorkflowRequest ->
                                                             PutWorkflowResponse
                                                             (201 created, 200 replaced)
GET      /v1/workflows/{name}                                GetWorkflowResponse
GET      /v1/workflows?limit=&page_token=                    ListWorkflowsResponse
GET      /v1/fleet                                           jobs by status, the backlog,
                                                             the workers and the outbox
GET      /v1/outbox?status=FAILED&job_id=&limit=         FAILED outbox rows, oldest first
         &page_token=
POST     /v1/outbox:redrive                                  {"ids": [...]} | {"job_id": ...}
                                                             | {"all": true}: FAILED -> PENDING
GET      /v1/requests-dlq?max=&page_token=                   dead-lettered requests
POST     /v1/requests-dlq:redrive                            {"positions": [{"partition",
                                                             "offset"}, ...]} | {"all": true}
GET      /healthz                                            liveness: 503 when a part is
                                                             stuck (``streams.health``)
GET      /readyz                                             readiness: 503 while a part is
                                                             not serving yet
GET      /metrics                                            Prometheus text format
                                                             (``streams.metrics``); absent
                                                             with WFJOBS_METRICS=off
GET      /v1/openapi.json                                    the OpenAPI document of these
                                                             routes (``streams.openapi``)
=======  ==================================================  ==========================

Every route but ``/healthz``, ``/readyz``, ``/metrics`` and the OpenAPI document
needs ``Authorization: Bearer <token>`` carrying the verb's scope, and reaches
only the caller's own jobs unless the token is fleet-wide (``streams.auth``):
submit and resume need ``submit``; get and list, of jobs and of stored
workflows, ``read``; complete-step ``complete``; cancel, of one job or by
filter, ``cancel``; storing a workflow and the outbox and dead-letter routes
``admin`` (the dead-letter topic's messages belong to nobody, so those routes
also need ``fleet``). A stored workflow's version is its ``ETag``; a PUT with
``If-Match: "N"`` lands only on version N, one with ``If-None-Match: *`` only
creates, and a refused one answers 412 ``VERSION_MISMATCH``.

complete-step answers 200 for the outcomes COMPLETED, ALREADY_DONE and REJECTED:
a rejected response is the workflow's answer (the job FAILED with that verdict),
not a malformed call, so the body says REJECTED and carries the failed job.
WRONG_STATE is the one outcome that is an error: 409 with code WRONG_STATE and
a message naming the job's current status.

cancel answers 200 for every outcome: CANCELLED (the job was QUEUED or
WAITING), CANCEL_REQUESTED (it is RUNNING; its worker settles it), and
ALREADY_CANCELLED or ALREADY_FINISHED for a job that had ended, which is
answered as it is.

Every route with a GET answers HEAD too (headers, no body); one without, 405.

Every error is ``{"code": ..., "message": ...}`` (``ErrorBody``), with the HTTP
status taken from ``HTTP_STATUS`` and nowhere else; ``streams.http_errors``
answers that way for everything the verbs do not (unknown routes, parser
refusals, bugs) and holds the checks every input passes (JSON media type,
U+0000, nesting depth).

``HttpVerbs`` translates: a body or query into the arguments of a verb of
``streams.jobs.Jobs`` (which owns what the verb means, for every way in), and
its result or error into a reply. It knows nothing of the web framework, so the
Faust views only read the request and send the reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC
from functools import partial
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID

from aiohttp import web as aiohttp_web
from faust.web import Request, Response, View
from google.protobuf.message import Message

from schemas.contract import api_pb2, check_incoming, from_json, parse_job_id, to_json
from schemas.errors import (
    InvalidArgument,
    PayloadTooLarge,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    WorkflowJobsError,
)
from store.errors import outages_as_unavailable
from streams import auth, http_errors, metrics
from streams.auth import Authenticator, Caller
from streams.convert import (
    job_message,
    job_summary_message,
    listing_json,
    message_json,
    stored_workflow_message,
    struct_to_dict,
    timestamp_json,
)
from streams.dashboard import register_dashboard
from streams.explain import explain_job
from streams.health import HealthReport
from streams.http_errors import json_type, load_json
from streams.jobs import Jobs
from streams.openapi import register_openapi
from streams.tracing import TRACEPARENT, TRACESTATE, TraceContext, incoming

if TYPE_CHECKING:
    import faust

    from streams.requests_dlq import Position
    from streams.runtime import Runtime
    from streams.watch import JobWatch, WatchStream

log = logging.getLogger(__name__)

# The one table from error codes to HTTP statuses.
HTTP_STATUS: Mapping[str, int] = {
    "INVALID_ARGUMENT": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "FAILED_PRECONDITION": 409,
    "ALREADY_EXISTS": 409,
    "WRONG_STATE": 409,
    "METHOD_NOT_ALLOWED": 405,
    "VERSION_MISMATCH": 412,
    "PAYLOAD_TOO_LARGE": 413,
    "URI_TOO_LONG": 414,
    "UNSUPPORTED_MEDIA_TYPE": 415,
    "RESOURCE_EXHAUSTED": 429,
    "HEADERS_TOO_LARGE": 431,
    "UNAVAILABLE": 503,
    "INTERNAL": 500,
}

LIST_JOBS_PARAMETERS = ("status", "workflow_name", "limit", "page_token")
LIST_WORKFLOWS_PARAMETERS = ("limit", "page_token")
LIST_OUTBOX_PARAMETERS = ("status", "job_id", "limit", "page_token")
LIST_REQUESTS_DLQ_PARAMETERS = ("max", "page_token")
WATCH_JOB_PARAMETERS = ("after",)


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: dict[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)


def error_reply(code: str, message: str) -> Reply:
    # A 401 names the scheme it wants (RFC 9110).
    headers = (
        {"WWW-Authenticate": 'Bearer realm="workflow-jobs"'} if code == "UNAUTHENTICATED" else {}
    )
    return Reply(
        HTTP_STATUS.get(code, 500),
        to_json(api_pb2.ErrorBody(code=code, message=message)),
        headers,
    )


def _etag(version: int) -> dict[str, str]:
    return {"ETag": f'"{version}"'}


def write_conditions(if_match: str | None, if_none_match: str | None) -> tuple[int | None, bool]:
    """``(if_version, create_only)`` from a PUT's ``If-Match`` / ``If-None-Match``."""
    if if_match is not None and if_none_match is not None:
        raise InvalidArgument("send If-Match or If-None-Match, not both")
    if if_none_match is not None:
        if if_none_match.strip() != "*":
            raise InvalidArgument(f"If-None-Match must be * (create only), got {if_none_match!r}")
        return None, True
    if if_match is None:
        return None, False
    raw = if_match.strip()
    unquoted = raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] == '"' else raw
    # str.isdigit also takes digits int() cannot read, such as superscripts; a
    # version is an int64, so no ETag of one runs past 19 digits.
    if not (unquoted.isascii() and unquoted.isdigit()) or len(unquoted) > 19 or int(unquoted) < 1:
        raise InvalidArgument(
            f'If-Match must be a stored version\'s ETag, like "3", got {if_match!r}'
        )
    return int(unquoted), False


async def answer(call: Callable[[], Awaitable[Reply]]) -> Reply:
    """Run one verb and turn the errors it raises on purpose into an ``ErrorBody`` reply.

    Anything else is a bug: it propagates to ``streams.http_errors``, which
    logs it with a request id and answers 500 with that id and nothing more.
    """
    try:
        return await call()
    except WorkflowJobsError as exc:
        return error_reply(exc.code, exc.message)


def _json_object(body: bytes, what: str) -> dict[str, Any]:
    if not body.strip():
        raise InvalidArgument(f"{what} needs a JSON object body, got an empty body")
    value = load_json(body, what)
    if not isinstance(value, dict):
        raise InvalidArgument(f"the body of {what} must be a JSON object, got {json_type(value)}")
    return value


def _only_parameters(query: Mapping[str, str], allowed: tuple[str, ...], verb: str) -> None:
    unknown = sorted(set(query) - set(allowed))
    if unknown:
        takes = ", ".join(allowed) if allowed else "none"
        raise InvalidArgument(
            f"unknown query parameter(s) {', '.join(unknown)}; {verb} takes {takes}"
        )


def _int_parameter(query: Mapping[str, str], name: str, default: int) -> int:
    raw = query.get(name, "").strip()
    if not raw:
        return default
    # Plain ASCII digits, as every client sends them: int() alone would also
    # take "1_0", "+5" and digits of other scripts.
    digits = raw.removeprefix("-")
    try:
        if digits.isascii() and digits.isdigit():
            return int(raw)
    except ValueError:  # longer than int() reads
        pass
    raise InvalidArgument(f"{name} must be an integer, got {raw!r}")


def _event_id(raw: str, what: str) -> int:
    """An outbox event id a watch resumes after: a non-negative integer."""
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        raise InvalidArgument(f"{what} must be an event id (a non-negative integer), got {raw!r}")
    return int(text)


def _one_selector(data: Mapping[str, Any], selectors: tuple[str, ...], verb: str) -> str:
    """The one key of ``selectors`` the body of ``verb`` uses; anything else is refused."""
    unknown = sorted(set(data) - set(selectors))
    if unknown:
        raise InvalidArgument(
            f"unknown field(s) {', '.join(unknown)}; {verb} takes one of {', '.join(selectors)}"
        )
    given = [key for key in selectors if key in data]
    if len(given) != 1:
        raise InvalidArgument(f"{verb} takes exactly one of {', '.join(selectors)}")
    if given[0] == "all" and data["all"] is not True:
        raise InvalidArgument(f"all must be true when given, got {data['all']!r}")
    return given[0]


def _parse_now(body: bytes, message: Message, what: str) -> Message:
    from_json(_json_object(body, what), message)
    check_incoming(message)
    return message


async def _parse(body: bytes, message: Message, what: str) -> Message:
    """``message`` from a JSON body, validated: off the event loop.

    Scanning, decoding and validating a definition costs a millisecond or more
    a request; a burst of them handled in one turn of the loop would hold up
    heartbeats and leases for their sum. A body of a megabyte holding many
    small values costs a second or more from bytes to the Struct's plain JSON,
    so the verbs that take a Struct convert it in the same thread.
    """
    return await asyncio.to_thread(_parse_now, body, message, what)


def _submit_now(
    body: bytes,
) -> tuple[api_pb2.SubmitWorkflowRequest, dict[str, Any], dict[str, Any] | None]:
    """The submit request, its input and its inline definition (None: a stored one)."""
    request = cast(
        api_pb2.SubmitWorkflowRequest,
        _parse_now(body, api_pb2.SubmitWorkflowRequest(), "submit-workflow"),
    )
    workflow = (
        struct_to_dict(request.workflow, "workflow") if request.HasField("workflow") else None
    )
    return request, struct_to_dict(request.input, "input"), workflow


def _agree_with_path(data: dict[str, Any], **path: str) -> None:
    """Fill in the body's copies of the path's values; refuse one that differs."""
    for key, value in path.items():
        given = data.setdefault(key, value)
        if given != value and not (key == "job_id" and _same_uuid(given, value)):
            raise InvalidArgument(
                f"{key} in the body ({given!r}) differs from the one in the path ({value!r})"
            )


def _same_uuid(given: Any, value: str) -> bool:
    # A UUID's hex digits may be sent in either case; it is one job id.
    try:
        return isinstance(given, str) and parse_job_id(given) == parse_job_id(value)
    except InvalidArgument:
        return False


def _complete_step_now(body: bytes, job_id: str, step_name: str) -> tuple[UUID, dict[str, Any]]:
    """The job id and the response of a complete-step body, checked against its path."""
    data = _json_object(body, "complete-step")
    _agree_with_path(data, job_id=job_id, step_name=step_name)
    parsed = parse_job_id(job_id)
    request = cast(api_pb2.CompleteStepRequest, from_json(data, api_pb2.CompleteStepRequest()))
    check_incoming(request)
    return parsed, struct_to_dict(request.response, "response")


def _put_workflow_now(body: bytes) -> dict[str, Any]:
    request = cast(
        api_pb2.PutWorkflowRequest,
        _parse_now(body, api_pb2.PutWorkflowRequest(), "put-workflow"),
    )
    return struct_to_dict(request.workflow, "workflow")


async def _answer_off_loop(
    build: Callable[[], Message], render: Callable[[Message], dict[str, Any]] = message_json
) -> dict[str, Any]:
    """The JSON of the answer ``build`` makes, one carrying a whole job or stored
    definition: off the event loop.

    A job's input and checkpoints, or a definition, may hold a megabyte of
    small values; making them a message and the message JSON takes about half
    a second a megabyte.
    """
    return await asyncio.to_thread(lambda: render(build()))


class HttpVerbs:
    """The verbs over HTTP: bodies and queries in, replies out; ``Jobs`` does the work."""

    def __init__(self, runtime: Runtime, jobs: Jobs | None = None) -> None:
        self._runtime = runtime
        self.jobs = jobs if jobs is not None else Jobs(runtime)
        self.authenticator = Authenticator(
            runtime.require_tokens, enabled=runtime.settings.auth_enabled
        )

    @property
    def watch(self) -> JobWatch | None:
        return self._runtime.watch

    @property
    def max_body_bytes(self) -> int:
        return self._runtime.settings.max_body_bytes

    async def authorize(self, authorization: str | None, scope: str) -> Caller:
        """The caller an ``Authorization`` header names, if its token carries ``scope``."""
        with outages_as_unavailable():
            caller = await self.authenticator.authenticate(authorization)
        caller.require(scope)
        return caller

    # ------------------------------------------------------------------ jobs

    async def submit(
        self, caller: Caller, body: bytes, *, trace: TraceContext | None = None
    ) -> Reply:
        """``trace``: the W3C context of the request's headers (malformed: None)."""
        request, input, workflow = await asyncio.to_thread(_submit_now, body)
        if workflow is not None:
            # A definition sent with the job names its own step targets and
            # rules: a scope of its own, beyond submitting stored workflows.
            auth.require_inline_definitions(caller)
        submitted = await self.jobs.submit(
            job_id=parse_job_id(request.job_id) if request.job_id else None,
            input=input,
            workflow=workflow,
            workflow_name=request.workflow_name,
            max_attempts=request.max_attempts or None,
            owner=caller.principal,
            owner_only=not caller.fleet_wide,
            deadline_ms=request.deadline_ms or None,
            trace=trace,
        )
        reply_body = await _answer_off_loop(
            lambda: api_pb2.SubmitWorkflowResponse(
                job=job_message(submitted.job), created=submitted.created
            )
        )
        return Reply(201 if submitted.created else 200, reply_body)

    async def get_job(self, caller: Caller, job_id: str) -> Reply:
        request = api_pb2.GetJobRequest(job_id=job_id)
        parsed = parse_job_id(job_id)
        check_incoming(request)
        job, history = await self.jobs.get_job_with_history(parsed, owner=caller.visible_owner)
        reply_body = await _answer_off_loop(
            lambda: api_pb2.GetJobResponse(job=job_message(job, history))
        )
        return Reply(200, reply_body)

    async def watch_job(
        self,
        caller: Caller,
        job_id: str,
        query: Mapping[str, str],
        last_event_id: str | None,
        connected: Callable[[], bool],
        *,
        authorization: str | None,
    ) -> WatchStream:
        """The job's event stream (``streams.watch``), once the request is found valid.

        Everything that can refuse the request is checked here, before any of
        the stream is sent, so a refusal is still an ordinary error reply.
        ``Last-Event-ID`` (sent by a reconnecting client) wins over ``after``.
        The ``Authorization`` header is checked again while the stream lasts,
        so a revoked token stops watching as it stops every other verb.
        """
        _only_parameters(query, WATCH_JOB_PARAMETERS, "watch-job")
        parsed = parse_job_id(job_id)
        if last_event_id is not None:
            after = _event_id(last_event_id, "the Last-Event-ID header")
        else:
            after = _event_id(query.get("after", "0"), "after")
        watch = self._runtime.require_watch()
        watch.admit()
        # Not found is what a caller who may not see the job is told, too.
        await self.jobs.get_job(parsed, owner=caller.visible_owner)

        async def authorized() -> bool:
            try:
                await self.authorize(authorization, auth.READ)
            except (Unauthenticated, PermissionDenied):
                return False
            except Unavailable:
                # The store is away: the stream's own reads wait for it too.
                return True
            return True

        return watch.frames(parsed, after=after, connected=connected, authorized=authorized)

    async def step_form(self, caller: Caller, job_id: str, step_name: str) -> Reply:
        parsed = parse_job_id(job_id)
        form = await self.jobs.step_form(
            job_id=parsed, step_name=step_name, owner=caller.visible_owner
        )
        return Reply(200, form)

    async def fleet(self, caller: Caller, query: Mapping[str, str]) -> Reply:
        _only_parameters(query, (), "fleet")
        overview = await self.jobs.fleet(owner=caller.visible_owner)
        return Reply(200, overview)

    async def explain_job(self, caller: Caller, job_id: str) -> Reply:
        request = api_pb2.ExplainJobRequest(job_id=job_id)
        parsed = parse_job_id(job_id)
        check_incoming(request)
        facts = await self.jobs.explain(parsed, owner=caller.visible_owner)
        return Reply(200, message_json(explain_job(facts)))

    async def list_jobs(self, caller: Caller, query: Mapping[str, str]) -> Reply:
        _only_parameters(query, LIST_JOBS_PARAMETERS, "list-jobs")
        page = await self.jobs.list_jobs(
            status=query.get("status", "").strip(),
            workflow_name=query.get("workflow_name", "").strip(),
            limit=_int_parameter(query, "limit", 0),
            page_token=query.get("page_token", ""),
            owner=caller.visible_owner,
        )
        response = api_pb2.ListJobsResponse(
            jobs=[job_summary_message(job) for job in page.jobs],
            next_page_token=page.next_page_token,
        )
        return Reply(200, listing_json(response))

    async def complete_step(
        self, caller: Caller, job_id: str, step_name: str, body: bytes
    ) -> Reply:
        http_errors.refuse_nul("path parameter step_name", step_name)
        parsed, response_json = await asyncio.to_thread(_complete_step_now, body, job_id, step_name)
        result = await self.jobs.complete_step(
            job_id=parsed,
            step_name=step_name,
            response=response_json,
            owner=caller.visible_owner,
        )
        reply_body = await _answer_off_loop(
            lambda: api_pb2.CompleteStepResponse(
                outcome=result.outcome, job=job_message(result.job), message=result.message
            )
        )
        return Reply(200, reply_body)

    # ------------------------------------------------------------------ cancel

    async def cancel(self, caller: Caller, job_id: str, body: bytes) -> Reply:
        """Cancel one job; 200 for every outcome, a finished job answered as it is."""
        data = await asyncio.to_thread(_json_object, body, "cancel") if body.strip() else {}
        _agree_with_path(data, job_id=job_id)
        parsed = parse_job_id(job_id)
        request = cast(api_pb2.CancelJobRequest, from_json(data, api_pb2.CancelJobRequest()))
        check_incoming(request)
        result = await self.jobs.cancel(
            job_id=parsed, reason=request.reason, owner=caller.visible_owner
        )
        reply_body = await _answer_off_loop(
            lambda: api_pb2.CancelJobResponse(
                outcome=result.outcome, job=job_message(result.job), message=result.message
            )
        )
        return Reply(200, reply_body)

    async def cancel_many(self, caller: Caller, body: bytes) -> Reply:
        """Cancel every live job a filter picks (within the caller's reach)."""
        request = cast(
            api_pb2.CancelJobsRequest,
            await _parse(body, api_pb2.CancelJobsRequest(), "bulk cancel"),
        )
        done = await self.jobs.cancel_many(
            status=api_pb2.Job.Status.Name(request.status) if request.status else "",
            workflow_name=request.workflow_name,
            owner_filter=request.owner,
            created_before=(
                request.created_before.ToDatetime(tzinfo=UTC)
                if request.HasField("created_before")
                else None
            ),
            reason=request.reason,
            owner=caller.visible_owner,
        )
        response = api_pb2.CancelJobsResponse(
            cancelled=[str(job_id) for job_id in done.cancelled],
            cancel_requested=[str(job_id) for job_id in done.cancel_requested],
        )
        return Reply(200, listing_json(response))

    # ------------------------------------------------------------------ resume

    async def resume(self, caller: Caller, job_id: str, body: bytes) -> Reply:
        """A FAILED, DEAD or CANCELLED job as a new run: 201 made, 200 made before."""
        data = await asyncio.to_thread(_json_object, body, "resume")
        _agree_with_path(data, job_id=job_id)
        parsed = parse_job_id(job_id)
        request = cast(api_pb2.ResumeJobRequest, from_json(data, api_pb2.ResumeJobRequest()))
        check_incoming(request)
        resumed = await self.jobs.resume(
            job_id=parsed,
            principal=caller.principal,
            owner=caller.visible_owner,
            from_step=request.from_step,
            use_current_definition=request.use_current_definition,
            request_key=request.request_key,
            max_attempts=request.max_attempts or None,
        )
        reply_body = await _answer_off_loop(
            lambda: api_pb2.ResumeJobResponse(job=job_message(resumed.job), created=resumed.created)
        )
        return Reply(201 if resumed.created else 200, reply_body)

    async def resume_many(self, caller: Caller, body: bytes) -> Reply:
        """Every ended job a filter picks that no run resumes yet, each as a new run."""
        request = cast(
            api_pb2.ResumeJobsRequest,
            await _parse(body, api_pb2.ResumeJobsRequest(), "bulk resume"),
        )
        created_before = (
            request.created_before.ToDatetime(tzinfo=UTC)
            if request.HasField("created_before")
            else None
        )
        done = await self.jobs.resume_many(
            principal=caller.principal,
            owner=caller.visible_owner,
            statuses=[api_pb2.Job.Status.Name(status) for status in request.statuses],
            workflow_name=request.workflow_name,
            job_owner=request.owner,
            created_before=created_before,
            use_current_definition=request.use_current_definition,
            request_key=request.request_key,
            limit=request.limit,
        )
        response = api_pb2.ResumeJobsResponse(
            resumed=[job_summary_message(item.job) for item in done.resumed],
            refused=[
                api_pb2.ResumeJobsResponse.Refusal(
                    job_id=str(refusal.job_id), code=refusal.code, message=refusal.message
                )
                for refusal in done.refused
            ],
        )
        return Reply(200, listing_json(response))

    # ------------------------------------------------------------------ stored workflows

    async def put_workflow(
        self,
        name: str,
        body: bytes,
        *,
        if_match: str | None = None,
        if_none_match: str | None = None,
    ) -> Reply:
        if_version, create_only = write_conditions(if_match, if_none_match)
        stored = await self.jobs.put_workflow(
            name,
            await asyncio.to_thread(_put_workflow_now, body),
            if_version=if_version,
            create_only=create_only,
        )
        answer = await _answer_off_loop(
            lambda: api_pb2.PutWorkflowResponse(workflow=stored_workflow_message(stored))
        )
        # Version 1 is the first write: nothing deletes a stored workflow.
        return Reply(201 if stored.version == 1 else 200, answer, _etag(stored.version))

    async def get_workflow(self, name: str) -> Reply:
        stored = await self.jobs.get_workflow(name)
        answer = await _answer_off_loop(
            lambda: api_pb2.GetWorkflowResponse(workflow=stored_workflow_message(stored))
        )
        return Reply(200, answer, _etag(stored.version))

    async def list_workflows(self, query: Mapping[str, str]) -> Reply:
        _only_parameters(query, LIST_WORKFLOWS_PARAMETERS, "list-workflows")
        page = await self.jobs.list_workflows(
            limit=_int_parameter(query, "limit", 0), page_token=query.get("page_token", "")
        )
        answer = await _answer_off_loop(
            lambda: api_pb2.ListWorkflowsResponse(
                workflows=[stored_workflow_message(item) for item in page.definitions],
                next_page_token=page.next_page_token,
            ),
            listing_json,
        )
        return Reply(200, answer)

    # ------------------------------------------------------------------ dead letters

    async def list_outbox(self, caller: Caller, query: Mapping[str, str]) -> Reply:
        """FAILED outbox rows (the relay's dead letters), oldest first."""
        _only_parameters(query, LIST_OUTBOX_PARAMETERS, "the outbox listing")
        status = query.get("status", "").strip() or "FAILED"
        if status != "FAILED":
            raise InvalidArgument(f"status must be FAILED (the only one listed), got {status!r}")
        job_id = query.get("job_id", "").strip()
        page = await self.jobs.failed_events(
            job_id=parse_job_id(job_id) if job_id else None,
            limit=_int_parameter(query, "limit", 0),
            page_token=query.get("page_token", ""),
            owner=caller.visible_owner,
        )
        events = [
            {
                "id": event.id,
                "job_id": str(event.job_id),
                "event_type": event.event_type,
                "attempts": event.attempts,
                "last_error": event.last_error or "",
                "created_at": timestamp_json(event.created_at),
            }
            for event in page.events
        ]
        return Reply(200, {"events": events, "next_page_token": page.next_page_token})

    async def redrive_outbox(self, caller: Caller, body: bytes) -> Reply:
        """FAILED outbox rows back to PENDING: by id, one job's, or all."""
        data = await asyncio.to_thread(_json_object, body, "the outbox redrive")
        selector = _one_selector(data, ("ids", "job_id", "all"), "the outbox redrive")
        if selector == "ids":
            ids = data["ids"]
            if (
                not isinstance(ids, list)
                or not ids
                or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
            ):
                raise InvalidArgument(
                    f"ids must be a non-empty list of outbox row ids, got {ids!r}"
                )
            redriven = await self.jobs.redrive_events(ids=ids, owner=caller.visible_owner)
        elif selector == "job_id":
            if not isinstance(data["job_id"], str):
                raise InvalidArgument(f"job_id must be a UUID, got {data['job_id']!r}")
            redriven = await self.jobs.redrive_events(
                job_id=parse_job_id(data["job_id"]), owner=caller.visible_owner
            )
        else:
            redriven = await self.jobs.redrive_events(owner=caller.visible_owner)
        body_out = {
            "redriven": [{"id": i, "job_id": str(job)} for i, job in redriven.events],
            "not_failed": list(redriven.not_failed),
        }
        return Reply(200, body_out)

    async def list_requests_dlq(self, caller: Caller, query: Mapping[str, str]) -> Reply:
        """What the request agent dead-lettered, with the reasons."""
        from streams.requests_dlq import DEFAULT_LIST_MAX

        caller.require_fleet("dead-lettered requests")

        _only_parameters(query, LIST_REQUESTS_DLQ_PARAMETERS, "the dead-letter listing")
        limit = _int_parameter(query, "max", DEFAULT_LIST_MAX)
        listing = await self.jobs.dead_lettered_requests(limit, query.get("page_token", ""))
        return Reply(
            200,
            {
                "topic": listing.topic,
                "total": listing.total,
                "messages": [message.to_json() for message in listing.messages],
                "next_page_token": listing.next_page_token,
            },
        )

    async def redrive_requests_dlq(self, caller: Caller, body: bytes) -> Reply:
        """Dead-lettered requests back to the requests topic: by position, or all."""
        caller.require_fleet("dead-lettered requests")
        data = await asyncio.to_thread(_json_object, body, "the dead-letter redrive")
        selector = _one_selector(data, ("positions", "all"), "the dead-letter redrive")
        positions: list[Position] | None = None
        if selector == "positions":
            raw = data["positions"]
            if not isinstance(raw, list) or not raw:
                raise InvalidArgument(
                    'positions must be a non-empty list of {"partition": P, "offset": O}, '
                    f"got {raw!r}"
                )
            positions = [_position(item) for item in raw]
        redriven = await self.jobs.redrive_requests(positions)
        return Reply(
            200,
            {
                "topic": self.jobs.requests_topic,
                "redriven": [message.to_json() for message in redriven],
            },
        )

    # ------------------------------------------------------------------ health

    async def health(self) -> Reply:
        """Liveness: 503 when some part is stuck (see ``streams.health``)."""
        health = await self._runtime.health_report()
        return Reply(200 if health.healthy else 503, self._health_body(health))

    async def readiness(self) -> Reply:
        """Readiness: 503 while some part is not serving yet, or is stuck."""
        health = await self._runtime.health_report()
        return Reply(200 if health.ready else 503, self._health_body(health))

    @property
    def metrics_enabled(self) -> bool:
        return self._runtime.metrics is not None

    async def metrics(self) -> bytes:
        """The Prometheus text format of this process's metrics (``streams.metrics``)."""
        return await self._runtime.metrics_exposition()

    def _health_body(self, health: HealthReport) -> dict[str, Any]:
        settings = self._runtime.settings
        return health.body(worker_id=settings.worker_id, roles=sorted(settings.roles))


def _position(item: Any) -> Position:
    from streams.requests_dlq import Position

    if (
        not isinstance(item, dict)
        or set(item) != {"partition", "offset"}
        or not all(isinstance(item[k], int) and not isinstance(item[k], bool) for k in item)
        or item["partition"] < 0
        or item["offset"] < 0
    ):
        raise InvalidArgument(
            'each of positions is {"partition": P, "offset": O} with non-negative integers, '
            f"got {item!r}"
        )
    return Position(item["partition"], item["offset"])


# ---------------------------------------------------------------------- aiohttp plumbing


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with PAYLOAD_TOO_LARGE past ``limit`` bytes.

    The declared length is checked first so an oversized upload is refused
    before it is read; a body without a length is counted as it streams.
    """
    raw = cast(aiohttp_web.Request, request)
    http_errors.require_json(raw)
    declared = raw.content_length
    if declared is not None and declared > limit:
        raise PayloadTooLarge(f"the body is {declared} bytes; the limit is {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in raw.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _query(request: Request) -> dict[str, str]:
    raw = cast(aiohttp_web.Request, request)
    query: dict[str, str] = {}
    for key, value in raw.query.items():
        if key in query:
            raise InvalidArgument(f"query parameter {key!r} is given more than once")
        query[key] = value
    http_errors.check_query(query)
    return query


def _no_query(request: Request, verb: str) -> None:
    # A parameter a verb ignored would let a typo through unnoticed: a cancel
    # sent ?reason=... would cancel without the reason, and say nothing.
    _only_parameters(_query(request), (), verb)


async def _respond(view: View, call: Callable[[], Awaitable[Reply]]) -> Response:
    reply = await answer(call)
    return view.json(reply.body, status=reply.status, headers=dict(reply.headers))


async def stream_events(
    request: Request, frames: WatchStream, write_timeout_s: float
) -> aiohttp_web.StreamResponse:
    """Send ``frames`` as ``text/event-stream`` until they end or the client goes.

    A client that stops reading (a frozen tab, a stalled proxy) keeps its
    connection open with its window shut, and a write to it never returns: a
    frame it has not taken within ``write_timeout_s`` cuts the stream, so its
    watcher's place is given back. A live client reconnects with Last-Event-ID.
    """
    raw = cast(aiohttp_web.Request, request)
    response = aiohttp_web.StreamResponse(
        status=200,
        headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            # Proxies that buffer responses (nginx) would hold the events back.
            "X-Accel-Buffering": "no",
        },
    )
    try:
        await response.prepare(raw)
    except BaseException:
        await frames.aclose()
        raise
    if raw.method == "HEAD":
        # An answer to HEAD has no body: frames written after its headers
        # would be read as the next answer on the connection, and would hold a
        # watcher's place for as long as the job lasts.
        await frames.aclose()
        await response.write_eof()
        return response
    try:
        async for frame in frames:
            try:
                async with asyncio.timeout(write_timeout_s):
                    await response.write(frame)
            except TimeoutError:
                log.info(
                    "watch %s cut: the client took no frame for %.0fs", raw.path, write_timeout_s
                )
                if raw.transport is not None:
                    # Closing would wait for the unread bytes to drain, for ever.
                    raw.transport.abort()
                return response
    except ConnectionResetError:
        # The client went away; its watch ends with it.
        pass
    finally:
        await frames.aclose()
    with contextlib.suppress(ConnectionResetError):
        await response.write_eof()
    return response


def _connected(request: Request) -> bool:
    transport = cast(aiohttp_web.Request, request).transport
    return transport is not None and not transport.is_closing()


def _authorization(request: Request) -> str | None:
    return cast(aiohttp_web.Request, request).headers.get("Authorization")


def _header(request: Request, name: str) -> str | None:
    return cast(aiohttp_web.Request, request).headers.get(name)


class _Route(View):
    """A view that answers HEAD only where it answers GET.

    Faust mounts HEAD on every view and serves it by calling ``get``: a route
    that takes only POST would list HEAD among its allowed methods and then
    refuse it with Faust's own 405.
    """

    def get_methods(self) -> set[str]:
        methods = set(super().get_methods())
        if "GET" not in methods:
            methods.discard("HEAD")
        return methods


_TOKENLESS_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


def register_views(app: faust.App, api: HttpVerbs, *, verbs: bool) -> None:
    """Mount ``/healthz`` and, when ``verbs``, the verbs, on the app's web server."""

    @app.page("/healthz")
    class Health(_Route):
        async def get(self, request: Request, **_: Any) -> Response:
            return await _respond(self, api.health)

    @app.page("/readyz")
    class Ready(_Route):
        async def get(self, request: Request, **_: Any) -> Response:
            return await _respond(self, api.readiness)

    if api.metrics_enabled:
        # Served like /healthz, without a token: Prometheus scrapers carry none,
        # and the page holds aggregate figures only, never a job id or a payload.
        @app.page("/metrics")
        class MetricsPage(_Route):
            async def get(self, request: Request, **_: Any) -> Response:
                return self.bytes(
                    await api.metrics(), headers={"Content-Type": metrics.CONTENT_TYPE}
                )

    http_errors.install(app, HTTP_STATUS)
    if not verbs:
        return
    web_app = cast(Any, app).web.web_app
    if not api.authenticator.enabled:

        @aiohttp_web.middleware
        async def local_only(
            request: aiohttp_web.Request,
            handler: Callable[[aiohttp_web.Request], Awaitable[aiohttp_web.StreamResponse]],
        ) -> aiohttp_web.StreamResponse:
            # The probes and the scrape need no token with auth on either, and
            # change nothing: a kubelet or a Prometheus that addresses the
            # process by its own IP must still reach them.
            if request.path not in _TOKENLESS_PATHS:
                # The header itself: without one, aiohttp's request.host asks
                # the resolver for this machine's name, on the event loop.
                auth.require_local_caller(
                    request.headers.get("Host", ""), request.headers.get("Origin")
                )
            return await handler(request)

        # Inside the error middleware, which answers the refusal as JSON.
        web_app.middlewares.append(local_only)
    register_openapi(app, metrics=api.metrics_enabled)
    register_dashboard(app)

    async def end_watches(_: aiohttp_web.Application) -> None:
        # Open event streams would otherwise hold the server's shutdown for
        # its whole handler timeout; a client reconnects with Last-Event-ID.
        if api.watch is not None:
            api.watch.close_streams()

    web_app.on_shutdown.append(end_watches)

    # Each call authorizes first: nothing of a request (body, query) is read
    # for a caller who may not make it.
    @app.page("/v1/workflow-runs")
    class WorkflowRuns(_Route):
        async def post(self, request: Request, **_: Any) -> Response:
            async def call() -> Reply:
                caller = await api.authorize(_authorization(request), auth.SUBMIT)
                _no_query(request, "submit-workflow")
                body = await read_body(request, api.max_body_bytes)
                trace = incoming(request.headers.get(TRACEPARENT), request.headers.get(TRACESTATE))
                return await api.submit(caller, body, trace=trace)

            return await _respond(self, call)

        async def get(self, request: Request, **_: Any) -> Response:
            async def call() -> Reply:
                caller = await api.authorize(_authorization(request), auth.READ)
                return await api.list_jobs(caller, _query(request))

            return await _respond(self, call)

    # A job id never holds ':' or '/', so ``{id}:verb`` routes never match here.
    @app.page("/v1/workflow-runs/{job_id:[^/:]+}")
    class WorkflowRun(_Route):
        async def get(self, request: Request, job_id: str = "", **_: Any) -> Response:
            async def call() -> Reply:
                caller = await api.authorize(_authorization(request), auth.READ)
                _no_query(request, "get-job")
                return await api.get_job(caller, job_id)

            return await _respond(self, call)

    @app.page("/v1/workflow-runs/{job_id:[^/:]+}/events")
    class WatchRun(_Route):
        async def get(self, request: Request, job_id: str = "", **_: Any) -> Response:
            frames: WatchStream | None = None

            async def call() -> Reply:
                nonlocal frames
                caller = await api.authorize(_authorization(request), auth.READ)
                frames = await api.watch_job(
                    caller,
                    job_id,
                    _query(request),
                    _header(request, "Last-Event-ID"),
                    connected=partial(_connected, request),
                    authorization=_authorization(request),
                )
                return Reply(200, {})

            reply = await answer(call)
            if frames is None:
                return self.json(reply.body, status=reply.status, headers=dict(reply.headers))
            watch = api.watch
            assert watch is not None  # frames come from it
            return cast(Response, await stream_events(request, frames, watch.write_timeout_s))

    @app.page("/v1/workflow-runs/{job_id:[^/:]+}:explain")
    class ExplainRun(_Route):
        async def get(self, request: Request, job_id: str = "", **_: Any) -> Response:
            async def call() -> Reply:
                caller = await api.authorize(_authorization(request), auth.READ)
                _no_query(request, "explain")
                return await api.explain_job(caller, job_id)

            return await _respond(self, call)

    @app.page("/v1/workflow-runs/{job_id:[^/:]+}:resume")
    class ResumeRun(_Route):
        async def post(self, request: Request, job_id: str = "", **_: Any) -> Response:
            async def call() -> Reply:
                caller = await api.authorize(_authorization(request), auth.SUBMIT)
                _no_query(request, "resume")
                body = await read_body(request, api.max_body_bytes)
                return await api.resume(caller, job_id, body)

            return await _respond(self, call)

    @app.page("/v1/workflow-runs:resume")
    class ResumeRuns(_Route):
        async def post(self, request: Request, **_: Any) -> Response:
            async def call() -> Reply:
                caller = await api.authorize(_authorization(request), auth.SUBMIT)
                _no_query(request, "bulk resume")
                return await api.resume_many(caller, await read_body(request, api.max_body_bytes))

            return await _respond(self, call)

    @app.page("/v1/workflow-runs/{job_id:[^/:]+}:cancel")
    class CancelRun(_Route):
        async def post(self, request: Request, job_id: str = "", **_: Any) -> Response:
            async def call() -> Reply:
                caller = await api.authorize(_authorization(request), auth.CANCEL)
                _no_query(request, "cancel")
                # The body is optional: a bare POST cancels without a reason.
                raw = cast(aiohttp_web.Request, request)
                body = await read_body(request, api.max_body_bytes) if raw.body_exists else b""
                return await api.cancel(caller, job_id, body)

            return await _respond(self, call)

    @app.page("/v1/workflow-runs:cancel")
    class CancelRuns(_Route):
        async def post(self, request: Request, **_: Any) -> Response:
            async def call() -> Reply:
                caller = await api.authorize(_authorization(request), auth.CANCEL)
                _no_query(request, "bulk cancel")
                return await api.cancel_many(caller, await read_body(request, api.max_body_bytes))

            return await _respond(self, call)

    @app.page("/v1/workflow-runs/{job_id}/steps/{step_name}:complete")
    class CompleteStep(_Route):
        async def post(
            self, request: Request, job_id: str = "", step_name: str = "", **_: Any
        ) -> Response:
            async def call() -> Reply:
                caller = await api.authorize(_authorization(request), auth.COMPLETE)
                _no_query(request, "complete-step")
                body = await read_body(request, api.max_body_bytes)
                return await api.complete_step(caller, job_id, step_name, body)

            return await _respond(self, call)

    @app.page("/v1/workflow-runs/{job_id}/steps/{step_name}:form")
    class StepForm(_Route):
        async def get(
            self, request: Request, job_id: str = "", step_name: str = "", **_: Any
        ) -> Response:
            async def call() -> Reply:
                caller = await api.authorize(_authorization(request), auth.READ)
                _no_query(request, "step-form")
                return await api.step_form(caller, job_id, step_name)

            return await _respond(self, call)

    @app.page("/v1/fleet")
    class Fleet(_Route):
        async def get(self, request: Request, **_: Any) -> Response:
            async def call() -> Reply:
                caller = await api.authorize(_authorization(request), auth.READ)
                return await api.fleet(caller, _query(request))

            return await _respond(self, call)

    @app.page("/v1/workflows")
    class Workflows(_Route):
        async def get(self, request: Request, **_: Any) -> Response:
            async def call() -> Reply:
                await api.authorize(_authorization(request), auth.READ)
                return await api.list_workflows(_query(request))

            return await _respond(self, call)

    @app.page("/v1/outbox")
    class OutboxView(_Route):
        async def get(self, request: Request, **_: Any) -> Response:
            async def call() -> Reply:
                caller = await api.authorize(_authorization(request), auth.ADMIN)
                return await api.list_outbox(caller, _query(request))

            return await _respond(self, call)

    @app.page("/v1/outbox:redrive")
    class OutboxRedrive(_Route):
        async def post(self, request: Request, **_: Any) -> Response:
            async def call() -> Reply:
                caller = await api.authorize(_authorization(request), auth.ADMIN)
                _no_query(request, "the outbox redrive")
                body = await read_body(request, api.max_body_bytes)
                return await api.redrive_outbox(caller, body)

            return await _respond(self, call)

    @app.page("/v1/requests-dlq")
    class RequestsDlq(_Route):
        async def get(self, request: Request, **_: Any) -> Response:
            async def call() -> Reply:
                caller = await api.authorize(_authorization(request), auth.ADMIN)
                return await api.list_requests_dlq(caller, _query(request))

            return await _respond(self, call)

    @app.page("/v1/requests-dlq:redrive")
    class RequestsDlqRedrive(_Route):
        async def post(self, request: Request, **_: Any) -> Response:
            async def call() -> Reply:
                caller = await api.authorize(_authorization(request), auth.ADMIN)
                _no_query(request, "the dead-letter redrive")
                body = await read_body(request, api.max_body_bytes)
                return await api.redrive_requests_dlq(caller, body)

            return await _respond(self, call)

    @app.page("/v1/workflows/{name}")
    class StoredWorkflowView(_Route):
        async def get(self, request: Request, name: str = "", **_: Any) -> Response:
            async def call() -> Reply:
                await api.authorize(_authorization(request), auth.READ)
                _no_query(request, "get-workflow")
                return await api.get_workflow(name)

            return await _respond(self, call)

        async def put(self, request: Request, name: str = "", **_: Any) -> Response:
            async def call() -> Reply:
                await api.authorize(_authorization(request), auth.ADMIN)
                _no_query(request, "put-workflow")
                return await api.put_workflow(
                    name,
                    await read_body(request, api.max_body_bytes),
                    if_match=_header(request, "If-Match"),
                    if_none_match=_header(request, "If-None-Match"),
                )

            return await _respond(self, call)


__all__ = [
    "HTTP_STATUS",
    "HttpVerbs",
    "Reply",
    "answer",
    "error_reply",
    "read_body",
    "register_views",
]
