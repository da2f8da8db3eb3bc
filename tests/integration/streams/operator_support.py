"""Shared by the event-size and redrive tests: a runtime on real Kafka, topic readers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from cli.main import main as cli_main
from schemas.contract import EventType, WorkflowRunEvent, decode_event
from streams.runtime import Runtime
from streams.settings import Settings
from tests.workflows_fixtures import make_registry

T = TypeVar("T")

# Short clocks, so loops answer within a test's patience.
FAST: Mapping[str, str] = {
    "WFJOBS_POLL_INTERVAL_S": "0.1",
    "WFJOBS_RELAY_INTERVAL_S": "0.1",
    "WFJOBS_WORKER_ID": "operator-test",
}


@contextlib.asynccontextmanager
async def running(env: Mapping[str, str]) -> AsyncIterator[Runtime]:
    """A started runtime (claim loops, relay: whatever ``WFJOBS_ROLES`` says)."""
    runtime = Runtime(Settings.from_env({**FAST, **env}), registry=make_registry())
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.stop()


async def eventually(
    probe: Callable[[], Awaitable[T | None]], what: str, timeout_s: float = 30.0
) -> T:
    """``probe()`` until it answers something other than None (or False)."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = await probe()
        if answer is not None and answer is not False:
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def read_topic(bootstrap: str, topic: str, count: int, *, timeout_s: float = 30.0) -> list[Message]:
    """The first ``count`` messages of ``topic`` (every partition), in arrival order."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"operator-test-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        messages: list[Message] = []
        deadline = time.monotonic() + timeout_s
        while len(messages) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: {len(messages)} of {count} messages arrived")
            message = consumer.poll(0.2)
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                raise AssertionError(f"{topic}: {error.str()}")
            if error is None:
                messages.append(message)
        return messages
    finally:
        consumer.close()


def read_events(
    bootstrap: str, topic: str, count: int, *, timeout_s: float = 30.0
) -> list[WorkflowRunEvent]:
    """Plain-Protobuf events (no registry configured), in arrival order."""
    return [
        decode_event(message.value() or b"")
        for message in read_topic(bootstrap, topic, count, timeout_s=timeout_s)
    ]


def kinds(events: list[WorkflowRunEvent]) -> list[str]:
    return [EventType.Name(event.type).removeprefix("TYPE_") for event in events]


def env_for(dsn: str, bootstrap: str, **more: Any) -> dict[str, str]:
    return {"DATABASE_URL": dsn, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, **more}


class Wfjobs:
    """``wfjobs --url URL ...`` in a thread, its exit code and output captured."""

    def __init__(self, url: str, capsys: Any) -> None:
        self._url = url
        self._capsys = capsys

    async def __call__(self, *argv: str) -> tuple[int, str, str]:
        self._capsys.readouterr()
        code = await asyncio.to_thread(cli_main, ["--url", self._url, *argv])
        captured = self._capsys.readouterr()
        return code, captured.out, captured.err

    async def json(self, *argv: str) -> dict[str, Any]:
        code, out, err = await self("--json", *argv)
        assert code == 0, err
        answer: dict[str, Any] = json.loads(out)
        return answer
