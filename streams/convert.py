"""Store rows to the proto messages the verbs answer with, and back to JSON.

The HTTP bodies are the proto3 JSON mapping of ``schemas/`` messages, so every
answer goes row -> message -> ``schemas.contract.to_json``; nothing hand-builds
a JSON shape that could drift from the ``.proto``.

The other way, a caller's ``Struct`` (HTTP or the topics) becomes the JSON a
job stores, and what ``jsonb`` cannot hold (a number that is not finite, text
with U+0000) is refused here, named by its path, for every transport alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format
from google.protobuf.message import Message
from google.protobuf.struct_pb2 import ListValue, Struct
from google.protobuf.timestamp_pb2 import Timestamp

from schemas.contract import api_pb2, integral_numbers, timestamp_json, to_json
from schemas.errors import InvalidArgument

if TYPE_CHECKING:
    # Types only: converting rows needs their shapes, not the store's driver.
    from store.definitions import StoredDefinition
    from store.records import Attempt, Job, JobSummary

JobMessage = api_pb2.Job

# The row's status column holds the enum's names; anything else is a bug upstream.
_STATUS_VALUES: Mapping[str, int] = {
    name: number for name, number in JobMessage.Status.items() if name != "STATUS_UNSPECIFIED"
}


def status_value(status: str) -> int:
    try:
        return _STATUS_VALUES[status]
    except KeyError:
        raise ValueError(f"unknown job status {status!r} in the store") from None


def _set_struct(target: Struct, value: Mapping[str, Any] | None) -> None:
    if value:
        target.update(dict(value))


def _set_time(target: Timestamp, value: datetime | None) -> None:
    if value is not None:
        target.FromDatetime(value)


def job_summary_message(job: Job | JobSummary) -> api_pb2.Job:
    """The ``Job`` view list-jobs answers with: its state and links, none of its payloads."""
    message = JobMessage(
        job_id=str(job.job_id),
        workflow_name=job.workflow_name,
        status=status_value(job.status),  # type: ignore[arg-type]
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        outstanding_step=job.outstanding_step or "",
        verdict=job.verdict or "",
        error=job.error or "",
        lease_owner=job.lease_owner or "",
        owner=job.owner or "",
    )
    _set_time(message.run_after, job.run_after)
    _set_time(message.lease_until, job.lease_until)
    _set_time(message.created_at, job.created_at)
    _set_time(message.updated_at, job.updated_at)
    message.resumed_from = str(job.resumed_from or "")
    message.resumed_by = str(job.resumed_by or "")
    _set_time(message.deadline, job.deadline_at)
    _set_time(message.step_deadline, job.step_deadline_at)
    _set_time(message.cancel_requested_at, job.cancel_requested_at)
    return message


def attempt_message(attempt: Attempt) -> api_pb2.Attempt:
    """One history row as the ``Attempt`` message."""
    message = api_pb2.Attempt(
        attempt=attempt.attempt,
        worker=attempt.worker or "",
        outcome=api_pb2.Attempt.Outcome.Value(attempt.outcome),  # type: ignore[arg-type]
        steps=attempt.steps,
        error=attempt.error or "",
        error_class=attempt.error_class or "",
    )
    _set_time(message.claimed_at, attempt.claimed_at)
    _set_time(message.ended_at, attempt.ended_at)
    _set_time(message.next_run_at, attempt.next_run_at)
    return message


def job_message(job: Job, history: Sequence[Attempt] = ()) -> api_pb2.Job:
    """The read-only ``Job`` view of one ``workflow_run`` row, payloads included,
    with ``history`` (its attempts, oldest first) where the caller read it."""
    message = job_summary_message(job)
    message.history.extend(attempt_message(attempt) for attempt in history)
    for entry in job.checkpoints:
        checkpoint = message.checkpoints.add(
            name=str(entry.get("name", "")), skipped=bool(entry.get("skipped", False))
        )
        response = entry.get("response")
        if isinstance(response, Mapping):
            # An empty response still marks the field present, so a reader can
            # tell "the step answered {}" from "no response recorded".
            checkpoint.response.SetInParent()
            _set_struct(checkpoint.response, response)
    if job.input is not None:
        message.input.SetInParent()
        _set_struct(message.input, job.input)
    if job.result is not None:
        message.result.SetInParent()
        _set_struct(message.result, job.result)
    if job.review_request is not None:
        message.review_request.SetInParent()
        _set_struct(message.review_request, job.review_request)
    return message


def stored_workflow_message(stored: StoredDefinition) -> api_pb2.StoredWorkflow:
    message = api_pb2.StoredWorkflow(name=stored.name, version=stored.version)
    message.definition.SetInParent()
    _set_struct(message.definition, stored.definition)
    _set_time(message.created_at, stored.created_at)
    _set_time(message.updated_at, stored.updated_at)
    return message


def struct_to_dict(value: Struct, field: str) -> dict[str, Any]:
    """A caller's ``Struct`` (its ``field``) as plain JSON values.

    ``Struct`` keeps every number as a double; JSON does not tell 3 from 3.0, so
    integral values come back as ints and an int64 field of the input type never
    sees "3.0". A double that is NaN or infinite has no JSON form and no column
    could store it: that is the caller's mistake, refused naming where it is.
    """
    try:
        plain = json_format.MessageToDict(value)
    except ValueError:
        where = _non_finite_number(value, field)
        if where is None:
            raise
        raise InvalidArgument(
            f"{_cut(where)} is not a finite number: JSON has no NaN or Infinity,"
            " and a number must fit a double"
        ) from None
    result: dict[str, Any] = integral_numbers(plain)
    return result


def _non_finite_number(value: Struct | ListValue, path: str) -> str | None:
    """The path of the first NaN or infinite number in ``value``, or None."""
    items = (
        ((f"{path}.{key}", item) for key, item in value.fields.items())
        if isinstance(value, Struct)
        else ((f"{path}[{index}]", item) for index, item in enumerate(value.values))
    )
    for where, item in items:
        kind = item.WhichOneof("kind")
        if kind == "number_value" and not math.isfinite(item.number_value):
            return where
        nested = (
            item.struct_value
            if kind == "struct_value"
            else item.list_value
            if kind == "list_value"
            else None
        )
        found = None if nested is None else _non_finite_number(nested, where)
        if found is not None:
            return found
    return None


_NUL = "\x00"


def nul_field(value: Any, path: str = "") -> str | None:
    """Where in a JSON value a string or key holds U+0000, which ``jsonb`` cannot store."""
    if isinstance(value, str):
        return (path or "the body") if _NUL in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            if _NUL in key:
                return f"a field name in {path or 'the body'}"
            found = nul_field(item, f"{path}.{key}" if path else key)
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = nul_field(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


def _cut(where: str) -> str:
    """A path through the caller's field names, cut short: a refusal becomes a
    dead letter's header or an answer's message, which must not grow with them."""
    return where[:200] + "..." if len(where) > 200 else where


def nul_refusal(where: str) -> InvalidArgument:
    return InvalidArgument(f"{_cut(where)} contains U+0000 (NUL), which is not accepted")


def storable_json(value: Struct, field: str) -> dict[str, Any]:
    """``struct_to_dict``, with text holding U+0000 refused too: for the topics,
    whose messages no ``load_json`` has checked as it checks every HTTP body."""
    result = struct_to_dict(value, field)
    where = nul_field(result, field)
    if where is not None:
        raise nul_refusal(where)
    return result


def message_json(message: Message) -> dict[str, Any]:
    """proto3 JSON of ``message``, with ``Struct`` numbers that are integral as ints.

    Checkpoints, inputs and results travel as ``Struct``, whose numbers are all
    doubles; without this a token id 17058 would read 17058.0 in every answer.
    """
    result: dict[str, Any] = integral_numbers(to_json(message))
    return result


# The answers that list things. proto3 JSON leaves a field at its default out,
# so an empty page would read ``{}``: a caller reading ``body["jobs"]`` would
# fail on exactly the answer that has none. Their own fields are always sent.
LISTINGS: tuple[type[Message], ...] = (
    api_pb2.ListJobsResponse,
    api_pb2.ListWorkflowsResponse,
    api_pb2.CancelJobsResponse,
    api_pb2.ResumeJobsResponse,
)


def listing_json(message: Message) -> dict[str, Any]:
    """``message_json`` of a ``LISTINGS`` answer, an empty list as ``[]``, no token as ``""``."""
    assert isinstance(message, LISTINGS), type(message)
    defaults: dict[str, Any] = json_format.MessageToDict(
        type(message)(), preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return {**defaults, **message_json(message)}


__all__ = [
    "LISTINGS",
    "attempt_message",
    "job_message",
    "job_summary_message",
    "listing_json",
    "message_json",
    "nul_field",
    "nul_refusal",
    "status_value",
    "storable_json",
    "stored_workflow_message",
    "struct_to_dict",
    "timestamp_json",
]
