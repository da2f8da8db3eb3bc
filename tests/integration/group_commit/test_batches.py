"""Group commit: concurrent runners' commit points in one statement, fenced row by row."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import Any
from uuid import UUID

import pytest

from schemas.contract import EventType, decode_event
from schemas.errors import LeaseLost, UnstorableValue
from store.control import ControlStore
from store.outbox import Outbox
from store.pool import Pool
from store.records import Lease
from store.runs import RunStore
from store.states import Status
from tests.integration.store.helpers import entry, submit, wait_for_lock_wait


async def _claimed(store: RunStore, count: int) -> list[Lease]:
    for _ in range(count):
        await submit(store)
    claimed = await store.claim_batch("w1", count)
    assert len(claimed) == count
    return [job.lease for job in claimed]


async def _event_types(pool: Pool, job_id: UUID) -> list[int]:
    records = await Outbox(pool).events_for(job_id)
    return [decode_event(record.payload).type for record in records]


@contextlib.asynccontextmanager
async def _row_locked(pool: Pool, job_id: UUID) -> AsyncIterator[None]:
    """The job's row locked by another transaction: a write to it waits until the block ends."""
    async with pool.connection() as blocker, blocker.transaction():
        await blocker.execute("SELECT 1 FROM workflow_run WHERE job_id = %s FOR UPDATE", (job_id,))
        yield


async def _together(*writes: Awaitable[Any]) -> list[Any]:
    """Started in the same turn of the loop, so the writer finds them all waiting."""
    return list(await asyncio.gather(*writes, return_exceptions=True))


async def test_one_lost_lease_in_a_batch_commits_the_others(pool: Pool) -> None:
    store = RunStore(pool)
    assert store.group is not None
    kept, lost, also_kept = await _claimed(store, 3)
    # Another claim took ``lost`` since: its token moved on.
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run SET lease_token = lease_token + 1 WHERE job_id = %s",
            (lost.job_id,),
        )

    answers = await _together(
        store.checkpoint(kept, entry("tokenize", ids=[1])),
        store.checkpoint(lost, entry("tokenize", ids=[2])),
        store.checkpoint(also_kept, entry("tokenize", ids=[3])),
    )

    assert answers[0] is None and answers[2] is None
    assert isinstance(answers[1], LeaseLost)
    assert store.group.stats.flushes == 1 and store.group.stats.largest == 3
    for lease, ids in ((kept, [1]), (also_kept, [3])):
        job = await store.get(lease.job_id)
        assert [c["response"] for c in job.checkpoints] == [{"ids": ids}]
        assert await _event_types(pool, lease.job_id) == [
            EventType.TYPE_ACCEPTED,
            EventType.TYPE_STEP_CHECKPOINT,
        ]
    assert (await store.get(lost.job_id)).checkpoints == ()
    assert await _event_types(pool, lost.job_id) == [EventType.TYPE_ACCEPTED]


async def test_a_job_asked_to_cancel_is_left_out_of_the_batch(pool: Pool) -> None:
    store = RunStore(pool)
    going, cancelled = await _claimed(store, 2)
    result = await ControlStore.beside(store).cancel(cancelled.job_id, reason="stop")
    assert result.outcome == "CANCEL_REQUESTED"

    answers = await _together(
        store.complete(going, result={"ok": True}, verdict="done"),
        store.complete(cancelled, result={"ok": True}, verdict="done"),
    )

    assert answers[0] is None and isinstance(answers[1], LeaseLost)
    assert (await store.get(going.job_id)).status == Status.COMPLETED
    assert (await store.get(cancelled.job_id)).status == Status.RUNNING
    # The worker's cancel path still settles it.
    assert await ControlStore.beside(store).settle_cancelled(cancelled)
    assert (await store.get(cancelled.job_id)).status == Status.CANCELLED


async def _one_by_one(*writes: Awaitable[Any]) -> list[Any]:
    """Each written alone: the statement's single-row form."""
    return [await write for write in writes]


