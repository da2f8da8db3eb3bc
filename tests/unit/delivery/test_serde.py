"""The wire formats interoperate with confluent-kafka's own serializers.

Every registry here is confluent's in-library ``mock://`` registry.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
import uuid
from datetime import UTC, datetime

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, json_format
from google.protobuf.message import Message

from schemas import defaults
from schemas.consumer import consumer_file, consumer_message_class
from schemas.contract import (
    EventType,
    StepCompletion,
    WorkflowRunEvent,
    WorkflowRunRequest,
    build_event,
    encode_event,
    with_event_id,
)
from schemas.errors import InvalidArgument, Unavailable
from schemas.serde import (
    REGISTRY_TIMEOUT_S,
    AvroEventSerializer,
    EventDecoder,
    MessageDecoder,
    PlainProtobufSerializer,
    ProtobufFramer,
    RequestDecoder,
    UndecodableMessage,
    avro_record_to_event,
    avro_schema_text,
    encode_message,
    encode_request,
    event_serializer,
    event_to_avro_record,
    framed_schema_id,
    open_registry,
)

TOPIC = "workflow-run-events"
CTX = SerializationContext(TOPIC, MessageField.VALUE)


def mock_registry() -> SchemaRegistryClient:
    return SchemaRegistryClient.new_client({"url": f"mock://{uuid.uuid4().hex}"})


def checkpoint_event() -> WorkflowRunEvent:
    return build_event(
        job_id=uuid.uuid4(),
        event_type=EventType.Value("TYPE_STEP_CHECKPOINT"),
        workflow_name="embed-text",
        attempt=2,
        occurred_at=datetime(2025, 3, 4, 5, 6, 7, 891011, tzinfo=UTC),
        step_name="tokenize",
        response={"ids": [4811, 9902], "nested": {"ok": True}},
    )


def completed_event() -> WorkflowRunEvent:
    return build_event(
        job_id=uuid.uuid4(),
        event_type=EventType.Value("TYPE_COMPLETED"),
        workflow_name="embed-text",
        attempt=1,
        occurred_at=datetime.now(UTC).replace(microsecond=123456),
        verdict="approved",
        result={"vector": [0.5, 0.25]},
    )


def stored_and_published(event: WorkflowRunEvent, event_id: int) -> tuple[bytes, WorkflowRunEvent]:
    """The relay's input (stored bytes plus id) and the event a consumer must see."""
    expected = WorkflowRunEvent()
    expected.CopyFrom(event)
    expected.event_id = event_id
    return with_event_id(encode_event(event), event_id), expected


def test_protobuf_framing_is_what_confluent_deserializers_read() -> None:
    registry = mock_registry()
    serializer = event_serializer(registry=registry, topic=TOPIC)
    serializer.prepare()
    stored, expected = stored_and_published(checkpoint_event(), 7)

    value = serializer.serialize(stored)

    assert value[0] == 0
    assert value[5] == 0, "first message of the file: a single zero index byte"
    assert value[6:] == stored
    subject_id = registry.get_latest_version(f"{TOPIC}-value").schema_id
    assert framed_schema_id(value) == subject_id
    # confluent's deserializer, as a consumer would configure it: defaults, and
    # with nothing but the registry URL's client.
    assert ProtobufDeserializer(WorkflowRunEvent, None, registry)(value, CTX) == expected
    assert ProtobufDeserializer(WorkflowRunEvent, None)(value, CTX) == expected
    assert EventDecoder(registry).decode(value) == expected


@pytest.mark.parametrize(
    ("message_type", "topic"),
    [(WorkflowRunEvent, TOPIC), (WorkflowRunRequest, "workflow-run-requests")],
)
def test_the_registered_schema_is_the_consumer_facing_one(
    message_type: type[Message], topic: str
) -> None:
    registry = mock_registry()
    ProtobufFramer(message_type, registry, topic).prepare()

    registered = registry.get_latest_version(f"{topic}-value")
    assert registered.schema.schema_type == "PROTOBUF"
    assert registered.schema.references == []
    assert registry.get_subjects() == [f"{topic}-value"]
    file = descriptor_pb2.FileDescriptorProto.FromString(
        base64.b64decode(registered.schema.schema_str)
    )
    assert file == consumer_file(message_type.DESCRIPTOR.file)
    assert all(name.startswith("google/protobuf/") for name in file.dependency)
    assert b"buf.validate" not in file.SerializeToString()
    assert "validate" not in str(file)


def test_consumer_classes_encode_exactly_like_ours() -> None:
    event = checkpoint_event()
    event.event_id = 42
    theirs = consumer_message_class(WorkflowRunEvent).FromString(encode_event(event))
    assert theirs.SerializeToString(deterministic=True) == event.SerializeToString(
        deterministic=True
    )
    assert json_format.MessageToDict(theirs) == json_format.MessageToDict(event)


