"""Every attempt is appended to the history by the statement that ends it.

Who held it, when the claim took it, when and how it ended, the steps it
checkpointed, and the error with its class; a retry and a sweep requeue
publish RETRY_SCHEDULED with the row's next run time, in the same statement.
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

import pytest

from schemas.contract import EventType, decode_event
from schemas.errors import LeaseLost
from schemas.verdicts import StepVerdict
from store.outbox import Outbox
from store.pool import Pool
from store.runs import RunStore
from tests.integration.store.helpers import age_rows, entry, submit


def _accept(response: dict[str, Any]) -> StepVerdict:
    return StepVerdict(step_name="review", accepted=True, response=response)


async def _let_the_backoff_pass(pool: Pool, job_id: object) -> None:
    async with pool.connection() as conn:
        await conn.execute("UPDATE workflow_run SET run_after = now() WHERE job_id = %s", (job_id,))


async def test_a_retry_a_park_and_a_completion_each_append_their_attempt(
    pool: Pool, store: RunStore, outbox: Outbox
) -> None:
    job_id = (await submit(store)).job.job_id

    first = await store.claim("w1")
    assert first is not None and first.job.claimed_at is not None
    await store.checkpoint(first.lease, entry("tokenize", ids=[1]))
    retried = await store.retry_or_die(first.lease, "UNAVAILABLE: embedder down")
    [one] = await store.history.attempts(job_id)
    assert (one.attempt, one.worker, one.outcome) == (1, "w1", "RETRY_SCHEDULED")
    assert one.claimed_at == first.job.claimed_at
    assert one.claimed_at is not None and one.ended_at >= one.claimed_at
    assert one.steps == ("tokenize",)
    assert (one.error, one.error_class) == ("UNAVAILABLE: embedder down", "retryable")
    assert one.next_run_at == retried.run_after == (await store.get(job_id)).run_after
    event = decode_event((await outbox.events_for(job_id))[-1].payload)
    assert event.type == EventType.TYPE_RETRY_SCHEDULED
    assert (event.attempt, event.error) == (1, "UNAVAILABLE: embedder down")
    assert event.next_run_at.ToDatetime(tzinfo=UTC) == retried.run_after

    await _let_the_backoff_pass(pool, job_id)
    second = await store.claim("w2")
    assert second is not None
    await store.checkpoint(second.lease, entry("embed", vector=[0.5]))
    await store.park(second.lease, "review")
    await store.complete_step(
        job_id=job_id, step_name="review", response={"approved": True}, verify=_accept
    )
    third = await store.claim("w3")
    assert third is not None
    await store.complete(third.lease, result={"ok": True}, verdict="done")

    history = await store.history.attempts(job_id)
    assert [(a.attempt, a.worker, a.outcome) for a in history] == [
        (1, "w1", "RETRY_SCHEDULED"),
        (2, "w2", "PARKED"),
        # The park gave its attempt back: the resumed run is attempt 2 again.
        (2, "w3", "COMPLETED"),
    ]
    # The review's response was checkpointed while parked, before the third claim.
    assert [a.steps for a in history] == [("tokenize",), ("embed",), ()]
    assert [a.error for a in history[1:]] == [None, None]
    assert history[2].claimed_at == third.job.claimed_at


async def test_failures_are_classified_and_dead_has_no_next_run(store: RunStore) -> None:
    failing = (await submit(store)).job.job_id
    claimed = await store.claim("w1")
    assert claimed is not None
    await store.fail(claimed.lease, error="INVALID_ARGUMENT: no such field")
    rejected = (await submit(store)).job.job_id
    claimed = await store.claim("w1")
    assert claimed is not None
    await store.fail(claimed.lease, verdict="text: must not be empty")
    dying = (await submit(store, max_attempts=1)).job.job_id
    claimed = await store.claim("w1")
    assert claimed is not None
    assert (await store.retry_or_die(claimed.lease, "UNAVAILABLE")).dead

    [failed] = await store.history.attempts(failing)
    assert (failed.outcome, failed.error_class) == ("FAILED", "non-retryable")
    assert failed.error == "INVALID_ARGUMENT: no such field"
    [verdict] = await store.history.attempts(rejected)
    assert (verdict.outcome, verdict.error_class) == ("FAILED", "verdict")
    [dead] = await store.history.attempts(dying)
    assert (dead.outcome, dead.error_class, dead.next_run_at) == ("DEAD", "retryable", None)


async def test_a_hand_back_is_kept_under_the_attempt_it_gave_back(store: RunStore) -> None:
    job_id = (await submit(store)).job.job_id
    claimed = await store.claim("w1")
    assert claimed is not None
    await store.hand_back(claimed.lease)
    again = await store.claim("w2")
    assert again is not None and again.lease.attempt == 1
    history = await store.history.attempts(job_id)
    assert [(a.attempt, a.worker, a.outcome, a.error) for a in history] == [
        (1, "w1", "HANDED_BACK", None)
    ]


async def test_sweeps_record_the_worker_that_lost_the_lease(
    pool: Pool, store: RunStore, outbox: Outbox
) -> None:
    job_id = (await submit(store, max_attempts=2)).job.job_id
    for worker in ("w1", "w2"):
        claimed = await store.claim(worker)
        assert claimed is not None
        await age_rows(pool, store.lease_s + 1, job_id)
        await store.sweep_expired()

    job = await store.get(job_id)
    assert job.status == "DEAD"
    swept, dead = await store.history.attempts(job_id)
    assert (swept.attempt, swept.worker, swept.outcome, swept.error_class) == (
        1,
        "w1",
        "SWEPT",
        "lease",
    )
    assert swept.error == "lease expired on attempt 1/2 (worker w1)"
    assert (dead.attempt, dead.worker, dead.outcome, dead.error_class) == (2, "w2", "DEAD", "lease")
    events = [decode_event(row.payload) for row in await outbox.events_for(job_id)]
    assert [e.type for e in events] == [
        EventType.TYPE_ACCEPTED,
        EventType.TYPE_RETRY_SCHEDULED,
        EventType.TYPE_DEAD,
    ]
    assert events[1].next_run_at.ToDatetime(tzinfo=UTC) == swept.next_run_at


async def test_a_queued_job_out_of_attempts_ends_no_attempt(pool: Pool, store: RunStore) -> None:
    job_id = (await submit(store)).job.job_id
    claimed = await store.claim("w1")
    assert claimed is not None
    await store.retry_or_die(claimed.lease, "UNAVAILABLE")
    async with pool.connection() as conn:
        await conn.execute("UPDATE workflow_run SET max_attempts = 1 WHERE job_id = %s", (job_id,))
    assert (await store.sweep_expired()).dead == 1
    assert [a.outcome for a in await store.history.attempts(job_id)] == ["RETRY_SCHEDULED"]


async def test_a_lost_lease_appends_nothing(pool: Pool, store: RunStore) -> None:
    job_id = (await submit(store)).job.job_id
    stale = await store.claim("w1")
    assert stale is not None
    await age_rows(pool, store.lease_s + 1, job_id)
    await store.sweep_expired()
    for write in (
        store.retry_or_die(stale.lease, "UNAVAILABLE"),
        store.fail(stale.lease, error="boom"),
        store.complete(stale.lease, result={}, verdict="ok"),
        store.park(stale.lease, "review"),
        store.hand_back(stale.lease),
    ):
        with pytest.raises(LeaseLost):
            await write
    assert [a.outcome for a in await store.history.attempts(job_id)] == ["SWEPT"]
