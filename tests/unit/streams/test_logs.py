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
