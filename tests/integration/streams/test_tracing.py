"""One job is one trace: submit, claim, segment, steps and the events on Kafka.

The runtime runs in the test process with every role, on the real Postgres and
the real Apache Kafka, with a tracer provider whose spans the test reads from
an in-memory exporter. The events are consumed from the topic itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from schemas.contract import WorkflowRunEvent, WorkflowRunRequest
from schemas.serde import RequestDecoder
from store.records import Job
from streams.app import create_app
from streams.auth import SCOPES
from streams.request_agent import Message, RequestHandler
from streams.runtime import Runtime
from streams.settings import Settings
from streams.tracing import Tracing, headers_of, incoming
from tests.integration.streams.conftest import bearer
from tests.workflows_fixtures import envelope, make_registry

pytestmark = pytest.mark.kafka

WORKFLOW = envelope(name="traced", review="invoke")
COMPLETED = WorkflowRunEvent.Type.Value("TYPE_COMPLETED")
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
CLIENT_TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


class Traced:
    """A runtime with every role, its HTTP client, and the spans it made."""

    def __init__(
        self, runtime: Runtime, client: TestClient[Any, Any], spans: InMemorySpanExporter | None
    ) -> None:
        self.runtime = runtime
        self.client = client
        self.exporter = spans

    def spans_of(self, job_id: str) -> list[ReadableSpan]:
        assert self.exporter is not None
        return [
            span
            for span in self.exporter.get_finished_spans()
            if (span.attributes or {}).get("wfjobs.job_id") == job_id
        ]

    async def finished(self, job_id: str) -> Job:
        runs = self.runtime.require_runs()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            job = await runs.get(uuid.UUID(job_id))
            if job.status in {"COMPLETED", "FAILED", "DEAD"}:
                return job
            await asyncio.sleep(0.05)
        raise AssertionError(f"job {job_id} did not finish: {job}")


@pytest.fixture
def make_traced(
    dsn: str, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> Callable[..., contextlib.AbstractAsyncContextManager[Traced]]:
    @contextlib.asynccontextmanager
    async def traced(*, tracing: bool = True) -> AsyncIterator[Traced]:
        exporter = InMemorySpanExporter() if tracing else None
        provided: Tracing | None = None
        if exporter is not None:
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            provided = Tracing(provider, worker_id="trace-test")
        settings = Settings.from_env(
            {
                "DATABASE_URL": dsn,
                "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                "WFJOBS_EVENTS_TOPIC": new_topic(kafka_bootstrap, 1, prefix="traced-events"),
                "WFJOBS_ROLES": "api,relay,worker",
                "WFJOBS_WORKER_ID": "trace-test",
                "WFJOBS_POLL_INTERVAL_S": "0.2",
                "WFJOBS_RELAY_INTERVAL_S": "0.1",
            }
        )
        runtime = Runtime(settings, registry=make_registry(), tracing=provided)
        app = create_app(settings, runtime=runtime)
        await runtime.start()
        await runtime.wait_ready()
        await runtime.require_definitions().put(WORKFLOW["name"], WORKFLOW)
        headers = await bearer(dsn, "tracer", SCOPES)
        client = TestClient(TestServer(app.web.web_app), headers=headers)  # type: ignore[attr-defined]
        await client.start_server()
        try:
            yield Traced(runtime, client, exporter)
        finally:
            await client.close()
            await runtime.stop()

    return traced


async def submit(traced: Traced, headers: Mapping[str, str] | None = None) -> str:
    response = await traced.client.post(
        "/v1/workflow-runs",
        json={"workflow_name": WORKFLOW["name"], "input": {"text": "follow this job"}},
        headers=dict(headers or {}),
    )
    assert response.status == 201, await response.text()
    job_id: str = (await response.json())["job"]["job_id"]
    return job_id


def events_of(settings: Settings, job_id: str) -> list[tuple[WorkflowRunEvent, Any]]:
    """The job's events as the topic holds them, with their headers, up to COMPLETED."""
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap_servers,
            "group.id": f"trace-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(settings.events_topic, 0, OFFSET_BEGINNING)])
    found: list[tuple[WorkflowRunEvent, Any]] = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            event = WorkflowRunEvent.FromString(message.value())
            if event.job_id == job_id:
                found.append((event, message.headers()))
                if event.type == COMPLETED:
                    return found
    finally:
        consumer.close()
    raise AssertionError(f"no COMPLETED event for job {job_id}; saw {len(found)} events")


