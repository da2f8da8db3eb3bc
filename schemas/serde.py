"""Kafka value encodings of the contract: Confluent wire format or plain Protobuf.

Outbox rows hold an event's Protobuf bytes (without ``event_id``); publishing only
adds framing, so nothing is re-encoded per row on the hot path:

* no registry configured: the Protobuf bytes as they are;
* a registry, Protobuf (the default): magic byte ``0``, the 4-byte big-endian
  schema id, the message-index array (a single ``0`` for the first message of a
  file), then the Protobuf bytes;
* a registry, Avro (``WFJOBS_EVENT_FORMAT=avro``): magic byte, schema id, then the
  record encoded with fastavro against ``avro/workflow_run_event.avsc``.

The schema id is registered (or looked up) once per serializer, by confluent-kafka
itself for Protobuf. What is registered is the consumer-facing schema
(:mod:`schemas.consumer`, shipped in ``schemas/proto-consumer``): the same wire
contract without the protovalidate import and options, so it has no reference a
registry could refuse and consumers compile it with the well-known types alone.
Registering also declares the subject's compatibility ``BACKWARD`` (unless it is
already at least that strict): a new version must read everything written before.

Decoders accept both framed and plain values. A Protobuf value never starts with a
zero byte (tag 0 is not a valid field), so a leading ``0`` always means framing.
"""

from __future__ import annotations

import abc
import base64
import io
import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import fastavro
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2
from google.protobuf.message import DecodeError, Message
from google.protobuf.struct_pb2 import ListValue, Struct, Value

from schemas import defaults
from schemas.consumer import consumer_message_class
from schemas.contract import (
    StepCompletion,
    StepCompletionResult,
    WorkflowRunEvent,
    WorkflowRunRequest,
    decode_event,
)
from schemas.errors import InvalidArgument, Unavailable

MAGIC_BYTE = 0
EVENT_FORMATS = ("protobuf", "avro")
AVSC_PATH = Path(__file__).resolve().parent / "avro" / "workflow_run_event.avsc"
DEFAULT_EVENTS_TOPIC = defaults.EVENTS_TOPIC
DEFAULT_REQUESTS_TOPIC = defaults.REQUESTS_TOPIC

# The subject of a topic's values is ``<topic>-value``. Spelled out rather than left
# to the library default, which asks the registry for topic associations first: an
# API older Confluent-compatible registries do not have.
_SERDE_CONF: dict[str, Any] = {"subject.name.strategy.type": "TOPIC"}

# Seconds one registry request may take. The client's own default is no
# limit at all: a registry that takes the connection and never answers would
# hold the relay's pass, or a request's decode, for good, with nothing
# reporting it. Timed out, the request is retried (the client's max.retries)
# and then an outage like a registry that refuses connections.
REGISTRY_TIMEOUT_S = 10.0

# Consumers upgrade after producers, so every new version of a subject must read
# what the versions before it wrote. Levels at least this strict are left alone.
COMPATIBILITY = "BACKWARD"
_AT_LEAST_BACKWARD = frozenset({"BACKWARD", "BACKWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE"})


M = TypeVar("M", bound=Message)


class UndecodableMessage(InvalidArgument):
    """A Kafka value that is not a message of the expected type; the reason says why."""


# --------------------------------------------------------------------------- registry


def open_registry(
    url: str,
    *,
    conf: Mapping[str, Any] | None = None,
    events_topic: str = DEFAULT_EVENTS_TOPIC,
    requests_topic: str = DEFAULT_REQUESTS_TOPIC,
    completions_topic: str = defaults.COMPLETIONS_TOPIC,
    completion_results_topic: str = defaults.COMPLETION_RESULTS_TOPIC,
) -> SchemaRegistryClient:
    """A registry client for ``url``; ``mock://...`` gives confluent's in-process mock.

    A mock registry lives inside one process, so a producer and a consumer in two
    processes would each hold their own. Every mock opened here registers the
    contract's schemas in one fixed order, which hands out the same ids in every
    process that uses the same topic names; bytes framed by one process then decode
    through the registry in another.
    """
    client = SchemaRegistryClient.new_client(
        {"timeout": REGISTRY_TIMEOUT_S, **(conf or {}), "url": url}
    )
    if url.startswith("mock://"):
        ProtobufFramer(WorkflowRunEvent, client, events_topic).prepare()
        AvroEventSerializer(client, events_topic).prepare()
        ProtobufFramer(WorkflowRunRequest, client, requests_topic).prepare()
        ProtobufFramer(StepCompletion, client, completions_topic).prepare()
        ProtobufFramer(StepCompletionResult, client, completion_results_topic).prepare()
    return client


