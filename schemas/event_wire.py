"""The events every job writes, encoded straight in the wire format.

A job's commit points are nearly all STEP_CHECKPOINT and COMPLETED events, and
its submit writes an ACCEPTED one.
Built as messages, each one is constructed field by field, its Struct parsed
into it (``schemas.struct_wire``), its rules read back off it and then
serialized again. Here the same bytes ``encode_event(build_event(...))`` gives
are written in one pass: the fields in field-number order, the Struct from
``struct_wire`` (map keys sorted, as deterministic serialization sorts them).

Only events whose every rule is plainly met take this path; anything else
(an empty step name or verdict, an empty Struct, a value ``struct_wire``
refuses, text that is not UTF-8, an attempt past int32, a moment not in UTC
or before 1970) answers ``None``, and the caller builds the
message, which checks it and words any refusal. ``tests/unit/test_event_wire.py``
holds the bytes equal to the message path's.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any
from uuid import UUID

from schemas.struct_wire import struct_bytes, varint

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

# Tags (field number << 3 | wire type) of WorkflowRunEvent (events.proto).
_JOB_ID = b"\x12"  # 2, length-delimited
_TYPE = b"\x18"  # 3, varint
_WORKFLOW_NAME = b"\x22"  # 4
_ATTEMPT = b"\x28"  # 5, varint
_STEP_NAME = b"\x32"  # 6
_RESPONSE = b"\x3a"  # 7
_SKIPPED = b"\x40\x01"  # 8, true
_VERDICT = b"\x4a"  # 9
_RESULT = b"\x5a"  # 11
_OCCURRED_AT = b"\x62"  # 12
# Timestamp's own fields.
_SECONDS = b"\x08"
_NANOS = b"\x10"

# WorkflowRunEvent.Type values (events.proto); test_event_wire pins them.
ACCEPTED = 1
STEP_CHECKPOINT = 2
COMPLETED = 4


def _text(tag: bytes, value: str) -> bytes:
    raw = value.encode()
    return tag + varint(len(raw)) + raw


def _message(tag: bytes, raw: bytes) -> bytes:
    return tag + varint(len(raw)) + raw


def _timestamp(moment: datetime) -> bytes | None:
    if moment.tzinfo is not UTC:
        return None
    micros = (moment - _EPOCH) // _MICROSECOND
    if micros < 0:
        return None
    seconds, fraction = divmod(micros, 1_000_000)
    raw = (_seconds_field(seconds) if seconds else b"") + (
        _NANOS + varint(fraction * 1_000) if fraction else b""
    )
    return _message(_OCCURRED_AT, raw)


@lru_cache(maxsize=4)
def _seconds_field(seconds: int) -> bytes:
    # Every event of the same second shares it; a process writes them in order.
    return _SECONDS + varint(seconds)


_INT32_MAX = 2**31 - 1


def _head(job_id: UUID, event_type: int, workflow_name: str, attempt: int) -> bytes | None:
    if not workflow_name or not 0 <= attempt <= _INT32_MAX:
        return None
    job, attempt_of_job = _job_fields(job_id, workflow_name, attempt)
    return job + _TYPE + varint(event_type) + attempt_of_job


@lru_cache(maxsize=4096)
def _job_fields(job_id: UUID, workflow_name: str, attempt: int) -> tuple[bytes, bytes]:
    """The fields every event of one attempt repeats: before and after its type.

    An attempt writes an event at each of its commit points, and the job id's
    text alone costs more to make than the cache lookup; the cache holds more
    attempts than a worker runs at once.
    """
    return _text(_JOB_ID, str(job_id)), _text(_WORKFLOW_NAME, workflow_name) + (
        _ATTEMPT + varint(attempt) if attempt else b""
    )


def _struct(tag: bytes, mapping: Mapping[str, Any]) -> bytes | None:
    if not mapping:
        return None
    raw = struct_bytes(mapping)
    return None if raw is None else _message(tag, raw)


def _event(
    event_type: int,
    job_id: UUID,
    workflow_name: str,
    attempt: int,
    occurred_at: datetime,
    named: tuple[bytes, str],
    struct: tuple[bytes, Mapping[str, Any]],
    flag: bytes = b"",
) -> bytes | None:
    # Both events are the head, a required text field, a Struct, an optional
    # flag and the moment, in field-number order.
    try:
        head = _head(job_id, event_type, workflow_name, attempt)
        body = _struct(*struct)
        moment = _timestamp(occurred_at)
        tag, text = named
        if head is None or body is None or moment is None or not text:
            return None
        return head + _text(tag, text) + body + flag + moment
    except UnicodeEncodeError:
        return None


def accepted_bytes(*, job_id: UUID, workflow_name: str, occurred_at: datetime) -> bytes | None:
    """An ACCEPTED event's outbox bytes, or ``None``: build the message instead."""
    if not isinstance(job_id, UUID):
        return None
    try:
        head = _head(job_id, ACCEPTED, workflow_name, 0)
    except UnicodeEncodeError:
        return None
    moment = _timestamp(occurred_at)
    if head is None or moment is None:
        return None
    return head + moment


def step_checkpoint_bytes(
    *,
    job_id: UUID,
    workflow_name: str,
    attempt: int,
    occurred_at: datetime,
    step_name: str,
    response: Mapping[str, Any],
    skipped: bool,
) -> bytes | None:
    """A STEP_CHECKPOINT event's outbox bytes, or ``None``: build the message instead."""
    flag = _SKIPPED if skipped else b""
    named, struct = (_STEP_NAME, step_name), (_RESPONSE, response)
    return _event(STEP_CHECKPOINT, job_id, workflow_name, attempt, occurred_at, named, struct, flag)


def completed_bytes(
    *,
    job_id: UUID,
    workflow_name: str,
    attempt: int,
    occurred_at: datetime,
    verdict: str,
    result: Mapping[str, Any],
) -> bytes | None:
    """A COMPLETED event's outbox bytes, or ``None``: build the message instead."""
    named, struct = (_VERDICT, verdict), (_RESULT, result)
    return _event(COMPLETED, job_id, workflow_name, attempt, occurred_at, named, struct)


__all__ = [
    "ACCEPTED",
    "COMPLETED",
    "STEP_CHECKPOINT",
    "accepted_bytes",
    "completed_bytes",
    "step_checkpoint_bytes",
]
