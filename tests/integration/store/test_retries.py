"""Retries back off base x 2^(attempt-1) on the database clock, then land DEAD."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from schemas.contract import EventType, decode_event
from store.outbox import Outbox
from store.pool import Pool
from store.runs import RunStore
from tests.integration.store.helpers import submit

FAST_BASE_S = 0.02


async def test_attempts_one_and_two_back_off_five_and_ten_seconds_then_dead(
    pool: Pool, outbox: Outbox
) -> None:
    store = RunStore(pool)  # base 5 s
    fast = RunStore(pool, retry_base_s=FAST_BASE_S)

    # Attempt 1 with the default base: +5 s. run_after and updated_at are both
    # the statement's now(), so their difference is the backoff exactly.
    first = (await submit(store)).job.job_id
    claimed = await store.claim("w1")
    assert claimed is not None and claimed.lease.attempt == 1
    outcome = await store.retry_or_die(claimed.lease, "UNAVAILABLE: embedder down")
    job = await store.get(first)
    assert (outcome.status, outcome.attempt, job.status) == ("QUEUED", 1, "QUEUED")
    assert job.run_after - job.updated_at == timedelta(seconds=5)
    assert outcome.run_after == job.run_after
    assert job.error == "UNAVAILABLE: embedder down"
    assert job.lease_owner is None and job.lease_until is None
    assert await store.claim("w1") is None  # not before its backoff

    # Attempt 2 with the default base: +10 s (attempt 1 of this job retried fast).
    second = (await submit(store)).job.job_id
    claimed = await store.claim("w1")
    assert claimed is not None and claimed.job_id == second
    await fast.retry_or_die(claimed.lease, "DEADLINE_EXCEEDED")
    await asyncio.sleep(FAST_BASE_S * 2)
    claimed = await store.claim("w2")
    assert claimed is not None and claimed.job_id == second and claimed.lease.attempt == 2
    outcome = await store.retry_or_die(claimed.lease, "DEADLINE_EXCEEDED again")
    job = await store.get(second)
    assert (outcome.status, outcome.attempt) == ("QUEUED", 2)
    assert job.run_after - job.updated_at == timedelta(seconds=10)

    # Attempt 3 of 3: DEAD with the last error verbatim, and its DEAD event.
    third = (await submit(store)).job.job_id
    last_error = "RESOURCE_EXHAUSTED: quota of 'embedder' exceeded (limit 10/s)"
    for attempt in (1, 2, 3):
        await asyncio.sleep(FAST_BASE_S * 2 ** (attempt - 1) * 1.5)
        claimed = await fast.claim("w3")
        assert claimed is not None and claimed.job_id == third
        assert claimed.lease.attempt == attempt
        outcome = await fast.retry_or_die(
            claimed.lease, f"try {attempt}" if attempt < 3 else last_error
        )
    assert outcome.dead
    job = await store.get(third)
    assert job.status == "DEAD"
    assert job.error == last_error
    assert job.attempt == 3
    assert job.lease_owner == "w3"
    events = [decode_event(row.payload) for row in await outbox.events_for(third)]
    assert [event.type for event in events] == [EventType.TYPE_ACCEPTED, EventType.TYPE_DEAD]
    assert events[-1].error == last_error
    assert events[-1].attempt == 3
    assert await fast.claim("w3") is None


async def test_the_backoff_base_is_configurable(pool: Pool) -> None:
    store = RunStore(pool, retry_base_s=0.1, default_max_attempts=5)
    job_id = (await submit(store)).job.job_id
    expected = []
    for attempt in (1, 2, 3):
        claimed = await store.claim("w1")
        assert claimed is not None and claimed.lease.attempt == attempt
        await store.retry_or_die(claimed.lease, "UNAVAILABLE")
        job = await store.get(job_id)
        expected.append((job.run_after - job.updated_at).total_seconds())
        await asyncio.sleep(0.1 * 2 ** (attempt - 1) + 0.03)
    assert expected == pytest.approx([0.1, 0.2, 0.4])