def is_mock(registry: SchemaRegistryClient) -> bool:
    """Whether ``registry`` is confluent's in-process ``mock://`` registry."""
    conf: Mapping[str, Any] = registry.config()  # type: ignore[no-untyped-call]
    return str(conf.get("url", "")).startswith("mock://")


def _context(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


def declare_compatibility(registry: SchemaRegistryClient, subject: str) -> None:
    """Make ``subject`` at least ``BACKWARD`` compatible before we register in it.

    confluent's ``mock://`` registry keeps no compatibility settings (and checks
    none), so there is nothing to declare there.
    """
    if is_mock(registry):
        return
    try:
        current: str | None = registry.get_compatibility(subject)
    except SchemaRegistryError as exc:
        if exc.http_status_code != 404:  # 404: the subject has no level of its own
            raise
        current = None
    if current not in _AT_LEAST_BACKWARD:
        registry.set_compatibility(subject_name=subject, level=COMPATIBILITY)


# --------------------------------------------------------------------------- producing


class EventSerializer(Protocol):
    """Turns stored event bytes (``event_id`` already appended) into a Kafka value."""

    @property
    def description(self) -> str: ...

    def prepare(self) -> None:
        """Do the blocking registry work once, before the first ``serialize``."""

    def serialize(self, event_bytes: bytes) -> bytes: ...


class PlainProtobufSerializer:
    """No registry: the Protobuf bytes go out untouched."""

    description = "plain protobuf"

    def prepare(self) -> None:
        return None

    def serialize(self, event_bytes: bytes) -> bytes:
        return event_bytes


class _RegistryFraming(abc.ABC):
    """The Confluent header of one subject, ``<topic>-value``: magic byte and schema id.

    ``prepare`` does the registry round trip once; ``_register`` says how a
    format gets its header.
    """

    format_name = ""

    def __init__(
        self, registry: SchemaRegistryClient, topic: str, *, auto_register: bool = True
    ) -> None:
        self._registry = registry
        self._topic = topic
        self._auto_register = auto_register
        self._header: bytes | None = None

    @property
    def subject(self) -> str:
        return f"{self._topic}-value"

    @property
    def description(self) -> str:
        suffix = f" (schema id {self.schema_id})" if self._header is not None else ""
        return f"{self.format_name} via schema registry, subject {self.subject}{suffix}"

    @property
    def header(self) -> bytes:
        if self._header is None:
            raise RuntimeError(f"{type(self).__name__}.prepare() has not run")
        return self._header

    @property
    def schema_id(self) -> int:
        return int.from_bytes(self.header[1:5], "big")

    def prepare(self) -> None:
        if self._header is None:
            # Only a serializer that registers owns the subject's settings; one that
            # merely looks ids up may not be allowed to change them.
            if self._auto_register:
                declare_compatibility(self._registry, self.subject)
            self._header = self._register()

    @abc.abstractmethod
    def _register(self) -> bytes:
        """Register (or look up) the schema and return the frame header."""


class ProtobufFramer(_RegistryFraming):
    """Confluent framing for already-encoded Protobuf messages of one type.

    The header for a message type is exactly what confluent's ``ProtobufSerializer``
    writes in front of the payload, so it is taken from that serializer: serializing
    an empty message yields the header alone, and registers the schema on the way.
    The serializer is given the consumer-facing class of the type, so the schema it
    derives and registers is the consumer-facing one; both classes encode a message
    to the same bytes, so the header frames our payloads unchanged.
    """

    format_name = "protobuf"

    def __init__(
        self,
        message_type: type[Message],
        registry: SchemaRegistryClient,
        topic: str,
        *,
        auto_register: bool = True,
    ) -> None:
        super().__init__(registry, topic, auto_register=auto_register)
        self._message_type = message_type

    def _register(self) -> bytes:
        consumer_type = consumer_message_class(self._message_type)
        serializer = ProtobufSerializer(
            consumer_type,
            self._registry,
            {
                **_SERDE_CONF,
                "auto.register.schemas": self._auto_register,
                # Not registering: frame with the subject's latest version, which
                # whoever owns the subject registered (a registry that refuses
                # writes to this process, or a schema managed elsewhere).
                "use.latest.version": not self._auto_register,
            },
        )
        header = serializer(consumer_type(), _context(self._topic))
        if not header or header[0] != MAGIC_BYTE:
            raise RuntimeError(f"unexpected Confluent header {header!r}")
        return bytes(header)

    def serialize(self, event_bytes: bytes) -> bytes:
        return self.header + event_bytes

    def frame_message(self, message: Message) -> bytes:
        self.prepare()
        return self.header + message.SerializeToString(deterministic=True)


@cache
def avro_schema_text() -> str:
    return AVSC_PATH.read_text()


@cache
def _parsed_avro_schema() -> Any:
    return fastavro.parse_schema(json.loads(avro_schema_text()))


def event_to_avro_record(event: WorkflowRunEvent) -> dict[str, Any]:
    """The Avro record for an event; Struct fields become JSON text (see ``_struct_json``)."""
    return {
        "event_id": event.event_id,
        "job_id": event.job_id,
        "type": WorkflowRunEvent.Type.Name(event.type),
        "workflow_name": event.workflow_name,
        "attempt": event.attempt,
        "step_name": event.step_name,
        "response": _struct_json(event, "response"),
        "skipped": event.skipped,
        "verdict": event.verdict,
        "error": event.error,
        "result": _struct_json(event, "result"),
        "occurred_at": event.occurred_at.ToDatetime(tzinfo=UTC),
        "next_run_at": (
            event.next_run_at.ToDatetime(tzinfo=UTC) if event.HasField("next_run_at") else None
        ),
        "resumed_from": event.resumed_from,
        "resumed_by": event.resumed_by,
        "review_request": _struct_json(event, "review_request"),
        "deadline": event.deadline,
        "reason": event.reason,
    }


def avro_record_to_event(record: Mapping[str, Any]) -> WorkflowRunEvent:
    """The inverse of :func:`event_to_avro_record`."""
    event = WorkflowRunEvent(
        event_id=record["event_id"],
        job_id=record["job_id"],
        type=record["type"],
        workflow_name=record["workflow_name"],
        attempt=record["attempt"],
        step_name=record.get("step_name", ""),
        skipped=record.get("skipped", False),
        verdict=record.get("verdict", ""),
        error=record.get("error", ""),
        resumed_from=record.get("resumed_from", ""),
        resumed_by=record.get("resumed_by", ""),
        deadline=record.get("deadline", ""),
        reason=record.get("reason", ""),
    )
    for field in ("response", "result", "review_request"):
        if record.get(field) is not None:
            getattr(event, field).update(json.loads(record[field]))
    event.occurred_at.FromDatetime(_avro_time(record["occurred_at"]))
    if record.get("next_run_at") is not None:
        event.next_run_at.FromDatetime(_avro_time(record["next_run_at"]))
    return event


def _avro_time(value: datetime | int) -> datetime:
    if isinstance(value, int):  # read without logical types: microseconds
        return datetime.fromtimestamp(value / 1_000_000, tz=UTC)
    return value


def _struct_json(event: WorkflowRunEvent, field: str) -> str | None:
    """A Struct field as compact JSON text, its whole numbers written as integers.

    A Struct holds every number as a double, so a response's ``"dimensions": 8``
    comes back as ``8.0``; written as such, JSON readers that type by token (most
    of them) would hand consumers a float. Doubles with no fractional part are
    written as integers instead: the same number, read back into a Struct exactly.
    """
    if not event.HasField(field):
        return None
    return json.dumps(_plain_struct(getattr(event, field)), separators=(",", ":"), sort_keys=True)


def _plain_struct(struct: Struct) -> dict[str, Any]:
    return {key: _plain_value(value) for key, value in struct.fields.items()}


def _plain_list(values: ListValue) -> list[Any]:
    return [_plain_value(value) for value in values.values]


def _plain_value(value: Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        number = value.number_value
        negative_zero = number == 0 and math.copysign(1.0, number) < 0
        # -0.0 stays a float: written as 0 it would read back as +0.0.
        if number.is_integer() and not negative_zero:
            return int(number)
        return number
    if kind == "struct_value":
        return _plain_struct(value.struct_value)
    if kind == "list_value":
        return _plain_list(value.list_value)
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    return None


def encode_avro_body(event: WorkflowRunEvent) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, _parsed_avro_schema(), event_to_avro_record(event))
    return out.getvalue()


class AvroEventSerializer(_RegistryFraming):
    """Confluent framing around the Avro rendering of an event."""

    format_name = "avro"

    def _register(self) -> bytes:
        subject = self.subject
        schema = Schema(avro_schema_text(), schema_type="AVRO")
        if self._auto_register:
            schema_id = int(self._registry.register_schema(subject, schema))
        else:
            found = self._registry.lookup_schema(subject, schema).schema_id
            if found is None:
                raise Unavailable(f"schema registry has no id for subject {subject}")
            schema_id = int(found)
        return bytes([MAGIC_BYTE]) + schema_id.to_bytes(4, "big")

    def serialize(self, event_bytes: bytes) -> bytes:
        return self.header + encode_avro_body(decode_event(event_bytes))


def event_serializer(
    *,
    registry: SchemaRegistryClient | None,
    topic: str,
    event_format: str = "protobuf",
    auto_register: bool = True,
) -> EventSerializer:
    """The serializer the settings ask for; plain Protobuf when there is no registry."""
    if event_format not in EVENT_FORMATS:
        raise InvalidArgument(f"event format must be one of {EVENT_FORMATS}, got {event_format!r}")
    if registry is None:
        if event_format == "avro":
            raise InvalidArgument("the avro event format needs a schema registry")
        return PlainProtobufSerializer()
    if event_format == "avro":
        return AvroEventSerializer(registry, topic, auto_register=auto_register)
    return ProtobufFramer(WorkflowRunEvent, registry, topic, auto_register=auto_register)


def encode_message(
    message: Message,
    *,
    registry: SchemaRegistryClient | None,
    topic: str,
    auto_register: bool = True,
) -> bytes:
    """Any contract message as a Kafka value of ``topic``: framed when a registry is
    configured, plain Protobuf when none is."""
    if registry is None:
        return message.SerializeToString(deterministic=True)
    framer = ProtobufFramer(type(message), registry, topic, auto_register=auto_register)
    return framer.frame_message(message)


def encode_request(
    request: WorkflowRunRequest,
    *,
    registry: SchemaRegistryClient | None,
    topic: str = DEFAULT_REQUESTS_TOPIC,
    auto_register: bool = True,
) -> bytes:
    """A request as a Kafka value: framed when a registry is configured.

    ``auto_register=False`` frames with the subject's latest registered version.
    """
    if registry is None:
        return request.SerializeToString(deterministic=True)
    framer = ProtobufFramer(WorkflowRunRequest, registry, topic, auto_register=auto_register)
    return framer.frame_message(request)


# --------------------------------------------------------------------------- consuming


def is_framed(data: bytes) -> bool:
    return bool(data) and data[0] == MAGIC_BYTE


def framed_schema_id(data: bytes) -> int:
    if len(data) < 5 or data[0] != MAGIC_BYTE:
        raise UndecodableMessage("value is not in the Confluent wire format")
    return int.from_bytes(data[1:5], "big")


def _decode_failure(what: str, exc: Exception) -> Exception:
    """Classify a decode failure: the message's fault, or the registry's.

    A message that cannot be decoded goes to a dead-letter topic; one that could not
    be decoded because the registry was unreachable must be retried instead, so only
    registry answers and transport errors count as ``Unavailable``. The HTTP client
    confluent-kafka uses is an implementation detail (httpx or its fork), hence the
    check by module rather than by class.
    """
    if isinstance(exc, SchemaRegistryError):
        if exc.http_status_code == 404:
            return UndecodableMessage(f"cannot decode {what}: unknown schema: {exc}")
        return Unavailable(f"schema registry: {exc}")
    if isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in {"httpx", "httpx2"}:
        return Unavailable(f"schema registry: {exc}")
    return UndecodableMessage(f"cannot decode {what}: {exc}")


class EventDecoder:
    """Decodes ``workflow-run-events`` values of any format into ``WorkflowRunEvent``.

    Framed values go through confluent's own deserializers. With a registry the
    writer schema's type (Protobuf or Avro) comes from the registry; without one,
    framed values are read with the contract's own schemas, as ``event_format``.
    """

    def __init__(
        self,
        registry: SchemaRegistryClient | None = None,
        *,
        topic: str = DEFAULT_EVENTS_TOPIC,
        event_format: str = "protobuf",
    ) -> None:
        self._registry = registry
        self._topic = topic
        self._event_format = event_format
        self._protobuf = ProtobufDeserializer(WorkflowRunEvent, dict(_SERDE_CONF), registry)
        self._avro = (
            AvroDeserializer(registry, avro_schema_text(), conf=dict(_SERDE_CONF))
            if registry is not None
            else None
        )
        self._schema_types: dict[int, str] = {}
        self._writers = _WriterNames(registry)

    def decode(self, data: bytes | None, *, topic: str | None = None) -> WorkflowRunEvent:
        if data is None:
            raise UndecodableMessage("empty value (tombstone)")
        if not is_framed(data):
            return _parse_plain(WorkflowRunEvent, data)
        context = _context(topic or self._topic)
        try:
            if self._schema_type(data) == "AVRO":
                if self._avro is None:
                    return _decode_avro_without_registry(data)
                record = self._avro(data, context)
                return avro_record_to_event(record)
            self._writers.check(data, WorkflowRunEvent, topic or self._topic)
            event = self._protobuf(data, context)
        except UndecodableMessage:
            raise
        except Exception as exc:
            raise _decode_failure("WorkflowRunEvent", exc) from None
        if not isinstance(event, WorkflowRunEvent):
            raise UndecodableMessage(f"decoded {type(event).__name__}, not WorkflowRunEvent")
        return event

    def _schema_type(self, data: bytes) -> str:
        if self._registry is None:
            return "AVRO" if self._event_format == "avro" else "PROTOBUF"
        schema_id = framed_schema_id(data)
        known = self._schema_types.get(schema_id)
        if known is None:
            schema = self._registry.get_schema(schema_id)
            known = str(schema.schema_type or "AVRO")  # the registry's default type
            self._schema_types[schema_id] = known
        return known


def _decode_avro_without_registry(data: bytes) -> WorkflowRunEvent:
    record = fastavro.schemaless_reader(io.BytesIO(data[5:]), _parsed_avro_schema(), None)
    if not isinstance(record, dict):
        raise UndecodableMessage("avro body is not a record")
    return avro_record_to_event(record)


class _WriterNames:
    """The full name of the message a framed Protobuf value was written as.

    confluent's deserializer parses the bytes into the reader's class whatever
    message the writer schema names, and messages of the contract share field
    numbers and types: a StepCompletion framed for its own topic parses as a
    WorkflowRunRequest whose workflow is the step's name. The writer schema
    says what the value is, so that is checked (once per schema id and index).
    """

    def __init__(self, registry: SchemaRegistryClient | None) -> None:
        self._registry = registry
        self._names: dict[tuple[int, tuple[int, ...]], str] = {}

    def check(self, data: bytes, expected: type[Message], topic: str) -> None:
        """Raise ``UndecodableMessage`` when ``data`` was written as another message."""
        if self._registry is None:
            return  # without a registry the framing is taken on trust
        schema_id = framed_schema_id(data)
        key = (schema_id, _message_indexes(data))
        name = self._names.get(key)
        if name is None:
            # Asked as confluent's deserializer asks, so its cached answer serves.
            schema = self._registry.get_schema(schema_id, f"{topic}-value", "serialized")
            if schema.schema_str is None:
                raise UndecodableMessage(f"the registry has no schema text for id {schema_id}")
            name = _message_name(schema.schema_str, key[1])
            self._names[key] = name
        wanted = expected.DESCRIPTOR
        if name != wanted.full_name:
            raise UndecodableMessage(
                f"cannot decode {wanted.name}: the value was written with the schema of {name}"
            )


def _message_indexes(data: bytes) -> tuple[int, ...]:
    """The message-index array after the schema id: zigzag varints, a count first
    (0 alone standing for the first message of the file)."""
    position = 5

    def varint() -> int:
        nonlocal position
        shift = result = 0
        while True:
            if position >= len(data) or shift > 63:
                raise UndecodableMessage("the Confluent message-index array is cut short")
            byte = data[position]
            position += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1)
            shift += 7

    count = varint()
    if count == 0:
        return (0,)
    if not 0 < count <= 64:
        raise UndecodableMessage(f"the Confluent message-index array has {count} entries")
    return tuple(varint() for _ in range(count))


