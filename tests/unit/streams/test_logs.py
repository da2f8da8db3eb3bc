"""JSON log lines: the standard fields, and the job a line is about."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from streams import logs


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    logger = logging.getLogger(f"wfjobs-test-{id(stream)}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(logging.StreamHandler(stream))
    yield logger, stream
    logger.handlers.clear()


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_the_job_the_worker_and_the_trace(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = captured
    logs.install(logger, log_format="json", worker_id="w-1", trace_ids=lambda: ("a" * 32, "b" * 16))
    logger.info("not about a job")
    with logs.about_job("job-1", 2):
        logger.warning("job %s failed", "job-1")
    logger.info("named here", extra={"job_id": "job-2", "attempt": 1})
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("with a traceback")

    first, second, third, fourth = lines(stream)
    assert first["message"] == "not about a job" and "job_id" not in first
    assert first["worker_id"] == "w-1" and first["level"] == "INFO"
    assert first["logger"] == logger.name and first["timestamp"].endswith("+00:00")
    assert (second["job_id"], second["attempt"], second["message"]) == (
        "job-1",
        2,
        "job job-1 failed",
    )
    assert (second["trace_id"], second["span_id"]) == ("a" * 32, "b" * 16)
    assert (third["job_id"], third["attempt"]) == ("job-2", 1)
    assert "ValueError: boom" in fourth["exception"]


def test_the_job_passes_to_tasks_started_while_it_runs(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = captured
    logs.install(logger, log_format="json", worker_id="w-1")

    async def run() -> None:
        with logs.about_job("job-3", 1):
            await asyncio.create_task(asyncio.sleep(0))
            await asyncio.get_running_loop().create_task(_log(logger))
        logger.info("after")

    asyncio.run(run())
    inside, after = lines(stream)
    assert inside["job_id"] == "job-3" and "trace_id" not in inside
    assert "job_id" not in after


async def _log(logger: logging.Logger) -> None:
    logger.info("inside")


def test_text_keeps_the_handlers_own_format(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    logs.install(logger, log_format="text", worker_id="w-1")
    with logs.about_job("job-1", 1):
        logger.info("plain")
    assert stream.getvalue() == "plain\n"


def test_a_kafka_client_line_that_repeats_is_written_once_a_minute_with_a_count() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    now = [1000.0]
    handler.addFilter(logs.RepeatedLines(window_s=60.0, clock=lambda: now[0]))
    client = logging.getLogger(f"aiokafka.conn.test-{id(stream)}")
    ours = logging.getLogger(f"streams.test-{id(stream)}")
    for logger in (client, ours):
        logger.propagate = False
        logger.addHandler(handler)
    try:
        for second in range(120):
            now[0] = 1000.0 + second
            client.error("Unable connect to node with id %s: %s", 1, f"refused {second}")
            client.error("Unable to update metadata from [%s]", 1)
            if second < 3:
                ours.warning("the service's own line %d", second)
        written = stream.getvalue().splitlines()
    finally:
        for logger in (client, ours):
            logger.handlers.clear()
    assert written == [
        "Unable connect to node with id 1: refused 0",
        "Unable to update metadata from [1]",
        "the service's own line 0",
        "the service's own line 1",
        "the service's own line 2",
        "Unable connect to node with id 1: refused 60"
        " (59 more like this in the last 60s not logged)",
        "Unable to update metadata from [1] (59 more like this in the last 60s not logged)",
    ]


def test_install_limits_repeated_kafka_client_lines_in_text_too(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = captured
    logs.install(logger, log_format="text", worker_id="w-1")
    client = logging.getLogger("aiokafka.client")
    # Only for this test: the client's lines reach this handler alone.
    client.addHandler(logger.handlers[0])
    propagate, client.propagate = client.propagate, False
    try:
        for _ in range(50):
            client.error("Unable connect to %s", "127.0.0.1:9")
    finally:
        client.removeHandler(logger.handlers[0])
        client.propagate = propagate
    assert stream.getvalue().splitlines() == ["Unable connect to 127.0.0.1:9"]


def test_repeated_lines_keeps_few_books_on_messages_that_never_repeat() -> None:
    now = [0.0]
    repeated = logs.RepeatedLines(window_s=60.0, clock=lambda: now[0])
    logger = logging.getLogger("aiokafka.test-books")
    for second in range(5000):
        now[0] = float(second)
        record = logger.makeRecord(
            logger.name, logging.INFO, __file__, 1, f"offset {second}", None, None
        )
        assert repeated.filter(record)
    assert len(repeated._seen) <= 1024


def test_repeated_lines_are_judged_once_for_every_handler() -> None:
    # A root logger may have two handlers (a log file and the terminal): the
    # second one's filter saw the first line as a repeat and left it out.
    now = [1000.0]
    repeated = logs.RepeatedLines(window_s=60.0, clock=lambda: now[0])
    streams = [io.StringIO(), io.StringIO()]
    client = logging.getLogger("aiokafka.test-two-handlers")
    client.propagate = False
    for stream in streams:
        handler = logging.StreamHandler(stream)
        handler.addFilter(repeated)
        client.addHandler(handler)
    try:
        for second in range(61):
            now[0] = 1000.0 + second
            client.error("Unable connect to %s", "127.0.0.1:9")
    finally:
        client.handlers.clear()
    for stream in streams:
        assert stream.getvalue().splitlines() == [
            "Unable connect to 127.0.0.1:9",
            "Unable connect to 127.0.0.1:9 (59 more like this in the last 60s not logged)",
        ]
