"""The verbs over HTTP, served by the Faust web server.

Routes (JSON bodies in the proto3 JSON mapping of ``workflowjobs.v1`` messages,
field names as in the ``.proto``):

=======  ==================================================  ==========================
method   path                                                body / answer
=======  ==================================================  ==========================
POST     /v1/workflow-runs                                   SubmitWorkflowRequest ->
                                                             SubmitWorkflowResponse
                                                             (201 created, 200 existed)
GET      /v1/workflow-runs/{job_id}                          GetJobResponse
GET      /v1/workflow-runs?status=&workflow_name=&limit=     ListJobsResponse
         &page_token=
POST     /v1/workflow-runs/{job_id}/steps/{step_name}:complete
                                                             CompleteStepRequest (job_id
                                                             and step_name may be left
                                                             out) -> CompleteStepResponse
PUT      /v1/workflows/{name}                                PutWorkflowRequest ->
                                                             PutWorkflowResponse
GET      /v1/workflows/{name}                                GetWorkflowResponse
GET      /v1/workflows                                       ListWorkflowsResponse
GET      /healthz                                            {"status", "worker_id", ...}
=======  ==================================================  ==========================

complete-step answers 200 for the outcomes COMPLETED, ALREADY_DONE and REJECTED:
a rejected response is the workflow's answer (the job FAILED with that verdict),
not a malformed call, so the body says REJECTED and carries the failed job.
WRONG_STATE is the one outcome that is an error: 409 with code WRONG_STATE and
a message naming the job's current status.

Every error is ``{"code": ..., "message": ...}`` (``ErrorBody``), with the HTTP
status taken from ``HTTP_STATUS`` and nowhere else.

The ``Api`` class holds the verbs and knows nothing of the web framework, so the
Faust views are thin adapters and each verb can be exercised directly.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import psycopg
import psycopg_pool
from aiohttp import web as aiohttp_web
from faust.web import Request, Response, View
from google.protobuf.message import Message

from schemas.contract import api_pb2, check_incoming, from_json, parse_job_id, to_json
from schemas.errors import InvalidArgument, PayloadTooLarge, WorkflowJobsError
from store.definitions import validate_workflow_name
from store.runs import CompleteStepResult
from store.states import Status
from streams.convert import job_message, message_json, stored_workflow_message, struct_to_dict

if TYPE_CHECKING:
    import faust

    from streams.runtime import Runtime

log = logging.getLogger(__name__)

# The one table from error codes to HTTP statuses.
HTTP_STATUS: Mapping[str, int] = {
    "INVALID_ARGUMENT": 400,
    "NOT_FOUND": 404,
    "FAILED_PRECONDITION": 409,
    "ALREADY_EXISTS": 409,
    "WRONG_STATE": 409,
    "PAYLOAD_TOO_LARGE": 413,
    "RESOURCE_EXHAUSTED": 429,
    "UNAVAILABLE": 503,
    "INTERNAL": 500,
}

LIST_JOBS_PARAMETERS = ("status", "workflow_name", "limit", "page_token")

# The aiohttp statuses we render as ErrorBody instead of aiohttp's plain text.
_FRAMEWORK_CODES: Mapping[int, str] = {
    404: "NOT_FOUND",
    405: "INVALID_ARGUMENT",
    413: "PAYLOAD_TOO_LARGE",
}


class WrongState(WorkflowJobsError):
    """complete-step on a job that is not WAITING on that step."""

    code = "WRONG_STATE"


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: dict[str, Any]


def error_reply(code: str, message: str) -> Reply:
    return Reply(HTTP_STATUS.get(code, 500), to_json(api_pb2.ErrorBody(code=code, message=message)))


async def answer(call: Callable[[], Awaitable[Reply]]) -> Reply:
    """Run one verb and turn whatever it raises into an ``ErrorBody`` reply."""
    try:
        return await call()
    except WorkflowJobsError as exc:
        return error_reply(exc.code, exc.message)
    except (psycopg.OperationalError, psycopg.InterfaceError, psycopg_pool.PoolTimeout) as exc:
        # Connection trouble, not a bad request: the caller may retry as is.
        log.warning("store unreachable while serving a request: %s", exc)
        return error_reply("UNAVAILABLE", f"the store is unreachable: {exc}")
    except Exception as exc:
        log.exception("internal error while serving a request")
        return error_reply("INTERNAL", f"internal error: {type(exc).__name__}: {exc}")


def _json_object(body: bytes, what: str) -> dict[str, Any]:
    if not body.strip():
        raise InvalidArgument(f"{what} needs a JSON object body, got an empty body")
    try:
        value = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgument(f"the body of {what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidArgument(
            f"the body of {what} must be a JSON object, got {type(value).__name__}"
        )
    return value


def _parse(body: bytes, message: Message, what: str) -> Message:
    from_json(_json_object(body, what), message)
    check_incoming(message)
    return message


class Api:
    """The verbs, against the process's runtime (which may have no store)."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    @property
    def max_body_bytes(self) -> int:
        return self._runtime.settings.max_body_bytes

    # ------------------------------------------------------------------ jobs

    async def submit(self, body: bytes) -> Reply:
        request = cast(
            api_pb2.SubmitWorkflowRequest,
            _parse(body, api_pb2.SubmitWorkflowRequest(), "submit-workflow"),
        )
        runs = self._runtime.require_runs()
        job_id = parse_job_id(request.job_id) if request.job_id else uuid.uuid4()
        input_ = struct_to_dict(request.input)
        if request.HasField("workflow"):
            envelope = struct_to_dict(request.workflow)
        else:
            stored = await self._runtime.require_definitions().get(request.workflow_name)
            envelope = stored.definition
        compiled = self._runtime.compile(envelope)
        normalized = compiled.validate_input(input_)
        existing = await self._runtime.admit(job_id if request.job_id else None)
        if existing is not None:
            response = api_pb2.SubmitWorkflowResponse(job=job_message(existing), created=False)
            return Reply(200, message_json(response))
        result = await runs.submit(
            job_id=job_id,
            workflow_name=compiled.name,
            definition=envelope,
            definition_hash=compiled.definition_hash,
            input=normalized,
            max_attempts=request.max_attempts or None,
        )
        if result.created:
            self._runtime.admission.admitted()
        response = api_pb2.SubmitWorkflowResponse(
            job=job_message(result.job), created=result.created
        )
        return Reply(201 if result.created else 200, message_json(response))

    async def get_job(self, job_id: str) -> Reply:
        request = api_pb2.GetJobRequest(job_id=job_id)
        parse_job_id(job_id)
        check_incoming(request)
        job = await self._runtime.require_runs().get(job_id)
        return Reply(200, message_json(api_pb2.GetJobResponse(job=job_message(job))))

    async def list_jobs(self, query: Mapping[str, str]) -> Reply:
        unknown = sorted(set(query) - set(LIST_JOBS_PARAMETERS))
        if unknown:
            raise InvalidArgument(
                f"unknown query parameter(s) {', '.join(unknown)}; "
                f"list-jobs takes {', '.join(LIST_JOBS_PARAMETERS)}"
            )
        status = query.get("status", "").strip()
        workflow_name = query.get("workflow_name", "").strip()
        if workflow_name:
            validate_workflow_name(workflow_name)
        raw_limit = query.get("limit", "").strip() or "0"
        try:
            limit = int(raw_limit)
        except ValueError:
            raise InvalidArgument(f"limit must be an integer, got {raw_limit!r}") from None
        if limit < 0:
            raise InvalidArgument(f"limit must not be negative, got {limit}")
        page = await self._runtime.require_runs().list(
            status=status or None,
            workflow_name=workflow_name or None,
            limit=limit,
            page_token=query.get("page_token") or None,
        )
        response = api_pb2.ListJobsResponse(
            jobs=[job_message(job) for job in page.jobs], next_page_token=page.next_page_token
        )
        return Reply(200, message_json(response))

    async def complete_step(self, job_id: str, step_name: str, body: bytes) -> Reply:
        data = _json_object(body, "complete-step")
        for key, value in (("job_id", job_id), ("step_name", step_name)):
            given = data.setdefault(key, value)
            if given != value:
                raise InvalidArgument(
                    f"{key} in the body ({given!r}) differs from the one in the path ({value!r})"
                )
        parse_job_id(job_id)
        request = cast(api_pb2.CompleteStepRequest, from_json(data, api_pb2.CompleteStepRequest()))
        check_incoming(request)
        runs = self._runtime.require_runs()
        # Read first: a NOT_FOUND needs no lock, and a step whose validate
        # rules read the input or earlier steps is judged against them. Neither
        # changes while the job is WAITING, which the store checks again under
        # the row lock before it calls the verifier.
        job = await runs.get(job_id)
        parked_here = job.status == Status.WAITING and job.outstanding_step == step_name
        result: CompleteStepResult = await runs.complete_step(
            job_id=job_id,
            step_name=step_name,
            response=struct_to_dict(request.response),
            verify=self._runtime.step_verifier(
                step_name,
                input=job.input if parked_here else None,
                checkpoints=job.checkpoints if parked_here else (),
            ),
        )
        if result.outcome == "WRONG_STATE":
            raise WrongState(result.message)
        response = api_pb2.CompleteStepResponse(
            outcome=result.outcome,
            job=job_message(result.job),
            message=result.message,
        )
        return Reply(200, message_json(response))

    # ------------------------------------------------------------------ stored workflows

    async def put_workflow(self, name: str, body: bytes) -> Reply:
        validate_workflow_name(name)
        request = cast(
            api_pb2.PutWorkflowRequest,
            _parse(body, api_pb2.PutWorkflowRequest(), "put-workflow"),
        )
        envelope = struct_to_dict(request.workflow)
        if envelope.get("name") != name:
            raise InvalidArgument(
                f"the definition is named {envelope.get('name')!r} but the path names {name!r}"
            )
        definitions = self._runtime.require_definitions()
        # A definition that does not compile would only fail later, at every submit.
        self._runtime.compile(envelope)
        stored = await definitions.put(name, envelope)
        response = api_pb2.PutWorkflowResponse(workflow=stored_workflow_message(stored))
        return Reply(200, message_json(response))

    async def get_workflow(self, name: str) -> Reply:
        validate_workflow_name(name)
        stored = await self._runtime.require_definitions().get(name)
        response = api_pb2.GetWorkflowResponse(workflow=stored_workflow_message(stored))
        return Reply(200, message_json(response))

    async def list_workflows(self, query: Mapping[str, str]) -> Reply:
        if query:
            raise InvalidArgument(
                f"list-workflows takes no query parameters, got {', '.join(sorted(query))}"
            )
        stored = await self._runtime.require_definitions().list()
        response = api_pb2.ListWorkflowsResponse(
            workflows=[stored_workflow_message(item) for item in stored]
        )
        return Reply(200, message_json(response))

    # ------------------------------------------------------------------ health

    async def health(self) -> Reply:
        settings = self._runtime.settings
        body: dict[str, Any] = {
            "status": "ok",
            "worker_id": settings.worker_id,
            "roles": sorted(settings.roles),
        }
        if not settings.store_configured:
            body["store"] = "not configured"
            return Reply(200, body)
        problem = await self._runtime.check_store()
        if problem:
            body.update(status="degraded", store=problem)
            return Reply(503, body)
        body["store"] = "ok"
        return Reply(200, body)