def test_schema_id_is_looked_up_once() -> None:
    registry = mock_registry()
    framer = ProtobufFramer(WorkflowRunEvent, registry, TOPIC)
    framer.prepare()
    header = framer.header
    framer.prepare()
    assert framer.header is header
    assert framer.serialize(b"x") == header + b"x"


def test_bytes_from_confluent_serializer_decode_here() -> None:
    registry = mock_registry()
    event = completed_event()
    event.event_id = 99
    value = ProtobufSerializer(WorkflowRunEvent, registry)(event, CTX)
    assert EventDecoder(registry).decode(value) == event
    assert EventDecoder().decode(value) == event


def test_without_registry_events_are_plain_protobuf() -> None:
    serializer = event_serializer(registry=None, topic=TOPIC)
    assert isinstance(serializer, PlainProtobufSerializer)
    stored, expected = stored_and_published(checkpoint_event(), 3)
    assert serializer.serialize(stored) == stored
    assert EventDecoder().decode(stored) == expected


def test_avro_round_trip_through_confluent_avro_serde() -> None:
    registry = mock_registry()
    serializer = event_serializer(registry=registry, topic=TOPIC, event_format="avro")
    assert isinstance(serializer, AvroEventSerializer)
    serializer.prepare()
    for event, event_id in ((checkpoint_event(), 11), (completed_event(), 12)):
        stored, expected = stored_and_published(event, event_id)
        value = serializer.serialize(stored)
        assert value[0] == 0
        assert framed_schema_id(value) == serializer.schema_id

        record = AvroDeserializer(registry)(value, CTX)
        assert record == event_to_avro_record(expected)
        assert avro_record_to_event(record) == expected
        assert EventDecoder(registry).decode(value) == expected
        # Without a registry the decoder falls back to the contract's own schema.
        assert EventDecoder(event_format="avro").decode(value) == expected

        theirs = AvroSerializer(registry, avro_schema_text())(event_to_avro_record(expected), CTX)
        assert EventDecoder(registry).decode(theirs) == expected


def test_avro_writes_whole_numbers_as_integers() -> None:
    registry = mock_registry()
    serializer = event_serializer(registry=registry, topic=TOPIC, event_format="avro")
    serializer.prepare()
    event = build_event(
        job_id=uuid.uuid4(),
        event_type=EventType.Value("TYPE_STEP_CHECKPOINT"),
        workflow_name="embed-text",
        attempt=3,
        occurred_at=datetime.now(UTC),
        step_name="embed",
        response={
            "dimensions": 8,
            "vector": [0.5, -1.25, 3, -0.0],
            "nested": {"count": 0, "big": 2**53, "ratio": 2.5},
            "flags": [True, None, "8.0"],
        },
    )
    stored, expected = stored_and_published(event, 2**40)

    record = AvroDeserializer(registry)(serializer.serialize(stored), CTX)

    assert record["response"] == (
        '{"dimensions":8,"flags":[true,null,"8.0"],'
        '"nested":{"big":9007199254740992,"count":0,"ratio":2.5},"vector":[0.5,-1.25,3,-0.0]}'
    )
    response = json.loads(record["response"])
    assert type(response["dimensions"]) is int
    assert [type(n) for n in response["vector"]] == [float, float, int, float]
    assert type(record["event_id"]) is int and record["event_id"] == 2**40
    assert type(record["attempt"]) is int and record["attempt"] == 3
    assert avro_record_to_event(record) == expected


def test_avro_record_keeps_absent_structs_absent() -> None:
    event = build_event(
        job_id=uuid.uuid4(),
        event_type=EventType.Value("TYPE_ACCEPTED"),
        workflow_name="w",
        attempt=0,
        occurred_at=datetime.now(UTC),
    )
    record = event_to_avro_record(event)
    assert record["response"] is None
    assert record["result"] is None
    assert record["type"] == "TYPE_ACCEPTED"
    back = avro_record_to_event(record)
    assert not back.HasField("response")
    assert not back.HasField("result")


def test_avro_needs_a_registry() -> None:
    with pytest.raises(InvalidArgument):
        event_serializer(registry=None, topic=TOPIC, event_format="avro")
    with pytest.raises(InvalidArgument):
        event_serializer(registry=None, topic=TOPIC, event_format="json")


def test_mock_registries_in_two_processes_agree_on_ids() -> None:
    # Two clients stand for two processes: each mock:// client has its own store.
    producer_side = open_registry("mock://wfjobs")
    consumer_side = open_registry("mock://wfjobs")
    serializer = event_serializer(registry=producer_side, topic=TOPIC)
    serializer.prepare()
    stored, expected = stored_and_published(checkpoint_event(), 5)
    value = serializer.serialize(stored)
    assert ProtobufDeserializer(WorkflowRunEvent, None, consumer_side)(value, CTX) == expected

    request = WorkflowRunRequest(job_id=str(uuid.uuid4()), workflow_name="w")
    framed = encode_request(request, registry=producer_side)
    assert RequestDecoder(consumer_side).decode(framed) == request