def _message_name(schema_text: str, indexes: tuple[int, ...]) -> str:
    """The full name of the message ``indexes`` pick in a serialized (base64) file."""
    file = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(schema_text))
    names: list[str] = []
    messages = file.message_type
    for index in indexes:
        if not 0 <= index < len(messages):
            raise UndecodableMessage(f"the writer schema has no message at index {indexes}")
        names.append(messages[index].name)
        messages = messages[index].nested_type
    return ".".join([file.package, *names] if file.package else names)


class RequestDecoder:
    """Decodes ``workflow-run-requests`` values, framed or plain, into ``WorkflowRunRequest``."""

    def __init__(
        self,
        registry: SchemaRegistryClient | None = None,
        *,
        topic: str = DEFAULT_REQUESTS_TOPIC,
    ) -> None:
        self._topic = topic
        self._protobuf = ProtobufDeserializer(WorkflowRunRequest, dict(_SERDE_CONF), registry)
        self._writers = _WriterNames(registry)

    def decode(self, data: bytes | None, *, topic: str | None = None) -> WorkflowRunRequest:
        if data is None:
            raise UndecodableMessage("empty value (tombstone)")
        if not is_framed(data):
            return _parse_plain(WorkflowRunRequest, data)
        try:
            request = self._protobuf(data, _context(topic or self._topic))
            self._writers.check(data, WorkflowRunRequest, topic or self._topic)
        except UndecodableMessage:
            raise
        except Exception as exc:
            raise _decode_failure("WorkflowRunRequest", exc) from None
        if not isinstance(request, WorkflowRunRequest):
            raise UndecodableMessage(f"decoded {type(request).__name__}, not WorkflowRunRequest")
        return request


