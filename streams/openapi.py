"""The OpenAPI 3.1 document of the HTTP API, served at ``GET /v1/openapi.json``.

Request and response bodies of the verbs are the proto3 JSON mapping of the
``workflowjobs.v1`` messages (field names as in the ``.proto``), so their JSON
Schemas are made from the message descriptors here and cannot drift from the
contract. The operator routes' bodies are not messages; their schemas are
written out below. A test compares the document's paths and methods with the
routes the web server serves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from faust.web import Request, Response, View
from google.protobuf.descriptor import FieldDescriptor

from schemas.contract import api_pb2
from schemas.gen.buf.validate import validate_pb2
from streams.convert import LISTINGS
from streams.http_errors import JSON_MEDIA_TYPE

if TYPE_CHECKING:
    import faust

OPENAPI_PATH = "/v1/openapi.json"

_SCALARS: Mapping[int, dict[str, Any]] = {
    FieldDescriptor.TYPE_STRING: {"type": "string"},
    FieldDescriptor.TYPE_BOOL: {"type": "boolean"},
    FieldDescriptor.TYPE_DOUBLE: {"type": "number"},
    FieldDescriptor.TYPE_FLOAT: {"type": "number"},
    FieldDescriptor.TYPE_INT32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_SINT32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_SFIXED32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_UINT32: {"type": "integer", "minimum": 0},
    FieldDescriptor.TYPE_FIXED32: {"type": "integer", "minimum": 0},
    # proto3 JSON writes 64-bit integers as strings and reads either form.
    FieldDescriptor.TYPE_INT64: {"type": ["string", "integer"], "format": "int64"},
    FieldDescriptor.TYPE_SINT64: {"type": ["string", "integer"], "format": "int64"},
    FieldDescriptor.TYPE_SFIXED64: {"type": ["string", "integer"], "format": "int64"},
    FieldDescriptor.TYPE_UINT64: {"type": ["string", "integer"], "format": "int64"},
    FieldDescriptor.TYPE_FIXED64: {"type": ["string", "integer"], "format": "int64"},
    FieldDescriptor.TYPE_BYTES: {"type": "string", "contentEncoding": "base64"},
}

_WELL_KNOWN: Mapping[str, dict[str, Any]] = {
    "google.protobuf.Struct": {"type": "object"},
    "google.protobuf.Value": {},
    "google.protobuf.ListValue": {"type": "array"},
    "google.protobuf.Timestamp": {"type": "string", "format": "date-time"},
}

# Statuses every route may answer besides its own: the framework's and the parser's.
_COMMON_ERRORS = ("400", "404", "405", "414", "431", "500")
_ERROR_DESCRIPTIONS: Mapping[str, str] = {
    "400": "INVALID_ARGUMENT: the request is malformed; the message names the field",
    "401": "UNAUTHENTICATED: no token, or one that is unknown or revoked",
    "403": "PERMISSION_DENIED: the token lacks the scope the verb needs",
    "404": "NOT_FOUND: no such resource (or route)",
    "405": "METHOD_NOT_ALLOWED: the route does not take this method",
    "409": "FAILED_PRECONDITION, ALREADY_EXISTS or WRONG_STATE",
    "412": "VERSION_MISMATCH: If-Match or If-None-Match did not hold",
    "413": "PAYLOAD_TOO_LARGE: the body, or the event it would make, is over its limit",
    "414": "URI_TOO_LONG: the URL is over the limit",
    "415": "UNSUPPORTED_MEDIA_TYPE: bodies must be application/json, uncompressed",
    "429": "RESOURCE_EXHAUSTED: the backlog (or a watch limit) is full; retry later",
    "431": "HEADERS_TOO_LARGE: a header is too long, or there are too many",
    "500": "INTERNAL: a bug; the message carries the request id the log has",
    "503": "UNAVAILABLE: the store (or broker) is not configured or not reachable",
}
# What a verb that takes a token, a JSON body, or both may answer besides.
_AUTH_ERRORS = ("401", "403")
_BODY_ERRORS = ("400", "413", "415")


_LISTED = frozenset(listing.DESCRIPTOR.full_name for listing in LISTINGS)


# Descriptors are typed Any: the generated modules hand out upb's descriptor
# classes, which the stubs type apart from ``google.protobuf.descriptor``'s.
Descriptor = Any


class _Schemas:
    """Component schemas made from message descriptors, each once."""

    def __init__(self) -> None:
        self.components: dict[str, Any] = {}

    def ref(self, descriptor: Descriptor) -> dict[str, Any]:
        name = descriptor.name
        if name not in self.components:
            self.components[name] = {}  # placeholder: a message may name itself
            self.components[name] = self._message(descriptor)
        return {"$ref": f"#/components/schemas/{name}"}

    def _message(self, descriptor: Descriptor) -> dict[str, Any]:
        properties = {field.name: self._field(field) for field in descriptor.fields}
        schema: dict[str, Any] = {
            "type": "object",
            "properties": properties,
            # Unknown fields are refused (``schemas.contract.from_json``).
            "additionalProperties": False,
        }
        if descriptor.full_name in _LISTED:
            # Sent even when empty (``streams.convert.listing_json``).
            schema["required"] = list(properties)
        else:
            # A request without one of these is refused (``schemas.contract.check_incoming``).
            required = [field.name for field in descriptor.fields if _required_by_rule(field)]
            if required:
                schema["required"] = required
        return schema

    def _field(self, field: Descriptor) -> dict[str, Any]:
        if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
            # A map is a repeated entry message in the descriptor, but its JSON is an object.
            value = self._field(field.message_type.fields_by_name["value"])
            return {"type": "object", "additionalProperties": value}
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            full_name = field.message_type.full_name
            if full_name in _WELL_KNOWN:
                single = dict(_WELL_KNOWN[full_name])
            else:
                single = self.ref(field.message_type)
        elif field.type == FieldDescriptor.TYPE_ENUM:
            single = _enum(field.enum_type)
        else:
            single = dict(_SCALARS[field.type])
        if field.is_repeated:
            return {"type": "array", "items": single}
        return single


def _required_by_rule(field: Descriptor) -> bool:
    options = field.GetOptions()
    return bool(
        options.HasExtension(validate_pb2.field) and options.Extensions[validate_pb2.field].required
    )


def _enum(descriptor: Descriptor) -> dict[str, Any]:
    return {"type": "string", "enum": [value.name for value in descriptor.values]}


def _json_body(schema: Mapping[str, Any], description: str) -> dict[str, Any]:
    return {
        "required": True,
        "description": description,
        "content": {JSON_MEDIA_TYPE: {"schema": dict(schema)}},
    }


def _answer(schema: Mapping[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON_MEDIA_TYPE: {"schema": dict(schema)}}}


def _versioned(answer: dict[str, Any]) -> dict[str, Any]:
    """``answer`` with the ETag header a stored workflow's answers carry."""
    etag = {"description": 'the version, quoted: "3"', "schema": {"type": "string"}}
    return {**answer, "headers": {"ETag": etag}}


