"""A worker that starts while its broker is away.

A real ``faust -A streams.app worker`` whose broker does not answer yet serves
what needs no Kafka (the API, the claim loops) and connects the request agent
once the broker comes up, on a broker of the test's own that it halts and resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer

from devstack.apache_kafka import ApacheKafkaService
from devstack.processes import free_port
from devstack.stack import WorkerProcess, ensure_topics, worker_environment
from schemas.contract import WorkflowRunRequest
from schemas.errors import NotFound
from schemas.serde import encode_request
from store.pool import Pool, open_pool
from store.runs import RunStore
from store.tokens import create_token
from streams.auth import SCOPES
from tests.e2e.harness import (
    FAST_SETTINGS,
    HANDLERS_MODULE,
    REPO_ROOT,
    wait_until,
)
from tests.forkserver import ForkServer
from tests.workflows_fixtures import envelope

pytestmark = pytest.mark.e2e


class LiveWorker(WorkerProcess):
    """Counts as started once ``/healthz`` answers 200: alive, not necessarily ready."""

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False


@pytest.fixture
def broker() -> Iterator[ApacheKafkaService]:
    """A broker of the test's own, which it may halt and resume."""
    service = ApacheKafkaService("")
    try:
        service.start()
        yield service
    finally:
        service.stop()


@pytest.fixture
async def database(make_database: Callable[[], str]) -> AsyncIterator[tuple[str, Pool]]:
    dsn = make_database(migrated=True)
    pool = await open_pool(dsn, min_size=1, max_size=2)
    try:
        yield dsn, pool
    finally:
        await pool.close()


async def test_a_worker_starts_while_its_broker_is_down(
    database: tuple[str, Pool],
    broker: ApacheKafkaService,
    tmp_path: Path,
    fork_server: ForkServer,
) -> None:
    dsn, pool = database
    runs = RunStore(pool)
    # The broker made the topics; it is halted (same address, same topics)
    # before the worker starts, and resumed while it runs.
    worker: LiveWorker | None = None
    try:
        bootstrap = broker.bootstrap_servers
        # Every topic the worker subscribes to exists before it joins: a topic
        # created under a joining group rebalances it again (see the harness).
        topics = _own_topics(bootstrap)
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
                "WFJOBS_COMPLETIONS_TOPIC": topics["completions"],
                "WFJOBS_COMPLETION_RESULTS_TOPIC": topics["completion-results"],
                "WFJOBS_GROUP": f"e2e-{uuid.uuid4().hex[:8]}",
                "WFJOBS_BROKER_RETRY_MAX_S": "1",
                "WFJOBS_BROKER_SESSION_TIMEOUT_S": "6",
            },
        )
        worker = LiveWorker(
            env, workdir=tmp_path, name="w-early", cwd=REPO_ROOT, launch=fork_server
        )
        await asyncio.to_thread(worker.start, timeout_s=60.0)
        workflow = envelope(name="e2e-early", review="invoke")
        token = (await create_token(dsn, "e2e", SCOPES)).token
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=worker.url, timeout=10, headers=headers) as http:
            put = await http.put(
                f"/v1/workflows/{workflow['name']}", json={"workflow": dict(workflow)}
            )
            assert put.status_code in (200, 201), put.text
            job_id = await _submit(http, workflow["name"], "no broker yet")
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


async def _submit(http: httpx.AsyncClient, workflow_name: str, text: str) -> uuid.UUID:
    job_id = uuid.uuid4()
    answer = await http.post(
        "/v1/workflow-runs",
        json={"job_id": str(job_id), "workflow_name": workflow_name, "input": {"text": text}},
    )
    assert answer.is_success, answer.text
    return job_id


async def _outbox_rows(pool: Pool, job_id: uuid.UUID) -> list[tuple[str, str | None]]:
    async with pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT status, lease_owner FROM workflow_run_events_outbox"
            " WHERE job_id = %s ORDER BY id",
            (job_id,),
        )
        return [(str(status), owner) for status, owner in await cursor.fetchall()]


def _own_topics(bootstrap: str) -> dict[str, str]:
    """A topic of this test's own for each one the worker uses, made on ``bootstrap``."""
    topics = {
        name: f"e2e-{name}-{uuid.uuid4().hex[:8]}"
        for name in ("requests", "dlq", "events", "completions", "completion-results")
    }
    ensure_topics(bootstrap, topics.values(), partitions=1)
    return topics


def _relaying_worker(
    name: str,
    dsn: str,
    bootstrap: str,
    topics: dict[str, str],
    group: str,
    tmp_path: Path,
    fork_server: ForkServer,
) -> LiveWorker:
    """A worker with every role, on the product's own relay clocks: a publish may
    wait 30 s for its acknowledgement, longer than any stop should take."""
    env = worker_environment(
        database_url=dsn,
        bootstrap_servers=bootstrap,
        worker_id=name,
        web_port=free_port(),
        data_dir=tmp_path / name,
        handlers=(HANDLERS_MODULE,),
        roles="api,worker,relay",
        extra={
            **FAST_SETTINGS,
            "WFJOBS_RELAY_MESSAGE_TIMEOUT_MS": "30000",
            "WFJOBS_RELAY_LEASE_S": "60",
            "WFJOBS_REQUESTS_TOPIC": topics["requests"],
            "WFJOBS_REQUESTS_DLQ_TOPIC": topics["dlq"],
            "WFJOBS_EVENTS_TOPIC": topics["events"],
            "WFJOBS_COMPLETIONS_TOPIC": topics["completions"],
            "WFJOBS_COMPLETION_RESULTS_TOPIC": topics["completion-results"],
            "WFJOBS_GROUP": group,
            "WFJOBS_BROKER_RETRY_MAX_S": "1",
            "WFJOBS_BROKER_SESSION_TIMEOUT_S": "6",
        },
    )
    return LiveWorker(env, workdir=tmp_path, name=name, cwd=REPO_ROOT, launch=fork_server)


