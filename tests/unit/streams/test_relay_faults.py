"""Transient or permanent: the one decision that says whether an outbox row is dead."""

from __future__ import annotations

import httpx
import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.schema_registry.error import SchemaRegistryError
from google.protobuf.message import DecodeError

from schemas.errors import InvalidArgument, Unavailable
from streams.relay import Fault, classify_fault


@pytest.mark.parametrize(
    "code",
    [
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._QUEUE_FULL,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        # Configuration, not the record: fixed by an operator, no event lost meanwhile.
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.UNKNOWN,
    ],
)
def test_broker_faults_that_pass_are_transient(code: int) -> None:
    assert classify_fault(KafkaError(code)) is Fault.TRANSIENT
    assert classify_fault(KafkaException(KafkaError(code))) is Fault.TRANSIENT


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_MSG,
        KafkaError._VALUE_SERIALIZATION,
    ],
)
def test_faults_of_the_record_itself_are_permanent(code: int) -> None:
    assert classify_fault(KafkaError(code)) is Fault.PERMANENT
    assert classify_fault(KafkaException(KafkaError(code))) is Fault.PERMANENT


def test_a_fatal_producer_error_is_transient_because_a_new_producer_sends_again() -> None:
    fatal = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, fatal=True)
    assert classify_fault(fatal) is Fault.TRANSIENT


@pytest.mark.parametrize(
    ("status", "fault"),
    [
        # The schema, not the record: the same for every event, the deployment's to fix.
        (409, Fault.TRANSIENT),  # incompatible with the subject's history
        (422, Fault.TRANSIENT),  # not a valid schema, or a level the registry refuses
        (500, Fault.TRANSIENT),
        (503, Fault.TRANSIENT),
        (401, Fault.TRANSIENT),  # credentials: configuration, not the record
        (404, Fault.TRANSIENT),
        (-1, Fault.TRANSIENT),
    ],
)
def test_registry_answers(status: int, fault: Fault) -> None:
    assert classify_fault(SchemaRegistryError(status, status * 100, "no")) is fault


@pytest.mark.parametrize(
    "error",
    [
        httpx.ConnectError("connection refused"),
        ConnectionRefusedError(111, "refused"),
        TimeoutError(),
        Unavailable("schema registry has no id"),
        RuntimeError("something else"),
    ],
)
def test_unreachable_or_unknown_is_transient(error: BaseException) -> None:
    assert classify_fault(error) is Fault.TRANSIENT


@pytest.mark.parametrize(
    "error",
    [
        DecodeError("truncated message"),
        ValueError("not an Avro value"),
        InvalidArgument("event breaks its rules"),
    ],
)
def test_a_payload_that_cannot_be_serialized_is_permanent(error: BaseException) -> None:
    assert classify_fault(error) is Fault.PERMANENT