def _operation(
    operation_id: str,
    summary: str,
    answers: Mapping[str, dict[str, Any]],
    *,
    errors: tuple[str, ...] = (),
    parameters: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
    scope: str | None = None,
    fleet: bool = False,
    needs_also: str = "",
) -> dict[str, Any]:
    """``fleet``: the verb reaches data of no owner, so it needs the ``fleet`` scope too;
    ``needs_also``: a sentence on what some of its requests need besides."""
    operation: dict[str, Any] = {"operationId": operation_id, "summary": summary}
    if scope is None:
        operation["security"] = []
    else:
        scopes = f"`{scope}` and `fleet` scopes" if fleet else f"`{scope}` scope"
        operation["description"] = f"Needs a token with the {scopes}. {needs_also}".strip()
        errors = errors + _AUTH_ERRORS
    if parameters:
        operation["parameters"] = parameters
    if body is not None:
        operation["requestBody"] = body
        errors = errors + _BODY_ERRORS
    responses = dict(answers)
    for status in sorted(set(errors + _COMMON_ERRORS)):
        responses[status] = {"$ref": f"#/components/responses/E{status}"}
    operation["responses"] = responses
    return operation


def _path(name: str, schema: Mapping[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": dict(schema),
    }


def _query(name: str, schema: Mapping[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": dict(schema),
    }


def _header(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "header",
        "required": False,
        "description": description,
        "schema": {"type": "string"},
    }


_UUID: Mapping[str, Any] = {"type": "string", "format": "uuid"}
_NAME: Mapping[str, Any] = {"type": "string", "minLength": 1, "maxLength": 200}
_LIMIT: Mapping[str, Any] = {"type": "integer", "minimum": 0}

_COUNTS: Mapping[str, Any] = {"type": "object", "additionalProperties": {"type": "integer"}}
_FLEET: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "as_of": {"type": "string", "format": "date-time"},
        "jobs_by_status": _COUNTS,
        "jobs_by_status_last_5m": _COUNTS,
        "oldest_queued_age_s": {"type": ["number", "null"]},
        "outbox": {
            "type": "object",
            "description": "only for a fleet-wide token",
            "properties": {
                "pending": {"type": "integer"},
                "oldest_pending_age_s": {"type": ["number", "null"]},
                "failed": {"type": "integer"},
            },
        },
        "workers": {
            "type": "array",
            "description": "only for a fleet-wide token: workers holding RUNNING jobs",
            "items": {
                "type": "object",
                "properties": {
                    "worker": {"type": "string"},
                    "running": {"type": "integer"},
                    "first_lease_until": {"type": "string", "format": "date-time"},
                    "last_lease_until": {"type": "string", "format": "date-time"},
                    "live": {
                        "type": "boolean",
                        "description": "its process is alive (holds its worker id); false "
                        "for one that died, whose jobs wait for their leases to pass",
                    },
                },
            },
        },
    },
}
_STEP_FORM: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "job_id": {"type": "string"},
        "step_name": {"type": "string"},
        "response_type": {"type": "string"},
        "parked_here": {"type": "boolean"},
        "fields": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {
                        "type": "string",
                        "description": "the field's JSON name; empty for the whole response",
                    },
                    "kind": {"enum": ["boolean", "integer", "number", "string", "enum", "json"]},
                    "type": {"type": "string", "description": "the field's .proto type"},
                    "choices": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}