def test_requests_framed_or_plain() -> None:
    registry = mock_registry()
    request = WorkflowRunRequest(job_id=str(uuid.uuid4()), workflow_name="sample")
    request.input.update({"text": "hello"})

    framed = encode_request(request, registry=registry)
    plain = encode_request(request, registry=None)
    theirs = ProtobufSerializer(WorkflowRunRequest, registry)(
        request, SerializationContext("workflow-run-requests", MessageField.VALUE)
    )
    assert framed[0] == 0
    assert plain[0] != 0
    for value in (framed, plain, theirs):
        assert RequestDecoder(registry).decode(value) == request
        assert RequestDecoder().decode(value) == request
    ctx = SerializationContext("workflow-run-requests", MessageField.VALUE)
    assert ProtobufDeserializer(WorkflowRunRequest, None, registry)(framed, ctx) == request


@pytest.mark.parametrize(
    "value",
    [
        b"\xff\xff\xff",
        b"\x0a\x10abc",  # a length-delimited field running past the end
        b"\x00\x00",  # magic byte and nothing else
        b"\x00\x00\x00\x03\xe7\x00\x0a\x01a",  # framed with an id the registry never issued
    ],
)
def test_garbage_is_undecodable_not_a_crash(value: bytes) -> None:
    registry = mock_registry()
    ProtobufFramer(WorkflowRunRequest, registry, "workflow-run-requests").prepare()
    with pytest.raises(UndecodableMessage):
        RequestDecoder(registry).decode(value)
    with pytest.raises(UndecodableMessage):
        EventDecoder(registry).decode(value)


def test_tombstone_is_undecodable() -> None:
    with pytest.raises(UndecodableMessage):
        EventDecoder().decode(None)
    with pytest.raises(UndecodableMessage):
        RequestDecoder().decode(None)


def test_an_unreachable_registry_is_unavailable_not_undecodable() -> None:
    from devstack.processes import free_port

    registry = SchemaRegistryClient({"url": f"http://127.0.0.1:{free_port()}", "max.retries": 0})
    framed = b"\x00\x00\x00\x00\x07\x00\x0a\x01a"
    with pytest.raises(Unavailable):
        RequestDecoder(registry).decode(framed)
    with pytest.raises(Unavailable):
        EventDecoder(registry).decode(framed)


def test_a_registry_that_never_answers_is_unavailable_within_its_timeout() -> None:
    # A registry that takes the connection and says nothing (overloaded, or a
    # half-open connection): without a timeout, every lookup waited for ever.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        registry = open_registry(url, conf={"max.retries": 0})
        framed = b"\x00\x00\x00\x00\x07\x00\x0a\x01a"
        caught: list[BaseException] = []

        def decode() -> None:
            try:
                RequestDecoder(registry).decode(framed)
            except BaseException as exc:
                caught.append(exc)

        began = time.monotonic()
        lookup = threading.Thread(target=decode, daemon=True)
        lookup.start()
        lookup.join(REGISTRY_TIMEOUT_S + 5)
        assert not lookup.is_alive(), "the lookup is still waiting for the registry"
    assert time.monotonic() - began >= REGISTRY_TIMEOUT_S - 1
    [error] = caught
    assert isinstance(error, Unavailable)


def test_a_value_framed_with_another_messages_schema_is_undecodable() -> None:
    # Field numbers and types line up, so the bytes would parse: a completion
    # on the request topic would submit its step name as a workflow.
    registry = open_registry(f"mock://{uuid.uuid4().hex}")
    completion = StepCompletion(job_id=str(uuid.uuid4()), step_name="review", request_id="r")
    completion.response.update({"approved": True})
    framed_completion = encode_message(
        completion, registry=registry, topic=defaults.COMPLETIONS_TOPIC
    )
    with pytest.raises(UndecodableMessage) as refused:
        RequestDecoder(registry).decode(framed_completion)
    assert refused.value.message == (
        "cannot decode WorkflowRunRequest: the value was written with the schema of"
        " workflowjobs.v1.StepCompletion"
    )

    request = WorkflowRunRequest(job_id=str(uuid.uuid4()), workflow_name="sample")
    framed_request = encode_request(request, registry=registry)
    completions = MessageDecoder(StepCompletion, registry, topic=defaults.COMPLETIONS_TOPIC)
    with pytest.raises(UndecodableMessage, match=r"workflowjobs\.v1\.WorkflowRunRequest$"):
        completions.decode(framed_request)
    # Their own framing still decodes, through the same client.
    assert RequestDecoder(registry).decode(framed_request) == request
    assert completions.decode(framed_completion) == completion
    # Nor is a request framed for its own topic taken for an event.
    with pytest.raises(UndecodableMessage, match=r"workflowjobs\.v1\.WorkflowRunRequest$"):
        EventDecoder(registry).decode(framed_request)
