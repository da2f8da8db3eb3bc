"""Retries back off base x 2^(attempt-1) on the database clock, then land DEAD.

Each retry publishes RETRY_SCHEDULED naming the row's next run time. The
backoff is counted from the settle on the database clock as the claim read it
(``Lease.clock_offset_s``), so it matches ``updated_at`` (the statement's
now()) to within the round trips of the claim and the settle.
"""

from __future__ import annotations

import uuid
from datetime import UTC, timedelta

import pytest

from schemas.contract import EventType, decode_event
from store.outbox import Outbox
from store.pool import Pool
from store.runs import RunStore
from tests.integration.store.helpers import age_rows, submit

BASE_S = 60.0
# How far the backoff, counted on the database clock as the claim measured it,
# may fall from the statement's own now(): a claim's and a settle's round trip.
ROUND_TRIPS_S = 0.5


async def _let_the_backoff_pass(pool: Pool, job_id: uuid.UUID) -> None:
    # Stands in for waiting out the backoff; the claim still compares against now().
    async with pool.connection() as conn:
        await conn.execute("UPDATE workflow_run SET run_after = now() WHERE job_id = %s", (job_id,))


async def test_attempts_one_and_two_back_off_five_and_ten_seconds_then_dead(
    pool: Pool, store: RunStore, outbox: Outbox
) -> None:
    job_id = (await submit(store)).job.job_id
    assert store.retry_base_s == 5.0 and store.default_max_attempts == 3
    errors = [
        "UNAVAILABLE: embedder down",
        "DEADLINE_EXCEEDED: embedder slow",
        "RESOURCE_EXHAUSTED: quota of 'embedder' exceeded (limit 10/s)",
    ]
    # updated_at is the statement's now(): run_after is the backoff after it.
    for attempt, (error, backoff_s) in enumerate(zip(errors[:2], (5, 10), strict=True), 1):
        claimed = await store.claim("w1")
        assert claimed is not None and claimed.job_id == job_id
        assert claimed.lease.attempt == attempt
        outcome = await store.retry_or_die(claimed.lease, error)
        job = await store.get(job_id)
        assert (outcome.status, outcome.attempt, job.status) == ("QUEUED", attempt, "QUEUED")
        assert not outcome.dead
        assert job.run_after - job.updated_at == pytest.approx(
            timedelta(seconds=backoff_s), abs=timedelta(seconds=ROUND_TRIPS_S)
        )
        assert outcome.run_after == job.run_after
        assert job.error == error
        assert job.lease_owner is None and job.lease_until is None
        assert await store.claim("w2") is None  # not before its backoff
        await _let_the_backoff_pass(pool, job_id)

    claimed = await store.claim("w3")
    assert claimed is not None and claimed.lease.attempt == 3
    outcome = await store.retry_or_die(claimed.lease, errors[2])
    assert outcome.dead and outcome.attempt == 3
    job = await store.get(job_id)
    assert (job.status, job.error, job.attempt) == ("DEAD", errors[2], 3)
    assert job.lease_owner == "w3"  # who held the last attempt
    events = [decode_event(row.payload) for row in await outbox.events_for(job_id)]
    # Each retry says so, with its error and the row's next run time; then DEAD.
    assert [event.type for event in events] == [
        EventType.TYPE_ACCEPTED,
        EventType.TYPE_RETRY_SCHEDULED,
        EventType.TYPE_RETRY_SCHEDULED,
        EventType.TYPE_DEAD,
    ]
    assert [(e.error, e.attempt) for e in events[1:]] == [
        (error, n) for n, error in enumerate(errors, 1)
    ]
    history = await store.history.attempts(job_id)
    assert [a.outcome for a in history] == ["RETRY_SCHEDULED", "RETRY_SCHEDULED", "DEAD"]
    for event, attempt in zip(events[1:3], history[:2], strict=True):
        assert event.next_run_at.ToDatetime(tzinfo=UTC) == attempt.next_run_at
    assert not events[-1].HasField("next_run_at") and history[-1].next_run_at is None
    await _let_the_backoff_pass(pool, job_id)
    assert await store.claim("w1") is None


async def test_a_retry_waits_out_its_backoff_on_the_database_clock(pool: Pool) -> None:
    store = RunStore(pool, retry_base_s=BASE_S)
    job_id = (await submit(store)).job.job_id
    for attempt in (1, 2, 3):
        if attempt > 1:
            # Attempt n-1 backed off base x 2^(n-2): nothing to claim until exactly
            # that much has passed on the database clock.
            assert await store.claim("w1") is None
            await age_rows(pool, BASE_S * 2 ** (attempt - 2), job_id)
        claimed = await store.claim("w1")
        assert claimed is not None and claimed.job_id == job_id
        assert claimed.lease.attempt == attempt
        outcome = await store.retry_or_die(claimed.lease, f"UNAVAILABLE #{attempt}")
    assert outcome.dead
    assert (await store.get(job_id)).error == "UNAVAILABLE #3"