_OUTBOX_PAGE: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "events": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "job_id": _UUID,
                    "event_type": {"type": "string"},
                    "attempts": {"type": "integer"},
                    "last_error": {"type": "string"},
                    "created_at": {"type": "string", "format": "date-time"},
                },
            },
        },
        "next_page_token": {"type": "string"},
    },
    "required": ["events", "next_page_token"],
}
_OUTBOX_REDRIVE: Mapping[str, Any] = {
    "oneOf": [
        {
            "type": "object",
            "properties": {
                "ids": {
                    "type": "array",
                    "items": {"type": "integer"},
                    "minItems": 1,
                    "maxItems": 1000,
                },
            },
            "required": ["ids"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"job_id": _UUID},
            "required": ["job_id"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"all": {"const": True}},
            "required": ["all"],
            "additionalProperties": False,
        },
    ]
}
_OUTBOX_REDRIVEN: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "redriven": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"id": {"type": "integer"}, "job_id": _UUID},
            },
        },
        "not_failed": {"type": "array", "items": {"type": "integer"}},
    },
}
_POSITION: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "partition": {"type": "integer", "minimum": 0},
        "offset": {"type": "integer", "minimum": 0},
    },
    "required": ["partition", "offset"],
    "additionalProperties": False,
}
_DLQ_MESSAGE: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "partition": {"type": "integer"},
        "offset": {"type": "integer"},
        # null: a message produced without a key, or stamped with no time.
        "key": {"type": ["string", "null"]},
        "reason": {"type": "string"},
        "timestamp": {"type": ["string", "null"], "format": "date-time"},
        "size": {"type": "integer"},
        "job_id": {"type": "string"},
        "workflow_name": {"type": "string"},
    },
}
_DLQ_LISTING: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "topic": {"type": "string"},
        "total": {"type": "integer"},
        "messages": {"type": "array", "items": _DLQ_MESSAGE},
        "next_page_token": {"type": "string"},
    },
    "required": ["topic", "total", "messages", "next_page_token"],
}
_DLQ_REDRIVE: Mapping[str, Any] = {
    "oneOf": [
        {
            "type": "object",
            "properties": {"positions": {"type": "array", "items": _POSITION, "minItems": 1}},
            "required": ["positions"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"all": {"const": True}},
            "required": ["all"],
            "additionalProperties": False,
        },
    ]
}
_DLQ_REDRIVEN: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "topic": {"type": "string"},
        "redriven": {"type": "array", "items": _DLQ_MESSAGE},
    },
}
_HEALTH: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["ok", "not ready", "stuck"]},
        "worker_id": {"type": "string"},
        "roles": {"type": "array", "items": {"type": "string"}},
        "parts": {"type": "object"},
    },
}


