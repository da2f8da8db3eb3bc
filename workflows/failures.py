"""The failure taxonomy. Every way a step can fail is sorted here, and only here.

Three kinds, and what the service does with each:

* ``RETRYABLE`` - the same step may succeed later: gRPC ``UNAVAILABLE``,
  ``DEADLINE_EXCEEDED`` or ``RESOURCE_EXHAUSTED``; a segment that ran past its
  ``deadlineMs``; a remote call cut off by its channel closing; a handler
  raising :class:`RetryableError`. The job is requeued with backoff until its
  attempts run out.
* ``VERDICT`` - a step's response broke its ``validate`` rules. That is the
  workflow's answer, not an error: the job fails with the violations recorded.
* ``NON_RETRYABLE`` - retrying cannot help: a mapping rule that cannot be
  evaluated, a checkpoint that no longer matches the definition, any other gRPC
  status (and a ``RESOURCE_EXHAUSTED`` for a message over gRPC's size limit), a
  handler raising anything else. The job fails, loudly.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterable, Mapping
from typing import Any

import grpc

from schemas.errors import WorkflowJobsError


class FailureKind(enum.Enum):
    RETRYABLE = "retryable"
    VERDICT = "verdict"
    NON_RETRYABLE = "non_retryable"


class RetryableError(Exception):
    """Raise from a handler when the same call may succeed later (a dependency is down)."""


class NonRetryableError(Exception):
    """Raise from a handler to fail the job at once; the message is recorded verbatim."""


class SegmentDeadlineExceeded(Exception):
    """A segment ran past the workflow's ``deadlineMs``."""


RETRYABLE_GRPC_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)


class StepFailure(Exception):
    """A step failed, already classified.

    ``message`` is the underlying error verbatim; ``str(failure)`` prefixes the
    step name and is what belongs in the job row's ``error`` column. A verdict
    carries its ``violations`` and, when a step answered, the rejected
    ``response`` (proto3 JSON) so the record shows what was refused.
    """

    def __init__(
        self,
        kind: FailureKind,
        step_name: str,
        message: str,
        *,
        violations: Iterable[str] = (),
        response: Mapping[str, Any] | None = None,
    ) -> None:
        self.kind = kind
        self.step_name = step_name
        self.message = message
        self.violations = tuple(violations)
        self.response = dict(response) if response is not None else None
        super().__init__(self.describe())

    @property
    def retryable(self) -> bool:
        return self.kind is FailureKind.RETRYABLE

    def describe(self) -> str:
        return f"step {self.step_name!r}: {self.message}" if self.step_name else self.message

    def __str__(self) -> str:
        return self.describe()

    def __repr__(self) -> str:
        return f"StepFailure({self.kind.name}, {self.step_name!r}, {self.message!r})"


def _text(exc: BaseException) -> str:
    text = str(exc)
    return text if text else type(exc).__name__


def classify(exc: BaseException, step_name: str) -> StepFailure:
    """Sort any exception raised while running ``step_name`` into the taxonomy."""
    if isinstance(exc, StepFailure):
        return exc
    if isinstance(exc, RetryableError):
        return StepFailure(FailureKind.RETRYABLE, step_name, _text(exc))
    if isinstance(exc, NonRetryableError):
        return StepFailure(FailureKind.NON_RETRYABLE, step_name, _text(exc))
    if isinstance(exc, SegmentDeadlineExceeded):
        return StepFailure(FailureKind.RETRYABLE, step_name, _text(exc))
    if isinstance(exc, grpc.RpcError):
        code = _grpc_code(exc)
        details = _grpc_details(exc)
        name = code.name if code is not None else "UNKNOWN"
        return StepFailure(_grpc_kind(code, details), step_name, f"gRPC {name}: {details}")
    if isinstance(exc, asyncio.CancelledError):
        # Only ever passed here when nothing cancelled the step: its own defect.
        return StepFailure(
            FailureKind.NON_RETRYABLE,
            step_name,
            "CancelledError: the step was cancelled from within, though nothing cancelled it",
        )
    if isinstance(exc, WorkflowJobsError):
        # Definition, input and mapping defects are deterministic: retrying repeats them.
        return StepFailure(FailureKind.NON_RETRYABLE, step_name, exc.message)
    return StepFailure(FailureKind.NON_RETRYABLE, step_name, f"{type(exc).__name__}: {exc}")


