"""The hot queries are served by their indexes (EXPLAIN, sequential scans discouraged)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest

from store.outbox import FETCH_PENDING_SQL
from store.pool import Pool
from store.runs import CLAIM_SQL, SELECT_EXHAUSTED_SQL, SELECT_EXPIRED_SQL, RunStore, list_jobs_sql
from tests.integration.store.helpers import submit_many


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


async def test_the_sweeper_uses_its_indexes(filled: Pool) -> None:
    plan = await _plan(filled, SELECT_EXPIRED_SQL, {"limit": 100})
    assert "workflow_run_lease_idx" in plan, plan
    plan = await _plan(filled, SELECT_EXHAUSTED_SQL, {"limit": 100})
    assert "workflow_run_exhausted_idx" in plan, plan


async def test_the_relay_uses_the_partial_pending_index(filled: Pool) -> None:
    plan = await _plan(filled, FETCH_PENDING_SQL, {"limit": 100})
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
        "status": "QUEUED",
        "workflow_name": "embed",
        "after_created_at": datetime.now(UTC),
        "after_job_id": uuid4(),
    }
    statement = list_jobs_sql(by_status=by_status, by_name=by_name, after=after)
    plan = await _plan(filled, statement, params)
    assert index in plan, plan
    assert "Sort" not in plan, plan
