"""Roles that run alone: every combination, and api, relay and worker side by side.

Every process here is a real ``faust -A streams.app worker``. A process without
the ``worker`` role starts no Faust Kafka client at all, so any combination of
roles runs on its own. The three single-role processes share one database and
carry jobs side by side; the four combinations of several roles run on a
database of their own, so they take none of those jobs.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections import Counter
from collections.abc import Mapping

import httpx
import pytest

from devstack.stack import WorkerProcess
from store.pool import Pool
from tests.e2e.conftest import PARTITIONS, MakeStack
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
# One API process runs the other auth mode: no tokens at all.
AUTH_OFF = "api,relay"
SPLIT = ("api", "relay", "worker")
# How long every process is health-checked at least: a process that would die
# once a Kafka client of Faust's gave up on it does so within seconds.
WATCH_S = 20.0
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


async def _carry_jobs_side_by_side(
    stack: Stack, api: WorkerProcess, relay: WorkerProcess, worker: WorkerProcess
) -> None:
    """Jobs submitted through ``api``, run by ``worker``, their events published by ``relay``."""
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
    assert {job.lease_owner for job in jobs} == {worker.name}

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


async def _watch_health(processes: Mapping[str, WorkerProcess], done: asyncio.Event) -> None:
    """Every process alive and healthy, with its roles, until ``done`` and for ``WATCH_S``."""
    until = time.monotonic() + WATCH_S
    async with httpx.AsyncClient(timeout=5) as http:
        while not done.is_set() or time.monotonic() < until:
            for roles, process in processes.items():
                assert process.exit_code() is None, (roles, process.log_tail())
                answer = await http.get(f"{process.url}/healthz")
                assert answer.status_code == 200, (roles, answer.text)
                assert answer.json()["roles"] == sorted(roles.split(","))
            await asyncio.sleep(2)


async def test_every_combination_of_roles_runs_alone_and_split_roles_carry_jobs(
    make_stack: MakeStack,
) -> None:
    split, combined = await make_stack(), await make_stack()
    started = await asyncio.gather(
        *(
            (split if roles in SPLIT else combined).start_worker(
                f"roles-{roles.replace(',', '-')}",
                WFJOBS_ROLES=roles,
                WFJOBS_AUTH="off" if roles == AUTH_OFF else "on",
            )
            for roles in COMBINATIONS
        )
    )
    processes = dict(zip(COMBINATIONS, started, strict=True))
    assert len(processes) == 7

    async with httpx.AsyncClient(timeout=5) as http:
        for roles, process in processes.items():
            if "api" not in roles:
                continue
            tokenless = await http.get(f"{process.url}/v1/workflow-runs")
            if roles == AUTH_OFF:
                assert tokenless.status_code == 200, tokenless.text
                assert "WFJOBS_AUTH=off" in process.log_tail(200)
            else:
                assert tokenless.status_code == 401, (roles, tokenless.text)

    done = asyncio.Event()
    watching = asyncio.create_task(_watch_health(processes, done))
    try:
        api, relay, worker = (processes[roles] for roles in SPLIT)
        await _carry_jobs_side_by_side(split, api, relay, worker)
    finally:
        done.set()
    await watching

    for roles, process in processes.items():
        kafka_clients = _faust_kafka_started(process)
        # Only the worker role runs Faust's Kafka clients; the relay has its own producer.
        assert kafka_clients == (list(FAUST_KAFKA_CLIENTS) if "worker" in roles else []), roles
    codes = await asyncio.gather(*(asyncio.to_thread(process.stop) for process in started))
    for roles, process, code in zip(COMBINATIONS, started, codes, strict=True):
        assert code == 0, (roles, process.log_tail())