# What a job records when a remote step's call fails: the status and one of
# these, never the transport's own text, which echoes what the peer sent and
# would tell a definition's author what listens where.
_TRANSPORT_MESSAGES = {
    grpc.StatusCode.CANCELLED: "the call was cancelled",
    grpc.StatusCode.UNKNOWN: "the target failed the call",
    grpc.StatusCode.INVALID_ARGUMENT: "the target refused the request as invalid",
    grpc.StatusCode.DEADLINE_EXCEEDED: "the target did not answer within the deadline",
    grpc.StatusCode.NOT_FOUND: "the target reported something not found",
    grpc.StatusCode.ALREADY_EXISTS: "the target reported something already existing",
    grpc.StatusCode.PERMISSION_DENIED: "the target denied permission",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "the target is out of capacity",
    grpc.StatusCode.FAILED_PRECONDITION: "the target refused the call in its current state",
    grpc.StatusCode.ABORTED: "the target aborted the call",
    grpc.StatusCode.OUT_OF_RANGE: "the target reported a value out of range",
    grpc.StatusCode.UNIMPLEMENTED: "the target does not implement the method",
    grpc.StatusCode.INTERNAL: "the call failed inside the target or the transport",
    grpc.StatusCode.UNAVAILABLE: "the target could not be reached or is not serving",
    grpc.StatusCode.DATA_LOSS: "the target reported data loss",
    grpc.StatusCode.UNAUTHENTICATED: "the target did not accept the caller's credentials",
}


# gRPC refuses a message over its size limit with RESOURCE_EXHAUSTED too, on
# whichever side receives it (grpc core's words, "CLIENT: ..." here, "SERVER:
# ..." from the target). That is no shortage: the same call is refused again.
_OVERSIZE = "Received message larger than max"


def _grpc_kind(code: grpc.StatusCode | None, details: str) -> FailureKind:
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and _OVERSIZE in details:
        return FailureKind.NON_RETRYABLE
    return FailureKind.RETRYABLE if code in RETRYABLE_GRPC_CODES else FailureKind.NON_RETRYABLE


def transport_failure(exc: grpc.RpcError, step_name: str, target: str) -> StepFailure:
    """A remote call's failure, classified: its status code and a fixed short message."""
    code = _grpc_code(exc)
    name = code.name if code is not None else "UNKNOWN"
    details = _grpc_details(exc)
    kind = _grpc_kind(code, details)
    message = _TRANSPORT_MESSAGES.get(code, "the call failed") if code is not None else ""
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and kind is FailureKind.NON_RETRYABLE:
        message = (
            "the request is larger than the target accepts"
            if "SERVER:" in details
            else "the answer is larger than gRPC accepts here"
        )
    return StepFailure(
        kind, step_name, f"gRPC {name} from {target}: {message or 'the call failed'}"
    )


def channel_closed_failure(step_name: str, target: str) -> StepFailure:
    """A remote call cut off because its channel was closed under it: retryable,
    as the same call on a fresh channel may well succeed."""
    return StepFailure(
        FailureKind.RETRYABLE,
        step_name,
        f"gRPC CANCELLED from {target}: the call was cut off when its channel closed",
    )


def _grpc_code(exc: grpc.RpcError) -> grpc.StatusCode | None:
    code = getattr(exc, "code", None)
    if not callable(code):
        return None
    value = code()
    return value if isinstance(value, grpc.StatusCode) else None


def _grpc_details(exc: grpc.RpcError) -> str:
    details = getattr(exc, "details", None)
    if callable(details):
        text = details()
        if text:
            return str(text)
    return "(no details)"


__all__ = [
    "RETRYABLE_GRPC_CODES",
    "FailureKind",
    "NonRetryableError",
    "RetryableError",
    "SegmentDeadlineExceeded",
    "StepFailure",
    "channel_closed_failure",
    "classify",
    "transport_failure",
]
