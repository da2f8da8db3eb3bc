"""The published contract, as a consumer team meets it, against a real Schema Registry.

The registry is the session's ``schema_registry`` (Apicurio Registry started by
the suite, or ``WFJOBS_TEST_SCHEMA_REGISTRY_URL``); Kafka is the session's
Apache Kafka. The consumer side runs in a separate interpreter that can import
nothing of this project: only classes ``protoc`` generated from the shipped
``schemas/proto-consumer`` files, and confluent-kafka.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from google.protobuf import descriptor_pb2

from cli.errors import CliError
from cli.kafka import _framed
from devstack.schema_registry import SchemaRegistryService
from schemas.consumer import consumer_file
from schemas.contract import (
    EventType,
    StepCompletion,
    StepCompletionResult,
    WorkflowRunEvent,
    WorkflowRunRequest,
    build_event,
    encode_event,
    to_json,
    with_event_id,
)
from schemas.generate import CONSUMER_ROOT
from schemas.serde import (
    COMPATIBILITY,
    EventDecoder,
    RequestDecoder,
    UndecodableMessage,
    encode_message,
    encode_request,
    event_serializer,
)
from store.outbox import OutboxRow
from streams.completions_agent import ResultEncoder
from streams.relay import build_relay
from streams.settings import Settings

pytestmark = pytest.mark.kafka

PROJECT_PACKAGES = ("schemas", "streams", "store", "workflows", "migrations", "benchmarks")

# What a consumer team writes: the README's example, bounded. It is run with
# `python -I` from a directory holding only protoc's output, and every package
# of this project is made unimportable before it starts.
CONSUMER = textwrap.dedent(
    """
    import json
    import sys

    registry_url, bootstrap, topic, count, requests_topic, request_hex = sys.argv[1:]

    from confluent_kafka import Consumer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf import json_format

    from workflowjobs.v1 import events_pb2, requests_pb2

    registry = SchemaRegistryClient({"url": registry_url})
    deserialize = ProtobufDeserializer(events_pb2.WorkflowRunEvent, None, registry)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "review-queue-" + topic,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen = set()
    events = []
    while len(events) < int(count):
        message = consumer.poll(1.0)
        if message is None or message.error():
            continue
        context = SerializationContext(message.topic(), MessageField.VALUE)
        event = deserialize(message.value(), context)
        if event.event_id not in seen:
            seen.add(event.event_id)
            events.append(json_format.MessageToDict(event, preserving_proto_field_name=True))
        consumer.commit(message)
    consumer.close()

    read_request = ProtobufDeserializer(requests_pb2.WorkflowRunRequest, None, registry)
    request = read_request(
        bytes.fromhex(request_hex), SerializationContext(requests_topic, MessageField.VALUE)
    )
    print(
        json.dumps(
            {
                "events": events,
                "request": json_format.MessageToDict(request, preserving_proto_field_name=True),
                "modules": sorted(n for n, m in sys.modules.items() if m is not None),
            }
        )
    )
    """
)


def protoc_consumer_classes(out: Path) -> None:
    """What a consumer runs on the shipped files: protoc's Python output, nothing else."""
    sources = sorted(str(p.relative_to(CONSUMER_ROOT)) for p in CONSUMER_ROOT.rglob("*.proto"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{CONSUMER_ROOT}",
            f"--python_out={out}",
            *sources,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    generated = "".join(p.read_text() for p in out.rglob("*_pb2.py"))
    assert "buf/validate" not in generated
    assert "buf.validate" not in generated


def run_consumer(gen: Path, *args: str) -> dict[str, object]:
    poison = "".join(f"sys.modules[{name!r}] = None\n" for name in PROJECT_PACKAGES)
    script = f"import sys\nsys.path.insert(0, {str(gen)!r})\n{poison}{CONSUMER}"
    proc = subprocess.run(
        [sys.executable, "-I", "-c", script, *args],
        cwd=gen,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def contract_events(count: int) -> list[WorkflowRunEvent]:
    job_id = uuid.uuid4()
    when = datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=UTC)
    kinds = [
        (EventType.TYPE_ACCEPTED, {}),
        (EventType.TYPE_STEP_CHECKPOINT, {"step_name": "embed", "response": {"dimensions": 8}}),
        (EventType.TYPE_WAITING, {"step_name": "review"}),
        (EventType.TYPE_COMPLETED, {"verdict": "approved", "result": {"score": 0.5}}),
    ]
    events = []
    for i in range(count):
        kind, fields = kinds[i % len(kinds)]
        events.append(
            build_event(
                job_id=job_id,
                event_type=kind,
                workflow_name="embed-and-review",
                attempt=1,
                occurred_at=when,
                **fields,  # type: ignore[arg-type]
            )
        )
    return events


def registered_file(registry: SchemaRegistryClient, subject: str) -> str:
    """The latest schema of ``subject`` as the registry hands it out, checked for references."""
    registered = registry.get_latest_version(subject)
    assert registered.schema.schema_type == "PROTOBUF"
    assert registered.schema.references == []
    text = registered.schema.schema_str
    assert text is not None
    return text


def test_a_consumer_with_only_protoc_classes_reads_events_and_requests(
    schema_registry: SchemaRegistryService,
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    topic = new_topic(kafka_bootstrap, 1, prefix="contract-events")
    requests_topic = f"contract-requests-{uuid.uuid4().hex[:12]}"
    settings = Settings.from_env(
        {
            "WFJOBS_SCHEMA_REGISTRY_URL": schema_registry.url,
            "WFJOBS_EVENTS_TOPIC": topic,
            "WFJOBS_REQUESTS_TOPIC": requests_topic,
        }
    )
    registry = settings.open_registry()
    assert registry is not None
    # What the relay does: prepare once, then frame each stored payload with its id.
    serializer = event_serializer(registry=registry, topic=topic)
    serializer.prepare()
    expected = []
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for event_id, event in enumerate(contract_events(4), start=101):
        value = serializer.serialize(with_event_id(encode_event(event), event_id))
        producer.produce(topic, value=value, key=event.job_id.encode())
        event.event_id = event_id
        expected.append(to_json(event))
    assert producer.flush(30) == 0
    request = WorkflowRunRequest(job_id=str(uuid.uuid4()), workflow_name="embed-and-review")
    request.input.update({"text": "the quick brown fox", "limit": 3})
    framed_request = encode_request(request, registry=registry, topic=requests_topic)
    # The worker's decoder, with a client of its own: the value's writer schema
    # must name the request, not a message whose fields happen to line up.
    worker_side = RequestDecoder(settings.open_registry(), topic=requests_topic)
    assert worker_side.decode(framed_request) == request
    completion = StepCompletion(job_id=request.job_id, step_name="review")
    completion.response.update({"approved": True})
    completions_topic = f"contract-completions-{uuid.uuid4().hex[:12]}"
    framed_completion = encode_message(completion, registry=registry, topic=completions_topic)
    with pytest.raises(UndecodableMessage, match=r"schema of workflowjobs\.v1\.StepCompletion$"):
        worker_side.decode(framed_completion)
    # The events' own decoder (wfjobs events) takes the relay's framing and no other.
    events_side = EventDecoder(settings.open_registry(), topic=topic)
    assert to_json(events_side.decode(value)) == expected[-1]
    with pytest.raises(
        UndecodableMessage, match=r"schema of workflowjobs\.v1\.WorkflowRunRequest$"
    ):
        events_side.decode(framed_request, topic=requests_topic)

    gen = tmp_path / "consumer"
    gen.mkdir()
    protoc_consumer_classes(gen)
    seen = run_consumer(
        gen,
        schema_registry.url,
        kafka_bootstrap,
        topic,
        str(len(expected)),
        requests_topic,
        framed_request.hex(),
    )

    assert seen["events"] == expected
    assert seen["request"] == to_json(request)
    modules = seen["modules"]
    assert isinstance(modules, list)
    assert not [m for m in modules if m.split(".")[0] in (*PROJECT_PACKAGES, "buf")]

    # The schemas the registry hands out are the consumer-facing files, reference-free.
    subjects = registry.get_subjects()
    assert not [subject for subject in subjects if "validate" in subject]
    for subject, message_type in (
        (f"{topic}-value", WorkflowRunEvent),
        (f"{requests_topic}-value", WorkflowRunRequest),
    ):
        text = registered_file(registry, subject)
        assert "buf/validate" not in text and "buf.validate" not in text
        file = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text))
        assert file == consumer_file(message_type.DESCRIPTOR.file)
        assert all(name.startswith("google/protobuf/") for name in file.dependency)
        assert b"buf/validate" not in base64.b64decode(text)


@pytest.mark.parametrize("event_format", ["protobuf", "avro"])
def test_subject_compatibility_is_backward_after_prepare(
    schema_registry: SchemaRegistryService, event_format: str
) -> None:
    topic = f"contract-compat-{uuid.uuid4().hex[:12]}"
    registry = SchemaRegistryClient({"url": schema_registry.url})
    serializer = event_serializer(registry=registry, topic=topic, event_format=event_format)

    serializer.prepare()

    assert registry.get_compatibility(f"{topic}-value") == COMPATIBILITY == "BACKWARD"


def test_a_laxer_level_is_raised_and_a_stricter_one_kept(
    schema_registry: SchemaRegistryService,
) -> None:
    registry = SchemaRegistryClient({"url": schema_registry.url})
    lax, strict = (f"contract-{uuid.uuid4().hex[:12]}" for _ in range(2))
    event_serializer(registry=registry, topic=lax).prepare()
    # Set on an existing subject: Apicurio has nothing to relax on one it does not know.
    registry.set_compatibility(subject_name=f"{lax}-value", level="NONE")
    registry.set_compatibility(subject_name=f"{strict}-value", level="FULL_TRANSITIVE")

    event_serializer(registry=registry, topic=lax).prepare()  # the relay restarting
    event_serializer(registry=registry, topic=strict).prepare()

    assert registry.get_compatibility(f"{lax}-value") == "BACKWARD"
    assert registry.get_compatibility(f"{strict}-value") == "FULL_TRANSITIVE"


def test_a_lookup_only_serializer_leaves_the_subject_settings_alone(
    schema_registry: SchemaRegistryService,
) -> None:
    topic = f"contract-lookup-{uuid.uuid4().hex[:12]}"
    registry = SchemaRegistryClient({"url": schema_registry.url})
    event_serializer(registry=registry, topic=topic).prepare()
    registry.set_compatibility(subject_name=f"{topic}-value", level="NONE")

    looked_up = event_serializer(registry=registry, topic=topic, auto_register=False)
    looked_up.prepare()

    assert registry.get_compatibility(f"{topic}-value") == "NONE"


class _NoOutbox:
    async def relay_batch(self, publish: object, limit: int = 100, *, owner: str = "") -> Any:
        raise AssertionError("not used here")

    async def backlog(self) -> Any:
        raise AssertionError("not used here")


@pytest.mark.parametrize("event_format", ["protobuf", "avro"])
async def test_without_auto_register_nothing_is_written_to_the_registry(
    schema_registry: SchemaRegistryService,
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    event_format: str,
) -> None:
    events_topic = new_topic(kafka_bootstrap, 1, prefix="lookup-events")
    suffix = uuid.uuid4().hex[:12]
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "WFJOBS_SCHEMA_REGISTRY_URL": schema_registry.url,
        "WFJOBS_EVENT_FORMAT": event_format,
        "WFJOBS_EVENTS_TOPIC": events_topic,
        "WFJOBS_REQUESTS_TOPIC": f"lookup-requests-{suffix}",
        "WFJOBS_COMPLETION_RESULTS_TOPIC": f"lookup-results-{suffix}",
        "WFJOBS_RELAY_MESSAGE_TIMEOUT_MS": "20000",
    }
    owner = Settings.from_env(env)
    reader = Settings.from_env({**env, "WFJOBS_SCHEMA_REGISTRY_AUTO_REGISTER": "false"})
    subjects = [
        f"{topic}-value"
        for topic in (events_topic, reader.requests_topic, reader.completion_results_topic)
    ]
    registry = SchemaRegistryClient({"url": schema_registry.url})
    event = contract_events(1)[0]
    row = OutboxRow(1, uuid.UUID(event.job_id), "ACCEPTED", encode_event(event), 0)
    request = WorkflowRunRequest(job_id=str(uuid.uuid4()), workflow_name="embed-and-review")
    result = StepCompletionResult(job_id=request.job_id, step_name="review", outcome="COMPLETED")

    async def frame_all(settings: Settings, published: int) -> list[bytes]:
        """The relay's event (the topic's ``published``-th), the CLI's request and the
        completions agent's result, each framed as ``settings`` say."""
        relay = build_relay(settings, _NoOutbox())
        try:
            assert await relay.publish([row]) == [None]
        finally:
            await relay.stop()
        read = Consumer(
            {"bootstrap.servers": kafka_bootstrap, "group.id": f"lookup-{uuid.uuid4().hex}"}
        )
        try:
            read.assign([TopicPartition(events_topic, 0, published - 1)])
            message = read.poll(15)
            assert message is not None and message.error() is None
            value = message.value()
            assert isinstance(value, bytes)
        finally:
            read.close()
        encoder = ResultEncoder(
            settings.open_registry(),
            settings.completion_results_topic,
            auto_register=settings.schema_registry_auto_register,
        )
        return [
            value,
            _framed(settings, request, settings.requests_topic, "request"),
            await encoder.encode(result),
        ]

    # Nobody has registered the schemas: a process that may not register fails
    # to frame, and leaves the subjects as they were (absent).
    relay = build_relay(reader, _NoOutbox())
    refused = await relay.publish([row])
    assert refused[0] is not None and not refused[0].permanent
    with pytest.raises(CliError, match="cannot frame the request"):
        _framed(reader, request, reader.requests_topic, "request")
    with pytest.raises(SchemaRegistryError):
        await ResultEncoder(
            reader.open_registry(), reader.completion_results_topic, auto_register=False
        ).encode(result)
    assert not set(subjects) & set(registry.get_subjects())

    # Registered by a process that may, the schemas are looked up and framed
    # with the owner's ids; neither a version nor a compatibility level is written.
    owned = await frame_all(owner, 1)
    for subject in subjects:
        registry.set_compatibility(subject_name=subject, level="NONE")
    versions = {subject: registry.get_versions(subject) for subject in subjects}
    looked_up = await frame_all(reader, 2)
    assert [value[:5] for value in looked_up] == [value[:5] for value in owned]
    for subject in subjects:
        assert registry.get_versions(subject) == versions[subject]
        assert registry.get_compatibility(subject) == "NONE"
