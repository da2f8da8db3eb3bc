"""A process without a relay listens for outbox notifications only while someone watches."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg
import pytest

from store.control import ControlStore
from store.job_feed import FeedPage, JobFeed
from store.notify import APPLICATION_NAME
from store.pool import Pool
from store.runs import RunStore
from store.tokens import TokenStore, create_token
from streams.watch import KEEPALIVE, JobWatch
from tests.integration.store.helpers import submit

pytestmark = pytest.mark.asyncio

LISTENERS_SQL = """
SELECT count(*) FROM pg_stat_activity
 WHERE datname = current_database() AND application_name = %(name)s
"""


async def _listening_backends(pool: Pool) -> int:
    async with pool.connection() as conn:
        cursor = await conn.execute(LISTENERS_SQL, {"name": APPLICATION_NAME})
        row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def _until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_listening_starts_with_the_first_watcher_and_ends_once_none_is_left(
    dsn: str, pool: Pool, store: RunStore
) -> None:
    # Polling alone would take half a minute: only a notification can be quick.
    watch = JobWatch(JobFeed(pool), dsn=dsn, poll_s=30.0, listen_idle_s=0.5)
    await watch.start()
    try:
        job_id = (await submit(store)).job.job_id
        assert not watch.listening and await _listening_backends(pool) == 0
        frames: list[bytes] = []

        async def follow() -> None:
            async for frame in watch.frames(job_id, after=0):
                frames.append(frame)

        following = asyncio.create_task(follow())
        await _until(lambda: len(frames) == 1 and watch.listening)
        assert await _listening_backends(pool) == 1
        started = time.monotonic()
        await ControlStore(pool, max_event_bytes=1_000_000).cancel(job_id, reason="enough")
        await asyncio.wait_for(following, timeout=10)
        assert time.monotonic() - started < 5.0
        cancelled = json.loads(frames[1].decode().split("data: ", 1)[1])
        assert cancelled["type"] == "TYPE_CANCELLED"
        assert b"event: end" in frames[-1]
        # Nobody watches any more: the connection goes once the idle time has passed.
        await _until(lambda: not watch.listening)
        # The server ends its backend a moment after the client closed it.
        for _ in range(500):
            if await _listening_backends(pool) == 0:
                break
            await asyncio.sleep(0.02)
        assert await _listening_backends(pool) == 0
    finally:
        await watch.stop()


class _AwayFeed(JobFeed):
    """A feed whose reads fail as a store that went away fails, while ``away`` is set."""

    def __init__(self, pool: Pool) -> None:
        super().__init__(pool)
        self.away = False

    async def read(self, job_id: Any, *, after: int, limit: int) -> FeedPage | None:
        if self.away:
            raise psycopg.OperationalError("connection refused")
        return await super().read(job_id, after=after, limit=limit)


async def keeps_alive_through(
    watch: JobWatch,
    pool: Pool,
    store: RunStore,
    trouble: Callable[[], AbstractAsyncContextManager[object]],
    authorized: Callable[[], Awaitable[bool]] | None = None,
) -> None:
    """A new job's stream sends keep-alives while ``trouble`` holds, then ends with the job."""
    await watch.start()
    try:
        job_id = (await submit(store)).job.job_id
        frames: list[bytes] = []

        async def follow() -> None:
            async for frame in watch.frames(job_id, after=0, authorized=authorized):
                frames.append(frame)

        following = asyncio.create_task(follow())
        await _until(lambda: len(frames) == 1)
        async with trouble():
            await _until(lambda: KEEPALIVE in frames, timeout_s=5.0)
        await ControlStore(pool, max_event_bytes=1_000_000).cancel(job_id, reason="enough")
        await asyncio.wait_for(following, timeout=10)
        assert b"event: end" in frames[-1]
    finally:
        await watch.stop()


def locked(dsn: str, table: str) -> Callable[[], AbstractAsyncContextManager[object]]:
    """``table`` locked by another session, so every statement reading it waits."""

    @contextlib.asynccontextmanager
    async def holding() -> AsyncIterator[object]:
        async with await psycopg.AsyncConnection.connect(dsn) as holder:
            await holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            yield holder
            await holder.rollback()

    return holding


async def test_a_watch_keeps_its_stream_alive_while_the_store_is_away(
    pool: Pool, store: RunStore
) -> None:
    # Proxies (and ``wfjobs watch``) cut a stream that stays silent: an outage
    # must not silence it, or the watch ends and its reconnects find no store.
    feed = _AwayFeed(pool)

    @contextlib.asynccontextmanager
    async def away() -> AsyncIterator[object]:
        feed.away = True
        yield feed
        feed.away = False

    watch = JobWatch(feed, poll_s=0.05, keepalive_s=1.0)
    await keeps_alive_through(watch, pool, store, away)


async def test_a_watch_keeps_its_stream_alive_while_its_read_goes_unanswered(
    dsn: str, pool: Pool, store: RunStore
) -> None:
    # A statement behind a lock (or on a connection whose server went without a
    # word) is never answered: the stream must not fall silent behind it.
    watch = JobWatch(JobFeed(pool), poll_s=0.05, keepalive_s=1.0)
    await keeps_alive_through(watch, pool, store, locked(dsn, "workflow_run_progress"))


async def test_a_watch_keeps_its_stream_alive_while_its_token_check_goes_unanswered(
    dsn: str, pool: Pool, store: RunStore
) -> None:
    issued = await create_token(dsn, "watcher", ["read"])
    tokens = TokenStore(pool)

    async def authorized() -> bool:
        return await tokens.verify(issued.token) is not None

    watch = JobWatch(JobFeed(pool), poll_s=0.05, keepalive_s=1.0)
    await keeps_alive_through(watch, pool, store, locked(dsn, "api_token"), authorized=authorized)