async def test_a_broker_outage_is_a_few_log_lines_not_a_flood(
    database: tuple[str, Pool],
    broker: ApacheKafkaService,
    tmp_path: Path,
    fork_server: ForkServer,
) -> None:
    """The Kafka client's repeated lines are written once a minute each, the
    broker part of ``/readyz`` says the broker is lost, and the worker is ready
    again once it is back."""
    dsn, _pool = database
    worker: LiveWorker | None = None
    try:
        bootstrap = broker.bootstrap_servers
        topics = _own_topics(bootstrap)
        group = f"e2e-{uuid.uuid4().hex[:8]}"
        worker = _relaying_worker("w-quiet", dsn, bootstrap, topics, group, tmp_path, fork_server)
        await asyncio.to_thread(worker.start, timeout_s=60.0)

        async def connected() -> bool | None:
            async with httpx.AsyncClient(base_url=worker.url, timeout=5) as http:
                return True if (await http.get("/readyz")).status_code == 200 else None

        await wait_until(connected, timeout_s=60, interval_s=0.5)
        before = worker.log_path.read_text(errors="replace").count("\n")
        await asyncio.to_thread(broker.halt)
        await asyncio.sleep(20)
        lines = worker.log_path.read_text(errors="replace").splitlines()[before:]
        # Unlimited, aiokafka alone wrote some 1 500 lines in these 20 s.
        assert len(lines) < 60, "\n".join(lines[-80:])
        # Not ready, and saying since when; alive all the same.
        async with httpx.AsyncClient(base_url=worker.url, timeout=5) as http:
            ready = await http.get("/readyz")
            assert ready.status_code == 503, ready.text
            part = ready.json()["parts"]["broker"]
            assert part["ready"] is False and part["healthy"] is True, part
            assert part["summary"].startswith(f"Kafka at {bootstrap} has not answered since "), part
            assert (await http.get("/healthz")).status_code == 200
        await asyncio.to_thread(broker.resume)
        await wait_until(connected, timeout_s=60, interval_s=0.5)
        assert worker.stop(timeout_s=30) == 0, worker.log_tail()
    finally:
        if worker is not None:
            worker.stop(timeout_s=15)


async def test_a_worker_stops_promptly_while_its_broker_is_down(
    database: tuple[str, Pool],
    broker: ApacheKafkaService,
    tmp_path: Path,
    fork_server: ForkServer,
) -> None:
    """A stop does not wait out the producer's message timeout for a broker that
    is gone: the relay's pass in flight hands its rows back, PENDING and free for
    the next relay, and the process exits cleanly within its grace."""
    dsn, pool = database
    runs = RunStore(pool)
    workers: list[LiveWorker] = []
    try:
        bootstrap = broker.bootstrap_servers
        topics = _own_topics(bootstrap)
        group = f"e2e-{uuid.uuid4().hex[:8]}"

        def start_worker(name: str) -> LiveWorker:
            worker = _relaying_worker(name, dsn, bootstrap, topics, group, tmp_path, fork_server)
            workers.append(worker)
            worker.start(timeout_s=60.0)
            return worker

        first = await asyncio.to_thread(start_worker, "w-first")
        workflow = envelope(name="e2e-stop", review="invoke")
        token = (await create_token(dsn, "e2e", SCOPES)).token
        headers = {"Authorization": f"Bearer {token}"}

        async def all_published(job_id: uuid.UUID) -> bool | None:
            rows = await _outbox_rows(pool, job_id)
            return True if rows and all(s == "PUBLISHED" for s, _ in rows) else None

        async with httpx.AsyncClient(base_url=first.url, timeout=10, headers=headers) as http:
            put = await http.put(
                f"/v1/workflows/{workflow['name']}", json={"workflow": dict(workflow)}
            )
            assert put.status_code in (200, 201), put.text
            before = await _submit(http, workflow["name"], "the broker is up")
            await _wait_for_status(runs, before, "COMPLETED", first)
            await wait_until(lambda: all_published(before), timeout_s=30, interval_s=0.2)

            await asyncio.to_thread(broker.halt)
            during = await _submit(http, workflow["name"], "the broker is gone")
            await _wait_for_status(runs, during, "COMPLETED", first)

        async def leased() -> bool | None:
            rows = await _outbox_rows(pool, during)
            return True if any(owner is not None for _, owner in rows) else None

        # A pass is in flight: its rows leased, their acknowledgement awaited.
        await wait_until(leased, timeout_s=15, interval_s=0.1)
        began = time.monotonic()
        code = await asyncio.to_thread(first.stop, timeout_s=60)
        took = time.monotonic() - began
        assert code == 0, first.log_tail()
        assert took < 15, f"the stop took {took:.1f} s\n{first.log_tail()}"
        rows = await _outbox_rows(pool, during)
        assert rows and all(rows_status == "PENDING" for rows_status, _ in rows), rows
        assert all(owner is None for _, owner in rows), rows

        await asyncio.to_thread(broker.resume)
        second = await asyncio.to_thread(start_worker, "w-second")
        try:
            await wait_until(lambda: all_published(during), timeout_s=60, interval_s=0.2)
        except TimeoutError:
            raise AssertionError(
                f"{await _outbox_rows(pool, during)}\n{second.log_tail()}"
            ) from None
        assert second.stop(timeout_s=15) == 0, second.log_tail()
    finally:
        for worker in workers:
            worker.stop(timeout_s=15)
