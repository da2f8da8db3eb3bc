"""A minute of steady work through a Postgres crash and two broker outages.

Its own Postgres (embedded, SIGKILLed on the postmaster and recovered on the
same port and data directory) and its own Apache Kafka (halted and resumed on
the same port, once for longer than the consumer session timeout), so the
shared servers other tests use are never touched. Two worker processes run
every role while jobs keep arriving through the HTTP API and the requests
topic. Afterwards every acknowledged submission is a job, every job is
terminal, no job was ever seen RUNNING past its lease plus its deadline, and
every event is published and on the topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import KafkaError, Message, Producer

from devstack.apache_kafka import ApacheKafkaService
from devstack.postgres import PostgresService
from devstack.stack import WorkerProcess
from schemas.contract import WorkflowRunRequest
from schemas.serde import encode_request
from store.migrate import migrate
from store.pool import Pool, open_pool
from tests.e2e.conftest import PARTITIONS
from tests.e2e.harness import Stack, dedupe, stack_topics, type_name, wait_until
from tests.forkserver import ForkServer
from tests.workflows_fixtures import envelope

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

SESSION_TIMEOUT_S = 6.0
LEASE_S = 3.0
DEADLINE_MS = 5_000
# What the sweeper may take on top of the bound before a row counts as stuck.
SWEEP_SLACK_S = 5.0
TERMINAL = {"COMPLETED", "FAILED", "DEAD"}
WORKER_SETTINGS = {
    "WFJOBS_BROKER_SESSION_TIMEOUT_S": str(SESSION_TIMEOUT_S),
    "WFJOBS_LEASE_S": str(LEASE_S),
    "WFJOBS_HEARTBEAT_S": "0.5",
    "WFJOBS_POOL_TIMEOUT_S": "3",
    "WFJOBS_STORE_RETRY_MAX_S": "2",
    "WFJOBS_MAX_ATTEMPTS": "10",
}

# Rows RUNNING past their bound: an expired lease the sweeper left, or a
# segment renewed without progress past its deadline plus the lease.
STUCK_SQL = """
SELECT job_id, lease_owner, lease_until, stall_at FROM workflow_run
 WHERE status = 'RUNNING'
   AND (lease_until < now() - %(slack)s * interval '1 second'
        OR (progress_token = lease_token AND stall_at < now() - %(slack)s * interval '1 second'))
