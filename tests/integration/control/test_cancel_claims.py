"""The worker's side of a cancel, with claim loops in-process against a real Postgres."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from store.control import ControlStore
from store.pool import Pool, open_pool
from store.runs import RunStore
from tests.integration.streams.test_claims import Harness
from tests.workflows_fixtures import REVIEW, TOKENIZE, CallLog, envelope, make_registry
from workflows.invokers import StepContext

OUTBOX_SQL = "SELECT event_type FROM workflow_run_events_outbox WHERE job_id = %s ORDER BY id"


@pytest.fixture
async def pool(make_database: Callable[..., str]) -> AsyncIterator[Pool]:
    opened = await open_pool(make_database(migrated=True), min_size=1, max_size=12)
    try:
        yield opened
    finally:
        await opened.close()


async def kinds(pool: Pool, job_id: uuid.UUID) -> list[str]:
    async with pool.connection() as conn:
        return [row[0] for row in await (await conn.execute(OUTBOX_SQL, (job_id,))).fetchall()]


async def test_a_step_finishing_as_the_cancel_lands_writes_nothing_and_the_job_is_cancelled(
    pool: Pool,
) -> None:
    """The request arrives while the step runs; the step then answers anyway.

    Its checkpoint is refused, and the refusal sends the runner to the cancel
    settle: no heartbeat is needed (it is set far beyond the test).
    """
    runs = RunStore(pool, retry_base_s=0.05, lease_s=30.0)
    control = ControlStore.beside(runs)
    registry = make_registry(CallLog())
    tokenize = registry.get(TOKENIZE)
    assert tokenize is not None
    asked = asyncio.Event()

    async def cancelled_while_running(request: Any, ctx: StepContext) -> Any:
        result = await control.cancel(uuid.UUID(ctx.job_id), reason="mid-step")
        assert result.outcome == "CANCEL_REQUESTED"
        asked.set()
        return await tokenize(request, ctx)

    registry.register(TOKENIZE, cancelled_while_running, replace=True)
    harness = Harness(runs, registry, CallLog())
    job_id = await harness.submit(envelope(name="auto", review="invoke"), {"text": "a b"})
    loops = harness.loops(heartbeat_s=20.0)
    await loops.start()
    try:
        job = await harness.wait_status(job_id, "CANCELLED")
    finally:
        await loops.stop()
    assert asked.is_set()
    assert job.checkpoints == ()
    assert job.cancel_reason == "mid-step"
    assert await kinds(pool, job_id) == ["ACCEPTED", "CANCELLED"]
    assert (loops.stats.cancelled, loops.stats.lease_lost) == (1, 0)


async def test_the_heartbeat_stops_a_sleeping_step_and_the_runner_settles_cancelled(
    pool: Pool,
) -> None:
    runs = RunStore(pool, retry_base_s=0.05, lease_s=30.0)
    control = ControlStore.beside(runs)
    registry = make_registry(CallLog())
    started, stopped = asyncio.Event(), asyncio.Event()

    async def sleeper(request: Any, ctx: StepContext) -> Any:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.set()
            raise
        raise AssertionError("the step was not cancelled")

    registry.register(TOKENIZE, sleeper, replace=True)
    harness = Harness(runs, registry, CallLog())
    job_id = await harness.submit(envelope(name="auto", review="invoke"), {"text": "a b"})
    loops = harness.loops(heartbeat_s=0.1)
    await loops.start()
    try:
        await asyncio.wait_for(started.wait(), 10)
        await control.cancel(job_id, reason="too slow")
        await asyncio.wait_for(stopped.wait(), 10)
        job = await harness.wait_status(job_id, "CANCELLED")
    finally:
        await loops.stop()
    assert job.checkpoints == ()
    assert await kinds(pool, job_id) == ["ACCEPTED", "CANCELLED"]
    assert loops.stats.cancelled == 1


async def test_a_cancel_landing_before_a_settle_the_database_refuses_is_still_settled(
    pool: Pool,
) -> None:
    """The last step's response cannot be stored (U+0000 in a string): the
    settle's fallback, failing the job, meets the cancel's fence instead, and
    the runner settles the cancel then, not the sweeper once the lease passes."""
    runs = RunStore(pool, retry_base_s=0.05, lease_s=30.0)
    control = ControlStore.beside(runs)
    registry = make_registry(CallLog())

    async def unstorable_review(request: Any, ctx: StepContext) -> Any:
        result = await control.cancel(uuid.UUID(ctx.job_id), reason="mid-review")
        assert result.outcome == "CANCEL_REQUESTED"
        return {"approved": True, "reviewer": "a\x00b"}

    registry.register(REVIEW, unstorable_review, replace=True)
    harness = Harness(runs, registry, CallLog())
    job_id = await harness.submit(envelope(name="auto", review="invoke"), {"text": "a b"})
    loops = harness.loops(heartbeat_s=20.0, hold_back_last_checkpoint=True)
    await loops.start()
    try:
        job = await harness.wait_status(job_id, "CANCELLED", timeout_s=5.0)
    finally:
        await loops.stop()
    assert job.cancel_reason == "mid-review"
    assert (await kinds(pool, job_id))[-1] == "CANCELLED"
    assert (loops.stats.cancelled, loops.stats.lease_lost) == (1, 0)
