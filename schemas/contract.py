"""The wire contract: message types, their CEL rules, and event encoding."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import protovalidate
from google.protobuf import json_format, timestamp_pb2
from google.protobuf.message import Message

from schemas.errors import ContractViolation, EventTooLarge, InvalidArgument
from schemas.gen.workflowjobs.v1 import api_pb2, events_pb2, requests_pb2
from schemas.struct_wire import fill_struct, set_timestamp

WorkflowRunEvent = events_pb2.WorkflowRunEvent
WorkflowRunRequest = requests_pb2.WorkflowRunRequest
StepCompletion = requests_pb2.StepCompletion
StepCompletionResult = requests_pb2.StepCompletionResult
EventType = events_pb2.WorkflowRunEvent.Type

_validator = protovalidate.Validator()


_STRUCT = "google.protobuf.Struct"


def _as_the_rules_read_it(message: Message) -> Message:
    """``message`` with each Struct field of its own still set, but empty.

    No rule of the contract reads into a Struct, only whether one is set
    (tests/unit/test_contract.py holds that). protovalidate walks a message
    whole, in native code that holds the interpreter lock: half a second for
    a Struct of 130 000 values, in which no other thread, the event loop's
    included, would run.
    """
    structs = [
        field.name
        for field, _ in message.ListFields()
        if field.message_type is not None
        and field.message_type.full_name == _STRUCT
        and not field.is_repeated
    ]
    if not structs:
        return message
    shown = type(message)()
    shown.CopyFrom(message)
    for name in structs:
        shown.ClearField(name)
        getattr(shown, name).SetInParent()
    return shown


def violations(message: Message) -> list[str]:
    """Every CEL/protovalidate violation of ``message`` as ``field: message`` lines."""
    found = []
    for violation in _validator.collect_violations(_as_the_rules_read_it(message)):
        field = violation.proto.field
        elements = field.elements if field is not None else []
        path = ".".join(element.field_name for element in elements if element.field_name)
        found.append(f"{path}: {violation.proto.message}" if path else violation.proto.message)
    return found


def check_outgoing(message: Message) -> None:
    """Refuse to publish or store a message that breaks its rules: that is our bug."""
    problems = violations(message)
    if problems:
        name = message.DESCRIPTOR.full_name
        raise ContractViolation(f"{name} breaks its contract: {'; '.join(problems)}")


def check_incoming(message: Message) -> None:
    """Refuse a caller's message that breaks its rules: that is the caller's mistake."""
    problems = violations(message)
    if problems:
        raise InvalidArgument("; ".join(problems))


# The textual form protovalidate's `string.uuid` accepts. uuid.UUID() alone is far
# looser (braces, "urn:uuid:", hyphens anywhere or none), so an id refused on the
# wire would otherwise be accepted by the verbs.
_UUID_TEXT = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")


def parse_job_id(value: str | uuid.UUID) -> uuid.UUID:
    """A job id is a UUID in its 8-4-4-4-12 form; anything else is refused with the value."""
    if isinstance(value, uuid.UUID):
        return value
    if not isinstance(value, str) or not _UUID_TEXT.fullmatch(value):
        raise InvalidArgument(f"job_id must be a UUID, got {value!r}")
    return uuid.UUID(value)


def build_event(
    *,
    job_id: uuid.UUID | str,
    event_type: int,
    workflow_name: str,
    attempt: int,
    occurred_at: datetime,
    step_name: str = "",
    response: Mapping[str, Any] | None = None,
    skipped: bool = False,
    verdict: str = "",
    error: str = "",
    result: Mapping[str, Any] | None = None,
    next_run_at: datetime | None = None,
    resumed_from: uuid.UUID | str = "",
    resumed_by: uuid.UUID | str = "",
    review_request: Mapping[str, Any] | None = None,
    deadline: str = "",
    reason: str = "",
) -> WorkflowRunEvent:
    """Build a lifecycle event (without ``event_id``) and check its rules."""
    event = WorkflowRunEvent(
        job_id=str(job_id),
        type=event_type,  # type: ignore[arg-type]
        workflow_name=workflow_name,
        attempt=attempt,
        step_name=step_name,
        skipped=skipped,
        verdict=verdict,
        error=error,
        resumed_from=str(resumed_from),
        resumed_by=str(resumed_by),
        deadline=deadline,
        reason=reason,
    )
    if response is not None:
        fill_struct(event.response, response)
    if result is not None:
        fill_struct(event.result, result)
    if review_request is not None:
        fill_struct(event.review_request, review_request)
    if next_run_at is not None:
        set_timestamp(event.next_run_at, next_run_at)
    set_timestamp(event.occurred_at, occurred_at)
    # Every commit point builds one of these, so the rules are first checked by
    # a plain-Python mirror of them; only an event the mirror doubts goes to
    # protovalidate, which then decides (and words the refusal).
    if not event_obeys_rules(event):
        check_outgoing(event)
    return event


# The rules of WorkflowRunEvent as declared in events.proto, in plain Python.
# protovalidate stays the authority: this mirror may only answer True for an
# event protovalidate accepts. tests/unit/test_contract.py proves it answers
# exactly as protovalidate does over every event type and every rule, and pins
# the declared rules, so editing them in the .proto fails until this follows.
_DEFINED_EVENT_TYPES = frozenset(
    value.number for value in WorkflowRunEvent.DESCRIPTOR.enum_types_by_name["Type"].values
) - {EventType.TYPE_UNSPECIFIED}
_NEEDS_STEP_NAME = frozenset({EventType.TYPE_STEP_CHECKPOINT, EventType.TYPE_WAITING})
_NEEDS_ERROR = frozenset({EventType.TYPE_FAILED, EventType.TYPE_DEAD})
# Read once: each attribute of the enum wrapper is a Python-level lookup.
_COMPLETED = EventType.TYPE_COMPLETED
_RETRY_SCHEDULED = EventType.TYPE_RETRY_SCHEDULED
_RESUMED = EventType.TYPE_RESUMED


def event_obeys_rules(event: WorkflowRunEvent) -> bool:
    """True when ``event`` meets every rule protovalidate would check on it."""
    kind = event.type
    return (
        kind in _DEFINED_EVENT_TYPES
        and _UUID_TEXT.fullmatch(event.job_id) is not None
        and event.workflow_name != ""
        and event.attempt >= 0
        and event.HasField("occurred_at")
        and (kind != _COMPLETED or event.verdict != "")
        and (kind not in _NEEDS_ERROR or event.error != "")
        and (kind not in _NEEDS_STEP_NAME or event.step_name != "")
        and (kind != _RETRY_SCHEDULED or (event.error != "" and event.HasField("next_run_at")))
        and (kind != _RESUMED or event.resumed_by != "")
    )


def encode_event(event: WorkflowRunEvent) -> bytes:
    """The bytes stored in the outbox row; the relay adds ``event_id`` and framing."""
    return event.SerializeToString(deterministic=True)


# The largest encoded event a commit point may write. Kafka brokers accept about
# 1 MiB per message by default, and librdkafka's producer refuses a message
# whose key, value and record overhead pass 1 000 000 bytes; the relay adds the
# event id and the registry framing (a few dozen bytes with the key). An event
# past the limit would sit in the outbox as a FAILED row, so it is refused
# before it is committed.
DEFAULT_MAX_EVENT_BYTES = 990_000
# Below this a FAILED event with a useful error could not fit.
MIN_EVENT_BYTES = 16_384


def refuse_oversize(size: int, max_bytes: int, what: str, detail: str = "") -> None:
    """``EventTooLarge`` naming ``what``, its size and the limit, when ``size`` is above it."""
    if size > max_bytes:
        raise EventTooLarge(
            f"{what} would be {size:,} bytes, above the event size limit of {max_bytes:,} "
            f"bytes (WFJOBS_MAX_EVENT_BYTES){detail}"
        )


def encode_event_within(event: WorkflowRunEvent, max_bytes: int) -> bytes:
    """``encode_event``, refused with ``EventTooLarge`` when the bytes exceed ``max_bytes``."""
    payload = encode_event(event)
    if len(payload) > max_bytes:
        kind = EventType.Name(event.type).removeprefix("TYPE_")
        step = f" of step {event.step_name!r}" if event.step_name else ""
        refuse_oversize(
            len(payload),
            max_bytes,
            f"the {kind} event{step} of job {event.job_id}",
            _largest_field(event),
        )
    return payload


def _largest_field(event: WorkflowRunEvent) -> str:
    # Says which part to shrink: nearly always the response or the result.
    largest, largest_size = "", 0
    for field, value in event.ListFields():
        if isinstance(value, Message):
            size = value.ByteSize()
        elif isinstance(value, str):
            size = len(value.encode())
        else:
            continue
        if size > largest_size:
            largest, largest_size = field.name, size
    return f"; its {largest} alone is {largest_size:,} bytes" if largest else ""


def with_event_id(payload: bytes, event_id: int) -> bytes:
    """Set ``event_id`` (field 1) on an encoded event without decoding it.

    Protobuf parsers take the last occurrence of a scalar field, so appending the
    field to the stored bytes is equivalent to re-encoding with the id set. This is
    what lets the outbox store an event before the row id exists.
    """
    return payload + b"\x08" + _varint(event_id)


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def decode_event(payload: bytes) -> WorkflowRunEvent:
    event = WorkflowRunEvent()
    event.ParseFromString(payload)
    return event


def to_json(message: Message) -> dict[str, Any]:
    """proto3 JSON mapping, field names as in the .proto (snake_case)."""
    result: dict[str, Any] = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=False
    )
    return result


def from_json(data: Mapping[str, Any], message: Message) -> Message:
    """Parse a proto3 JSON object into ``message``; unknown fields are refused."""
    try:
        json_format.ParseDict(dict(data), message, ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        raise InvalidArgument(f"{message.DESCRIPTOR.name}: {exc}") from None
    return message


def integral_numbers(value: Any) -> Any:
    """``value`` with every whole float below 2**53 (exact in a double) as an int.

    ``Struct`` keeps every JSON number as a double; without this a token id
    17058 would read 17058.0 wherever a ``Struct`` is shown as JSON.
    """
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {key: integral_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [integral_numbers(item) for item in value]
    return value


def timestamp_json(moment: datetime) -> str:
    """``moment`` as every answer writes one: the proto3 JSON of a ``Timestamp``
    (RFC 3339 in UTC, with a ``Z``), so the fields no message carries read like
    those that one does."""
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(moment)
    return stamp.ToJsonString()


__all__ = [
    "DEFAULT_MAX_EVENT_BYTES",
    "MIN_EVENT_BYTES",
    "EventType",
    "StepCompletion",
    "StepCompletionResult",
    "WorkflowRunEvent",
    "WorkflowRunRequest",
    "api_pb2",
    "build_event",
    "check_incoming",
    "check_outgoing",
    "decode_event",
    "encode_event",
    "encode_event_within",
    "event_obeys_rules",
    "events_pb2",
    "from_json",
    "integral_numbers",
    "parse_job_id",
    "refuse_oversize",
    "requests_pb2",
    "timestamp_json",
    "to_json",
    "violations",
    "with_event_id",
]
