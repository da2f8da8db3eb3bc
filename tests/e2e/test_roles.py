"""Roles that run alone: every combination, and api, relay and worker side by side.

Every process here is a real ``faust -A streams.app worker``. A process without
the ``worker`` role starts no Faust Kafka client at all, so any combination of
roles runs on its own.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections import Counter

import httpx
import pytest

from devstack.stack import WorkerProcess
from store.pool import Pool
from tests.e2e.conftest import PARTITIONS
from tests.e2e.harness import (
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
# The API-only process also runs the other auth mode: no tokens at all.
AUTH_OFF = "api"
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
    async with httpx.AsyncClient(base_url=api.url, timeout=30, headers=stack.headers) as http:

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
            stack.start_worker(
                f"roles-{roles.replace(',', '-')}",
                WFJOBS_ROLES=roles,
                WFJOBS_AUTH="off" if roles == AUTH_OFF else "on",
            )
            for roles in COMBINATIONS
        )
    )
    assert len(workers) == 7
    async with httpx.AsyncClient(timeout=5) as http:
        for roles, worker in zip(COMBINATIONS, workers, strict=True):
            if "api" not in roles:
                continue
            tokenless = await http.get(f"{worker.url}/v1/workflow-runs")
            if roles == AUTH_OFF:
                assert tokenless.status_code == 200, tokenless.text
                assert "WFJOBS_AUTH=off" in worker.log_tail(200)
            else:
                assert tokenless.status_code == 401, (roles, tokenless.text)
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
    codes = await asyncio.gather(*(asyncio.to_thread(worker.stop) for worker in workers))
    for roles, worker, code in zip(COMBINATIONS, workers, codes, strict=True):
        assert code == 0, (roles, worker.log_tail())
