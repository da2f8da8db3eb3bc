"""Worker processes and Kafka plumbing for the end-to-end tests.

Each test gets a ``Stack``: its own migrated database, its own topics
(requests, dead letters, events), its own consumer group and its own in-process
mock Schema Registry URL. Workers are real ``faust -A streams.app worker``
processes started from the repository root, stopped by pid at teardown (and
SIGKILLed by pid when a test wants a crash).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from schemas.contract import EventType, WorkflowRunEvent, WorkflowRunRequest
from schemas.serde import EventDecoder, encode_request, open_registry
from store.outbox import Outbox
from store.pool import Pool
from store.runs import Job, RunStore
from streams.services import ManagedProcess, free_port, log_tail

REPO_ROOT = Path(__file__).resolve().parents[2]
FAUST = Path(sys.executable).with_name("faust")
HANDLERS_MODULE = "tests.e2e.handlers"

# Short clocks so retries, leases and sweeps happen within seconds.
FAST_SETTINGS: Mapping[str, str] = {
    "WFJOBS_LEASE_S": "3",
    "WFJOBS_RETRY_BASE_S": "0.2",
    "WFJOBS_POLL_INTERVAL_S": "0.3",
    "WFJOBS_SWEEP_INTERVAL_S": "0.5",
    "WFJOBS_RELAY_INTERVAL_S": "0.1",
    "WFJOBS_SHUTDOWN_GRACE_S": "3",
    "WFJOBS_CLAIM_LOOPS": "4",
    "WFJOBS_POOL_MAX": "8",
}

# Our variables and Faust's unprefixed ones never leak from the test environment.
_SCRUBBED_PREFIXES = ("WFJOBS_", "F_", "FAUST_")
_SCRUBBED = {"DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS"}

TYPE_NAMES = {number: name.removeprefix("TYPE_") for name, number in EventType.items()}

T = TypeVar("T")


def type_name(event: WorkflowRunEvent) -> str:
    return TYPE_NAMES[event.type]


@dataclass(frozen=True)
class Call:
    worker: str
    method: str
    job_id: str
    attempt: int


class WorkerProcess:
    def __init__(self, name: str, env: Mapping[str, str], log_path: Path) -> None:
        self.name = name
        self.env = dict(env)
        self.port = int(env["WFJOBS_WEB_PORT"])
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.process = ManagedProcess(
            f"worker-{name}",
            [str(FAUST), "-A", "streams.app", "worker", "-l", "info"],
            log_path=log_path,
            env=self.env,
            cwd=REPO_ROOT,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 80) -> str:
        return log_tail(self.log_path, lines)

    async def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until ``/healthz`` answers 200 (web server up, store reachable)."""
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(base_url=self.url, timeout=2.0) as client:
            while True:
                code = self.process.exit_code()
                if code is not None:
                    raise AssertionError(
                        f"worker {self.name} exited with {code} while starting:\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get("/healthz")).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"worker {self.name} not ready after {timeout_s}s:\n{self.log_tail()}"
                    )
                await asyncio.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no hand-back, the lease simply stops being extended."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.process.stop(timeout_s=10)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        self.process.stop(timeout_s=timeout_s)
        return self.process.exit_code()


