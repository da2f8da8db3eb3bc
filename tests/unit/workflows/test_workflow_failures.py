"""The failure taxonomy, one exception at a time."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest

from schemas.errors import InvalidArgument
from workflows import (
    DefinitionError,
    FailureKind,
    NonRetryableError,
    RetryableError,
    SegmentDeadlineExceeded,
    StepFailure,
    classify,
)
from workflows.failures import transport_failure


def _rpc_error(code: grpc.StatusCode, details: str = "it broke") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


# Written out rather than imported, so the table in failures.py is checked, not echoed.
TRANSIENT = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


@pytest.mark.parametrize(
    "code", [code for code in grpc.StatusCode if code is not grpc.StatusCode.OK], ids=str
)
def test_only_transient_grpc_statuses_are_retryable(code: grpc.StatusCode) -> None:
    failure = classify(_rpc_error(code), "embed")
    expected = FailureKind.RETRYABLE if code in TRANSIENT else FailureKind.NON_RETRYABLE
    assert failure.kind is expected
    assert failure.retryable is (code in TRANSIENT)
    assert failure.message == f"gRPC {code.name}: it broke"


@pytest.mark.parametrize(
    ("details", "kind", "said"),
    [
        ("server overloaded", FailureKind.RETRYABLE, "the target is out of capacity"),
        (
            "SERVER: Received message larger than max (5242880 vs. 4194304)",
            FailureKind.NON_RETRYABLE,
            "the request is larger than the target accepts",
        ),
        (
            "Stream removed (CLIENT: Received message larger than max (6291461 vs. 4194304))",
            FailureKind.NON_RETRYABLE,
            "the answer is larger than gRPC accepts here",
        ),
    ],
)
def test_a_message_over_grpcs_size_limit_is_no_shortage(
    details: str, kind: FailureKind, said: str
) -> None:
    failure = transport_failure(
        _rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, details), "embed", "svc:50051"
    )
    assert failure.kind is kind
    assert failure.message == f"gRPC RESOURCE_EXHAUSTED from svc:50051: {said}"


def test_a_handlers_own_call_over_grpcs_size_limit_is_no_shortage_either() -> None:
    details = "Stream removed (CLIENT: Received message larger than max (6291461 vs. 4194304))"
    failure = classify(_rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, details), "embed")
    assert failure.kind is FailureKind.NON_RETRYABLE
    assert failure.message == f"gRPC RESOURCE_EXHAUSTED: {details}"


def test_handler_errors_say_what_they_are() -> None:
    assert classify(RetryableError("quota"), "s").kind is FailureKind.RETRYABLE
    assert classify(NonRetryableError("bad"), "s").kind is FailureKind.NON_RETRYABLE
    crash = classify(ZeroDivisionError("division by zero"), "s")
    assert crash.kind is FailureKind.NON_RETRYABLE
    assert crash.message == "ZeroDivisionError: division by zero"


def test_the_segment_deadline_is_retryable() -> None:
    failure = classify(SegmentDeadlineExceeded("ran past 100 ms"), "tokenize")
    assert failure.kind is FailureKind.RETRYABLE
    assert str(failure) == "step 'tokenize': ran past 100 ms"


def test_definition_and_argument_defects_are_not_retryable() -> None:
    assert classify(DefinitionError("broken"), "s").kind is FailureKind.NON_RETRYABLE
    assert classify(InvalidArgument("broken"), "s").message == "broken"


def test_a_step_failure_passes_through() -> None:
    failure = StepFailure(FailureKind.VERDICT, "review", "no", violations=["a is false"])
    assert classify(failure, "other") is failure
    assert failure.violations == ("a is false",)
    assert "VERDICT" in repr(failure)


def test_an_empty_message_still_says_something() -> None:
    assert classify(RetryableError(), "s").message == "RetryableError"


def test_a_failure_outside_any_step_has_no_prefix() -> None:
    failure = StepFailure(FailureKind.NON_RETRYABLE, "", "output rule failed")
    assert str(failure) == "output rule failed"
