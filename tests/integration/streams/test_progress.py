"""Progress reports: throttled to one statement per interval, fenced on the claim."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from store.pool import Pool
from store.progress import ProgressStore
from store.runs import RunStore
from streams.progress import ProgressRecorder
from tests.integration.store.helpers import submit

pytestmark = pytest.mark.asyncio

PROGRESS_SQL = "SELECT attempt, step_name, fraction, message FROM workflow_run_progress"


async def _stored(pool: Pool, want_rows: int, timeout_s: float = 5.0) -> list[tuple[Any, ...]]:
    deadline = time.monotonic() + timeout_s
    while True:
        async with pool.connection() as conn:
            rows = await (await conn.execute(PROGRESS_SQL)).fetchall()
        if len(rows) >= want_rows or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.02)


async def test_a_burst_of_reports_is_one_row_holding_the_last(pool: Pool, store: RunStore) -> None:
    job_id = (await submit(store)).job.job_id
    claimed = await store.claim("w-progress")
    assert claimed is not None and claimed.job.job_id == job_id
    recorder = ProgressRecorder(ProgressStore(pool), interval_s=0.2)
    await recorder.start()
    try:
        for i in range(1, 1001):
            recorder.report(claimed.lease, "tokenize", i / 1000, f"{i} of 1000")
        assert await _stored(pool, 1) == [(claimed.lease.attempt, "tokenize", 1.0, "1000 of 1000")]
        assert recorder.written == 1
        # Reports after the write wait for the interval, then go out together.
        recorder.report(claimed.lease, "embed", 0.5, "half")
        await asyncio.sleep(0.5)
        assert await _stored(pool, 1) == [(claimed.lease.attempt, "embed", 0.5, "half")]
        assert recorder.written == 2
    finally:
        await recorder.stop()


async def test_nothing_is_stored_for_a_job_nobody_holds(pool: Pool, store: RunStore) -> None:
    recorder = ProgressRecorder(ProgressStore(pool), interval_s=0.05)
    job_id = (await submit(store)).job.job_id
    claimed = await store.claim("w-progress")
    assert claimed is not None
    await store.hand_back(claimed.lease)
    recorder.report(claimed.lease, "tokenize", 0.5, "")
    await recorder.flush()
    assert recorder.written == 0
    assert await _stored(pool, 1, timeout_s=0.1) == []
    assert (await store.get(job_id)).status == "QUEUED"


@pytest.mark.parametrize(
    ("fraction", "message", "kept"),
    [
        # A handler may quote its input in the message: a proto string may hold NUL.
        (0.5, "file a\x00b", (0.5, "file a\\u0000b")),
        # A file name decoded with os.fsdecode keeps undecodable bytes as lone surrogates.
        (0.5, "file \udcff", (0.5, "file \\udcff")),
        # A fraction from 0 to 1, which a remote step's header may give: Postgres
        # refuses to round it to a real rather than store 0.
        (1e-50, "barely begun", (0.0, "barely begun")),
    ],
)
async def test_a_report_postgres_cannot_hold_as_sent_is_stored_as_it_can_beside_the_others(
    fraction: float, message: str, kept: tuple[float, str], pool: Pool, store: RunStore
) -> None:
    first = (await submit(store)).job.job_id
    second = (await submit(store)).job.job_id
    held = {}
    for _ in range(2):
        claimed = await store.claim("w-progress")
        assert claimed is not None
        held[claimed.job.job_id] = claimed.lease
    recorder = ProgressRecorder(ProgressStore(pool), interval_s=0.05)
    await recorder.start()
    try:
        recorder.report(held[first], "tokenize", fraction, message)
        recorder.report(held[second], "tokenize", 0.25, "quarter")
        rows = await _stored(pool, 2)
        assert sorted(rows) == sorted([(1, "tokenize", 0.25, "quarter"), (1, "tokenize", *kept)])
        assert not recorder.crashed
    finally:
        await recorder.stop()