@pytest.mark.parametrize("together", [True, False], ids=["in-one-statement", "each-alone"])
async def test_every_kind_writes_rows_events_and_history(pool: Pool, together: bool) -> None:
    store = RunStore(pool, retry_base_s=0.5)
    assert store.group is not None
    checkpointed, completed, parked, failed, retried = await _claimed(store, 5)

    answers = await (_together if together else _one_by_one)(
        store.checkpoint(checkpointed, entry("tokenize", ids=[1])),
        store.complete(
            completed,
            result={"ok": True},
            verdict="completed 1 step: tokenize",
            last_checkpoint=entry("tokenize", ids=[2]),
        ),
        store.park(parked, "review", request={"text": "hi"}, timeout_ms=60_000),
        store.fail(failed, verdict="text: must not be empty"),
        store.retry_or_die(retried, "UNAVAILABLE: try later"),
    )

    assert answers[:4] == [None, None, None, None], answers
    retry = answers[4]
    assert retry.status == Status.QUEUED and retry.attempt == 1 and retry.max_attempts == 3
    if together:
        assert store.group.stats.flushes == 1 and store.group.stats.largest == 5
    else:
        assert store.group.stats.flushes == 5 and store.group.stats.largest == 1

    done = await store.get(completed.job_id)
    assert done.status == Status.COMPLETED and done.result == {"ok": True}
    assert [c["response"] for c in done.checkpoints] == [{"ids": [2]}]
    # The held-back checkpoint's event comes before the completion's.
    assert await _event_types(pool, completed.job_id) == [
        EventType.TYPE_ACCEPTED,
        EventType.TYPE_STEP_CHECKPOINT,
        EventType.TYPE_COMPLETED,
    ]
    history = await store.history.attempts(completed.job_id)
    assert [(a.outcome, list(a.steps)) for a in history] == [("COMPLETED", ["tokenize"])]

    waiting = await store.get(parked.job_id)
    assert waiting.status == Status.WAITING and waiting.outstanding_step == "review"
    assert waiting.review_request == {"text": "hi"} and waiting.step_deadline_at is not None
    assert (await _event_types(pool, parked.job_id))[-1] == EventType.TYPE_WAITING
    assert [a.outcome for a in await store.history.attempts(parked.job_id)] == ["PARKED"]

    gone = await store.get(failed.job_id)
    assert gone.status == Status.FAILED and gone.verdict == "text: must not be empty"
    assert (await _event_types(pool, failed.job_id))[-1] == EventType.TYPE_FAILED
    (attempt,) = await store.history.attempts(failed.job_id)
    assert (attempt.outcome, attempt.error_class) == ("FAILED", "verdict")

    again = await store.get(retried.job_id)
    assert again.status == Status.QUEUED and again.run_after == retry.run_after
    records = await Outbox(pool).events_for(retried.job_id)
    event = decode_event(records[-1].payload)
    assert event.type == EventType.TYPE_RETRY_SCHEDULED
    assert event.next_run_at.ToDatetime().timestamp() == pytest.approx(
        retry.run_after.timestamp(), abs=1e-3
    )
    (attempt,) = await store.history.attempts(retried.job_id)
    assert (attempt.outcome, attempt.next_run_at) == ("RETRY_SCHEDULED", retry.run_after)

    # And the next to the checkpointed job, the checkpoint alone.
    assert [c["response"] for c in (await store.get(checkpointed.job_id)).checkpoints] == [
        {"ids": [1]}
    ]


async def test_retry_or_die_in_a_batch_ends_dead_on_the_last_attempt(pool: Pool) -> None:
    store = RunStore(pool, default_max_attempts=1)
    (lease,) = await _claimed(store, 1)
    outcome = await store.retry_or_die(lease, "UNAVAILABLE: gone")
    assert outcome.dead and outcome.status == Status.DEAD
    assert (await _event_types(pool, lease.job_id))[-1] == EventType.TYPE_DEAD
    assert [a.outcome for a in await store.history.attempts(lease.job_id)] == ["DEAD"]


async def test_a_value_the_database_refuses_fails_only_its_own_row(pool: Pool) -> None:
    store = RunStore(pool)
    assert store.group is not None
    good, bad = await _claimed(store, 2)

    answers = await _together(
        store.checkpoint(good, entry("tokenize", ids=[1])),
        # jsonb cannot hold U+0000: the whole statement fails, then each row
        # is written on its own.
        store.checkpoint(bad, entry("tokenize", text="a\x00b")),
    )

    assert answers[0] is None
    assert isinstance(answers[1], UnstorableValue)
    assert store.group.stats.split == 1
    assert len((await store.get(good.job_id)).checkpoints) == 1
    assert (await store.get(bad.job_id)).checkpoints == ()
    assert await _event_types(pool, bad.job_id) == [EventType.TYPE_ACCEPTED]


async def test_commit_points_arriving_during_a_flush_go_together_in_the_next(pool: Pool) -> None:
    store = RunStore(pool)
    assert store.group is not None
    first, second, third = await _claimed(store, 3)
    # The first flush waits on this row lock: the others arrive meanwhile.
    async with _row_locked(pool, first.job_id):
        writing = asyncio.ensure_future(store.checkpoint(first, entry("tokenize", ids=[1])))
        await wait_for_lock_wait(pool)
        later = asyncio.ensure_future(
            _together(
                store.checkpoint(second, entry("tokenize", ids=[2])),
                store.complete(third, result={}, verdict="done"),
            )
        )
        await asyncio.sleep(0)
        assert not writing.done() and not later.done()
    await writing
    assert await later == [None, None]
    assert store.group.stats.flushes == 2 and store.group.stats.rows == 3
    assert store.group.stats.largest == 2