async def test_the_backoff_base_is_configurable(pool: Pool) -> None:
    store = RunStore(pool, retry_base_s=10.0, default_max_attempts=5)
    job_id = (await submit(store)).job.job_id
    expected = []
    for attempt in (1, 2, 3):
        claimed = await store.claim("w1")
        assert claimed is not None and claimed.lease.attempt == attempt
        await store.retry_or_die(claimed.lease, "UNAVAILABLE")
        job = await store.get(job_id)
        expected.append((job.run_after - job.updated_at).total_seconds())
        await age_rows(pool, 10.0 * 2 ** (attempt - 1) + ROUND_TRIPS_S, job_id)
    assert expected == pytest.approx([10.0, 20.0, 40.0], abs=ROUND_TRIPS_S)


async def _set_attempt(pool: Pool, job_id: uuid.UUID, attempt: int) -> None:
    # Stands in for the attempts spent before: the next claim counts attempt + 1.
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run SET attempt = %s WHERE job_id = %s", (attempt, job_id)
        )


@pytest.mark.parametrize("group_commit", [True, False])
async def test_the_backoff_stops_at_its_cap_up_to_the_last_allowed_attempt(
    pool: Pool, outbox: Outbox, group_commit: bool
) -> None:
    store = RunStore(pool, group_commit=group_commit)
    job_id = (await submit(store, max_attempts=100)).job.job_id
    # 5 s doubled 36 times and more is past any date a row can hold.
    for attempt in (37, 99):
        await _set_attempt(pool, job_id, attempt - 1)
        claimed = await store.claim("w1")
        assert claimed is not None and claimed.lease.attempt == attempt
        outcome = await store.retry_or_die(claimed.lease, f"UNAVAILABLE #{attempt}")
        job = await store.get(job_id)
        assert (outcome.status, job.error) == ("QUEUED", f"UNAVAILABLE #{attempt}")
        assert job.run_after - job.updated_at == pytest.approx(
            timedelta(seconds=store.retry_max_s), abs=timedelta(seconds=ROUND_TRIPS_S)
        )
        await _let_the_backoff_pass(pool, job_id)
    claimed = await store.claim("w1")
    assert claimed is not None and claimed.lease.attempt == 100
    outcome = await store.retry_or_die(claimed.lease, "UNAVAILABLE #100")
    assert outcome.dead
    job = await store.get(job_id)
    assert (job.status, job.error) == ("DEAD", "UNAVAILABLE #100")
    events = [decode_event(row.payload) for row in await outbox.events_for(job_id)]
    assert [event.type for event in events][-1] == EventType.TYPE_DEAD


@pytest.mark.parametrize("group_commit", [True, False])
async def test_a_retry_due_after_the_job_deadline_fails_the_job_at_once(
    pool: Pool, outbox: Outbox, group_commit: bool
) -> None:
    store = RunStore(pool, group_commit=group_commit, retry_base_s=BASE_S)
    # Attempt 1 backs off 60 s and fits a 10-minute deadline; attempt 2's 120 s
    # would end past the deadline once five of its minutes have gone.
    submitted = await store.submit(
        job_id=uuid.uuid4(),
        workflow_name="embed-text",
        definition={"name": "embed-text"},
        definition_hash="hash-embed-text",
        input={"text": "hello"},
        deadline_ms=600_000,
    )
    job_id = submitted.job.job_id
    claimed = await store.claim("w1")
    assert claimed is not None
    assert (await store.retry_or_die(claimed.lease, "UNAVAILABLE #1")).status == "QUEUED"
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run SET run_after = now(), deadline_at = now() + interval '100 s'"
            " WHERE job_id = %s",
            (job_id,),
        )
    claimed = await store.claim("w1")
    assert claimed is not None and claimed.lease.attempt == 2
    outcome = await store.retry_or_die(claimed.lease, "UNAVAILABLE #2")
    assert outcome.status == "FAILED" and not outcome.dead
    job = await store.get(job_id)
    assert job.status == "FAILED" and job.lease_owner == "w1"
    assert job.error.startswith("UNAVAILABLE #2; not retried: the job's deadline passes")
    events = [decode_event(row.payload) for row in await outbox.events_for(job_id)]
    assert [event.type for event in events] == [
        EventType.TYPE_ACCEPTED,
        EventType.TYPE_RETRY_SCHEDULED,
        EventType.TYPE_FAILED,
    ]
    assert (events[-1].error, events[-1].deadline) == (job.error, "job")
    history = await store.history.attempts(job_id)
    assert [(a.outcome, a.error_class) for a in history] == [
        ("RETRY_SCHEDULED", "retryable"),
        ("DEADLINE_PASSED", "deadline"),
    ]
    assert history[-1].error == job.error and history[-1].next_run_at is None


@pytest.mark.parametrize("base_s", [3600.0 * 24 * 365 * 10_000, 1e300])
async def test_a_base_above_the_cap_waits_the_cap(pool: Pool, base_s: float) -> None:
    store = RunStore(pool, retry_base_s=base_s, retry_max_s=120.0)
    job_id = (await submit(store)).job.job_id
    claimed = await store.claim("w1")
    assert claimed is not None
    outcome = await store.retry_or_die(claimed.lease, "UNAVAILABLE")
    job = await store.get(job_id)
    assert outcome.status == "QUEUED"
    assert job.run_after - job.updated_at == pytest.approx(
        timedelta(seconds=120.0), abs=timedelta(seconds=ROUND_TRIPS_S)
    )


async def test_the_backoff_cap_must_be_positive(pool: Pool) -> None:
    with pytest.raises(ValueError, match="retry_max_s"):
        RunStore(pool, retry_max_s=0.0)