class Stack:
    """One test's database, topics, registry and workers."""

    def __init__(
        self,
        *,
        dsn: str,
        bootstrap: str,
        topics: Mapping[str, str],
        tmp: Path,
        pool: Pool,
    ) -> None:
        self.dsn = dsn
        self.bootstrap = bootstrap
        self.requests_topic = topics["requests"]
        self.dlq_topic = topics["dlq"]
        self.events_topic = topics["events"]
        self.group = f"e2e-{uuid.uuid4().hex[:10]}"
        # confluent-kafka's mock registry lives inside one process. Every process
        # that opens it through schemas.serde.open_registry registers the
        # contract's schemas in the same order, so the worker's ids and ours agree.
        self.registry_url = f"mock://e2e-{uuid.uuid4().hex[:10]}"
        self.registry = open_registry(
            self.registry_url,
            events_topic=self.events_topic,
            requests_topic=self.requests_topic,
        )
        self.tmp = tmp
        self.calls_path = tmp / "calls.log"
        self.pool = pool
        self.runs = RunStore(pool)
        self.outbox = Outbox(pool)
        self.workers: list[WorkerProcess] = []
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})

    # ------------------------------------------------------------------ workers

    def worker_env(self, worker_id: str, **overrides: str) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(_SCRUBBED_PREFIXES) and key not in _SCRUBBED
        }
        env.update(FAST_SETTINGS)
        env.update(
            {
                "DATABASE_URL": self.dsn,
                "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
                "WFJOBS_WORKER_ID": worker_id,
                "WFJOBS_WEB_PORT": str(free_port()),
                "WFJOBS_REQUESTS_TOPIC": self.requests_topic,
                "WFJOBS_REQUESTS_DLQ_TOPIC": self.dlq_topic,
                "WFJOBS_EVENTS_TOPIC": self.events_topic,
                "WFJOBS_GROUP": self.group,
                "WFJOBS_SCHEMA_REGISTRY_URL": self.registry_url,
                "WFJOBS_HANDLERS": HANDLERS_MODULE,
                "WFJOBS_DATA_DIR": str(self.tmp / f"faust-{worker_id}"),
                "WFJOBS_E2E_CALLS": str(self.calls_path),
            }
        )
        env.update(overrides)
        return env

    async def start_worker(self, worker_id: str, **overrides: str) -> WorkerProcess:
        worker = WorkerProcess(
            worker_id,
            self.worker_env(worker_id, **overrides),
            self.tmp / f"worker-{worker_id}.log",
        )
        self.workers.append(worker)
        await worker.wait_ready()
        return worker

    def stop_workers(self) -> None:
        for worker in reversed(self.workers):
            worker.stop(timeout_s=15)

    # ------------------------------------------------------------------ requests

    def produce_keyed(self, topic: str, *, key: bytes | None, value: bytes) -> None:
        """Queue one raw message; ``flush`` sends it."""
        self._producer.produce(topic, value=value, key=key)

    def produce_request(
        self, workflow_name: str, input: Mapping[str, Any], *, job_id: uuid.UUID | str | None = None
    ) -> uuid.UUID:
        """A ``WorkflowRunRequest`` framed through the registry, keyed by its job id."""
        job = uuid.UUID(str(job_id)) if job_id is not None else uuid.uuid4()
        request = WorkflowRunRequest(job_id=str(job), workflow_name=workflow_name)
        request.input.update(dict(input))
        value = encode_request(request, registry=self.registry, topic=self.requests_topic)
        self._producer.produce(self.requests_topic, value=value, key=str(job).encode())
        return job

    def flush(self) -> None:
        self._producer.flush(10)

    # ------------------------------------------------------------------ reading back

    def calls(self) -> list[Call]:
        if not self.calls_path.exists():
            return []
        found = []
        for line in self.calls_path.read_text().splitlines():
            worker, method, job_id, attempt = line.split()
            found.append(Call(worker, method, job_id, int(attempt)))
        return found

    def calls_for(self, job_id: uuid.UUID | str, method: str | None = None) -> list[Call]:
        return [
            call
            for call in self.calls()
            if call.job_id == str(job_id) and (method is None or call.method == method)
        ]

    async def job(self, job_id: uuid.UUID | str) -> Job:
        return await self.runs.get(job_id)

    async def wait_for_job(
        self,
        job_id: uuid.UUID | str,
        statuses: Iterable[str],
        *,
        timeout_s: float = 30.0,
    ) -> Job:
        wanted = set(statuses)
        last: Job | None = None

        async def check() -> Job | None:
            nonlocal last
            with contextlib.suppress(Exception):
                last = await self.runs.get(job_id)
            return last if last is not None and last.status in wanted else None

        try:
            return await wait_until(check, timeout_s=timeout_s)
        except TimeoutError:
            raise AssertionError(
                f"job {job_id} not in {sorted(wanted)} after {timeout_s}s: {last}\n"
                + self.worker_logs()
            ) from None

    def worker_logs(self, lines: int = 40) -> str:
        return "\n".join(
            f"--- worker {worker.name}:\n{worker.log_tail(lines)}" for worker in self.workers
        )

    def event_reader(self, partitions: int) -> EventReader:
        return EventReader(
            self.bootstrap, self.events_topic, partitions, EventDecoder(self.registry)
        )


class EventReader:
    """Reads the events topic from the beginning and decodes every value."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, decoder: EventDecoder) -> None:
        self._topic = topic
        self._decoder = decoder
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"e2e-reader-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
            }
        )
        # Assigned, not subscribed: no group rebalance to wait for.
        self._consumer.assign(
            [TopicPartition(topic, partition, OFFSET_BEGINNING) for partition in range(partitions)]
        )
        self.events: list[WorkflowRunEvent] = []

    def poll(self, seconds: float = 0.5) -> None:
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            message = self._consumer.poll(min(left, 0.2))
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise AssertionError(f"reading {self._topic}: {error}")
            self.events.append(self._decoder.decode(message.value(), topic=self._topic))

    def for_job(self, job_id: uuid.UUID | str) -> list[WorkflowRunEvent]:
        return [event for event in self.events if event.job_id == str(job_id)]

    async def wait(
        self, predicate: Callable[[list[WorkflowRunEvent]], bool], *, timeout_s: float = 30.0
    ) -> list[WorkflowRunEvent]:
        async def check() -> list[WorkflowRunEvent] | None:
            await asyncio.to_thread(self.poll, 0.3)
            return self.events if predicate(self.events) else None

        try:
            return await wait_until(check, timeout_s=timeout_s, interval_s=0.0)
        except TimeoutError:
            seen = [(event.job_id[:8], type_name(event), event.step_name) for event in self.events]
            raise AssertionError(f"events not as expected after {timeout_s}s; saw {seen}") from None

    def close(self) -> None:
        self._consumer.close()


async def wait_until(
    check: Callable[[], Awaitable[T | None]], *, timeout_s: float, interval_s: float = 0.1
) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        found = await check()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError
        await asyncio.sleep(interval_s)


def dedupe(events: Iterable[WorkflowRunEvent]) -> list[WorkflowRunEvent]:
    """First delivery of each ``event_id``: delivery is at least once."""
    seen: set[int] = set()
    unique = []
    for event in events:
        if event.event_id not in seen:
            seen.add(event.event_id)
            unique.append(event)
    return unique


def read_dlq(
    bootstrap: str, topic: str, partitions: int, count: int, timeout_s: float
) -> list[Any]:
    """``count`` messages of the dead-letter topic, as confluent ``Message`` objects."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"e2e-dlq-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign(
        [TopicPartition(topic, partition, OFFSET_BEGINNING) for partition in range(partitions)]
    )
    found: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(found) < count and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            found.append(message)
    finally:
        consumer.close()
    return found
