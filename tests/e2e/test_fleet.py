"""Two worker processes share 200 jobs: each completes once, in order, and both work.

One writes its commit points through group commit (the default), the other one
statement each (``WFJOBS_GROUP_COMMIT=false``): a fleet mid-way through
changing the setting is a fleet like any other.
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from schemas.contract import WorkflowRunEvent
from tests.e2e.conftest import PARTITIONS
from tests.e2e.harness import Stack, dedupe, type_name, wait_until
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


async def test_two_workers_two_hundred_jobs(stack: Stack) -> None:
    first = await stack.start_worker("w1")
    second = await stack.start_worker("w2", WFJOBS_GROUP_COMMIT="false")
    workflow = envelope(name="e2e-fleet", review="invoke")
    await stack.put_workflow(first, workflow)

    # A few milliseconds per tokenize call keeps both workers' loops busy.
    job_ids = [
        stack.produce_request(workflow["name"], {"text": f"job number {n}", "delay_ms": 5})
        for n in range(JOBS)
    ]
    stack.flush()

    async def all_settled() -> int | None:
        async with stack.pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT count(*) FROM workflow_run WHERE status IN ('COMPLETED', 'FAILED', 'DEAD')"
            )
            row = await cursor.fetchone()
        assert row is not None
        return row[0] if row[0] == JOBS else None

    try:
        await wait_until(all_settled, timeout_s=90, interval_s=0.5)
    except TimeoutError:
        raise AssertionError(f"not all jobs settled\n{stack.worker_logs()}") from None

    jobs = [await stack.job(job_id) for job_id in job_ids]
    assert Counter(job.status for job in jobs) == {"COMPLETED": JOBS}
    owners = Counter(job.lease_owner for job in jobs)
    assert set(owners) == {"w1", "w2"}, owners
    callers = Counter(call.worker for call in stack.calls())
    assert set(callers) == {"w1", "w2"}, callers

    reader = stack.event_reader(PARTITIONS)
    wanted = set(map(str, job_ids))

    def everything(events: list[WorkflowRunEvent]) -> bool:
        done = {e.job_id for e in reader.events if type_name(e) == "COMPLETED"}
        return wanted <= done

    await reader.wait(everything, timeout_s=60)
    by_job: dict[str, list[tuple[int, str, str]]] = {}
    for event in dedupe(reader.events):
        by_job.setdefault(event.job_id, []).append(
            (event.event_id, type_name(event), event.step_name)
        )
    assert set(by_job) == wanted
    for job_id, events in by_job.items():
        ids = [event_id for event_id, _, _ in events]
        assert ids == sorted(ids), (job_id, events)
        assert [(kind, step) for _, kind, step in events] == EXPECTED, (job_id, events)
    reader.close()

    # Exactly one COMPLETED commit point per job in the store as well.
    async with stack.pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT job_id, count(*) FROM workflow_run_events_outbox"
            " WHERE event_type = 'COMPLETED' GROUP BY job_id"
        )
        rows = await cursor.fetchall()
    assert {str(job_id): count for job_id, count in rows} == dict.fromkeys(wanted, 1)
    assert all(isinstance(job_id, uuid.UUID) for job_id in job_ids)

    assert first.stop() == 0, first.log_tail()
    assert second.stop() == 0, second.log_tail()
