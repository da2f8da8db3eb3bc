"""The outbox relay against a real Postgres and the real Apache Kafka the suite starts.

Events are written through the run store, exactly as the worker writes them, and
read back from the topic through confluent-kafka's own deserializers with the
in-library ``mock://`` registry.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from devstack.processes import free_port
from schemas.contract import WorkflowRunEvent
from schemas.serde import EventDecoder, EventSerializer, avro_record_to_event, event_serializer
from store import Outbox, RunStore, open_pool
from store.channels import JOBS_QUEUED_CHANNEL, OUTBOX_CHANNEL
from store.outbox import Backlog, Publisher, PublishFailure, RelayResult
from store.pool import Pool
from store.records import Lease
from streams.listener import Listener
from streams.relay import SETTLE_WAIT_S, OutboxRelay, Publish, build_relay, producer_config
from streams.settings import Settings
from tests.http_stub import serving

pytestmark = pytest.mark.kafka

DEFINITION: dict[str, Any] = {"name": "relay-test", "steps": []}


@dataclass
class Store:
    dsn: str
    pool: Pool
    runs: RunStore
    outbox: Outbox


@pytest.fixture
async def store(make_database: Callable[[], str]) -> AsyncIterator[Store]:
    dsn = make_database(migrated=True)
    pool = await open_pool(dsn, min_size=1, max_size=8)
    try:
        yield Store(dsn, pool, RunStore(pool), Outbox(pool))
    finally:
        await pool.close()


def mock_registry() -> SchemaRegistryClient:
    return SchemaRegistryClient.new_client({"url": f"mock://{uuid.uuid4().hex}"})


def make_relay(
    store: Store,
    bootstrap: str,
    topic: str,
    serializer: EventSerializer,
    *,
    batch: int = 100,
    interval_s: float = 0.05,
    overrides: dict[str, Any] | None = None,
    name: str = "relay",
    wake: asyncio.Event | None = None,
) -> OutboxRelay:
    return OutboxRelay(
        store.outbox,
        producer_config=producer_config(bootstrap, overrides),
        topic=topic,
        serializer=serializer,
        interval_s=interval_s,
        batch=batch,
        wake=wake,
        name=name,
    )


async def submit(store: Store) -> uuid.UUID:
    job_id = uuid.uuid4()
    await store.runs.submit(
        job_id=job_id,
        workflow_name="relay-test",
        definition=DEFINITION,
        definition_hash="relay-test",
        input={"text": "hello"},
    )
    return job_id


async def claim_all(store: Store, job_ids: list[uuid.UUID]) -> dict[uuid.UUID, Lease]:
    """Claim every job of this test's own database."""
    claimed = await store.runs.claim_batch("relay-test-worker", len(job_ids))
    leases = {job.job_id: job.lease for job in claimed}
    assert set(leases) == set(job_ids)
    return leases


async def checkpoint(store: Store, lease: Lease, step: int) -> None:
    entry = {"name": f"step{step}", "skipped": False, "response": {"n": step}}
    await store.runs.checkpoint(lease, entry)


async def run_job(store: Store, steps: int, *, finish: bool = True) -> uuid.UUID:
    """Submit, claim and checkpoint ``steps`` steps, then complete: 2 + ``steps`` events."""
    job_id = await submit(store)
    if steps or finish:
        lease = (await claim_all(store, [job_id]))[job_id]
        for step in range(steps):
            await checkpoint(store, lease, step)
        if finish:
            await store.runs.complete(lease, result={"steps": steps}, verdict="done")
    return job_id