async def test_a_commit_point_that_comes_alone_is_sent_by_its_own_caller(pool: Pool) -> None:
    # No writer task to start and no hand-over to wait for: a paced job's
    # commit points all come alone.
    store = RunStore(pool)
    assert store.group is not None
    alone, later = await _claimed(store, 2)
    async with _row_locked(pool, alone.job_id):
        writing = asyncio.ensure_future(store.checkpoint(alone, entry("tokenize", ids=[1])))
        await wait_for_lock_wait(pool)
        assert "GroupCommit" not in {task.get_name() for task in asyncio.all_tasks()}
        # One arriving meanwhile waits for a writer, started once the first returns.
        waiting = asyncio.ensure_future(store.checkpoint(later, entry("tokenize", ids=[2])))
        await asyncio.sleep(0)
        assert not waiting.done()
    await writing
    await waiting
    assert store.group.stats.flushes == 2 and store.group.stats.largest == 1
    for lease in (alone, later):
        assert len((await store.get(lease.job_id)).checkpoints) == 1


async def test_a_lone_caller_cancelled_mid_statement_leaves_the_store_writing(
    pool: Pool,
) -> None:
    store = RunStore(pool)
    cancelled, after = await _claimed(store, 2)
    async with _row_locked(pool, cancelled.job_id):
        writing = asyncio.ensure_future(store.checkpoint(cancelled, entry("tokenize", ids=[1])))
        await wait_for_lock_wait(pool)
        writing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await writing
    # Its checkpoint committed or not, whole: the row and its events agree.
    checkpoints = (await store.get(cancelled.job_id)).checkpoints
    events = await _event_types(pool, cancelled.job_id)
    assert len(checkpoints) == events.count(EventType.TYPE_STEP_CHECKPOINT) <= 1
    async with asyncio.timeout(30):
        await store.checkpoint(after, entry("tokenize", ids=[2]))
    assert len((await store.get(after.job_id)).checkpoints) == 1


async def test_a_runner_cancelled_before_its_flush_writes_nothing(pool: Pool) -> None:
    store = RunStore(pool)
    first, dropped = await _claimed(store, 2)
    async with _row_locked(pool, first.job_id):
        writing = asyncio.ensure_future(store.checkpoint(first, entry("tokenize", ids=[1])))
        await wait_for_lock_wait(pool)
        waiting = asyncio.ensure_future(store.checkpoint(dropped, entry("tokenize", ids=[2])))
        await asyncio.sleep(0)
        waiting.cancel()
    await writing
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert (await store.get(dropped.job_id)).checkpoints == ()
    assert await _event_types(pool, dropped.job_id) == [EventType.TYPE_ACCEPTED]


async def test_without_group_commit_the_held_back_checkpoint_is_its_own_statement(
    pool: Pool,
) -> None:
    store = RunStore(pool, group_commit=False)
    assert store.group is None
    (lease,) = await _claimed(store, 1)
    await store.complete(
        lease, result={"ok": True}, verdict="done", last_checkpoint=entry("tokenize", ids=[7])
    )
    job = await store.get(lease.job_id)
    assert job.status == Status.COMPLETED and len(job.checkpoints) == 1
    assert await _event_types(pool, lease.job_id) == [
        EventType.TYPE_ACCEPTED,
        EventType.TYPE_STEP_CHECKPOINT,
        EventType.TYPE_COMPLETED,
    ]


async def test_commit_points_and_submits_go_through_the_connections_given_them(
    pool: Pool, dsn: str
) -> None:
    from store.pool import open_pool

    commits = await open_pool(dsn, min_size=1, max_size=1)
    submits = await open_pool(dsn, min_size=1, max_size=1)
    try:
        store = RunStore(pool, commit_pool=commits, submit_pool=submits)
        [lease] = await _claimed(store, 1)
        assert submits.get_stats()["requests_num"] == 1
        shared = pool.get_stats().get("requests_num", 0)

        await store.checkpoint(lease, entry("tokenize", ids=[1]))
        await store.complete(lease, result={"ok": True}, verdict="approved")

        assert commits.get_stats()["requests_num"] == 2
        assert pool.get_stats().get("requests_num", 0) == shared
        assert await _event_types(pool, lease.job_id) == [
            EventType.TYPE_ACCEPTED,
            EventType.TYPE_STEP_CHECKPOINT,
            EventType.TYPE_COMPLETED,
        ]
    finally:
        await commits.close()
        await submits.close()
