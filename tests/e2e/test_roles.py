"""Roles that run alone, and a worker that starts while its broker is away.

Every process here is a real ``faust -A streams.app worker``. A process without
the ``worker`` role starts no Faust Kafka client at all, so any combination of
roles runs on its own; a worker whose broker does not answer yet serves what
needs no Kafka and connects the request agent once the broker comes up.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer

from devstack.services import ApacheKafkaService, free_port
from devstack.stack import WorkerProcess, ensure_topics, worker_environment
from schemas.contract import WorkflowRunRequest
from schemas.errors import NotFound
from schemas.serde import encode_request
from store.pool import Pool, open_pool
from store.runs import RunStore
from tests.e2e.conftest import PARTITIONS
from tests.e2e.harness import (
    FAST_SETTINGS,
    HANDLERS_MODULE,
    REPO_ROOT,
    Stack,
    type_name,
    wait_until,
)
from tests.workflows_fixtures import envelope

pytestmark = pytest.mark.e2e

JOBS = 200
EXPECTED = [
    ("ACCEPTED", ""),
    ("STEP_CHECKPOINT", "tokenize"),
    ("STEP_CHECKPOINT", "embed"),
    ("STEP_CHECKPOINT", "review"),
    ("COMPLETED", ""),
]
ROLES = ("api", "relay", "worker")
COMBINATIONS = [
    ",".join(combo) for size in (1, 2, 3) for combo in itertools.combinations(ROLES, size)
]
# Faust logs each service it starts; these are its Kafka clients.
FAUST_KAFKA_CLIENTS = ("[^--Consumer]: Starting", "[^--Producer]: Starting")


def _faust_kafka_started(worker: WorkerProcess) -> list[str]:
    log = worker.log_path.read_text(errors="replace")
    return [client for client in FAUST_KAFKA_CLIENTS if client in log]


async def _settled(pool: Pool) -> int:
    async with pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT count(*) FROM workflow_run WHERE status IN ('COMPLETED', 'FAILED', 'DEAD')"
        )
        row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


async def test_api_relay_and_worker_processes_side_by_side(stack: Stack) -> None:
    api = await stack.start_worker("api-1", WFJOBS_ROLES="api")
    relay = await stack.start_worker("relay-1", WFJOBS_ROLES="relay")
    worker = await stack.start_worker("worker-1", WFJOBS_ROLES="worker")
    workflow = envelope(name="e2e-split", review="invoke")
    await stack.put_workflow(api, workflow)

    job_ids = [uuid.uuid4() for _ in range(JOBS)]
    limit = asyncio.Semaphore(16)
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as http:

        async def submit(job_id: uuid.UUID) -> None:
            async with limit:
                answer = await http.post(
                    "/v1/workflow-runs",
                    json={
                        "job_id": str(job_id),
                        "workflow_name": workflow["name"],
                        "input": {"text": f"job {job_id}"},
                    },
                )
            assert answer.is_success, answer.text
            assert answer.json()["created"] is True

        await asyncio.gather(*(submit(job_id) for job_id in job_ids))

    async def all_settled() -> int | None:
        count = await _settled(stack.pool)
        return count if count == JOBS else None

    try:
        await wait_until(all_settled, timeout_s=120, interval_s=0.5)
    except TimeoutError:
        raise AssertionError(f"not all jobs settled\n{stack.worker_logs()}") from None
    jobs = [await stack.job(job_id) for job_id in job_ids]
    assert Counter(job.status for job in jobs) == {"COMPLETED": JOBS}
    assert {job.lease_owner for job in jobs} == {"worker-1"}

    # Every outbox row was published, and each reached the topic exactly once.
    async def outbox_published() -> list[tuple[int, str]] | None:
        async with stack.pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT id, status FROM workflow_run_events_outbox ORDER BY id"
            )
            rows = [(int(row[0]), str(row[1])) for row in await cursor.fetchall()]
        return rows if all(status == "PUBLISHED" for _, status in rows) else None

    try:
        rows = await wait_until(outbox_published, timeout_s=60, interval_s=0.5)
    except TimeoutError:
        raise AssertionError(f"outbox rows left unpublished\n{stack.worker_logs()}") from None
    assert len(rows) == JOBS * len(EXPECTED)

    reader = stack.event_reader(PARTITIONS)
    try:
        await reader.wait(lambda events: len(events) >= len(rows), timeout_s=60)
        reader.poll(1.0)
        event_ids = [event.event_id for event in reader.events]
        duplicates = [eid for eid, count in Counter(event_ids).items() if count > 1]
        assert duplicates == []
        assert sorted(event_ids) == [row_id for row_id, _ in rows]
        wanted = {str(job_id) for job_id in job_ids}
        assert {event.job_id for event in reader.events} == wanted
        for job_id in wanted:
            # One job's events share a partition, so the topic holds them in order.
            events = reader.for_job(job_id)
            ids = [event.event_id for event in events]
            assert ids == sorted(ids), (job_id, ids)
            assert [(type_name(e), e.step_name) for e in events] == EXPECTED, job_id
    finally:
        reader.close()

    for process in (api, relay, worker):
        assert process.exit_code() is None, process.log_tail()
    # Only the worker role runs Faust's Kafka clients; the relay has its own producer.
    assert _faust_kafka_started(api) == []
    assert _faust_kafka_started(relay) == []
    assert _faust_kafka_started(worker) == list(FAUST_KAFKA_CLIENTS)
    for process in (api, relay, worker):
        assert process.stop() == 0, process.log_tail()


async def test_every_combination_of_roles_runs_alone(stack: Stack) -> None:
    workers = await asyncio.gather(
        *(
            stack.start_worker(f"roles-{roles.replace(',', '-')}", WFJOBS_ROLES=roles)
            for roles in COMBINATIONS
        )
    )
    assert len(workers) == 7
    async with httpx.AsyncClient(timeout=5) as http:
        # Half a minute of health checks: a process that would die once a
        # Kafka client of Faust's gave up on it does so within seconds.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for roles, worker in zip(COMBINATIONS, workers, strict=True):
                assert worker.exit_code() is None, (roles, worker.log_tail())
                answer = await http.get(f"{worker.url}/healthz")
                assert answer.status_code == 200, (roles, answer.text)
                assert answer.json()["roles"] == sorted(roles.split(","))
            await asyncio.sleep(2)
    for roles, worker in zip(COMBINATIONS, workers, strict=True):
        started = _faust_kafka_started(worker)
        assert started == (list(FAUST_KAFKA_CLIENTS) if "worker" in roles else []), roles
        assert worker.stop() == 0, (roles, worker.log_tail())


class LiveWorker(WorkerProcess):
    """Counts as started once ``/healthz`` answers 200: alive, not necessarily ready."""

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False


@pytest.fixture
async def database(make_database: Callable[[], str]) -> AsyncIterator[tuple[str, Pool]]:
    dsn = make_database(migrated=True)
    pool = await open_pool(dsn, min_size=1, max_size=2)
    try:
        yield dsn, pool
    finally:
        await pool.close()


async def test_a_worker_starts_while_its_broker_is_down(
    database: tuple[str, Pool], tmp_path: Path
) -> None:
    dsn, pool = database
    runs = RunStore(pool)
    # Our own broker: started to make the topics, then halted (same address,
    # same topics) before the worker starts, and resumed while it runs.
    broker = ApacheKafkaService("")
    worker: LiveWorker | None = None
    try:
        await asyncio.to_thread(broker.start)
        bootstrap = broker.bootstrap_servers
        topics = {
            name: f"e2e-{name}-{uuid.uuid4().hex[:8]}" for name in ("requests", "dlq", "events")
        }
        ensure_topics(bootstrap, topics.values(), partitions=1)
        broker.halt()
        env = worker_environment(
            database_url=dsn,
            bootstrap_servers=bootstrap,
            worker_id="w-early",
            web_port=free_port(),
            data_dir=tmp_path / "faust",
            handlers=(HANDLERS_MODULE,),
            roles="api,worker",
            extra={
                **FAST_SETTINGS,
                "WFJOBS_REQUESTS_TOPIC": topics["requests"],
                "WFJOBS_REQUESTS_DLQ_TOPIC": topics["dlq"],
                "WFJOBS_EVENTS_TOPIC": topics["events"],
                "WFJOBS_GROUP": f"e2e-{uuid.uuid4().hex[:8]}",
                "WFJOBS_BROKER_RETRY_MAX_S": "1",
                "WFJOBS_BROKER_SESSION_TIMEOUT_S": "6",
            },
        )
        worker = LiveWorker(env, workdir=tmp_path, name="w-early", cwd=REPO_ROOT)
        await asyncio.to_thread(worker.start, timeout_s=60.0)
        workflow = envelope(name="e2e-early", review="invoke")
        async with httpx.AsyncClient(base_url=worker.url, timeout=10) as http:
            put = await http.put(
                f"/v1/workflows/{workflow['name']}", json={"workflow": dict(workflow)}
            )
            assert put.status_code == 200, put.text
            job_id = uuid.uuid4()
            submitted = await http.post(
                "/v1/workflow-runs",
                json={
                    "job_id": str(job_id),
                    "workflow_name": workflow["name"],
                    "input": {"text": "no broker yet"},
                },
            )
            assert submitted.is_success, submitted.text
            got = await http.get(f"/v1/workflow-runs/{job_id}")
            assert got.status_code == 200, got.text
            # The claim loops need no broker either.
            await _wait_for_status(runs, job_id, "COMPLETED", worker)

            ready = await http.get("/readyz")
            assert ready.status_code == 503, ready.text
            body: dict[str, Any] = ready.json()
            part = body["parts"]["broker"]
            assert part["ready"] is False and part["healthy"] is True, part
            assert part["summary"].startswith(f"waiting for Kafka at {bootstrap} since "), part
            assert (await http.get("/healthz")).status_code == 200

            await asyncio.to_thread(broker.resume)
            request = WorkflowRunRequest(job_id=str(uuid.uuid4()), workflow_name=workflow["name"])
            request.input.update({"text": "the broker is up"})
            producer = Producer({"bootstrap.servers": bootstrap})
            producer.produce(
                topics["requests"],
                key=request.job_id.encode(),
                value=encode_request(request, registry=None, topic=topics["requests"]),
            )
            assert producer.flush(30) == 0
            await _wait_for_status(runs, request.job_id, "COMPLETED", worker, timeout_s=90)

            async def turned_ready() -> dict[str, Any] | None:
                answer = await http.get("/readyz")
                return answer.json() if answer.status_code == 200 else None

            try:
                body = await wait_until(turned_ready, timeout_s=30, interval_s=0.5)
            except TimeoutError:
                raise AssertionError(
                    f"/readyz: {(await http.get('/readyz')).text}\n{worker.log_tail()}"
                ) from None
            assert body["parts"]["broker"]["summary"].startswith(
                f"connected to Kafka at {bootstrap}"
            )
        assert worker.exit_code() is None, worker.log_tail()
        assert worker.stop(timeout_s=15) == 0, worker.log_tail()
    finally:
        if worker is not None:
            worker.stop(timeout_s=15)
        broker.stop()


async def _wait_for_status(
    runs: RunStore,
    job_id: uuid.UUID | str,
    status: str,
    worker: WorkerProcess,
    *,
    timeout_s: float = 30.0,
) -> None:
    async def reached() -> bool | None:
        with contextlib.suppress(NotFound):
            if (await runs.get(job_id)).status == status:
                return True
        return None

    try:
        await wait_until(reached, timeout_s=timeout_s, interval_s=0.2)
    except TimeoutError:
        raise AssertionError(f"job {job_id} not {status}\n{worker.log_tail()}") from None