# ---------------------------------------------------------------------- aiohttp plumbing


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with PAYLOAD_TOO_LARGE past ``limit`` bytes.

    The declared length is checked first so an oversized upload is refused
    before it is read; a body without a length is counted as it streams.
    """
    raw = cast(aiohttp_web.Request, request)
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
    return query


async def _respond(view: View, call: Callable[[], Awaitable[Reply]]) -> Response:
    reply = await answer(call)
    return view.json(reply.body, status=reply.status)


@aiohttp_web.middleware
async def json_errors(
    request: aiohttp_web.Request,
    handler: Callable[[aiohttp_web.Request], Awaitable[aiohttp_web.StreamResponse]],
) -> aiohttp_web.StreamResponse:
    """Unknown paths and methods answer an ``ErrorBody`` too, not aiohttp's text."""
    try:
        return await handler(request)
    except aiohttp_web.HTTPException as exc:
        code = _FRAMEWORK_CODES.get(exc.status)
        if code is None or not request.path.startswith("/v1/"):
            raise
        message = {
            404: f"no such resource: {request.path}",
            405: f"method {request.method} is not allowed on {request.path}",
            413: exc.text or "the body is too large",
        }[exc.status]
        body = to_json(api_pb2.ErrorBody(code=code, message=message))
        return aiohttp_web.json_response(body, status=exc.status)


