"""A worker whose lease was swept changes nothing and publishes nothing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from schemas.contract import EventType, decode_event
from schemas.errors import LeaseLost
from store.outbox import Outbox
from store.pool import Pool
from store.records import Lease
from store.runs import RunStore
from tests.integration.store.helpers import age_rows, entry, submit


async def _swept_lease(store: RunStore, pool: Pool) -> Lease:
    await submit(store)
    claimed = await store.claim("w1")
    assert claimed is not None
    await age_rows(pool, store.lease_s + 1, claimed.job_id)
    swept = await store.sweep_expired()
    assert swept.requeued == 1
    return claimed.lease


async def _assert_every_fenced_write_refused(store: RunStore, lease: Lease) -> None:
    writes: dict[str, Callable[[], Awaitable[object]]] = {
        "extend_lease": lambda: store.extend_lease(lease),
        "checkpoint": lambda: store.checkpoint(lease, entry("tokenize", ids=[1])),
        "park": lambda: store.park(lease, "review"),
        "complete": lambda: store.complete(lease, result={"ok": True}, verdict="done"),
        "fail with an error": lambda: store.fail(lease, error="INVALID_ARGUMENT: boom"),
        "fail with a verdict": lambda: store.fail(lease, verdict="text: must not be empty"),
        "retry_or_die": lambda: store.retry_or_die(lease, "UNAVAILABLE"),
        "hand_back": lambda: store.hand_back(lease),
    }
    for what, write in writes.items():
        with pytest.raises(LeaseLost, match="no longer holds"):
            await write()
            pytest.fail(f"{what} succeeded with a lost lease")


async def test_a_swept_worker_cannot_write_and_publishes_nothing(pool: Pool) -> None:
    store = RunStore(pool)
    outbox = Outbox(pool)
    stale = await _swept_lease(store, pool)
    before = await store.get(stale.job_id)
    assert before.status == "QUEUED"

    await _assert_every_fenced_write_refused(store, stale)

    after = await store.get(stale.job_id)
    assert after == before
    events = [decode_event(row.payload) for row in await outbox.events_for(stale.job_id)]
    # ACCEPTED, then the sweeper's RETRY_SCHEDULED; nothing from the stale worker.
    assert [event.type for event in events] == [
        EventType.TYPE_ACCEPTED,
        EventType.TYPE_RETRY_SCHEDULED,
    ]
    assert "lease expired" in events[1].error
    # The history holds the one SWEPT attempt, and nothing the stale worker tried.
    assert [a.outcome for a in await store.history.attempts(stale.job_id)] == ["SWEPT"]


async def test_a_swept_worker_cannot_write_over_the_next_claim(pool: Pool) -> None:
    store = RunStore(pool)
    outbox = Outbox(pool)
    stale = await _swept_lease(store, pool)
    # The same worker id claims again: only the attempt tells the two runs apart.
    fresh = await store.claim("w1")
    assert fresh is not None
    assert fresh.lease.attempt == stale.attempt + 1

    await _assert_every_fenced_write_refused(store, stale)

    job = await store.get(stale.job_id)
    assert job.status == "RUNNING"
    assert job.attempt == fresh.lease.attempt
    assert job.checkpoints == ()
    # The live lease still works.
    await store.checkpoint(fresh.lease, entry("tokenize", ids=[1]))
    events = [decode_event(row.payload) for row in await outbox.events_for(stale.job_id)]
    # ACCEPTED, the sweep's RETRY_SCHEDULED (the stale attempt), the live checkpoint.
    assert [event.attempt for event in events] == [0, stale.attempt, fresh.lease.attempt]
    assert events[1].type == EventType.TYPE_RETRY_SCHEDULED


async def test_a_settled_job_refuses_its_old_lease(store: RunStore) -> None:
    await submit(store)
    claimed = await store.claim("w1")
    assert claimed is not None
    await store.complete(claimed.lease, result={"n": 1}, verdict="ok")
    with pytest.raises(LeaseLost):
        await store.checkpoint(claimed.lease, entry("late", x=1))
    with pytest.raises(LeaseLost):
        await store.complete(claimed.lease, result={"n": 2}, verdict="again")


async def test_a_claim_lost_in_a_server_crash_is_not_repeated_by_the_next_one(
    pool: Pool,
) -> None:
    # A claim does not wait for its WAL flush, so a server crash can lose it
    # after its runner started: the row is back as it was before the claim.
    # The same worker's next claim then holds the same (owner, attempt) pair,
    # and only the token may tell the lost claim's runner from the new one.
    store = RunStore(pool)
    await submit(store)
    columns = "status, lease_owner, lease_until, attempt, lease_token, claimed_at, updated_at"
    async with pool.connection() as conn:
        cursor = await conn.execute(f"SELECT job_id, {columns} FROM workflow_run")
        before = await cursor.fetchone()
    assert before is not None
    lost = await store.claim("w1")
    assert lost is not None
    async with pool.connection() as conn:
        # What recovery leaves of a claim whose commit never reached the disk.
        await conn.execute(
            f"UPDATE workflow_run SET ({columns}) = (%s, %s, %s, %s, %s, %s, %s) WHERE job_id = %s",
            (*before[1:], before[0]),
        )
    again = await store.claim("w1")
    assert again is not None and again.job_id == lost.job_id
    assert again.lease.attempt == lost.lease.attempt
    assert again.lease.token > lost.lease.token

    await _assert_every_fenced_write_refused(store, lost.lease)
    await store.checkpoint(again.lease, entry("tokenize", ids=[1]))


async def test_a_handed_back_lease_stays_dead_when_the_same_worker_claims_again(
    pool: Pool,
) -> None:
    # A hand-back gives the attempt back, so the same worker's next claim holds
    # the same (owner, attempt) pair; only the fencing token tells them apart.
    store = RunStore(pool)
    outbox = Outbox(pool)
    await submit(store)
    first = await store.claim("w1")
    assert first is not None
    await store.hand_back(first.lease)
    second = await store.claim("w1")
    assert second is not None and second.job_id == first.job_id
    assert second.lease.attempt == first.lease.attempt
    assert second.lease.token > first.lease.token

    await _assert_every_fenced_write_refused(store, first.lease)

    job = await store.get(first.job_id)
    assert job.status == "RUNNING" and job.checkpoints == ()
    assert [row.event_type for row in await outbox.events_for(first.job_id)] == ["ACCEPTED"]
    await store.checkpoint(second.lease, entry("tokenize", ids=[1]))
