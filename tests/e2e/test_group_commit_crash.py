"""A worker killed while its group commit is in flight: the step is checkpointed
with its event, or not at all, and another worker finishes the job."""

from __future__ import annotations

import asyncio

import pytest

from schemas.contract import decode_event
from store.pool import Pool
from tests.e2e.harness import Stack, type_name, wait_until
from tests.workflows_fixtures import EMBED, envelope

pytestmark = pytest.mark.e2e

# The worker's backend inside the group commit's statement, waiting on the row lock.
IN_FLIGHT_SQL = """
SELECT pid FROM pg_stat_activity
 WHERE datname = current_database() AND application_name = %(app)s
   AND wait_event_type = 'Lock' AND query LIKE '%%checkpoint_in%%'
"""
STILL_ACTIVE_SQL = """
SELECT count(*) FROM pg_stat_activity
 WHERE datname = current_database() AND application_name = %(app)s AND state <> 'idle'
"""


async def _checkpoints_and_their_events(
    stack: Stack, job_id: object
) -> tuple[list[str], list[str]]:
    job = await stack.job(str(job_id))
    events = [decode_event(r.payload) for r in await stack.outbox.events_for(job.job_id)]
    return (
        [entry["name"] for entry in job.checkpoints],
        [e.step_name for e in events if type_name(e) == "STEP_CHECKPOINT"],
    )


async def _first_row(pool: Pool, sql: str, app: str) -> object:
    async with pool.connection() as conn:
        row = await (await conn.execute(sql, {"app": app})).fetchone()
    return row[0] if row is not None else None


async def test_kill_9_during_a_group_commit_leaves_the_step_whole_or_absent(stack: Stack) -> None:
    # w1's embed step answers two seconds after it is called: time to lock the
    # job's row, so the checkpoint that follows waits in its statement.
    first = await stack.start_worker("w1", WFJOBS_E2E_SLOW_METHOD=EMBED, WFJOBS_E2E_SLOW_S="2")
    workflow = envelope(name="e2e-group-crash", review="invoke")
    await stack.put_workflow(first, workflow)
    job_id = stack.produce_request(workflow["name"], {"text": "crash mid flush"})
    stack.flush()

    async def embedding() -> bool | None:
        return True if stack.calls_for(job_id, EMBED) else None

    await wait_until(embedding, timeout_s=30)
    # The connection the worker's group commit writes through.
    app = "workflow-jobs commits w1"
    async with stack.pool.connection() as blocker:
        async with blocker.transaction():
            await blocker.execute(
                "SELECT 1 FROM workflow_run WHERE job_id = %s FOR UPDATE", (job_id,)
            )

            async def in_flight() -> object:
                return await _first_row(stack.pool, IN_FLIGHT_SQL, app)

            # The flush was requested and sent; its acknowledgement cannot come yet.
            await wait_until(in_flight, timeout_s=20)
            first.kill()
            checkpoints, events = await _checkpoints_and_their_events(stack, job_id)
            assert (checkpoints, events) == (["tokenize"], ["tokenize"])
        # The lock is gone: the dead worker's statement ends on its own, committed
        # or not; either way nothing is half written.

        async def settled_backend() -> bool | None:
            return True if await _first_row(stack.pool, STILL_ACTIVE_SQL, app) == 0 else None

        await wait_until(settled_backend, timeout_s=20)
    checkpoints, events = await _checkpoints_and_their_events(stack, job_id)
    assert checkpoints == events
    assert checkpoints in (["tokenize"], ["tokenize", "embed"])

    second = await stack.start_worker("w2", WFJOBS_GROUP=f"{stack.group}-b")
    job = await stack.wait_for_job(job_id, {"COMPLETED", "FAILED", "DEAD"}, timeout_s=40)
    assert job.status == "COMPLETED", job
    checkpoints, events = await _checkpoints_and_their_events(stack, job_id)
    assert checkpoints == events == ["tokenize", "embed", "review"]
    await asyncio.to_thread(second.stop)
