"""One live holder per worker id, on a real database; the fleet view reads the same locks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket

import psycopg
import pytest

from schemas.errors import WorkerIdTaken
from store.fleet import FleetStore
from store.pool import Pool
from store.runs import RunStore
from store.worker_ids import WorkerIdLock
from streams.identity import WorkerIdentity
from tests.integration.store.helpers import submit

pytestmark = pytest.mark.asyncio


async def test_a_second_holder_of_an_id_is_refused_naming_the_first(dsn: str) -> None:
    first, second = WorkerIdLock(dsn, "w1"), WorkerIdLock(dsn, "w1")
    other = WorkerIdLock(dsn, "w2")
    try:
        await first.hold()
        await first.hold()  # holding on to it is no second take
        await other.hold()
        with pytest.raises(WorkerIdTaken) as refused:
            await second.hold()
        message = refused.value.message
        assert message.startswith("WFJOBS_WORKER_ID 'w1' is in use by the live process ")
        assert f"pid {os.getpid()} on {socket.gethostname()}" in message
        assert not second.held

        # Released, the id is free at once.
        await first.release()
        await second.hold()
    finally:
        for lock in (first, second, other):
            await lock.release()


async def test_an_id_whose_session_was_ended_is_taken_again(dsn: str) -> None:
    first, second = WorkerIdLock(dsn, "w1"), WorkerIdLock(dsn, "w1")
    try:
        await first.hold()
        # The server ends the holder's session, as it does for a killed process.
        # Only in this test's database: the server is shared with other tests,
        # whose workers hold their ids in sessions of the same name.
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name LIKE 'workflow-jobs id: %%'"
                " AND datname = current_database()"
            )
        await second.hold()
        # The first finds its session gone, and the id someone else's.
        with pytest.raises(psycopg.OperationalError):
            await first.hold()
        with pytest.raises(WorkerIdTaken):
            await first.hold()
    finally:
        await first.release()
        await second.release()


async def test_its_own_session_lost_to_a_silent_server_is_not_taken_for_a_second_process(
    dsn: str,
) -> None:
    """A check that times out against a server gone silent gives its session up; the
    server keeps it, and the lock, until it ends it. The process must not take that
    session for another process under its id: it ends it and takes the id back."""
    lock, stranger = WorkerIdLock(dsn, "w-silent"), WorkerIdLock(dsn, "w-silent")
    try:
        await lock.hold()
        assert lock._conn is not None
        backend = lock._conn.info.backend_pid
        os.kill(backend, signal.SIGSTOP)
        try:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5):
                    await lock.hold()
            assert not lock.held
            # Still stopped, it cannot end yet: an outage to wait out, not a duplicate.
            with pytest.raises(psycopg.OperationalError, match="own lost session"):
                await lock.hold()
        finally:
            os.kill(backend, signal.SIGCONT)
        for _ in range(50):
            with contextlib.suppress(psycopg.OperationalError):
                await lock.hold()
                break
            await asyncio.sleep(0.1)
        assert lock.held
        # Another process under the id is still refused, naming this one.
        with pytest.raises(WorkerIdTaken):
            await stranger.hold()
    finally:
        await lock.release()
        await stranger.release()


async def test_a_process_whose_lost_session_ended_still_yields_to_a_new_holder(
    dsn: str,
) -> None:
    first, second = WorkerIdLock(dsn, "w-lost"), WorkerIdLock(dsn, "w-lost")
    try:
        await first.hold()
        assert first._conn is not None
        backend = first._conn.info.backend_pid
        os.kill(backend, signal.SIGSTOP)
        try:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5):
                    await first.hold()
        finally:
            os.kill(backend, signal.SIGCONT)
        # Its lost session gone, another process takes the id meanwhile.
        for _ in range(50):
            with contextlib.suppress(WorkerIdTaken):
                await second.hold()
                break
            await asyncio.sleep(0.1)
        assert second.held
        with pytest.raises(WorkerIdTaken):
            await first.hold()
        assert second.held and second._conn is not None
        await second.hold()  # its session was not ended as if it were the first's
    finally:
        await first.release()
        await second.release()


async def test_the_fleet_view_says_which_workers_holding_jobs_live(
    dsn: str, pool: Pool, store: RunStore
) -> None:
    for _ in range(2):
        await submit(store)
    assert await store.claim("alive") is not None
    assert await store.claim("gone") is not None
    lock = WorkerIdLock(dsn, "alive")
    try:
        await lock.hold()
        workers = await FleetStore(pool).workers()
        assert [(w.worker, w.running, w.live) for w in workers] == [
            ("alive", 1, True),
            ("gone", 1, False),
        ]
    finally:
        await lock.release()
    # The server ends the session a moment after the client closed it.
    for _ in range(50):
        if not any(w.live for w in await FleetStore(pool).workers()):
            break
        await asyncio.sleep(0.1)
    assert [w.live for w in await FleetStore(pool).workers()] == [False, False]


async def test_a_check_slower_than_its_interval_keeps_the_id(dsn: str) -> None:
    """A check that takes longer than the interval between checks (a loop running
    late, a server slow for a moment) must not make the process let its id go."""
    lock = WorkerIdLock(dsn, "w-busy")
    identity = WorkerIdentity(lock, check_s=0.0005)
    await identity.start()
    try:
        held_by = lock._conn
        await asyncio.sleep(0.5)  # hundreds of checks, each slower than the interval
        assert lock.held and lock._conn is held_by
    finally:
        await identity.stop()
