"""The fleet's figures for /metrics and the dashboard, in one statement, on a real database."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from store.errors import is_outage
from store.fleet import FleetStore
from store.pool import Pool
from store.runs import RunStore
from store.states import STATUSES
from tests.integration.store.helpers import age_rows, submit, submit_many

pytestmark = pytest.mark.asyncio

BACKDATE_OUTBOX_SQL = """
UPDATE workflow_run_events_outbox SET created_at = created_at - interval '90 seconds'
 WHERE id = (SELECT min(id) FROM workflow_run_events_outbox WHERE status = 'PENDING')
"""
FAIL_OUTBOX_ROWS_SQL = """
UPDATE workflow_run_events_outbox SET status = 'FAILED'
 WHERE id IN (SELECT id FROM workflow_run_events_outbox ORDER BY id DESC LIMIT 2)
"""


async def test_an_empty_database_reads_zero_everywhere(pool: Pool) -> None:
    counts = await FleetStore(pool).read()
    assert dict(counts.jobs_by_status) == dict.fromkeys(STATUSES, 0)
    assert counts.oldest_queued_age_s is None
    assert counts.outbox_pending == 0
    assert counts.oldest_pending_age_s is None
    assert counts.outbox_failed == 0


async def test_the_figures_are_what_the_tables_hold(pool: Pool, store: RunStore) -> None:
    queued = await submit_many(store, 5)
    claimed = await store.claim_batch("w1", 2)
    assert len(claimed) == 2
    await store.fail(claimed[0].lease, error="boom")
    # A job waiting for its backoff is QUEUED but not claimable: it must not
    # count towards the oldest claimable age.
    backed_off = (await submit(store, name="later")).job.job_id
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run SET run_after = now() + interval '1 hour' WHERE job_id = %s",
            (backed_off,),
        )
    oldest = next(job_id for job_id in queued if job_id not in {c.job_id for c in claimed})
    await age_rows(pool, 120, oldest)
    async with pool.connection() as conn:
        await conn.execute(BACKDATE_OUTBOX_SQL)
        await conn.execute(FAIL_OUTBOX_ROWS_SQL)

    counts = await FleetStore(pool).read()

    async with pool.connection() as conn:
        cursor = await conn.execute("SELECT status, count(*) FROM workflow_run GROUP BY status")
        expected = dict.fromkeys(STATUSES, 0) | dict(await cursor.fetchall())
        cursor = await conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'PENDING'),"
            " count(*) FILTER (WHERE status = 'FAILED') FROM workflow_run_events_outbox"
        )
        pending, failed = await cursor.fetchone() or (0, 0)
    assert dict(counts.jobs_by_status) == expected
    assert expected["QUEUED"] == 4 and expected["RUNNING"] == 1 and expected["FAILED"] == 1
    assert counts.oldest_queued_age_s is not None and 120 <= counts.oldest_queued_age_s < 180
    assert (counts.outbox_pending, counts.outbox_failed) == (pending, failed)
    assert failed == 2
    assert counts.oldest_pending_age_s is not None and 90 <= counts.oldest_pending_age_s < 150
    # One owner's figures: its own jobs, and no outbox (it belongs to no owner).
    own = await FleetStore(pool).read("nobody")
    assert set(own.jobs_by_status.values()) == {0} and own.oldest_queued_age_s is None
    assert (own.outbox_pending, own.outbox_failed, own.oldest_pending_age_s) == (0, 0, None)


async def test_a_read_the_database_does_not_answer_gives_up_within_its_bound(
    dsn: str, pool: Pool
) -> None:
    # Behind a lock (or on a connection whose server went without a word) the
    # statement would wait for ever, and every scrape and fleet page with it.
    fleet = FleetStore(pool, read_timeout_s=0.5)
    async with await psycopg.AsyncConnection.connect(dsn) as holder:
        await holder.execute("LOCK TABLE workflow_run IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(fleet.read(), timeout=10)
        assert time.monotonic() - started < 3
        assert is_outage(TimeoutError())
        await holder.rollback()
    # The connection it used went back to the pool in working order.
    counts = await fleet.read()
    assert dict(counts.jobs_by_status) == dict.fromkeys(STATUSES, 0)


async def test_a_running_job_counts_as_reached_in_5_minutes_by_its_claim_not_its_heartbeats(
    pool: Pool, store: RunStore
) -> None:
    earlier, now = await submit_many(store, 2)
    claimed = {held.job_id: held for held in await store.claim_batch("w1", 2)}
    async with pool.connection() as conn:
        # Both were claimed ten minutes ago and have been updated since.
        await conn.execute(
            "UPDATE workflow_run SET claimed_at = claimed_at - interval '10 minutes',"
            " updated_at = updated_at - interval '10 minutes' WHERE job_id = ANY(%s)",
            ([earlier, now],),
        )
    # A heartbeat renews the lease: the job reached RUNNING no more recently for it.
    await store.extend_lease(claimed[earlier].lease)
    counts = await FleetStore(pool).read()
    assert counts.jobs_by_status["RUNNING"] == 2
    assert counts.recent_by_status["RUNNING"] == 0


async def test_rows_a_dead_letter_holds_back_do_not_age_the_outbox(pool: Pool) -> None:
    # A job whose first event is a dead letter, and a later event behind it,
    # written ten minutes ago: it waits for an operator's redrive, which the
    # FAILED count says, not for a relay. The age that pages for a stuck
    # relay must not grow with it.
    held = "30000000-0000-0000-0000-000000000001"
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO workflow_run_events_outbox"
            " (job_id, event_type, payload, status, created_at)"
            " VALUES (%(job)s, 'ACCEPTED', '\\x00', 'FAILED', now() - interval '11 minutes'),"
            " (%(job)s, 'STEP_CHECKPOINT', '\\x00', 'PENDING', now() - interval '10 minutes')",
            {"job": held},
        )
    counts = await FleetStore(pool).read()
    assert (counts.outbox_pending, counts.outbox_failed) == (1, 1)
    assert counts.oldest_pending_age_s is None

    # An event a relay may publish ages it as before.
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO workflow_run_events_outbox (job_id, event_type, payload, created_at)"
            " VALUES ('30000000-0000-0000-0000-000000000002', 'ACCEPTED', '\\x00',"
            "         now() - interval '30 seconds')"
        )
    counts = await FleetStore(pool).read()
    assert counts.outbox_pending == 2
    assert counts.oldest_pending_age_s is not None and 30 <= counts.oldest_pending_age_s < 90