async def drain(relay: OutboxRelay, store: Store, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while await store.outbox.pending_count():
        assert time.monotonic() < deadline, "outbox did not drain"
        await relay.relay_once()


def consume(bootstrap: str, topic: str, count: int, timeout_s: float = 60.0) -> list[Any]:
    """Read ``count`` messages from the start of ``topic`` (all partitions)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"relay-test-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    messages: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(messages) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            messages.append(message)
    finally:
        consumer.close()
    return messages


async def outbox_ids(store: Store, job_id: uuid.UUID) -> list[int]:
    return [record.id for record in await store.outbox.events_for(job_id)]


# --------------------------------------------------------------------------- formats


async def test_protobuf_events_decode_through_confluent_deserializer(
    store: Store, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(kafka_bootstrap)
    registry = mock_registry()
    relay = make_relay(
        store, kafka_bootstrap, topic, event_serializer(registry=registry, topic=topic)
    )
    jobs = [await run_job(store, steps=2) for _ in range(3)]

    await drain(relay, store)
    await relay.stop()

    messages = await asyncio.to_thread(consume, kafka_bootstrap, topic, 12)
    assert len(messages) == 12
    deserialize = ProtobufDeserializer(WorkflowRunEvent, None, registry)
    by_job: dict[str, list[WorkflowRunEvent]] = defaultdict(list)
    for message in messages:
        value = message.value()
        assert value[0] == 0, "Confluent framing: magic byte"
        event = deserialize(value, SerializationContext(topic, MessageField.VALUE))
        assert message.key() == event.job_id.encode()
        by_job[event.job_id].append(event)
    for job_id in jobs:
        events = by_job[str(job_id)]
        names = [WorkflowRunEvent.Type.Name(event.type) for event in events]
        assert names == [
            "TYPE_ACCEPTED",
            "TYPE_STEP_CHECKPOINT",
            "TYPE_STEP_CHECKPOINT",
            "TYPE_COMPLETED",
        ]
        assert [event.event_id for event in events] == await outbox_ids(store, job_id)
        assert [event.step_name for event in events[1:3]] == ["step0", "step1"]
        assert events[-1].verdict == "done"
        records = await store.outbox.events_for(job_id)
        assert {record.status for record in records} == {"PUBLISHED"}
        assert all(record.published_at is not None for record in records)


async def test_without_registry_events_are_plain_protobuf(
    store: Store, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(kafka_bootstrap)
    relay = make_relay(store, kafka_bootstrap, topic, event_serializer(registry=None, topic=topic))
    job_id = await run_job(store, steps=1)

    await drain(relay, store)
    await relay.stop()

    messages = await asyncio.to_thread(consume, kafka_bootstrap, topic, 3)
    events = []
    for message in messages:
        event = WorkflowRunEvent()
        event.ParseFromString(message.value())
        events.append(event)
    assert [event.event_id for event in events] == await outbox_ids(store, job_id)
    assert events == [EventDecoder().decode(message.value()) for message in messages]


async def test_events_reach_the_dev_stacks_tansu_broker(
    store: Store, tansu_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    # Tansu describes a topic's configuration without max.message.bytes.
    topic = new_topic(tansu_bootstrap)
    relay = make_relay(store, tansu_bootstrap, topic, event_serializer(registry=None, topic=topic))
    job_id = await run_job(store, steps=1)

    await drain(relay, store)
    await relay.stop()

    messages = await asyncio.to_thread(consume, tansu_bootstrap, topic, 3)
    events = [EventDecoder().decode(message.value()) for message in messages]
    assert [event.event_id for event in events] == await outbox_ids(store, job_id)


async def test_a_new_producers_first_pass_is_not_held_by_its_first_connection(
    store: Store, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    # An idempotent producer given a batch before any broker connection was up
    # asked for its producer id too early, and librdkafka asks again only after
    # 500 ms: every new producer's first pass took more than half a second
    # (0.45 s here lies between that and the 0.08 s it takes now).
    topic = new_topic(kafka_bootstrap)
    # A broker that has just started hands out its first producer ids slowly.
    warm = Producer(producer_config(kafka_bootstrap))
    warm.produce(topic, key=b"warm-up", value=b"")
    assert await asyncio.to_thread(warm.flush, 30) == 0
    # The broker also answers "coordinator load in progress" while it takes a
    # new block of producer ids, once in a thousand producers (the suite makes
    # many): the least of three new relays' first passes is the measure.
    passes = []
    for _ in range(3):
        relay = make_relay(
            store, kafka_bootstrap, topic, event_serializer(registry=None, topic=topic)
        )
        await run_job(store, steps=1)
        started = time.monotonic()
        result = await relay.relay_once()
        passes.append(time.monotonic() - started)
        await relay.stop()
        assert result.published == 3
    assert min(passes) < 0.45, f"the first passes took {passes} s"


def relay_of_settings(store: Store, bootstrap: str, topic: str, **env: str) -> OutboxRelay:
    """The relay a process with these settings (``WFJOBS_*`` as ``env``) runs."""
    settings = Settings.from_env(
        {
            "DATABASE_URL": store.dsn,
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "WFJOBS_EVENTS_TOPIC": topic,
            "WFJOBS_WORKER_ID": "relay-test",
            **env,
        }
    )
    return build_relay(settings, store.outbox)


async def test_a_relay_alone_creates_its_topic_with_the_settings_shape(
    store: Store, kafka_bootstrap: str
) -> None:
    # No worker declares it: the broker would make it on first use with its
    # own partition count (3 here).
    topic = f"relay-made-{uuid.uuid4().hex[:10]}"
    relay = relay_of_settings(
        store, kafka_bootstrap, topic, WFJOBS_CREATE_TOPICS="true", WFJOBS_TOPIC_PARTITIONS="5"
    )
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    try:
        job_id = await run_job(store, steps=1)
        await drain(relay, store)
        await relay.stop()
        metadata = admin.list_topics(topic, timeout=10).topics[topic]
        assert metadata.error is None and len(metadata.partitions) == 5
        messages = await asyncio.to_thread(consume, kafka_bootstrap, topic, 3)
        assert len(messages) == 3
        assert {message.key() for message in messages} == {str(job_id).encode()}
    finally:
        for future in admin.delete_topics([topic]).values():
            future.result(timeout=30)


async def test_a_topic_the_broker_will_not_create_keeps_every_row_pending(
    store: Store, kafka_bootstrap: str
) -> None:
    topic = f"relay-refused-{uuid.uuid4().hex[:10]}"
    # One broker cannot hold two replicas.
    relay = relay_of_settings(
        store, kafka_bootstrap, topic, WFJOBS_CREATE_TOPICS="true", WFJOBS_TOPIC_REPLICAS="2"
    )
    job_id = await run_job(store, steps=0, finish=False)
    result = await relay.relay_once()
    await relay.stop()
    assert (result.transient, result.failed, result.published) == (1, 0, 0), result
    [record] = await store.outbox.events_for(job_id)
    assert (record.status, record.attempts) == ("PENDING", 0)
    assert f"cannot create {topic}" in (record.last_error or "")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    assert topic not in admin.list_topics(timeout=10).topics


async def test_avro_events_round_trip(
    store: Store, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(kafka_bootstrap)
    registry = mock_registry()
    serializer = event_serializer(registry=registry, topic=topic, event_format="avro")
    relay = make_relay(store, kafka_bootstrap, topic, serializer)
    job_id = await run_job(store, steps=2)

    await drain(relay, store)
    await relay.stop()

    messages = await asyncio.to_thread(consume, kafka_bootstrap, topic, 4)
    deserialize = AvroDeserializer(registry)
    decoder = EventDecoder(registry)
    records = []
    for message in messages:
        context = SerializationContext(topic, MessageField.VALUE)
        record = deserialize(message.value(), context)
        records.append(record)
        assert avro_record_to_event(record) == decoder.decode(message.value())
    assert [record["event_id"] for record in records] == await outbox_ids(store, job_id)
    assert [record["type"] for record in records] == [
        "TYPE_ACCEPTED",
        "TYPE_STEP_CHECKPOINT",
        "TYPE_STEP_CHECKPOINT",
        "TYPE_COMPLETED",
    ]
    assert records[1]["response"] == '{"n":0}'
    assert records[3]["verdict"] == "done"
    assert records[3]["result"] == '{"steps":2}'


# --------------------------------------------------------------------------- failures


async def test_an_unreachable_broker_spends_no_attempt_and_fails_nothing(
    store: Store, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    dead_broker = f"127.0.0.1:{free_port()}"
    relay = make_relay(
        store,
        dead_broker,
        "workflow-run-events",
        event_serializer(registry=None, topic="workflow-run-events"),
        overrides={"message.timeout.ms": 300, "reconnect.backoff.max.ms": 100},
    )
    job_id = await run_job(store, steps=0, finish=False)

    # Each pass waits out the message timeout and spends no attempt. An outage
    # longer than the old attempt limit of ten is test_relay_outage's.
    for _ in range(3):
        result = await relay.relay_once()
        assert (result.transient, result.failed, result.published) == (1, 0, 0)
        [record] = await store.outbox.events_for(job_id)
        assert (record.status, record.attempts, record.published_at) == ("PENDING", 0, None)
        assert record.last_error and "timed out" in record.last_error.lower()
    await relay.stop()

    # The broker comes back (here: a relay that can reach one) and the row goes out.
    topic = new_topic(kafka_bootstrap)
    healthy = make_relay(
        store, kafka_bootstrap, topic, event_serializer(registry=None, topic=topic)
    )
    assert (await healthy.relay_once()).published == 1
    await healthy.stop()
    [record] = await store.outbox.events_for(job_id)
    assert (record.status, record.attempts) == ("PUBLISHED", 1)


async def test_unable_to_publish_counts_from_the_start_of_the_first_pass_that_failed(
    store: Store,
) -> None:
    # The first pass waits out the whole message timeout before it learns the
    # broker is away; those seconds are already time the relay could not publish.
    relay = OutboxRelay(
        store.outbox,
        producer_config=producer_config(
            f"127.0.0.1:{free_port()}",
            {"reconnect.backoff.max.ms": 100},
            message_timeout_ms=2000,
        ),
        topic="workflow-run-events",
        serializer=event_serializer(registry=None, topic="workflow-run-events"),
        stuck_after_s=1.5,
    )
    await run_job(store, steps=0, finish=False)
    started = time.monotonic()
    result = await relay.relay_once()
    assert (result.transient, result.published) == (1, 0)
    assert time.monotonic() - started > 1.5
    part = relay.health()
    await relay.stop()
    assert not part.healthy, part
    assert part.summary.startswith("cannot publish for"), part.summary
    assert part.detail["unable_to_publish_s"] >= 1.5, part


async def test_a_registry_that_never_answers_is_an_outage_the_relay_reports(
    store: Store, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(kafka_bootstrap)
    # Takes connections into its backlog and never answers them, as a
    # registry behind a stalled proxy does.
    with socket.create_server(("127.0.0.1", 0), backlog=64) as silent:
        relay = relay_of_settings(
            store,
            kafka_bootstrap,
            topic,
            WFJOBS_SCHEMA_REGISTRY_URL=f"http://127.0.0.1:{silent.getsockname()[1]}",
        )
        job_id = await run_job(store, steps=0, finish=False)
        try:
            result = await asyncio.wait_for(relay.relay_once(), timeout=90)
        finally:
            # Resets whatever is still waiting in the backlog.
            silent.close()
        assert (result.transient, result.failed, result.published) == (1, 0, 0)
        [record] = await store.outbox.events_for(job_id)
        assert (record.status, record.attempts) == ("PENDING", 0)
        assert record.last_error and "schema registry" in record.last_error
        health = relay.health()
        assert health.summary.startswith("retrying after: schema registry"), health.summary
    await relay.stop()


class _RegistryStub(BaseHTTPRequestHandler):
    """Answers in the Schema Registry's content type."""

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _RefusingRegistry(_RegistryStub):
    """A registry that takes the compatibility level and refuses the schema, 409."""

    def do_GET(self) -> None:
        self._answer(404, {"error_code": 40408, "message": "Subject has no level"})

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._answer(200, {"compatibility": "BACKWARD"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._answer(409, {"error_code": 409, "message": "Schema is incompatible"})

    def log_message(self, format: str, *args: Any) -> None:
        pass


async def test_a_registry_refusing_the_schema_dead_letters_no_event(
    store: Store, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    # The schema is the deployment's, the same for every event: refused, it is
    # fixed by an operator, and until then every row waits, none is FAILED.
    topic = new_topic(kafka_bootstrap)
    with serving(_RefusingRegistry) as url:
        relay = relay_of_settings(store, kafka_bootstrap, topic, WFJOBS_SCHEMA_REGISTRY_URL=url)
        jobs = [await run_job(store, steps=0, finish=False) for _ in range(3)]
        for _ in range(2):
            result = await relay.relay_once()
            assert (result.transient, result.failed, result.published) == (3, 0, 0), result
        await relay.stop()
    for job_id in jobs:
        [record] = await store.outbox.events_for(job_id)
        assert (record.status, record.attempts) == ("PENDING", 0)
        assert record.last_error and "409" in record.last_error, record.last_error
    health = relay.health()
    assert health.summary.startswith("retrying after: schema registry"), health.summary
    assert "incompatible" in health.summary


class _RegistryBehindAuth(_RegistryStub):
    """A registry that answers 401 until ``open`` is set, then takes the schema."""

    open = threading.Event()

    def _refused(self) -> bool:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.open.is_set():
            return False
        self._answer(401, {"error_code": 401, "message": "Unauthorized"})
        return True

    def do_GET(self) -> None:
        if not self._refused():
            self._answer(404, {"error_code": 40408, "message": "Subject has no level"})

    def do_PUT(self) -> None:
        if not self._refused():
            self._answer(200, {"compatibility": "BACKWARD"})

    def do_POST(self) -> None:
        if not self._refused():
            self._answer(200, {"id": 7})

    def log_message(self, format: str, *args: Any) -> None:
        pass


async def test_a_publish_outage_logs_one_warning_with_the_reason_and_one_line_when_it_ends(
    store: Store,
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = new_topic(kafka_bootstrap)

    class Registry(_RegistryBehindAuth):
        open = threading.Event()

    with serving(Registry) as url, caplog.at_level(logging.INFO, logger="streams.relay"):
        host = url.removeprefix("http://")
        relay = relay_of_settings(
            store,
            kafka_bootstrap,
            topic,
            WFJOBS_SCHEMA_REGISTRY_URL=f"http://user:s3cret@{host}",
            WFJOBS_EVENT_FORMAT="avro",
            WFJOBS_RELAY_INTERVAL_S="0.05",
            WFJOBS_RELAY_BACKOFF_MAX_S="0.1",
        )
        job_id = await run_job(store, steps=0, finish=False)
        await relay.start()
        try:
            deadline = time.monotonic() + 60
            while relay.stats.failing_passes < 8:
                assert time.monotonic() < deadline, "the relay did not keep trying"
                await asyncio.sleep(0.05)
            Registry.open.set()
            while (await store.outbox.events_for(job_id))[0].status != "PUBLISHED":
                assert time.monotonic() < deadline, "the relay did not publish again"
                await asyncio.sleep(0.05)
        finally:
            await relay.stop()

    lines = [r for r in caplog.records if r.name == "streams.relay"]
    warnings = [r.getMessage() for r in lines if r.levelno == logging.WARNING]
    [warning] = warnings
    assert "401" in warning and f"http://***@{host}" in warning, warning
    assert "s3cret" not in "\n".join(r.getMessage() for r in lines)
    [again] = [r for r in lines if "publishing again" in r.getMessage()]
    assert again.levelno == logging.INFO


async def test_a_broker_that_is_away_is_logged_once_not_on_every_pass(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    relay = make_relay(
        store,
        f"127.0.0.1:{free_port()}",
        "workflow-run-events",
        event_serializer(registry=None, topic="workflow-run-events"),
        overrides={"message.timeout.ms": 300, "reconnect.backoff.max.ms": 100},
    )
    await run_job(store, steps=0, finish=False)
    with caplog.at_level(logging.INFO, logger="streams.relay"):
        for _ in range(3):
            assert (await relay.relay_once()).transient == 1
    await relay.stop()
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "timed out" in warning.lower(), warning


class _OutboxAway(Outbox):
    """An outbox whose first ``passes`` relay batches fail the way a store that
    is down does."""

    passes = 0

    async def relay_batch(
        self, publish: Publisher, limit: int = 100, *, owner: str = "relay"
    ) -> RelayResult:
        if self.passes:
            self.passes -= 1
            raise psycopg.OperationalError("connection refused")
        return await super().relay_batch(publish, limit, owner=owner)


async def test_a_store_outage_is_a_line_on_the_first_failed_pass_and_every_tenth(
    store: Store,
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = new_topic(kafka_bootstrap)
    outbox = _OutboxAway(store.pool)
    outbox.passes = 25
    relay = OutboxRelay(
        outbox,
        producer_config=producer_config(kafka_bootstrap),
        topic=topic,
        serializer=event_serializer(registry=None, topic=topic),
        interval_s=0.01,
        backoff_max_s=0.02,
    )
    job_id = await run_job(store, steps=0, finish=False)
    with caplog.at_level(logging.INFO, logger="streams.relay"):
        await relay.start()
        try:
            deadline = time.monotonic() + 60
            while (await store.outbox.events_for(job_id))[0].status != "PUBLISHED":
                assert time.monotonic() < deadline, "the relay did not publish after the outage"
                await asyncio.sleep(0.05)
        finally:
            await relay.stop()
    assert relay.stats.errors == 25
    failed = [r for r in caplog.records if "pass failed" in r.getMessage()]
    assert [r.getMessage().split(" in a row")[0] for r in failed] == [
        "relay: pass failed (1",
        "relay: pass failed (10",
        "relay: pass failed (20",
    ]
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in failed)
    assert "connection refused" in failed[0].getMessage()


async def test_a_row_that_cannot_be_serialized_fails_at_once_with_the_reason(
    store: Store,
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = new_topic(kafka_bootstrap)
    registry = mock_registry()
    relay = make_relay(
        store,
        kafka_bootstrap,
        topic,
        event_serializer(registry=registry, topic=topic, event_format="avro"),
    )
    broken, healthy = uuid.uuid4(), await run_job(store, steps=0, finish=False)
    async with store.pool.connection() as conn:
        await conn.execute(
            "INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)"
            " VALUES (%s, 'ACCEPTED', %s), (%s, 'COMPLETED', %s)",
            (broken, b"\xff\xff", broken, b""),
        )

    with caplog.at_level(logging.ERROR, logger="streams.relay"):
        result = await relay.relay_once()
    await relay.stop()

    assert (result.published, result.failed, result.held_back) == (1, 1, 1)
    bad, behind = await store.outbox.events_for(broken)
    assert (bad.status, bad.attempts) == ("FAILED", 1)
    assert bad.last_error and bad.last_error.startswith("cannot serialize event")
    # The job's later row waits behind its dead letter.
    assert (behind.status, behind.attempts, behind.last_error) == ("PENDING", 0, None)
    [good] = await store.outbox.events_for(healthy)
    assert good.status == "PUBLISHED"
    [logged] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert str(bad.id) in logged.getMessage() and str(broken) in logged.getMessage()
    # A JSON log line about a job names it in its own field.
    assert getattr(logged, "job_id", None) == str(broken)


def _topic_with_max_message_bytes(bootstrap: str, max_bytes: int) -> str:
    name = f"small-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(name, 1, 1, config={"max.message.bytes": str(max_bytes)})
    admin.create_topics([topic], operation_timeout=30)[name].result(timeout=30)
    deadline = time.monotonic() + 30
    while True:
        meta = admin.list_topics(topic=name, timeout=5).topics.get(name)
        if meta is not None and meta.error is None and meta.partitions[0].leader >= 0:
            return name
        assert time.monotonic() < deadline, f"topic {name} has no leader"
        time.sleep(0.05)


async def test_a_record_larger_than_the_topic_allows_fails_at_once_and_holds_back_its_job(
    store: Store, kafka_bootstrap: str
) -> None:
    # One partition: every row goes into the same produce requests, so the
    # small rows batched with the large one are refused with it at first.
    topic = await asyncio.to_thread(_topic_with_max_message_bytes, kafka_bootstrap, 2048)
    relay = make_relay(store, kafka_bootstrap, topic, event_serializer(registry=None, topic=topic))
    before, oversized, after = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    async with store.pool.connection() as conn:
        for job_id, payload in (
            (before, b""),
            (oversized, b""),
            (oversized, b"\x52" + b"\x00" * 8000),
            (oversized, b""),
            (after, b""),
        ):
            await conn.execute(
                "INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)"
                " VALUES (%s, 'STEP_CHECKPOINT', %s)",
                (job_id, payload),
            )

    result = await relay.relay_once()
    await relay.stop()

    assert (result.published, result.failed, result.held_back) == (3, 1, 1)
    first, big, behind = await store.outbox.events_for(oversized)
    assert first.status == "PUBLISHED"
    assert (big.status, big.attempts) == ("FAILED", 1)
    assert big.last_error and "MSG_SIZE_TOO_LARGE" in big.last_error
    assert (behind.status, behind.attempts) == ("PENDING", 0)
    for job_id in (before, after):
        assert [r.status for r in await store.outbox.events_for(job_id)] == ["PUBLISHED"]

    # Held back on every later pass too, until the FAILED row is redriven.
    relay = make_relay(store, kafka_bootstrap, topic, event_serializer(registry=None, topic=topic))
    assert (await relay.relay_once()).fetched == 0
    await relay.stop()


async def test_a_topic_taking_less_than_a_batch_keeps_each_jobs_order(
    store: Store, kafka_bootstrap: str
) -> None:
    # The producer fills a batch up to batch.size; one the topic refuses as a
    # whole must not let a later, smaller batch carry a job's later event in
    # before its earlier one goes again. (batch.size stands in for the default
    # 1 MB against a topic that takes less.)
    topic = await asyncio.to_thread(_topic_with_max_message_bytes, kafka_bootstrap, 2048)
    relay = make_relay(
        store,
        kafka_bootstrap,
        topic,
        event_serializer(registry=None, topic=topic),
        overrides={"batch.size": 4096},
    )
    job_id = uuid.uuid4()
    others = [(uuid.uuid4(), b"\x52" + b"\x00" * 600) for _ in range(7)]
    async with store.pool.connection() as conn:
        for owner, payload in [(job_id, b""), *others, (job_id, b"")]:
            await conn.execute(
                "INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)"
                " VALUES (%s, 'STEP_CHECKPOINT', %s)",
                (owner, payload),
            )

    result = await relay.relay_once()
    await relay.stop()

    assert (result.published, result.failed) == (9, 0), result
    messages = await asyncio.to_thread(consume, kafka_bootstrap, topic, 9)
    decoder = EventDecoder()
    sent = [decoder.decode(m.value()).event_id for m in messages if m.key() == str(job_id).encode()]
    assert sent == await outbox_ids(store, job_id)


async def test_a_compressed_record_over_the_topics_limit_is_left_to_the_broker(
    store: Store, kafka_bootstrap: str
) -> None:
    # Compressed, a record larger than max.message.bytes may fit: only the
    # broker can tell, so it is sent rather than failed before.
    topic = await asyncio.to_thread(_topic_with_max_message_bytes, kafka_bootstrap, 2048)
    relay = make_relay(
        store,
        kafka_bootstrap,
        topic,
        event_serializer(registry=None, topic=topic),
        overrides={"compression.type": "lz4"},
    )
    async with store.pool.connection() as conn:
        await conn.execute(
            "INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)"
            " VALUES (%s, 'STEP_CHECKPOINT', %s)",
            (uuid.uuid4(), b"\x52" + b"\x00" * 8000),
        )
    result = await relay.relay_once()
    await relay.stop()
    assert (result.published, result.failed) == (1, 0), result


# --------------------------------------------------------------------------- order


async def test_two_relays_keep_each_jobs_commit_order(
    store: Store, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(kafka_bootstrap, 3)
    registry = mock_registry()
    relays = [
        make_relay(
            store,
            kafka_bootstrap,
            topic,
            event_serializer(registry=registry, topic=topic),
            batch=7,
            interval_s=0.01,
            name=f"relay-{n}",
        )
        for n in range(2)
    ]
    for relay in relays:
        await relay.start()
    # Events are written while both relays drain, commit point by commit point
    # across all jobs, so each job's events land in many different batches and
    # the two relays keep meeting the same jobs.
    jobs = 40
    steps = 4
    job_ids = [await submit(store) for _ in range(jobs)]
    leases = await claim_all(store, job_ids)
    for step in range(steps):
        await asyncio.gather(*(checkpoint(store, leases[job], step) for job in job_ids))
        await asyncio.sleep(0.02)
    await asyncio.gather(
        *(store.runs.complete(leases[job], result={}, verdict="done") for job in job_ids)
    )
    deadline = time.monotonic() + 60
    while await store.outbox.pending_count():
        assert time.monotonic() < deadline, "outbox did not drain"
        await asyncio.sleep(0.05)
    for relay in relays:
        await relay.stop()

    total = jobs * (steps + 2)
    messages = await asyncio.to_thread(consume, kafka_bootstrap, topic, total)
    assert len(messages) >= total
    decoder = EventDecoder(registry)
    seen: dict[str, list[int]] = defaultdict(list)
    for message in messages:
        event = decoder.decode(message.value())
        if event.event_id not in seen[event.job_id]:  # consumers dedupe on event_id
            seen[event.job_id].append(event.event_id)
    for job_id in job_ids:
        assert seen[str(job_id)] == await outbox_ids(store, job_id)
    assert all(relay.stats.published > 0 for relay in relays), "both relays took part"


# --------------------------------------------------------------------------- loop


class WrappedOutbox:
    """The real outbox, for a relay; subclasses look at or slow down its passes."""

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox

    async def backlog(self) -> Backlog:
        return await self._outbox.backlog()


class SlowPass(WrappedOutbox):
    """The real outbox, with a pause at the start of every publish.

    It marks when a pass is in flight, so a test can stop the relay right there.
    """

    def __init__(self, outbox: Outbox) -> None:
        super().__init__(outbox)
        self.in_flight = asyncio.Event()

    async def relay_batch(
        self, publish: Publish, limit: int = 100, *, owner: str = "relay"
    ) -> RelayResult:
        async def slow(rows: list[Any]) -> Sequence[PublishFailure | None]:
            self.in_flight.set()
            await asyncio.sleep(0.3)
            return await publish(rows)

        return await self._outbox.relay_batch(slow, limit, owner=owner)


async def test_stop_finishes_the_pass_in_flight_and_flushes(
    store: Store, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(kafka_bootstrap)
    jobs = [await run_job(store, steps=1) for _ in range(5)]
    slow = SlowPass(store.outbox)
    relay = OutboxRelay(
        slow,
        producer_config=producer_config(kafka_bootstrap),
        topic=topic,
        serializer=event_serializer(registry=None, topic=topic),
        interval_s=60.0,
    )
    await relay.start()
    await asyncio.wait_for(slow.in_flight.wait(), timeout=30)
    await relay.stop()

    # Stopping did not cut the pass short: every row it held is acked and marked.
    assert await store.outbox.pending_count() == 0
    for job_id in jobs:
        assert {r.status for r in await store.outbox.events_for(job_id)} == {"PUBLISHED"}
    messages = await asyncio.to_thread(consume, kafka_bootstrap, topic, 15)
    assert len(messages) == 15
    assert relay.stats.published == 15


async def test_a_stop_gives_up_a_pass_the_broker_does_not_acknowledge(
    store: Store, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """With the broker away a pass would wait out the whole message timeout; a
    stop waits ``stop_wait_s`` for it, then hands its rows back, unleased and
    with no attempt spent, for the next relay."""
    jobs = [await run_job(store, steps=1) for _ in range(3)]
    relay = OutboxRelay(
        store.outbox,
        producer_config=producer_config(f"127.0.0.1:{free_port()}", {"message.timeout.ms": 60_000}),
        topic="workflow-run-events",
        serializer=event_serializer(registry=None, topic="workflow-run-events"),
        interval_s=60.0,
        stop_wait_s=0.5,
    )
    await relay.start()

    async def leased() -> bool:
        async with store.pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT count(*) FROM workflow_run_events_outbox WHERE lease_owner IS NOT NULL"
            )
            row = await cursor.fetchone()
        return row is not None and row[0] > 0

    deadline = time.monotonic() + 30
    while not await leased():
        assert time.monotonic() < deadline, "no pass leased the rows"
        await asyncio.sleep(0.05)
    began = time.monotonic()
    await relay.stop()
    assert time.monotonic() - began < 10

    assert not await leased()
    for job_id in jobs:
        records = await store.outbox.events_for(job_id)
        assert {(r.status, r.attempts) for r in records} == {("PENDING", 0)}
    assert relay.stats.published == 0

    # The next relay, with a broker, takes them at once: no pause was left on them.
    topic = new_topic(kafka_bootstrap)
    healthy = make_relay(
        store, kafka_bootstrap, topic, event_serializer(registry=None, topic=topic)
    )
    await drain(healthy, store, timeout_s=30)
    await healthy.stop()
    assert len(await asyncio.to_thread(consume, kafka_bootstrap, topic, 9)) == 9


class SilentStore(WrappedOutbox):
    """The real outbox until a pass has published; then the store never answers it."""

    def __init__(self, outbox: Outbox) -> None:
        super().__init__(outbox)
        self.published = asyncio.Event()

    async def relay_batch(
        self, publish: Publish, limit: int = 100, *, owner: str = "relay"
    ) -> RelayResult:
        async def then_silence(rows: list[Any]) -> Sequence[PublishFailure | None]:
            outcomes = await publish(rows)
            self.published.set()
            await asyncio.Event().wait()
            return outcomes

        return await self._outbox.relay_batch(then_silence, limit, owner=owner)


async def test_a_stop_ends_when_the_store_never_answers_the_pass_in_flight(
    store: Store, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """Past ``stop_wait_s`` and the settle's own wait, the pass is cancelled: a
    store gone silent must not hold the process's stop for ever. Its rows stay
    leased, for the next relay once the lease passes."""
    topic = new_topic(kafka_bootstrap)
    job_id = await run_job(store, steps=1)
    silent = SilentStore(store.outbox)
    relay = OutboxRelay(
        silent,
        producer_config=producer_config(kafka_bootstrap),
        topic=topic,
        serializer=event_serializer(registry=None, topic=topic),
        interval_s=60.0,
        stop_wait_s=0.5,
    )
    await relay.start()
    await asyncio.wait_for(silent.published.wait(), timeout=30)
    began = time.monotonic()
    await asyncio.wait_for(relay.stop(), timeout=30)
    assert time.monotonic() - began < 0.5 + 2 * SETTLE_WAIT_S + 1
    records = await store.outbox.events_for(job_id)
    assert {r.status for r in records} == {"PENDING"}


async def test_a_relay_that_cannot_publish_stays_stuck_while_another_one_holds_the_rows(
    store: Store, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    dead_broker = f"127.0.0.1:{free_port()}"
    overrides = {"message.timeout.ms": 300, "reconnect.backoff.max.ms": 100}
    slow = SlowPass(store.outbox)

    def unreachable(outbox: Any, name: str) -> OutboxRelay:
        return OutboxRelay(
            outbox,
            producer_config=producer_config(dead_broker, overrides),
            topic="workflow-run-events",
            serializer=event_serializer(registry=None, topic="workflow-run-events"),
            stuck_after_s=1.0,
            name=name,
        )

    first, second = unreachable(store.outbox, "first"), unreachable(slow, "second")
    # A job held back by its dead letter: its later row waits for an operator,
    # not for a relay.
    held = await run_job(store, steps=0)
    async with store.pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run_events_outbox SET status = 'FAILED' WHERE id = %s",
            (min(await outbox_ids(store, held)),),
        )
    job_id = await run_job(store, steps=0, finish=False)
    try:
        assert (await first.relay_once()).transient == 1
        await asyncio.sleep(1.2)
        assert not first.health().healthy

        # The broker is still away and the other relay has the row at the
        # moment this one looks: it is no less stuck for finding nothing.
        taking = asyncio.create_task(second.relay_once())
        await asyncio.wait_for(slow.in_flight.wait(), timeout=30)
        assert (await first.relay_once()).fetched == 0
        health = first.health()
        assert not health.healthy, health
        assert health.summary.startswith("cannot publish for"), health.summary
        assert (await taking).transient == 1

        # Another relay reaches a broker and publishes the row: nothing waits
        # for this one any more, so it is not stuck, although it never published.
        topic = new_topic(kafka_bootstrap)
        reaching = make_relay(
            store, kafka_bootstrap, topic, event_serializer(registry=None, topic=topic)
        )
        assert (await reaching.relay_once()).published == 1
        await reaching.stop()
        assert [r.status for r in await store.outbox.events_for(job_id)] == ["PUBLISHED"]
        assert (await first.relay_once()).fetched == 0
        health = first.health()
        assert health.healthy and health.summary == "ok", health
    finally:
        await first.stop()
        await second.stop()


class LeaseOutrun(WrappedOutbox):
    """The real outbox, whose every pass outlasts its lease before it settles."""

    def __init__(self, outbox: Outbox, pool: Any) -> None:
        super().__init__(outbox)
        self._pool = pool

    async def relay_batch(
        self, publish: Publish, limit: int = 100, *, owner: str = "relay"
    ) -> RelayResult:
        async def outrun(rows: list[Any]) -> Sequence[PublishFailure | None]:
            outcomes = await publish(rows)
            # The pass took longer than WFJOBS_RELAY_LEASE_S and another relay,
            # as slow, took the rows meanwhile (its lease already run out too):
            # the settle finds them no longer this relay's.
            async with self._pool.connection() as conn:
                await conn.execute(
                    "UPDATE workflow_run_events_outbox SET lease_owner = 'another relay',"
                    " lease_until = now() - interval '1 s' WHERE id = ANY(%s)",
                    ([row.id for row in rows],),
                )
            return outcomes

        return await self._outbox.relay_batch(outrun, limit, owner=owner)


async def test_a_relay_whose_passes_outlast_their_lease_is_stuck(
    store: Store, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    # Every pass sends its rows, then finds them no longer its own: they are
    # sent again and again and never marked, which is no less stuck than a
    # broker that never answers.
    topic = new_topic(kafka_bootstrap)
    relay = OutboxRelay(
        LeaseOutrun(store.outbox, store.pool),
        producer_config=producer_config(kafka_bootstrap, {}),
        topic=topic,
        serializer=event_serializer(registry=None, topic=topic),
        stuck_after_s=1.0,
    )
    await run_job(store, steps=0)
    try:
        first = await relay.relay_once()
        assert (first.fetched, first.published, first.lost) == (2, 0, 2)
        await asyncio.sleep(1.2)
        assert (await relay.relay_once()).lost == 2
        health = relay.health()
        assert not health.healthy, health
        assert "lease" in health.summary and "WFJOBS_RELAY_LEASE_S" in health.summary, health
    finally:
        await relay.stop()


async def test_notify_wakes_an_idle_relay(
    store: Store, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(kafka_bootstrap)
    # The process's shared LISTEN connection, as the runtime wires it.
    listener = Listener(store.dsn, JOBS_QUEUED_CHANNEL, OUTBOX_CHANNEL)
    await listener.start()
    relay = make_relay(
        store,
        kafka_bootstrap,
        topic,
        event_serializer(registry=None, topic=topic),
        interval_s=60.0,
        wake=listener.subscribe(OUTBOX_CHANNEL),
    )
    await relay.start()
    try:
        # Let the first (empty) pass run and the relay go idle for a minute.
        await asyncio.sleep(1.0)
        job_id = await run_job(store, steps=0, finish=False)
        started = time.monotonic()
        while (await store.outbox.events_for(job_id))[0].status != "PUBLISHED":
            assert time.monotonic() - started < 15, "NOTIFY did not wake the relay"
            await asyncio.sleep(0.05)
    finally:
        await relay.stop()
        await listener.stop()
    messages = await asyncio.to_thread(consume, kafka_bootstrap, topic, 1)
    assert EventDecoder().decode(messages[0].value()).job_id == str(job_id)


class PassClock(WrappedOutbox):
    """The real outbox, noting when each pass starts and ends and how many rows it leased."""

    def __init__(self, outbox: Outbox) -> None:
        super().__init__(outbox)
        self.passes: list[tuple[float, float, int]] = []

    async def relay_batch(
        self, publish: Publish, limit: int = 100, *, owner: str = "relay"
    ) -> RelayResult:
        started = time.monotonic()
        result = await self._outbox.relay_batch(publish, limit, owner=owner)
        self.passes.append((started, time.monotonic(), result.fetched))
        return result


async def test_a_woken_relay_lingers_after_a_partial_pass_only(
    store: Store, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(kafka_bootstrap)
    clock = PassClock(store.outbox)
    wake = asyncio.Event()
    relay = OutboxRelay(
        clock,
        producer_config=producer_config(kafka_bootstrap),
        topic=topic,
        serializer=event_serializer(registry=None, topic=topic),
        interval_s=60.0,
        batch=2,
        linger_s=1.0,
        wake=wake,
    )
    await relay.start()
    try:
        deadline = time.monotonic() + 30
        while not clock.passes:  # its first pass, empty, before any row
            assert time.monotonic() < deadline, "the relay never made its first pass"
            await asyncio.sleep(0.02)
        # Five rows at once: two full passes back to back, then a partial one.
        for _ in range(5):
            await submit(store)
        first_woken = time.monotonic()
        wake.set()
        while await store.outbox.pending_count():
            assert time.monotonic() < deadline, "the relay did not drain"
            await asyncio.sleep(0.02)
        # A row arrives and its NOTIFY wakes the relay at once, right after the partial pass.
        await submit(store)
        woken = time.monotonic()
        wake.set()
        while await store.outbox.pending_count():
            assert time.monotonic() < deadline, "the relay did not publish the late row"
            await asyncio.sleep(0.02)
    finally:
        await relay.stop()
    published = [entry for entry in clock.passes if entry[2]]
    assert [fetched for _, _, fetched in published] == [2, 2, 1, 1], clock.passes
    (first_start, first_end, _), (second_start, second_end, _), (third_start, _, _) = published[:3]
    # The empty pass before them found nothing to wait for: the first rows go at once.
    assert first_start - first_woken < 0.5, clock.passes
    # After a full pass the next one starts at once, linger or not.
    assert second_start - first_end < 0.5, clock.passes
    assert third_start - second_end < 0.5, clock.passes
    # The late row waited until a second after the partial pass began, and no longer.
    last_start = published[3][0]
    assert last_start - third_start >= 1.0, clock.passes
    assert last_start - woken < 2.0, clock.passes


def test_a_relay_refuses_a_negative_linger(store: Store) -> None:
    with pytest.raises(ValueError, match="linger_s"):
        OutboxRelay(
            store.outbox,
            producer_config=producer_config("127.0.0.1:9"),
            topic="t",
            serializer=event_serializer(registry=None, topic="t"),
            linger_s=-0.1,
        )


async def test_rows_that_keep_failing_while_others_publish_are_named_not_stuck(
    store: Store, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(kafka_bootstrap)
    relay = make_relay(store, kafka_bootstrap, topic, event_serializer(registry=None, topic=topic))
    held = await run_job(store, steps=0, finish=False)
    sent = relay.publish

    async def one_job_refused(rows: Sequence[Any]) -> list[PublishFailure | None]:
        # A passing fault that keeps coming back for this one job's partition.
        outcomes = await sent([row for row in rows if row.job_id != held])
        answers = iter(outcomes)
        return [
            PublishFailure("delivery failed: leader not available", permanent=False)
            if row.job_id == held
            else next(answers)
            for row in rows
        ]

    relay.publish = one_job_refused  # type: ignore[method-assign]
    for _ in range(3):
        await run_job(store, steps=0, finish=False)
        # The held row waits out its short pause before it is leased again.
        await asyncio.sleep(0.2)
        result = await relay.relay_once()
        assert (result.published, result.transient) == (1, 1), result

    # The relay publishes, so restarting it would not help: healthy, and it says why
    # one row still waits.
    part = relay.health()
    assert part.healthy, part
    assert part.summary == (
        "publishing; 1 row(s) of the last pass handed back after: "
        "delivery failed: leader not available"
    ), part
    assert part.detail["retrying_rows"] == 1, part
    [record] = await store.outbox.events_for(held)
    assert (record.status, record.attempts) == ("PENDING", 0)
    await relay.stop()
