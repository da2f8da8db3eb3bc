"""A worker process's JSON log lines and the trace a request topic message carries."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streams.tracing import headers_of
from tests.e2e.conftest import PARTITIONS
from tests.e2e.harness import Stack, type_name
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
