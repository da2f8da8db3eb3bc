"""The hot queries are served by their indexes, checked with EXPLAIN.

Twice: on a small table with the alternatives switched off (can the index serve
the query, order included?), and on a table shaped like production with the
planner left alone (does it choose to?).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest
from psycopg import AsyncConnection

from store.outbox import LEASE_PENDING_SQL, lease_pending_params
from store.pool import Pool, create_pool
from store.run_sql import (
    CLAIM_SESSION,
    CLAIM_SETTINGS_SQL,
    CLAIM_SQL,
    COUNT_QUEUED_SQL,
    SELECT_EXHAUSTED_SQL,
    SELECT_EXPIRED_SQL,
    list_jobs_sql,
)
from store.runs import RunStore
from tests.integration.store.helpers import submit_many


def _scans_a_table(plan: str) -> bool:
    """A sequential scan of anything but the definition snapshots.

    A job's definition is read by the snapshot's primary key; while the table
    holds a page or two of hashes, a scan of it costs the same and the planner
    may take either.
    """
    return re.search(r"Seq Scan on (?!workflow_definition_snapshot\b)", plan) is not None


async def _plan(pool: Pool, statement: str, params: dict[str, Any]) -> str:
    async with pool.connection() as conn, conn.transaction():
        # A test table is small enough that scanning and sorting would win; the
        # question here is whether the index can serve the query, order included.
        for setting in ("enable_seqscan", "enable_bitmapscan", "enable_sort"):
            await conn.execute(f"SET LOCAL {setting} = off".encode())
        cursor = await conn.execute(("EXPLAIN " + statement).encode(), params)
        return "\n".join(str(row[0]) for row in await cursor.fetchall())


@pytest.fixture
async def filled(pool: Pool, store: RunStore) -> Pool:
    await submit_many(store, 60, name="embed")
    await submit_many(store, 60, name="tokenize")
    await store.claim_batch("w1", 30)
    async with pool.connection() as conn:
        await conn.execute("ANALYZE")
    return pool


async def test_the_claim_uses_the_partial_queued_index(filled: Pool) -> None:
    plan = await _plan(filled, CLAIM_SQL, {"limit": 8, "worker_id": "w1", "lease_s": 300.0})
    assert "workflow_run_claim_idx" in plan, plan


async def _burst_after_a_caught_up_analyze(pool: Pool, store: RunStore) -> None:
    """The statistics of a caught-up queue (nothing QUEUED when it was last
    analyzed), then a burst: the planner believes every scan returns one row."""
    await submit_many(store, 40, name="embed")
    for settled in await store.claim_batch("w1", 40):
        await store.complete(settled.lease, result={}, verdict="done")
    async with pool.connection() as conn:
        await conn.execute("VACUUM ANALYZE workflow_run")
        # Left on, autovacuum may analyze the burst below before the plan is
        # read, and the statistics would no longer mislead the planner.
        await conn.execute("ALTER TABLE workflow_run SET (autovacuum_enabled = false)")
    await submit_many(store, 400, name="embed")


async def _claim_plans(conn: AsyncConnection[Any]) -> tuple[str, str]:
    """The claim's plan for these parameters, and its generic plan (the prepared one's)."""
    cursor = await conn.execute(("EXPLAIN " + CLAIM_SQL).encode(), _CLAIM_PARAMS)
    plan = "\n".join(str(row[0]) for row in await cursor.fetchall())
    placeholders = {"%(limit)s": "$1", "%(worker_id)s": "$2", "%(lease_s)s": "$3"}
    generic_sql = CLAIM_SQL
    for name, number in placeholders.items():
        generic_sql = generic_sql.replace(name, number)
    cursor = await conn.execute(("EXPLAIN (GENERIC_PLAN) " + generic_sql).encode())
    return plan, "\n".join(str(row[0]) for row in await cursor.fetchall())


def _reads_the_claim_index_in_order(plan: str) -> None:
    assert "workflow_run_claim_idx" in plan, plan
    assert "Sort" not in plan, plan
    assert not _scans_a_table(plan), plan


async def _claims_the_oldest(pool: Pool, store: RunStore) -> None:
    claimed = await store.claim_batch("w1", 8)
    assert len(claimed) == 8
    newest = max((job.job.run_after, job.job.created_at) for job in claimed)
    async with pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT count(*) FROM workflow_run WHERE status = 'QUEUED'"
            " AND (run_after, created_at) < (%s, %s)",
            newest,
        )
        row = await cursor.fetchone()
    assert row == (0,)


_CLAIM_PARAMS = {"limit": 8, "worker_id": "w1", "lease_s": 300.0}


async def test_the_claim_reads_the_index_in_order_when_statistics_say_nothing_is_queued(
    pool: Pool, store: RunStore
) -> None:
    # The claim must still read the backlog in index order and stop after
    # `limit` rows, rather than read all of it and sort.
    await _burst_after_a_caught_up_analyze(pool, store)
    async with pool.connection() as conn, conn.transaction():
        # The statement alone: the planner as the statistics lead it.
        cursor = await conn.execute(("EXPLAIN " + CLAIM_SQL).encode(), _CLAIM_PARAMS)
        unguided = "\n".join(str(row[0]) for row in await cursor.fetchall())
        # As a store without a claim connection sends it.
        await conn.execute(CLAIM_SETTINGS_SQL)
        plan, generic = await _claim_plans(conn)
    # Left to the statistics, the claim usually sorts the backlog; the two plans
    # cost within a hair of each other, so which one wins is not fixed, and only
    # the plan the store sends is held to the rule.
    assert "Sort" in unguided or "workflow_run_claim_idx" in unguided, unguided
    _reads_the_claim_index_in_order(plan)
    # The store's prepared claim runs the generic plan: it must be the same.
    _reads_the_claim_index_in_order(generic)
    # And the store's claim takes the oldest rows: none left behind is older.
    await _claims_the_oldest(pool, store)


async def test_the_claim_reads_its_rows_by_key_whatever_the_backlog(pool: Pool) -> None:
    # Statistics that know a long queue: the generic plan cannot know the limit
    # and guesses a tenth of the eligible rows. The update must still find the
    # picked rows by primary key, not hash them against a scan of the table,
    # which made a claim cost more the longer the queue.
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO workflow_run (job_id, workflow_name, definition_hash, status,"
            " max_attempts) SELECT gen_random_uuid(), 'embed', 'hash-embed', 'QUEUED', 3"
            " FROM generate_series(1, 20000)"
        )
        await conn.execute("ANALYZE workflow_run")
        async with conn.transaction():
            await conn.execute(CLAIM_SETTINGS_SQL)
            _, generic = await _claim_plans(conn)
    _reads_the_claim_index_in_order(generic)
    assert "workflow_run_pkey" in generic, generic


async def test_a_claim_connection_holds_the_planner_settings_for_its_session(
    dsn: str, pool: Pool, store: RunStore
) -> None:
    await _burst_after_a_caught_up_analyze(pool, store)
    claim_pool = create_pool(dsn, min_size=1, max_size=1, session=CLAIM_SESSION)
    await claim_pool.open(wait=True)
    try:
        async with claim_pool.connection() as conn:
            for name, value in CLAIM_SESSION.items():
                cursor = await conn.execute("SELECT current_setting(%s)", (name,))
                assert await cursor.fetchone() == (value,), name
            plan, generic = await _claim_plans(conn)
        _reads_the_claim_index_in_order(plan)
        _reads_the_claim_index_in_order(generic)
        await _claims_the_oldest(pool, RunStore(pool, claim_pool=claim_pool))
    finally:
        await claim_pool.close()
    # The shared pool's connections keep the server's settings.
    async with pool.connection() as conn:
        cursor = await conn.execute("SELECT current_setting('enable_sort')")
        assert await cursor.fetchone() == ("on",)


async def test_the_sweeper_uses_its_indexes(filled: Pool) -> None:
    plan = await _plan(filled, SELECT_EXPIRED_SQL, {"limit": 100, "now": None})
    assert "workflow_run_lease_idx" in plan, plan
    plan = await _plan(filled, SELECT_EXHAUSTED_SQL, {"limit": 100})
    assert "workflow_run_exhausted_idx" in plan, plan


async def test_the_relay_uses_the_partial_pending_index(filled: Pool) -> None:
    plan = await _plan(filled, LEASE_PENDING_SQL, lease_pending_params(100))
    assert "workflow_run_events_outbox_pending_idx" in plan, plan


@pytest.mark.parametrize(
    ("by_status", "by_name", "index"),
    [
        (False, False, "workflow_run_created_idx"),
        (True, False, "workflow_run_status_created_idx"),
        (False, True, "workflow_run_name_created_idx"),
    ],
)
@pytest.mark.parametrize("after", [False, True])
async def test_list_jobs_uses_its_index(
    filled: Pool, by_status: bool, by_name: bool, after: bool, index: str
) -> None:
    params: dict[str, Any] = {
        "limit": 51,
        # A status no row has: a filter the statistics call selective, so the
        # status index wins on cost by a wide margin. With a status that most
        # rows share, the two indexes cost the same to within page-count noise
        # on a table this small, and which one wins depends on the sample.
        "status": "WAITING",
        "workflow_name": "embed",
        "after_created_at": datetime.now(UTC),
        "after_job_id": uuid4(),
    }
    statement = list_jobs_sql(by_status=by_status, by_name=by_name, after=after)
    plan = await _plan(filled, statement, params)
    assert index in plan, plan
    assert "Sort" not in plan, plan


# A table shaped like production: a long history of settled jobs, a small
# backlog, a few jobs in flight, and an outbox mostly published.
HISTORY_SQL = """
INSERT INTO workflow_run (job_id, workflow_name, status, attempt, max_attempts, run_after,
                          lease_owner, lease_until, created_at, updated_at)
