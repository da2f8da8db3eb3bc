"""The sweeper: expired leases requeue, or land DEAD when the attempts are gone."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC

from schemas.contract import EventType, decode_event
from store.outbox import Outbox
from store.pool import Pool
from store.runs import RunStore
from tests.integration.store.helpers import age_rows, entry, submit


async def _expire(store: RunStore, pool: Pool, *job_ids: uuid.UUID) -> None:
    await age_rows(pool, store.lease_s + 1, *job_ids)


async def test_an_expired_lease_is_requeued_and_resumes_from_its_checkpoints(
    pool: Pool, outbox: Outbox
) -> None:
    store = RunStore(pool)
    job_id = (await submit(store)).job.job_id
    claimed = await store.claim("w1")
    assert claimed is not None
    await store.checkpoint(claimed.lease, entry("tokenize", ids=[1]))
    assert (await store.sweep_expired()).requeued == 0  # still leased

    await _expire(store, pool, job_id)
    result = await store.sweep_expired()
    assert (result.requeued, result.dead) == (1, 0)
    job = await store.get(job_id)
    assert job.status == "QUEUED"
    assert job.attempt == 1  # the expired attempt counts
    assert job.lease_owner is None and job.lease_until is None
    assert job.error == "lease expired on attempt 1/3 (worker w1)"
    assert job.run_after <= job.updated_at
    assert (await store.sweep_expired()).requeued == 0

    again = await store.claim("w2")
    assert again is not None and again.job_id == job_id
    assert again.lease.attempt == 2
    assert [item["name"] for item in again.job.checkpoints] == ["tokenize"]
    # The sweep says so: RETRY_SCHEDULED, runnable again at the sweep's now.
    events = [decode_event(row.payload) for row in await outbox.events_for(job_id)]
    assert [event.type for event in events] == [
        EventType.TYPE_ACCEPTED,
        EventType.TYPE_STEP_CHECKPOINT,
        EventType.TYPE_RETRY_SCHEDULED,
    ]
    assert events[-1].error == job.error
    assert events[-1].next_run_at.ToDatetime(tzinfo=UTC) == job.run_after


async def test_an_expired_lease_on_the_last_attempt_lands_dead(pool: Pool, outbox: Outbox) -> None:
    store = RunStore(pool)
    job_id = (await submit(store, max_attempts=2)).job.job_id
    for attempt in (1, 2):
        claimed = await store.claim("w1")
        assert claimed is not None and claimed.lease.attempt == attempt
        await _expire(store, pool, job_id)
        result = await store.sweep_expired()
        assert (result.requeued, result.dead) == ((1, 0) if attempt == 1 else (0, 1))

    job = await store.get(job_id)
    assert job.status == "DEAD"
    assert job.error == "lease expired on attempt 2/2 (worker w1)"
    assert job.lease_until is None
    events = [decode_event(row.payload) for row in await outbox.events_for(job_id)]
    assert [event.type for event in events] == [
        EventType.TYPE_ACCEPTED,
        EventType.TYPE_RETRY_SCHEDULED,
        EventType.TYPE_DEAD,
    ]
    assert events[-1].error == "lease expired on attempt 2/2 (worker w1)"
    assert events[-1].attempt == 2
    assert await store.claim("w1") is None
    assert await store.sweep_expired() == type(result)(requeued=0, dead=0)


async def test_a_queued_job_with_no_attempts_left_is_never_claimed_but_settled_dead(
    pool: Pool, store: RunStore, outbox: Outbox
) -> None:
    job_id = (await submit(store)).job.job_id
    claimed = await store.claim("w1")
    assert claimed is not None
    await store.retry_or_die(claimed.lease, "UNAVAILABLE: first try")
    # An operator lowers the budget below what the job already spent.
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run SET max_attempts = 1, run_after = now() WHERE job_id = %s",
            (job_id,),
        )
    assert await store.claim("w1") is None
    result = await store.sweep_expired()
    assert (result.requeued, result.dead) == (0, 1)
    job = await store.get(job_id)
    assert job.status == "DEAD"
    assert job.error == (
        "attempts exhausted (1/1) while queued; last error: UNAVAILABLE: first try"
    )
    last = decode_event((await outbox.events_for(job_id))[-1].payload)
    assert last.type == EventType.TYPE_DEAD
    assert last.error == job.error


async def test_two_sweepers_at_once_settle_each_job_once(pool: Pool, outbox: Outbox) -> None:
    store = RunStore(pool)
    ids = [(await submit(store, max_attempts=1)).job.job_id for _ in range(30)]
    assert len(await store.claim_batch("w1", 30)) == 30
    await _expire(store, pool, *ids)
    results = await asyncio.gather(store.sweep_expired(), store.sweep_expired())
    assert sum(result.dead for result in results) == 30
    for job_id in ids:
        assert len(await outbox.events_for(job_id)) == 2
