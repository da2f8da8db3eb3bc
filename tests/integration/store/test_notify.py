"""LISTEN/NOTIFY wake-ups: claim loops hear claimable work, relays hear new events."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from schemas.errors import LeaseLost
from schemas.verdicts import StepVerdict
from store.channels import JOBS_QUEUED_CHANNEL, OUTBOX_CHANNEL
from store.notify import listen
from store.pool import Pool
from store.runs import RunStore
from tests.integration.store.helpers import entry, submit


async def _heard(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> set[str]:
    heard = set()
    async for notify in conn.notifies(timeout=0.2):
        heard.add(notify.channel)
    return heard


async def test_claimable_work_and_new_events_wake_their_listeners(dsn: str, pool: Pool) -> None:
    store = RunStore(pool)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute(f"LISTEN {JOBS_QUEUED_CHANNEL}".encode())
        await listener.execute(f"LISTEN {OUTBOX_CHANNEL}".encode())

        await submit(store)
        assert await _heard(listener) == {JOBS_QUEUED_CHANNEL, OUTBOX_CHANNEL}

        claimed = await store.claim("w1")
        assert claimed is not None
        assert await _heard(listener) == set()

        # Step checkpoints keep NOTIFY off the hot path: the relay's next pass takes them.
        await store.checkpoint(claimed.lease, entry("tokenize", ids=[1]))
        assert await _heard(listener) == set()

        # A backoff in the future is not claimable yet: no claimer is woken, only
        # the relay, for the RETRY_SCHEDULED event.
        await store.retry_or_die(claimed.lease, "UNAVAILABLE")
        assert await _heard(listener) == {OUTBOX_CHANNEL}

        await submit(store)
        assert len(await _heard(listener)) == 2
        again = await store.claim("w1")
        assert again is not None
        await store.hand_back(again.lease)
        assert await _heard(listener) == {JOBS_QUEUED_CHANNEL}

        again = await store.claim("w1")
        assert again is not None
        await store.park(again.lease, "review")
        assert await _heard(listener) == {OUTBOX_CHANNEL}
        await store.complete_step(
            job_id=again.job_id,
            step_name="review",
            response={},
            verify=lambda response: StepVerdict("review", accepted=True, response=response),
        )
        assert await _heard(listener) == {JOBS_QUEUED_CHANNEL}
        resumed = await store.claim("w1")
        assert resumed is not None
        await store.complete(resumed.lease, result={}, verdict="done")
        assert await _heard(listener) == {OUTBOX_CHANNEL}


async def test_a_listening_connection_yields_the_channel_of_each_notification(
    dsn: str, pool: Pool
) -> None:
    async with listen(dsn, [JOBS_QUEUED_CHANNEL, OUTBOX_CHANNEL]) as notified:
        await submit(RunStore(pool))
        heard = {await anext(notified), await anext(notified)}
    assert heard == {JOBS_QUEUED_CHANNEL, OUTBOX_CHANNEL}


async def test_a_write_that_inserts_nothing_wakes_no_one(dsn: str, pool: Pool) -> None:
    store = RunStore(pool)
    job_id = uuid.uuid4()
    await submit(store, job_id=job_id)
    stale = await store.claim("w1")
    assert stale is not None
    await store.hand_back(stale.lease)
    claimed = await store.claim("w1")
    assert claimed is not None
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute(f"LISTEN {JOBS_QUEUED_CHANNEL}".encode())
        await listener.execute(f"LISTEN {OUTBOX_CHANNEL}".encode())

        # The same id again inserts no job and no ACCEPTED event.
        await submit(store, job_id=job_id)
        assert await _heard(listener) == set()

        # A completion under a lease that is gone writes no event.
        with pytest.raises(LeaseLost):
            await store.complete(stale.lease, result={}, verdict="done")
        assert await _heard(listener) == set()

        await store.complete(claimed.lease, result={}, verdict="done")
        assert await _heard(listener) == {OUTBOX_CHANNEL}


async def test_jobs_submitted_together_wake_their_listeners(dsn: str, pool: Pool) -> None:
    store = RunStore(pool)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute(f"LISTEN {JOBS_QUEUED_CHANNEL}".encode())
        await listener.execute(f"LISTEN {OUTBOX_CHANNEL}".encode())
        await asyncio.gather(*(submit(store) for _ in range(12)))
        assert await _heard(listener) == {JOBS_QUEUED_CHANNEL, OUTBOX_CHANNEL}
