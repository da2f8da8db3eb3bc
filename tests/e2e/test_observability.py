"""A worker process's JSON log lines and the trace a request topic message carries."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from devstack.processes import free_port
from streams.tracing import headers_of
from tests.e2e.conftest import PARTITIONS
from tests.e2e.harness import Stack, type_name, wait_until
from tests.workflows_fixtures import envelope

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{CLIENT_TRACE}-b7ad6b7169203331-01"


def json_lines(text: str) -> list[dict[str, Any]]:
    found = []
    for line in text.splitlines():
        if line.startswith("{"):
            found.append(json.loads(line))
    return found


async def test_a_worker_logs_json_lines_about_a_job_in_the_trace_its_request_carried(
    stack: Stack,
) -> None:
    worker = await stack.start_worker(
        "json-1",
        WFJOBS_LOG_FORMAT="json",
        WFJOBS_TRACING="on",
        # Spans are made and propagated, and exported nowhere.
        WFJOBS_TRACING_EXPORTER="none",
    )
    workflow = envelope(name="logged", review=None)
    await stack.put_workflow(worker, workflow)
    job_id = stack.produce_request(
        "logged",
        {"text": "this one fails", "fail": "NON_RETRYABLE"},
        headers=[("traceparent", TRACEPARENT.encode())],
    )
    stack.flush()
    job = await stack.wait_for_job(job_id, {"FAILED"})
    # The request agent read the header through Faust and stored the trace.
    assert job.traceparent is not None and job.traceparent.split("-")[1] == CLIENT_TRACE

    reader = stack.event_reader(PARTITIONS)
    try:
        await reader.wait(lambda events: "FAILED" in [type_name(e) for e in events])
        carried = [
            headers_of(headers)
            for event, headers in zip(reader.events, reader.headers, strict=True)
            if event.job_id == str(job_id)
        ]
    finally:
        reader.close()
    assert carried and all(c is not None for c in carried)
    assert {c.traceparent.split("-")[1] for c in carried if c is not None} == {CLIENT_TRACE}

    text = worker.log_path.read_text().splitlines()
    lines = json_lines("\n".join(text))
    assert lines, "\n".join(text[-20:])
    # Every line is JSON but Faust's start banner, which the ``faust`` command
    # prints before the worker exists (``faust --quiet`` leaves it out).
    first = next(n for n, line in enumerate(text) if line.startswith("{"))
    assert len(lines) == len(text) - first
    for line in lines:
        assert {"timestamp", "level", "logger", "message", "worker_id"} <= set(line)
    # Faust's and mode's own lines come out as JSON too, not only the service's.
    assert any(line["logger"].startswith(("faust", "mode")) for line in lines)
    about = [line for line in lines if line.get("job_id") == str(job_id)]
    failed = [line for line in about if "FAILED" in line["message"]]
    assert failed, [line["message"] for line in lines[-20:]]
    for line in failed:
        assert line["attempt"] == 1
        assert line["worker_id"] == "json-1"
        assert line["trace_id"] == CLIENT_TRACE
        assert len(line["span_id"]) == 16


async def test_a_worker_logs_plain_text_by_default(stack: Stack) -> None:
    worker = await stack.start_worker("text-1")
    text = worker.log_path.read_text()
    assert "runtime started" in text
    assert not json_lines(text)


@contextlib.asynccontextmanager
async def otlp_receiver() -> AsyncIterator[tuple[str, list[Any]]]:
    """An OTLP/HTTP traces endpoint on 127.0.0.1: what it was sent, as spans."""
    received: list[Any] = []

    async def traces(request: web.Request) -> web.Response:
        batch = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in batch.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                received.extend(scope_spans.spans)
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/v1/traces", received
    finally:
        await runner.cleanup()


async def test_the_default_exporter_sends_a_jobs_spans_over_otlp(stack: Stack) -> None:
    async with otlp_receiver() as (endpoint, received):
        # WFJOBS_TRACING_EXPORTER left at its default, otlp; the SDK's own
        # variables name the endpoint and a short batching delay.
        worker = await stack.start_worker(
            "otlp-1",
            WFJOBS_TRACING="on",
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=endpoint,
            OTEL_BSP_SCHEDULE_DELAY="100",
        )
        await stack.put_workflow(worker, envelope(name="exported", review=None))
        job_id = stack.produce_request("exported", {"text": "send my spans"})
        stack.flush()
        await stack.wait_for_job(job_id, {"COMPLETED"})

        def of_job() -> list[Any]:
            return [
                span
                for span in received
                if any(
                    a.key == "wfjobs.job_id" and a.value.string_value == str(job_id)
                    for a in span.attributes
                )
            ]

        async def exported() -> list[Any] | None:
            names = {span.name for span in of_job()}
            wanted = {"submit", "claim", "segment", "step tokenize", "step embed", "publish"}
            return of_job() if wanted <= names else None

        spans = await wait_until(exported, timeout_s=30)
    # One trace, from the request's submit to the events' publication.
    assert len({span.trace_id for span in spans}) == 1


async def test_the_console_exporter_prints_a_jobs_spans_to_the_workers_output(
    stack: Stack,
) -> None:
    worker = await stack.start_worker(
        "console-1",
        WFJOBS_TRACING="on",
        WFJOBS_TRACING_EXPORTER="console",
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    await stack.put_workflow(worker, envelope(name="printed", review=None))
    job_id = stack.produce_request("printed", {"text": "print my spans"})
    stack.flush()
    await stack.wait_for_job(job_id, {"COMPLETED"})

    async def printed() -> bool | None:
        text = worker.log_path.read_text()
        return (
            True if f'"wfjobs.job_id": "{job_id}"' in text and '"name": "segment"' in text else None
        )

    await wait_until(printed, timeout_s=30)
