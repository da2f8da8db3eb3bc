"""The retention loop as a service: it runs passes, rides out outages, dies loudly on defects."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import psycopg

from store.pool import Pool
from store.retention import PassResult, RetentionPolicy, RetentionStore
from store.states import TERMINAL
from streams.retention import RetentionLoop

POLICY = RetentionPolicy(outbox=timedelta(days=7), jobs=dict.fromkeys(TERMINAL, timedelta(days=30)))


class Failing(RetentionStore):
    """A store whose pass raises ``error``: what the loop does with it is the question."""

    def __init__(self, pool: Pool, error: Exception) -> None:
        super().__init__(pool)
        self.error = error

    async def run_pass(self, policy: RetentionPolicy, *, now: datetime | None = None) -> PassResult:
        raise self.error


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        await asyncio.sleep(0.02)


async def test_a_started_loop_runs_passes_and_reports_them(pool: Pool) -> None:
    loop = RetentionLoop(RetentionStore(pool), POLICY, interval_s=0.05)
    await loop.start()
    try:
        await until(lambda: loop.passes >= 2)
    finally:
        await loop.stop()
    health = loop.health()
    assert health.healthy and health.summary == "ok"
    assert health.detail["policy"] == (
        "outbox 7d; jobs CANCELLED 30d, COMPLETED 30d, DEAD 30d, FAILED 30d"
    )


async def test_an_outage_is_reported_and_tried_again(pool: Pool) -> None:
    loop = RetentionLoop(
        Failing(pool, psycopg.OperationalError("server closed the connection")),
        POLICY,
        interval_s=60.0,
    )
    assert await loop.run_once() is None
    health = loop.health()
    assert health.healthy and "server closed the connection" in health.summary
    assert not loop.crashed


async def test_a_defect_crashes_the_service(pool: Pool) -> None:
    loop = RetentionLoop(Failing(pool, KeyError("bug")), POLICY, interval_s=0.05)
    await loop.start()
    try:
        await until(lambda: loop.crashed)
        assert isinstance(loop.crash_reason, KeyError)
    finally:
        await loop.stop()
