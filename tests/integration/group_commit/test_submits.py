"""Group commit of submits: concurrent callers' jobs in one statement, each its own fate."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable
from typing import Any

import psycopg

from schemas.contract import EventType, decode_event
from schemas.errors import UnstorableValue
from store.outbox import Outbox
from store.pool import Pool
from store.records import SubmitResult
from store.runs import RunStore
from store.states import Status
from tests.integration.store.helpers import DEFINITION, submit, wait_for_lock_wait

# Rows a transaction wrote carry its id as their xmin: the count of distinct
# ones is the count of transactions that wrote these jobs.
WRITERS_SQL = "SELECT count(DISTINCT xmin::text) FROM workflow_run WHERE job_id = ANY(%s)"


async def _together(*writes: Awaitable[Any]) -> list[Any]:
    """Started in the same turn of the loop, so the writer finds them all waiting."""
    return list(await asyncio.gather(*writes, return_exceptions=True))


async def _writers(pool: Pool, results: list[SubmitResult]) -> int:
    async with pool.connection() as conn:
        cursor = await conn.execute(WRITERS_SQL, ([r.job.job_id for r in results],))
        row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


async def _event_types(pool: Pool, job_id: uuid.UUID) -> list[int]:
    records = await Outbox(pool).events_for(job_id)
    return [decode_event(record.payload).type for record in records]


async def test_concurrent_submits_share_one_statement_and_one_transaction(pool: Pool) -> None:
    store = RunStore(pool)
    assert store.submits is not None
    results: list[SubmitResult] = await _together(*(submit(store) for _ in range(12)))

    assert await _writers(pool, results) == 1
    assert store.submits.stats.largest == 12
    assert all(result.created for result in results)
    for result in results:
        job = await store.get(result.job.job_id)
        assert job.status == Status.QUEUED
        assert await _event_types(pool, job.job_id) == [EventType.TYPE_ACCEPTED]


async def test_a_value_the_database_refuses_fails_only_the_submit_that_sent_it(
    pool: Pool,
) -> None:
    store = RunStore(pool)
    assert store.submits is not None
    good, bad, also_good = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

    def submitting(job_id: uuid.UUID, text: str) -> Awaitable[SubmitResult]:
        return store.submit(
            job_id=job_id,
            workflow_name="embed-text",
            definition=DEFINITION,
            definition_hash="hash-embed-text",
            input={"text": text},
        )

    # jsonb cannot hold U+0000: the whole statement fails, then each caller's
    # rows are sent on their own.
    answers = await _together(
        submitting(good, "hello"), submitting(bad, "a\x00b"), submitting(also_good, "hi")
    )

    assert answers[0].created and answers[2].created
    assert isinstance(answers[1], UnstorableValue)
    assert store.submits.stats.split == 1
    assert (await store.get(good)).status == Status.QUEUED
    assert (await store.get(also_good)).status == Status.QUEUED
    assert await _event_types(pool, bad) == []


async def test_two_submits_of_one_job_at_once_create_it_once(pool: Pool) -> None:
    store = RunStore(pool)
    job_id = uuid.uuid4()

    first, second = await _together(submit(store, job_id=job_id), submit(store, job_id=job_id))

    assert [first.created, second.created] == [True, False]
    assert second.job.job_id == job_id and second.job.status == Status.QUEUED
    assert await _event_types(pool, job_id) == [EventType.TYPE_ACCEPTED]


async def test_a_caller_cancelled_before_its_batch_is_sent_writes_nothing(pool: Pool) -> None:
    store = RunStore(pool)
    first, dropped = uuid.uuid4(), uuid.uuid4()
    async with pool.connection() as blocker, blocker.transaction() as held:
        # The first submit waits on this uncommitted insert of its job id: the
        # second arrives meanwhile. Rolled back, the first one's insert goes on.
        await blocker.execute(
            "INSERT INTO workflow_run (job_id, workflow_name, status, max_attempts)"
            " VALUES (%s, 'embed-text', 'QUEUED', 3)",
            (first,),
        )
        writing = asyncio.ensure_future(submit(store, job_id=first))
        await wait_for_lock_wait(pool)
        waiting = asyncio.ensure_future(submit(store, job_id=dropped))
        await asyncio.sleep(0)
        waiting.cancel()
        raise psycopg.Rollback(held)
    assert (await writing).created
    assert waiting.cancelled()
    async with pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT count(*) FROM workflow_run WHERE job_id = %s", (dropped,)
        )
        assert await cursor.fetchone() == (0,)


async def test_without_group_commit_each_submit_is_its_own_transaction(pool: Pool) -> None:
    store = RunStore(pool, group_commit=False)
    assert store.submits is None
    results = await _together(*(submit(store) for _ in range(4)))
    assert all(result.created for result in results)
    assert await _writers(pool, results) == 4