def openapi_document(*, metrics: bool = True) -> dict[str, Any]:
    """The document: every route the ``api`` role serves, its inputs and its answers.

    ``metrics``: whether ``/metrics`` is served (``WFJOBS_METRICS``).
    """
    schemas = _Schemas()
    error_body = schemas.ref(api_pb2.ErrorBody.DESCRIPTOR)

    def message(name: str) -> dict[str, Any]:
        return schemas.ref(getattr(api_pb2, name).DESCRIPTOR)

    # A query filters by a real status; STATUS_UNSPECIFIED is only the proto's zero.
    job_status = _enum(api_pb2.Job.DESCRIPTOR.enum_types_by_name["Status"])
    job_status["enum"] = [name for name in job_status["enum"] if name != "STATUS_UNSPECIFIED"]
    paths: dict[str, Any] = {
        "/v1/workflow-runs": {
            "post": _operation(
                "submitWorkflow",
                "Submit a job: an inline definition or a stored one, with its input",
                {
                    "200": _answer(message("SubmitWorkflowResponse"), "the job id existed"),
                    "201": _answer(message("SubmitWorkflowResponse"), "the job was created"),
                },
                errors=("404", "409", "429", "503"),
                parameters=[
                    _header("traceparent", "W3C trace context: the job's spans join this trace"),
                    _header("tracestate", "W3C trace state, sent with traceparent"),
                ],
                body=_json_body(message("SubmitWorkflowRequest"), "the job"),
                scope="submit",
                needs_also="An inline `workflow` also needs the `define-inline` scope.",
            ),
            "get": _operation(
                "listJobs",
                "List jobs, newest first",
                {"200": _answer(message("ListJobsResponse"), "a page of jobs")},
                errors=("400", "503"),
                parameters=[
                    _query("status", job_status, "only jobs in this status"),
                    _query("workflow_name", _NAME, "only jobs of this workflow"),
                    _query("limit", _LIMIT, "jobs per page: 0 means 50, at most 500"),
                    _query("page_token", {"type": "string"}, "next_page_token of a page"),
                ],
                scope="read",
            ),
        },
        "/v1/workflow-runs/{job_id}": {
            "get": _operation(
                "getJob",
                "One job, whole, with its attempt history",
                {"200": _answer(message("GetJobResponse"), "the job")},
                errors=("400", "503"),
                parameters=[_path("job_id", _UUID, "the job's id")],
                scope="read",
            ),
        },
        "/v1/workflow-runs/{job_id}:explain": {
            "get": _operation(
                "explainJob",
                "Why the job is in its state, what happens next, what an operator can run",
                {"200": _answer(message("ExplainJobResponse"), "the explanation")},
                errors=("400", "503"),
                parameters=[_path("job_id", _UUID, "the job's id")],
                scope="read",
            ),
        },
        "/v1/workflow-runs/{job_id}/events": {
            "get": _operation(
                "watchJob",
                "The job's events so far, then live ones, as Server-Sent Events, until it ends",
                {
                    "200": {
                        "description": (
                            "an event stream: each event a message whose id is its event_id and "
                            "whose data is the WorkflowRunEvent as JSON; `progress` messages "
                            "carry the running step's latest progress; an `end` message "
                            "carries the job's final status and closes the stream"
                        ),
                        "content": {"text/event-stream": {"schema": {"type": "string"}}},
                    }
                },
                errors=("400", "404", "429", "503"),
                parameters=[
                    _path("job_id", _UUID, "the job's id"),
                    _query(
                        "after",
                        {"type": "integer", "minimum": 0},
                        "send only events with a greater event_id",
                    ),
                    _header(
                        "Last-Event-ID",
                        "sent by a reconnecting client: resume after this event (wins over after)",
                    ),
                ],
                scope="read",
            ),
        },
        "/v1/workflow-runs/{job_id}/steps/{step_name}:form": {
            "get": _operation(
                "stepForm",
                "The fields of an external step's response, to build a form that answers it",
                {"200": _answer(_STEP_FORM, "the step's response type and its fields")},
                errors=("400", "409", "503"),
                parameters=[
                    _path("job_id", _UUID, "the job's id"),
                    _path("step_name", {"type": "string", "minLength": 1}, "an external step"),
                ],
                scope="read",
            ),
        },
        "/v1/fleet": {
            "get": _operation(
                "fleetOverview",
                "Jobs by status, the backlog's age and, fleet-wide, the workers and the outbox",
                {"200": _answer(_FLEET, "the overview, at most a few seconds old")},
                errors=("400", "503"),
                scope="read",
            ),
        },
        "/v1/workflow-runs/{job_id}/steps/{step_name}:complete": {
            "post": _operation(
                "completeStep",
                "Answer the external step a WAITING job is parked on",
                {
                    "200": _answer(
                        message("CompleteStepResponse"), "COMPLETED, ALREADY_DONE or REJECTED"
                    )
                },
                errors=("409", "503"),
                parameters=[
                    _path("job_id", _UUID, "the job's id"),
                    _path("step_name", {"type": "string", "minLength": 1}, "the parked step"),
                ],
                body=_json_body(
                    message("CompleteStepRequest"),
                    "the step's response; job_id and step_name may be left out",
                ),
                scope="complete",
            ),
        },
        "/v1/workflow-runs/{job_id}:resume": {
            "post": _operation(
                "resumeJob",
                "Resume a FAILED, DEAD or CANCELLED job as a new run linked to it",
                {
                    "200": _answer(
                        message("ResumeJobResponse"), "this request key had resumed it already"
                    ),
                    "201": _answer(message("ResumeJobResponse"), "the new run was created"),
                },
                errors=("409", "429", "503"),
                parameters=[_path("job_id", _UUID, "the ended job's id")],
                body=_json_body(
                    message("ResumeJobRequest"),
                    "from_step, use_current_definition, request_key, max_attempts (all "
                    "optional: {} resumes with every checkpoint and the job's snapshot)",
                ),
                scope="submit",
            ),
        },
        "/v1/workflow-runs:resume": {
            "post": _operation(
                "resumeJobs",
                "Resume every ended job a filter picks that no run resumes yet",
                {"200": _answer(message("ResumeJobsResponse"), "the new runs and the refusals")},
                errors=("503",),
                body=_json_body(message("ResumeJobsRequest"), "the filter"),
                scope="submit",
            ),
        },
        "/v1/workflow-runs/{job_id}:cancel": {
            "post": _operation(
                "cancelJob",
                "Cancel a job: QUEUED or WAITING at once, RUNNING by its worker within a "
                "heartbeat; a finished job is answered as it is",
                {
                    "200": _answer(
                        message("CancelJobResponse"),
                        "CANCELLED, CANCEL_REQUESTED, ALREADY_CANCELLED or ALREADY_FINISHED",
                    )
                },
                errors=("503",),
                parameters=[_path("job_id", _UUID, "the job's id")],
                body={
                    **_json_body(message("CancelJobRequest"), 'optional: {"reason": ...}'),
                    "required": False,
                },
                scope="cancel",
            ),
        },
        "/v1/workflow-runs:cancel": {
            "post": _operation(
                "cancelJobs",
                "Cancel every live job matching all the conditions given (at least one)",
                {"200": _answer(message("CancelJobsResponse"), "the jobs cancelled or asked")},
                errors=("503",),
                body=_json_body(message("CancelJobsRequest"), "the filter and a reason"),
                scope="cancel",
            ),
        },
        "/v1/workflows": {
            "get": _operation(
                "listWorkflows",
                "List stored workflow definitions, by name",
                {"200": _answer(message("ListWorkflowsResponse"), "a page of definitions")},
                errors=("400", "503"),
                parameters=[
                    _query("limit", _LIMIT, "definitions per page: 0 means 50, at most 500"),
                    _query("page_token", {"type": "string"}, "next_page_token of a page"),
                ],
                scope="read",
            ),
        },
        "/v1/workflows/{name}": {
            "get": _operation(
                "getWorkflow",
                "One stored workflow definition; its version is the ETag",
                {"200": _versioned(_answer(message("GetWorkflowResponse"), "the definition"))},
                errors=("400", "503"),
                parameters=[_path("name", _NAME, "the workflow's name")],
                scope="read",
            ),
            "put": _operation(
                "putWorkflow",
                "Store a workflow definition under its name",
                {
                    "200": _versioned(
                        _answer(message("PutWorkflowResponse"), "the definition was replaced")
                    ),
                    "201": _versioned(
                        _answer(message("PutWorkflowResponse"), "the definition was created")
                    ),
                },
                errors=("409", "412", "503"),
                parameters=[
                    _path("name", _NAME, "the workflow's name (the definition's own)"),
                    _header("If-Match", 'store only over this version, e.g. "3"'),
                    _header("If-None-Match", "* stores only if the name is free"),
                ],
                body=_json_body(message("PutWorkflowRequest"), "the definition"),
                scope="admin",
            ),
        },
        "/v1/outbox": {
            "get": _operation(
                "listFailedEvents",
                "FAILED outbox rows (the relay's dead letters), oldest first",
                {"200": _answer(_OUTBOX_PAGE, "a page of FAILED rows")},
                errors=("400", "503"),
                parameters=[
                    _query("status", {"type": "string", "enum": ["FAILED"]}, "only FAILED"),
                    _query("job_id", _UUID, "only this job's rows"),
                    _query("limit", _LIMIT, "rows per page"),
                    _query("page_token", {"type": "string"}, "next_page_token of a page"),
                ],
                scope="admin",
            ),
        },
        "/v1/outbox:redrive": {
            "post": _operation(
                "redriveEvents",
                "FAILED outbox rows back to PENDING: by id, one job's, or all",
                {"200": _answer(_OUTBOX_REDRIVEN, "what was redriven")},
                errors=("503",),
                body=_json_body(_OUTBOX_REDRIVE, "which rows"),
                scope="admin",
            ),
        },
        "/v1/requests-dlq": {
            "get": _operation(
                "listDeadLetteredRequests",
                "Messages of the requests dead-letter topic, with reasons",
                {"200": _answer(_DLQ_LISTING, "the listing")},
                errors=("400", "503"),
                parameters=[
                    _query("max", {"type": "integer", "minimum": 1, "maximum": 1000}, "at most"),
                    _query("page_token", {"type": "string"}, "next_page_token of a page"),
                ],
                scope="admin",
                fleet=True,
            ),
        },
        "/v1/requests-dlq:redrive": {
            "post": _operation(
                "redriveRequests",
                "Dead-lettered requests back to the requests topic",
                {"200": _answer(_DLQ_REDRIVEN, "what was produced again")},
                errors=("503",),
                body=_json_body(_DLQ_REDRIVE, "which messages"),
                scope="admin",
                fleet=True,
            ),
        },
        "/healthz": {
            "get": _operation(
                "liveness",
                "503 when some part is stuck",
                {
                    "200": _answer(_HEALTH, "every part is healthy"),
                    "503": _answer(_HEALTH, "some part is stuck"),
                },
            ),
        },
        "/readyz": {
            "get": _operation(
                "readiness",
                "503 while some part is not serving yet",
                {
                    "200": _answer(_HEALTH, "every part is ready"),
                    "503": _answer(_HEALTH, "some part is not ready"),
                },
            ),
        },
        OPENAPI_PATH: {
            "get": _operation(
                "openapi",
                "This document",
                {"200": _answer({"type": "object"}, "the OpenAPI document")},
            ),
        },
    }
    if metrics:
        paths["/metrics"] = {
            "get": _operation(
                "metrics",
                "Prometheus metrics of this process and of the fleet (text format 0.0.4)",
                {
                    "200": {
                        "description": "the metrics",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            ),
        }
    responses = {
        f"E{status}": _answer(error_body, description)
        for status, description in _ERROR_DESCRIPTIONS.items()
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "workflow-jobs",
            "version": "v1",
            "description": (
                "Durable workflow jobs. Bodies are the proto3 JSON mapping of the "
                "workflowjobs.v1 messages, sent as application/json. Every error is an "
                "ErrorBody; every answer carries an X-Request-Id header."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": schemas.components,
            "responses": responses,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


def register_openapi(app: faust.App, *, metrics: bool = True) -> None:
    """Serve the document at ``OPENAPI_PATH`` (no token needed: it holds no data)."""
    document = openapi_document(metrics=metrics)

    @app.page(OPENAPI_PATH)
    class OpenApi(View):
        async def get(self, request: Request, **_: Any) -> Response:
            return self.json(document)


__all__ = ["OPENAPI_PATH", "openapi_document", "register_openapi"]