def register_views(app: faust.App, api: Api, *, verbs: bool) -> None:
    """Mount ``/healthz`` and, when ``verbs``, the verbs, on the app's web server."""

    @app.page("/healthz")
    class Health(View):
        async def get(self, request: Request, **_: Any) -> Response:
            return await _respond(self, api.health)

    if not verbs:
        return

    web_app = cast(Any, app.web).web_app
    web_app.middlewares.append(json_errors)

    @app.page("/v1/workflow-runs")
    class WorkflowRuns(View):
        async def post(self, request: Request, **_: Any) -> Response:
            async def call() -> Reply:
                return await api.submit(await read_body(request, api.max_body_bytes))

            return await _respond(self, call)

        async def get(self, request: Request, **_: Any) -> Response:
            return await _respond(self, lambda: api.list_jobs(_query(request)))

    @app.page("/v1/workflow-runs/{job_id}")
    class WorkflowRun(View):
        async def get(self, request: Request, job_id: str = "", **_: Any) -> Response:
            return await _respond(self, lambda: api.get_job(job_id))

    @app.page("/v1/workflow-runs/{job_id}/steps/{step_name}:complete")
    class CompleteStep(View):
        async def post(
            self, request: Request, job_id: str = "", step_name: str = "", **_: Any
        ) -> Response:
            async def call() -> Reply:
                body = await read_body(request, api.max_body_bytes)
                return await api.complete_step(job_id, step_name, body)

            return await _respond(self, call)

    @app.page("/v1/workflows")
    class Workflows(View):
        async def get(self, request: Request, **_: Any) -> Response:
            return await _respond(self, lambda: api.list_workflows(_query(request)))

    @app.page("/v1/workflows/{name}")
    class StoredWorkflowView(View):
        async def get(self, request: Request, name: str = "", **_: Any) -> Response:
            return await _respond(self, lambda: api.get_workflow(name))

        async def put(self, request: Request, name: str = "", **_: Any) -> Response:
            async def call() -> Reply:
                return await api.put_workflow(name, await read_body(request, api.max_body_bytes))

            return await _respond(self, call)


__all__ = [
    "HTTP_STATUS",
    "Api",
    "Reply",
    "WrongState",
    "answer",
    "error_reply",
    "read_body",
    "register_views",
]
