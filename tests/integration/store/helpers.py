"""Small builders shared by the store tests."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from store.pool import Pool
from store.records import SubmitResult
from store.runs import RunStore

DEFINITION: dict[str, Any] = {
    "name": "embed-text",
    "inputType": "jobs.test.Text",
    "steps": [
        {"name": "tokenize", "method": "jobs.test.Tokenizer/Tokenize"},
        {"name": "review", "method": "jobs.test.ReviewDesk/Review", "completion": "external"},
    ],
}


async def submit(
    store: RunStore,
    *,
    name: str = "embed-text",
    max_attempts: int | None = None,
    job_id: uuid.UUID | None = None,
) -> SubmitResult:
    return await store.submit(
        job_id=job_id or uuid.uuid4(),
        workflow_name=name,
        definition={**DEFINITION, "name": name},
        definition_hash="hash-" + name,
        input={"text": "hello"},
        max_attempts=max_attempts,
    )


async def submit_many(store: RunStore, count: int, *, name: str = "embed-text") -> list[uuid.UUID]:
    """``count`` jobs, submitted a few at a time; their ids in submit order."""
    ids = [uuid.uuid4() for _ in range(count)]
    for start in range(0, count, 20):
        await asyncio.gather(
            *(submit(store, name=name, job_id=job_id) for job_id in ids[start : start + 20])
        )
    return ids


def entry(name: str, **response: Any) -> dict[str, Any]:
    return {"name": name, "skipped": False, "response": dict(response)}


# Shifts a row's database-clock deadlines; stall_at is left alone, so an aged
# lease reads as expired rather than as a stalled segment.
AGE_ROW_SQL = """
UPDATE workflow_run
   SET lease_until = lease_until - %(seconds)s * interval '1 second',
       run_after = run_after - %(seconds)s * interval '1 second'
 WHERE job_id = %(job_id)s
"""


async def age_rows(pool: Pool, seconds: float, *job_ids: uuid.UUID) -> None:
    """Time passing for these jobs, without the wait: their lease and backoff
    deadlines move ``seconds`` into the past, judged as ever by the database's now()."""
    async with pool.connection() as conn:
        for job_id in job_ids:
            await conn.execute(AGE_ROW_SQL, {"seconds": seconds, "job_id": job_id})


async def wait_for_lock_wait(pool: Pool, timeout_s: float = 10.0) -> None:
    """Until some backend of this database waits on a row lock."""
    async with pool.connection() as conn, asyncio.timeout(timeout_s):
        while True:
            cursor = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            row = await cursor.fetchone()
            if row is not None and row[0] > 0:
                return
            await asyncio.sleep(0.01)
