"""Retention on a real Postgres: only what is old enough AND settled goes.

Ages are judged against a ``now`` handed to the pass, so a test moves the
clock forward instead of waiting for it.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from store.pool import Pool
from store.retention import (
    RETENTION_LOCK_KEY,
    PassResult,
    RetentionPolicy,
    RetentionStore,
    delete_jobs_batch_sql,
)
from store.run_sql import SNAPSHOT_LOCK_CLASS
from store.runs import RunStore
from store.states import TERMINAL, Status
from tests.integration.store.helpers import entry, submit, wait_for_lock_wait

DAY = timedelta(days=1)


def policy(*, outbox: timedelta | None = 7 * DAY, **jobs: timedelta | None) -> RetentionPolicy:
    ages: dict[Status, timedelta | None] = dict.fromkeys(TERMINAL, 30 * DAY)
    ages.update({Status(name): age for name, age in jobs.items()})
    return RetentionPolicy(outbox=outbox, jobs=ages)


async def rows(pool: Pool, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    async with pool.connection() as conn:
        cursor = await conn.execute(sql, params or None)
        return list(await cursor.fetchall())


async def publish_all(pool: Pool) -> None:
    """What a relay does once the broker acked every row."""
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run_events_outbox SET status = 'PUBLISHED', published_at = now()"
            " WHERE status = 'PENDING'"
        )


async def job_ids(pool: Pool) -> set[uuid.UUID]:
    return {row[0] for row in await rows(pool, "SELECT job_id FROM workflow_run")}


async def completed_job(store: RunStore, name: str = "embed-text") -> uuid.UUID:
    submitted = (await submit(store, name=name)).job
    claimed = await store.claim("w1")
    assert claimed is not None and claimed.job_id == submitted.job_id
    await store.checkpoint(claimed.lease, entry("tokenize", ids=[1, 2]))
    await store.complete(claimed.lease, result={"ok": True}, verdict="done")
    return submitted.job_id


async def failed_job(store: RunStore) -> uuid.UUID:
    result = await store.submit_failed(
        job_id=uuid.uuid4(), workflow_name="missing", input={}, error="no stored workflow"
    )
    return result.job.job_id


async def dead_job(store: RunStore) -> uuid.UUID:
    submitted = (await submit(store, max_attempts=1)).job
    claimed = await store.claim("w1")
    assert claimed is not None and claimed.job_id == submitted.job_id
    outcome = await store.retry_or_die(claimed.lease, "UNAVAILABLE: gone")
    assert outcome.dead
    return submitted.job_id


async def live_jobs(store: RunStore) -> dict[Status, uuid.UUID]:
    """One QUEUED, one RUNNING and one WAITING job."""
    waiting = (await submit(store, name="waits")).job.job_id
    claimed = await store.claim("w1")
    assert claimed is not None and claimed.job_id == waiting
    await store.park(claimed.lease, "review")
    running = (await submit(store, name="runs")).job.job_id
    claimed = await store.claim("w1")
    assert claimed is not None and claimed.job_id == running
    queued = (await submit(store, name="queued")).job.job_id
    return {Status.QUEUED: queued, Status.RUNNING: running, Status.WAITING: waiting}


async def test_only_old_settled_jobs_and_published_rows_go(pool: Pool, store: RunStore) -> None:
    completed = await completed_job(store)
    failed = await failed_job(store)
    dead = await dead_job(store)
    await publish_all(pool)
    # Settled, but its last event is still on its way.
    unpublished = await completed_job(store)
    # Settled, but one of its events is a dead letter.
    dead_lettered = await completed_job(store)
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run_events_outbox SET status = 'PUBLISHED', published_at = now()"
            " WHERE job_id = %s AND event_type <> 'STEP_CHECKPOINT'",
            (dead_lettered,),
        )
        await conn.execute(
            "UPDATE workflow_run_events_outbox SET status = 'FAILED', attempts = 10"
            " WHERE job_id = %s AND event_type = 'STEP_CHECKPOINT'",
            (dead_lettered,),
        )
    live = await live_jobs(store)
    everything = await job_ids(pool)
    retention = RetentionStore(pool)

    # Young: nothing goes, whatever its state.
    young = await retention.run_pass(policy(outbox=DAY, COMPLETED=DAY))
    assert young.ran and young.deleted == 0
    assert await job_ids(pool) == everything

    # A year on: every terminal job whose events are all PUBLISHED goes, with
    # its published rows and its snapshot; the rest stays whatever its age.
    later = await retention.run_pass(policy(), now=datetime.now(UTC) + 365 * DAY)
    assert later.jobs == {
        Status.COMPLETED: 1,
        Status.FAILED: 1,
        Status.DEAD: 1,
        Status.CANCELLED: 0,
    }
    left = await job_ids(pool)
    assert left == everything - {completed, failed, dead}
    assert set(live.values()) | {unpublished, dead_lettered} == left
    statuses = dict(await rows(pool, "SELECT job_id, status FROM workflow_run"))
    assert {statuses[job_id] for job_id in live.values()} == {"QUEUED", "RUNNING", "WAITING"}
    outbox = await rows(
        pool, "SELECT status, count(*) FROM workflow_run_events_outbox GROUP BY status"
    )
    # PENDING and FAILED rows all stay (the unpublished job's three, the
    # live jobs' four, the dead letter); of the PUBLISHED ones none is left.
    assert dict(outbox) == {"PENDING": 7, "FAILED": 1}
    # The live jobs' snapshots stay; the deleted jobs' one (embed-text) too,
    # since the two kept completed jobs still name it.
    snapshots = {
        row[0] for row in await rows(pool, "SELECT hash FROM workflow_definition_snapshot")
    }
    assert snapshots == {"hash-waits", "hash-runs", "hash-queued", "hash-embed-text"}


async def test_a_job_resumed_while_a_pass_deletes_it_is_kept_with_its_new_event(
    pool: Pool, store: RunStore
) -> None:
    failed = await failed_job(store)
    await publish_all(pool)
    retention = RetentionStore(pool)
    resumed_by = uuid.uuid4()
    # A resume holds the old job's row while it writes the link and the job's
    # RESUMED event (store.control_sql.RESUME_SQL); a pass judging the job
    # meanwhile must wait and then see that event on its way.
    async with pool.connection() as resume, resume.transaction():
        await resume.execute(
            "SELECT status FROM workflow_run WHERE job_id = %s FOR UPDATE", (failed,)
        )
        await resume.execute(
            "UPDATE workflow_run SET resumed_by = %s WHERE job_id = %s", (resumed_by, failed)
        )
        await resume.execute(
            "INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)"
            " VALUES (%s, 'RESUMED', '\\x00')",
            (failed,),
        )
        deleting = asyncio.create_task(
            retention.run_pass(policy(), now=datetime.now(UTC) + 365 * DAY)
        )
        await wait_for_lock_wait(pool)
    result = await deleting
    assert result.jobs[Status.FAILED] == 0
    assert failed in await job_ids(pool)
    assert await rows(
        pool,
        "SELECT event_type, status FROM workflow_run_events_outbox"
        " WHERE job_id = %s AND status <> 'PUBLISHED'",
        failed,
    ) == [("RESUMED", "PENDING")]


async def test_each_terminal_status_keeps_its_own_age(pool: Pool, store: RunStore) -> None:
    completed = await completed_job(store)
    failed = await failed_job(store)
    dead = await dead_job(store)
    await publish_all(pool)
    retention = RetentionStore(pool)
    ages = policy(outbox=None, COMPLETED=7 * DAY, FAILED=30 * DAY, DEAD=None)
    now = datetime.now(UTC)

    assert (await retention.run_pass(ages, now=now + 6 * DAY)).deleted == 0
    eight = await retention.run_pass(ages, now=now + 8 * DAY)
    assert eight.jobs == {Status.COMPLETED: 1, Status.FAILED: 0, Status.CANCELLED: 0}
    assert await job_ids(pool) == {failed, dead}
    thirty_one = await retention.run_pass(ages, now=now + 31 * DAY)
    assert thirty_one.jobs == {Status.COMPLETED: 0, Status.FAILED: 1, Status.CANCELLED: 0}
    # DEAD is kept forever; the outbox too (its age is None).
    assert await job_ids(pool) == {dead}
    assert (await rows(pool, "SELECT count(*) FROM workflow_run_events_outbox"))[0][0] > 0
    assert completed not in await job_ids(pool)


async def test_published_rows_go_by_the_time_they_were_published(
    pool: Pool, store: RunStore
) -> None:
    await completed_job(store)
    pending = (await submit(store, name="pending")).job.job_id
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run_events_outbox SET status = 'PUBLISHED',"
            " published_at = now() + interval '5 days' WHERE job_id <> %s",
            (pending,),
        )
    retention = RetentionStore(pool, batch=2)
    ages = policy(outbox=7 * DAY, COMPLETED=None, FAILED=None, DEAD=None)
    now = datetime.now(UTC)
    # Written now, published in five days: seven days later it is two days old.
    assert (await retention.run_pass(ages, now=now + 7 * DAY)).outbox_rows == 0
    later = await retention.run_pass(ages, now=now + 13 * DAY)
    assert later.outbox_rows == 3  # ACCEPTED, STEP_CHECKPOINT, COMPLETED
    assert later.batches > 1
    # The PENDING row of the queued job stays, however old.
    left = await rows(pool, "SELECT job_id, status FROM workflow_run_events_outbox")
    assert left == [(pending, "PENDING")]
    assert (await retention.run_pass(ages, now=now + 999 * DAY)).outbox_rows == 0


async def test_small_batches_delete_everything_across_many_transactions(
    pool: Pool, store: RunStore
) -> None:
    done = [await completed_job(store) for _ in range(7)]
    keep = await completed_job(store)
    await publish_all(pool)
    async with pool.connection() as conn:
        # An event of the last job was never published: it stays in the middle.
        await conn.execute(
            "UPDATE workflow_run_events_outbox SET status = 'PENDING', published_at = NULL"
            " WHERE job_id = %s AND event_type = 'COMPLETED'",
            (keep,),
        )
    retention = RetentionStore(pool, batch=2)
    result = await retention.run_pass(policy(outbox=None), now=datetime.now(UTC) + 60 * DAY)
    assert result.jobs[Status.COMPLETED] == len(done)
    assert result.batches >= 4
    assert await job_ids(pool) == {keep}


async def test_a_pass_runs_in_one_process_at_a_time(pool: Pool, store: RunStore, dsn: str) -> None:
    await completed_job(store)
    await publish_all(pool)
    retention = RetentionStore(pool)
    later = datetime.now(UTC) + 365 * DAY
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
        await other.execute("SELECT pg_advisory_lock(%s)", (RETENTION_LOCK_KEY,))
        assert await retention.run_pass(policy(), now=later) == PassResult(ran=False)
        await other.execute("SELECT pg_advisory_unlock(%s)", (RETENTION_LOCK_KEY,))
    result = await retention.run_pass(policy(), now=later)
    assert result.ran and result.jobs[Status.COMPLETED] == 1
    # The pass gave its lock back: another session can take it.
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
        cursor = await other.execute("SELECT pg_try_advisory_lock(%s)", (RETENTION_LOCK_KEY,))
        assert await cursor.fetchone() == (True,)


async def test_a_snapshot_a_submit_is_using_is_never_deleted(
    pool: Pool, store: RunStore, dsn: str
) -> None:
    await completed_job(store, name="once")
    await publish_all(pool)
    retention = RetentionStore(pool)
    later = datetime.now(UTC) + 365 * DAY
    async with await psycopg.AsyncConnection.connect(dsn) as submitter:
        # A submit that found the snapshot and has not committed its job yet
        # holds the hash's lock in shared mode.
        await submitter.execute(
            "SELECT pg_advisory_xact_lock_shared(%s, hashtext(%s))",
            (SNAPSHOT_LOCK_CLASS, "hash-once"),
        )
        held = await retention.run_pass(policy(), now=later)
        assert held.jobs[Status.COMPLETED] == 1 and held.snapshots == 0
        await submitter.rollback()
    freed = await retention.run_pass(policy(), now=later)
    assert freed.snapshots == 1
    assert await rows(pool, "SELECT hash FROM workflow_definition_snapshot") == []
    # A later submit of the same definition writes the snapshot again.
    again = (await submit(store, name="once")).job
    assert (await store.get(again.job_id)).definition == again.definition
    assert await rows(pool, "SELECT hash FROM workflow_definition_snapshot") == [("hash-once",)]


def test_only_terminal_statuses_can_be_given_an_age() -> None:
    with pytest.raises(ValueError, match="QUEUED is not a terminal status"):
        RetentionPolicy(outbox=None, jobs={Status.QUEUED: DAY})
    with pytest.raises(ValueError, match="RUNNING is not a terminal status"):
        delete_jobs_batch_sql(Status.RUNNING)
    with pytest.raises(ValueError, match="must be positive"):
        RetentionPolicy(outbox=timedelta(0), jobs={})