class MessageDecoder(Generic[M]):
    """Decodes one topic's values, framed or plain, into ``message_type``."""

    def __init__(
        self,
        message_type: type[M],
        registry: SchemaRegistryClient | None = None,
        *,
        topic: str,
    ) -> None:
        self._type = message_type
        self._topic = topic
        self._protobuf = ProtobufDeserializer(message_type, dict(_SERDE_CONF), registry)
        self._writers = _WriterNames(registry)

    def decode(self, data: bytes | None, *, topic: str | None = None) -> M:
        name = self._type.DESCRIPTOR.name
        if data is None:
            raise UndecodableMessage("empty value (tombstone)")
        if not is_framed(data):
            return _parse_plain(self._type, data)
        try:
            message = self._protobuf(data, _context(topic or self._topic))
            self._writers.check(data, self._type, topic or self._topic)
        except UndecodableMessage:
            raise
        except Exception as exc:
            raise _decode_failure(name, exc) from None
        if not isinstance(message, self._type):
            raise UndecodableMessage(f"decoded {type(message).__name__}, not {name}")
        return message


def _parse_plain(message_type: type[M], data: bytes) -> M:
    message = message_type()
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        name = message_type.DESCRIPTOR.name
        raise UndecodableMessage(f"not a {name} in plain Protobuf: {exc}") from None
    return message


__all__ = [
    "AVSC_PATH",
    "COMPATIBILITY",
    "EVENT_FORMATS",
    "MAGIC_BYTE",
    "AvroEventSerializer",
    "EventDecoder",
    "EventSerializer",
    "MessageDecoder",
    "PlainProtobufSerializer",
    "ProtobufFramer",
    "RequestDecoder",
    "UndecodableMessage",
    "avro_record_to_event",
    "avro_schema_text",
    "declare_compatibility",
    "encode_avro_body",
    "encode_message",
    "encode_request",
    "event_serializer",
    "event_to_avro_record",
    "framed_schema_id",
    "is_framed",
    "is_mock",
    "open_registry",
]