def trace_of(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.trace_id:032x}"


def span_id(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.span_id:016x}"


def parent_id(span: ReadableSpan) -> str | None:
    return None if span.parent is None else f"{span.parent.span_id:016x}"


def by_name(spans: list[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    named: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    return named


async def test_one_job_is_one_trace_from_submit_to_the_headers_of_its_events(
    make_traced: Callable[..., contextlib.AbstractAsyncContextManager[Traced]],
) -> None:
    async with make_traced() as traced:
        job_id = await submit(traced)
        job = await traced.finished(job_id)
        assert job.status == "COMPLETED"
        events = await asyncio.to_thread(events_of, traced.runtime.settings, job_id)
    # Read once the runtime stopped: a consumer may see an event before the
    # relay's pass has ended its publish span.
    spans = traced.spans_of(job_id)
    named = by_name(spans)
    assert sorted(named) == [
        "claim",
        "publish",
        "segment",
        "step embed",
        "step review",
        "step tokenize",
        "submit",
    ]
    [root] = named["submit"]
    trace = trace_of(root)
    assert root.parent is None
    assert {trace_of(span) for span in spans} == {trace}
    # The row stores the submit span's context: later spans are its children.
    assert job.traceparent is not None
    assert job.traceparent.startswith(f"00-{trace}-{span_id(root)}-")
    [segment] = named["segment"]
    assert parent_id(segment) == span_id(root)
    assert [parent_id(span) for span in named["claim"]] == [span_id(root)]
    for step in ("tokenize", "embed", "review"):
        [call] = named[f"step {step}"]
        assert parent_id(call) == span_id(segment)
    # Every event published (ACCEPTED, three checkpoints, COMPLETED) has its
    # publish span in the trace, and carries that span's context on Kafka.
    publish_ids = {span_id(span) for span in named["publish"]}
    assert {parent_id(span) for span in named["publish"]} == {span_id(root)}
    assert len(events) == 5
    for event, headers in events:
        carried = headers_of(headers)
        assert carried is not None, f"event {event.event_id} has no traceparent header"
        _, carried_trace, carried_span, _ = carried.traceparent.split("-")
        assert carried_trace == trace
        assert carried_span in publish_ids
    # Every span names its job and the process that made it; a run's spans their attempt.
    for span in spans:
        attributes = span.attributes or {}
        assert attributes.get("wfjobs.worker_id") == "trace-test", span.name
        if span.name not in ("submit", "publish"):
            assert attributes.get("wfjobs.attempt") == 1, span.name


async def test_a_traceparent_sent_on_submit_is_the_trace_the_job_joins(
    make_traced: Callable[..., contextlib.AbstractAsyncContextManager[Traced]],
) -> None:
    async with make_traced() as traced:
        job_id = await submit(
            traced, {"traceparent": CLIENT_TRACEPARENT, "tracestate": "vendor=opaque"}
        )
        job = await traced.finished(job_id)
        malformed = await submit(traced, {"traceparent": "00-not-a-trace-01"})
        await traced.finished(malformed)
    spans = traced.spans_of(job_id)
    other = traced.spans_of(malformed)
    named = by_name(spans)
    [root] = named["submit"]
    assert parent_id(root) == CLIENT_SPAN
    assert {trace_of(span) for span in spans} == {CLIENT_TRACE}
    assert job.tracestate == "vendor=opaque"
    assert {"claim", "segment", "step tokenize"} <= set(named)
    # A malformed traceparent is ignored: a new trace, and the submit succeeded.
    [fresh] = by_name(other)["submit"]
    assert fresh.parent is None and trace_of(fresh) != CLIENT_TRACE
    assert {trace_of(span) for span in other} == {trace_of(fresh)}


async def test_a_traceparent_on_a_request_topic_message_is_the_trace_the_job_joins(
    make_traced: Callable[..., contextlib.AbstractAsyncContextManager[Traced]],
) -> None:
    async with make_traced() as traced:
        handler = RequestHandler(
            traced.runtime,
            decoder=RequestDecoder(),
            dead_letter=_no_dead_letters,
            topic="requests",
        )
        job_id = str(uuid.uuid4())
        request = WorkflowRunRequest(job_id=job_id, workflow_name=WORKFLOW["name"])
        request.input.update({"text": "from the topic"})
        # As Faust hands the headers over: a list of (name, bytes).
        trace = headers_of([("traceparent", CLIENT_TRACEPARENT.encode())])
        [outcome] = await handler.handle_batch(
            [Message(job_id.encode(), request.SerializeToString(), trace)]
        )
        assert outcome.kind == "submitted"
        await traced.finished(job_id)
        events = await asyncio.to_thread(events_of, traced.runtime.settings, job_id)
    spans = traced.spans_of(job_id)
    named = by_name(spans)
    [root] = named["submit"]
    assert parent_id(root) == CLIENT_SPAN
    assert dict(root.attributes or {})["wfjobs.submit.via"] == "kafka"
    assert {trace_of(span) for span in spans} == {CLIENT_TRACE}
    assert {"claim", "segment", "step embed", "publish"} <= set(named)
    for _, headers in events:
        carried = headers_of(headers)
        assert carried is not None and carried.traceparent.split("-")[1] == CLIENT_TRACE


async def test_untraced_the_job_still_stores_what_the_client_sent(
    make_traced: Callable[..., contextlib.AbstractAsyncContextManager[Traced]],
) -> None:
    async with make_traced(tracing=False) as traced:
        assert traced.runtime.tracing is None
        job_id = await submit(traced, {"traceparent": CLIENT_TRACEPARENT})
        job = await traced.finished(job_id)
        events = await asyncio.to_thread(events_of, traced.runtime.settings, job_id)
    assert incoming(job.traceparent, None) is not None
    assert job.traceparent == CLIENT_TRACEPARENT
    # A relay that does not trace adds nothing to the events.
    assert all(not headers for _, headers in events)


async def test_a_request_whose_traceparent_holds_a_nul_is_submitted_untraced(
    make_traced: Callable[..., contextlib.AbstractAsyncContextManager[Traced]],
) -> None:
    # Untraced, the row would store the client's context as it came.
    async with make_traced(tracing=False) as traced:
        handler = RequestHandler(
            traced.runtime,
            decoder=RequestDecoder(),
            dead_letter=_no_dead_letters,
            topic="requests",
        )
        job_id = str(uuid.uuid4())
        request = WorkflowRunRequest(job_id=job_id, workflow_name=WORKFLOW["name"])
        request.input.update({"text": "from the topic"})
        future = f"cc-{CLIENT_TRACE}-{CLIENT_SPAN}-01-\x00"
        trace = headers_of([("traceparent", future.encode())])
        [outcome] = await handler.handle_batch(
            [Message(job_id.encode(), request.SerializeToString(), trace)]
        )
        assert outcome.kind == "submitted"
        job = await traced.finished(job_id)
    assert job.status == "COMPLETED" and job.traceparent is None


async def _no_dead_letters(key: bytes | None, value: bytes | None, reason: str) -> None:
    raise AssertionError(f"dead-lettered: {reason}")
