"""Worker processes and Kafka plumbing for the end-to-end tests.

Each test gets a ``Stack``: its own migrated database, its own topics
(requests, dead letters, events), its own consumer group and its own in-process
mock Schema Registry URL. Workers are real processes running the
``faust -A streams.app worker`` command line from the repository root, forked by
the session's fork server (``tests.forkserver``), stopped by pid at teardown
(and SIGKILLed by pid when a test wants a crash). Workers run with auth on: the
stack makes a fleet-wide token with every scope before its first worker
starts, and ``Stack.headers`` carries it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from devstack.processes import Launch, ServiceError, free_port
from devstack.stack import WorkerProcess, worker_environment
from schemas.contract import EventType, WorkflowRunEvent, WorkflowRunRequest
from schemas.serde import EventDecoder, encode_request, open_registry
from store.outbox import Outbox
from store.pool import Pool
from store.records import Job
from store.runs import RunStore
from store.tokens import create_token
from streams.auth import SCOPES

REPO_ROOT = Path(__file__).resolve().parents[2]
HANDLERS_MODULE = "tests.e2e.handlers"

# Short clocks so retries, leases and sweeps happen within seconds. New jobs
# and new events wake the loops by NOTIFY; the intervals only bound how late
# a retry, an expired lease or a relay's retry is noticed, and every poll of an
# idle worker costs CPU the whole suite shares.
FAST_SETTINGS: Mapping[str, str] = {
    "WFJOBS_LEASE_S": "3",
    "WFJOBS_RETRY_BASE_S": "0.2",
    "WFJOBS_POLL_INTERVAL_S": "0.5",
    "WFJOBS_SWEEP_INTERVAL_S": "1",
    "WFJOBS_RELAY_INTERVAL_S": "0.5",
    # A killed relay's leased rows wait out the lease before another relay
    # takes them; the lease must outlast the producer's message timeout.
    "WFJOBS_RELAY_MESSAGE_TIMEOUT_MS": "3000",
    "WFJOBS_RELAY_LEASE_S": "5",
    "WFJOBS_SHUTDOWN_GRACE_S": "3",
    "WFJOBS_CLAIM_LOOPS": "2",
    "WFJOBS_POOL_MAX": "8",
}

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


def self_provisioning_worker(
    name: str,
    *,
    dsn: str,
    bootstrap: str,
    settings: Mapping[str, str],
    tmp: Path,
    launch: Launch,
) -> WorkerProcess:
    """A worker with every role that reaches Kafka only as ``settings`` say.

    It creates its own topics and migrates its own database, so everything it
    does with Kafka (the admin client included) goes the way the settings
    describe: a test of a security mode gives it nothing else.
    """
    suffix = uuid.uuid4().hex[:10]
    env = worker_environment(
        database_url=dsn,
        bootstrap_servers=bootstrap,
        worker_id=f"{name}-1",
        web_port=free_port(),
        data_dir=tmp / "faust",
        handlers=(HANDLERS_MODULE,),
        extra={
            **FAST_SETTINGS,
            **settings,
            "WFJOBS_GROUP": f"{name}-{suffix}",
            "WFJOBS_CREATE_TOPICS": "true",
            "WFJOBS_TOPIC_PARTITIONS": "1",
            "WFJOBS_AUTO_MIGRATE": "true",
            "WFJOBS_BROKER_SESSION_TIMEOUT_S": "6",
        },
    )
    return WorkerProcess(env, workdir=tmp, name=name, cwd=REPO_ROOT, launch=launch)


def stack_topics(
    new_topic: Callable[..., str],
    bootstrap: str,
    *,
    prefix: str = "e2e",
    partitions: int = 3,
    requests: str | None = None,
) -> dict[str, str]:
    """A stack's own topics, made before any worker subscribes (see ``Stack``).

    ``requests`` names an existing requests topic to use instead of a new one.
    """
    return {
        "requests": requests or new_topic(bootstrap, partitions, prefix=f"{prefix}-requests"),
        "dlq": new_topic(bootstrap, 1, prefix=f"{prefix}-requests-dlq"),
        "events": new_topic(bootstrap, partitions, prefix=f"{prefix}-events"),
        "completions": new_topic(bootstrap, 1, prefix=f"{prefix}-completions"),
        "completion_results": new_topic(bootstrap, 1, prefix=f"{prefix}-completion-results"),
    }


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
        launch: Launch,
    ) -> None:
        self.dsn = dsn
        self.bootstrap = bootstrap
        self.requests_topic = topics["requests"]
        self.dlq_topic = topics["dlq"]
        self.events_topic = topics["events"]
        # Topics of the stack's own, made before a worker subscribes: a topic the
        # broker creates later changes the group's metadata and rebalances it.
        self.completions_topic = topics["completions"]
        self.completion_results_topic = topics["completion_results"]
        self.group = f"e2e-{uuid.uuid4().hex[:10]}"
        # confluent-kafka's mock registry lives inside one process. Every process
        # that opens it through schemas.serde.open_registry registers the
        # contract's schemas in the same order, so the worker's ids and ours agree.
        self.registry_url = f"mock://e2e-{uuid.uuid4().hex[:10]}"
        self.registry = open_registry(
            self.registry_url,
            events_topic=self.events_topic,
            requests_topic=self.requests_topic,
            completions_topic=self.completions_topic,
            completion_results_topic=self.completion_results_topic,
        )
        self.tmp = tmp
        self.launch = launch
        self.calls_path = tmp / "calls.log"
        self.pool = pool
        self.runs = RunStore(pool)
        self.outbox = Outbox(pool)
        self.workers: list[WorkerProcess] = []
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.token = ""

    @property
    def headers(self) -> dict[str, str]:
        """The ``Authorization`` header of the stack's token (made by ``start_worker``)."""
        assert self.token, "no worker started yet, so no token was made"
        return {"Authorization": f"Bearer {self.token}"}

    # ------------------------------------------------------------------ workers

    def worker_env(self, worker_id: str, **overrides: str) -> dict[str, str]:
        return worker_environment(
            database_url=self.dsn,
            bootstrap_servers=self.bootstrap,
            worker_id=worker_id,
            web_port=free_port(),
            data_dir=self.tmp / f"faust-{worker_id}",
            handlers=(HANDLERS_MODULE,),
            extra={
                **FAST_SETTINGS,
                "WFJOBS_REQUESTS_TOPIC": self.requests_topic,
                "WFJOBS_REQUESTS_DLQ_TOPIC": self.dlq_topic,
                "WFJOBS_EVENTS_TOPIC": self.events_topic,
                "WFJOBS_COMPLETIONS_TOPIC": self.completions_topic,
                "WFJOBS_COMPLETION_RESULTS_TOPIC": self.completion_results_topic,
                "WFJOBS_GROUP": self.group,
                "WFJOBS_SCHEMA_REGISTRY_URL": self.registry_url,
                "WFJOBS_E2E_CALLS": str(self.calls_path),
                **overrides,
            },
        )

    async def start_worker(self, worker_id: str, **overrides: str) -> WorkerProcess:
        """A worker process, once its ``/healthz`` answers (web up, store reachable)."""
        if not self.token:
            self.token = (await create_token(self.dsn, "e2e", SCOPES)).token
        worker = WorkerProcess(
            self.worker_env(worker_id, **overrides),
            workdir=self.tmp,
            name=worker_id,
            # The repository root, so the worker imports ``tests.e2e.handlers``.
            cwd=REPO_ROOT,
            launch=self.launch,
        )
        self.workers.append(worker)
        try:
            await asyncio.to_thread(worker.start, timeout_s=60.0)
        except ServiceError as exc:
            raise AssertionError(f"worker {worker_id} did not start: {exc}") from None
        return worker

    async def put_workflow(self, worker: WorkerProcess, workflow: Mapping[str, Any]) -> None:
        """Store ``workflow`` through ``worker``'s HTTP API, as an operator would."""
        async with httpx.AsyncClient(base_url=worker.url, timeout=10, headers=self.headers) as http:
            put = await http.put(
                f"/v1/workflows/{workflow['name']}", json={"workflow": dict(workflow)}
            )
        assert put.status_code in (200, 201), put.text

    def stop_workers(self) -> None:
        for worker in reversed(self.workers):
            worker.stop(timeout_s=15)

    # ------------------------------------------------------------------ requests

    def produce_keyed(self, topic: str, *, key: bytes | None, value: bytes) -> None:
        """Queue one raw message; ``flush`` sends it."""
        self._producer.produce(topic, value=value, key=key)

    def produce_request(
        self,
        workflow_name: str,
        input: Mapping[str, Any],
        *,
        job_id: uuid.UUID | str | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> uuid.UUID:
        """A ``WorkflowRunRequest`` framed through the registry, keyed by its job id."""
        job = uuid.UUID(str(job_id)) if job_id is not None else uuid.uuid4()
        request = WorkflowRunRequest(job_id=str(job), workflow_name=workflow_name)
        request.input.update(dict(input))
        value = encode_request(request, registry=self.registry, topic=self.requests_topic)
        self._producer.produce(
            self.requests_topic, value=value, key=str(job).encode(), headers=headers
        )
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
        # The Kafka value of each event, as it was on the topic, and its headers.
        self.values: list[bytes] = []
        self.headers: list[list[tuple[str, bytes]]] = []

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
            value = message.value()
            self.events.append(self._decoder.decode(value, topic=self._topic))
            self.values.append(value)
            self.headers.append(message.headers() or [])

    def for_job(self, job_id: uuid.UUID | str) -> list[WorkflowRunEvent]:
        return [event for event in self.events if event.job_id == str(job_id)]

    def values_for(self, job_id: uuid.UUID | str) -> list[bytes]:
        return [
            value
            for event, value in zip(self.events, self.values, strict=True)
            if event.job_id == str(job_id)
        ]

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