SELECT gen_random_uuid(),
       CASE WHEN n % 3 = 0 THEN 'embed' ELSE 'w-' || (n % 50) END,
       CASE WHEN n % 1000 = 0 THEN 'QUEUED'
            WHEN n % 1000 = 1 THEN 'RUNNING'
            WHEN n % 1000 = 2 THEN 'WAITING'
            WHEN n % 10 = 3 THEN 'FAILED'
            ELSE 'COMPLETED' END,
       1, 3, now() - n * interval '1 second',
       CASE WHEN n % 1000 = 1 THEN 'w1' END,
       CASE WHEN n % 1000 = 1 THEN now() + interval '5 minutes' END,
       now() - n * interval '1 second', now()
  FROM generate_series(1, 20000) AS n;
INSERT INTO workflow_run_events_outbox (job_id, event_type, payload, status)
SELECT job_id, 'COMPLETED', '\\x00',
       CASE WHEN row_number() OVER () % 500 = 0 THEN 'PENDING' ELSE 'PUBLISHED' END
  FROM workflow_run;
ANALYZE;
"""


@pytest.fixture
async def history(pool: Pool) -> Pool:
    async with pool.connection() as conn:
        await conn.execute(HISTORY_SQL.encode())
    return pool


async def _natural_plan(pool: Pool, statement: str, params: dict[str, Any]) -> str:
    async with pool.connection() as conn, conn.transaction():
        cursor = await conn.execute(("EXPLAIN " + statement).encode(), params)
        return "\n".join(str(row[0]) for row in await cursor.fetchall())


# (case, statement, parameters, the index its plan must use)
PLANNER_CASES: list[tuple[str, str, dict[str, Any], str]] = [
    (
        "claim",
        CLAIM_SQL,
        {"limit": 8, "worker_id": "w1", "lease_s": 300.0},
        "workflow_run_claim_idx",
    ),
    (
        "sweep",
        SELECT_EXPIRED_SQL,
        {"limit": 100, "now": None},
        "workflow_run_lease_idx",
    ),
    ("backlog", COUNT_QUEUED_SQL, {"limit": 1000}, "workflow_run_claim_idx"),
    (
        "relay",
        LEASE_PENDING_SQL,
        lease_pending_params(100),
        "workflow_run_events_outbox_pending_idx",
    ),
    (
        "list",
        list_jobs_sql(by_status=False, by_name=False, after=False),
        {"limit": 51},
        "workflow_run_created_idx",
    ),
    (
        "list-by-status",
        list_jobs_sql(by_status=True, by_name=False, after=True),
        {
            "limit": 51,
            "status": "WAITING",
            "after_created_at": datetime.now(UTC),
            "after_job_id": uuid4(),
        },
        "workflow_run_status_created_idx",
    ),
    (
        "list-by-name",
        list_jobs_sql(by_status=False, by_name=True, after=False),
        {"limit": 51, "workflow_name": "w-7"},
        "workflow_run_name_created_idx",
    ),
]


async def test_the_planner_picks_the_indexes_unprompted(history: Pool) -> None:
    # One table for every case: filling it is most of the test's cost.
    for case, statement, params, index in PLANNER_CASES:
        plan = await _natural_plan(history, statement, params)
        assert index in plan, (case, plan)
        assert not _scans_a_table(plan), (case, plan)
        if index.endswith("_created_idx"):
            assert "Sort" not in plan, (case, plan)  # newest first straight from the index