"""


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[PostgresService]:
    # Commits durable before they are answered: the test server's default
    # (synchronous_commit off) may lose the last moment of commits to a crash.
    with PostgresService("", settings={"synchronous_commit": "on"}) as server:
        yield server


@pytest.fixture(scope="module")
def own_kafka() -> Iterator[ApacheKafkaService]:
    with ApacheKafkaService("") as broker:
        yield broker


@pytest.fixture
async def soak_stack(
    own_postgres: PostgresService,
    own_kafka: ApacheKafkaService,
    new_topic: Callable[..., str],
    tmp_path: Path,
    fork_server: ForkServer,
) -> AsyncIterator[Stack]:
    dsn = own_postgres.create_database("soak")
    await migrate(dsn)
    bootstrap = own_kafka.bootstrap_servers
    topics = stack_topics(new_topic, bootstrap, prefix="soak", partitions=PARTITIONS)
    pool = await open_pool(dsn, min_size=1, max_size=4, timeout_s=3.0)
    built = Stack(
        dsn=dsn, bootstrap=bootstrap, topics=topics, tmp=tmp_path, pool=pool, launch=fork_server
    )
    try:
        yield built
    finally:
        built.stop_workers()
        await pool.close()


@dataclass
class Trickle:
    """Jobs arriving steadily, half through HTTP, half through the requests topic."""

    stack: Stack
    workers: list[WorkerProcess]
    workflow_name: str
    acknowledged: set[str] = field(default_factory=set)
    # Of those, the ones submitted through the requests topic.
    through_topic: set[str] = field(default_factory=set)
    refused: int = 0
    produced: int = 0
    _producer: Producer | None = None

    def __post_init__(self) -> None:
        self._producer = Producer(
            {
                "bootstrap.servers": self.stack.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
            }
        )

    def _delivered(self, error: KafkaError | None, message: Message) -> None:
        if error is None:
            key = message.key()
            assert key is not None
            self.acknowledged.add(key.decode())
            self.through_topic.add(key.decode())

    async def run(self, stop: asyncio.Event) -> None:
        assert self._producer is not None
        number = 0
        async with httpx.AsyncClient(timeout=5, headers=self.stack.headers) as http:
            while not stop.is_set():
                number += 1
                job_id = str(uuid.uuid4())
                job_input = {"text": f"soak job {number}", "delay_ms": 150}
                if number % 2:
                    worker = self.workers[number % len(self.workers)]
                    with contextlib.suppress(httpx.HTTPError):
                        answer = await http.post(
                            f"{worker.url}/v1/workflow-runs",
                            json={
                                "job_id": job_id,
                                "workflow_name": self.workflow_name,
                                "input": job_input,
                            },
                        )
                        if answer.status_code in (200, 201):
                            self.acknowledged.add(job_id)
                        else:
                            self.refused += 1
                else:
                    request = WorkflowRunRequest(job_id=job_id, workflow_name=self.workflow_name)
                    request.input.update(job_input)
                    value = encode_request(
                        request, registry=self.stack.registry, topic=self.stack.requests_topic
                    )
                    self._producer.produce(
                        self.stack.requests_topic,
                        value=value,
                        key=job_id.encode(),
                        on_delivery=self._delivered,
                    )
                    self.produced += 1
                self._producer.poll(0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=0.6)

    async def drain(self) -> None:
        assert self._producer is not None
        left = await asyncio.to_thread(self._producer.flush, 120)
        assert left == 0, f"{left} request(s) never acknowledged by the broker"


@dataclass
class StuckWatch:
    """Looks for RUNNING rows past their bound whenever the database answers."""

    pool: Pool
    seen: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):
                async with self.pool.connection(timeout=2.0) as conn:
                    cursor = await conn.execute(STUCK_SQL, {"slack": SWEEP_SLACK_S})
                    for row in await cursor.fetchall():
                        self.seen[str(row[0])] = tuple(row)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)


async def _phase(seconds: float) -> None:
    # The trickle keeps running meanwhile: this is the length of a phase of the
    # scenario, not a wait for something that could be awaited instead.
    await asyncio.sleep(seconds)


async def test_jobs_survive_a_postgres_crash_and_broker_outages(
    soak_stack: Stack, own_postgres: PostgresService, own_kafka: ApacheKafkaService
) -> None:
    stack = soak_stack
    workers = [
        await stack.start_worker("soak-1", **WORKER_SETTINGS),
        await stack.start_worker("soak-2", **WORKER_SETTINGS),
    ]
    workflow = envelope(name="soak", review="invoke", deadline_ms=DEADLINE_MS)
    await stack.put_workflow(workers[0], workflow)

    trickle = Trickle(stack, workers, workflow["name"])
    watch = StuckWatch(stack.pool)
    stop_trickle, stop_watch = asyncio.Event(), asyncio.Event()
    tasks = [
        asyncio.create_task(trickle.run(stop_trickle)),
        asyncio.create_task(watch.run(stop_watch)),
    ]
    started = time.monotonic()
    try:
        await _phase(6)
        own_postgres.crash()
        await _phase(4)
        await asyncio.to_thread(own_postgres.recover)
        await _phase(6)
        # Longer than the session timeout: the group loses its members.
        await asyncio.to_thread(own_kafka.halt)
        await _phase(SESSION_TIMEOUT_S + 3)
        await asyncio.to_thread(own_kafka.resume)
        await _phase(6)
        await asyncio.to_thread(own_kafka.halt)
        await _phase(3)
        await asyncio.to_thread(own_kafka.resume)
        await _phase(6)
    finally:
        stop_trickle.set()
        await tasks[0]
    await trickle.drain()
    faults_done = time.monotonic() - started
    acknowledged = set(trickle.acknowledged)
    assert len(acknowledged) > 30, (len(acknowledged), trickle.refused)

    async def every_job_terminal() -> bool | None:
        async with stack.pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT job_id::text, status FROM workflow_run WHERE job_id = ANY(%s::uuid[])",
                (list(acknowledged),),
            )
            rows = dict(await cursor.fetchall())
        return True if set(rows) == acknowledged and set(rows.values()) <= TERMINAL else None

    try:
        await wait_until(every_job_terminal, timeout_s=90)
    except TimeoutError:
        async with stack.pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT job_id::text, status, attempt, lease_owner, lease_until, error"
                " FROM workflow_run WHERE job_id = ANY(%s::uuid[])",
                (list(acknowledged),),
            )
            rows = {row[0]: row[1:] for row in await cursor.fetchall()}
        missing = sorted(acknowledged - set(rows))
        open_jobs = {job: row for job, row in rows.items() if row[0] not in TERMINAL}
        from_topic = [job for job in missing if job in trickle.through_topic]
        raise AssertionError(
            f"after {faults_done:.0f}s of faults and 90s more: {len(missing)} acknowledged "
            f"submission(s) without a job, {len(from_topic)} of them produced to the requests "
            f"topic (first: {missing[:5]}), {len(open_jobs)} job(s) not "
            f"terminal: {list(open_jobs.items())[:5]}\n{stack.worker_logs(60)}"
        ) from None
    finally:
        stop_watch.set()
        await tasks[1]

    assert not watch.seen, f"jobs RUNNING past lease + deadline: {watch.seen}"

    async with stack.pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT job_id::text, status FROM workflow_run WHERE job_id = ANY(%s::uuid[])",
            (list(acknowledged),),
        )
        statuses = dict(await cursor.fetchall())

    async def all_published() -> bool | None:
        async with stack.pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT status, count(*) FROM workflow_run_events_outbox GROUP BY status"
            )
            counts = dict(await cursor.fetchall())
        return True if set(counts) == {"PUBLISHED"} else None

    try:
        await wait_until(all_published, timeout_s=60)
    except TimeoutError:
        async with stack.pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT status, count(*) FROM workflow_run_events_outbox GROUP BY status"
            )
            counts = dict(await cursor.fetchall())
        raise AssertionError(
            f"outbox rows not all PUBLISHED: {counts}\n{stack.worker_logs(60)}"
        ) from None

    reader = stack.event_reader(PARTITIONS)
    try:

        def every_terminal_event(events: list[Any]) -> bool:
            finished = {event.job_id for event in events if type_name(event) in TERMINAL}
            return acknowledged <= finished

        await reader.wait(every_terminal_event, timeout_s=60)
        for job_id in sorted(acknowledged):
            kinds = [type_name(event) for event in dedupe(reader.for_job(job_id))]
            assert kinds[0] == "ACCEPTED" and kinds[-1] == statuses[job_id], (job_id, kinds)
    finally:
        reader.close()

    completed = sum(1 for status in statuses.values() if status == "COMPLETED")
    assert completed == len(acknowledged), {
        job: status for job, status in statuses.items() if status != "COMPLETED"
    }
    for worker in workers:
        assert worker.exit_code() is None, worker.log_tail()
