"""The store's part of ``/healthz`` and ``/readyz``, on a real Postgres.

A server that goes silent is made by stopping the backend of the pool's one
connection (``SIGSTOP``): the socket stays open and nothing answers, as after a
failover or a network partition, until TCP gives up hours later.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import time
from collections.abc import Iterator

import pytest

from streams.runtime import STORE_CHECK_S
from tests.integration.streams.conftest import serve

ONE_CONNECTION = {"WFJOBS_POOL_MIN": "1", "WFJOBS_POOL_MAX": "1"}


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_healthz_answers_in_time_that_a_silent_store_is_stuck(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn, **ONE_CONNECTION}, token=False) as (client, runtime):
        assert (await client.get("/healthz")).status == 200
        assert runtime.pool is not None
        async with runtime.pool.connection() as conn:
            backend = conn.info.backend_pid
        with stopped(backend):
            for _ in range(2):
                began = time.monotonic()
                response = await asyncio.wait_for(client.get("/healthz"), timeout=15)
                assert time.monotonic() - began < 4
                assert response.status == 503
                store = (await response.json())["parts"]["store"]
                assert not store["healthy"] and not store["ready"]
                assert "did not answer" in store["summary"]


async def test_a_pool_busy_with_work_is_alive_but_not_ready(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn, **ONE_CONNECTION}, token=False) as (client, runtime):
        assert (await client.get("/readyz")).status == 200
        assert runtime.pool is not None
        async with runtime.pool.connection():
            # Every connection of the pool is out, doing work: busy, not dead.
            response = await client.get("/healthz")
            store = (await response.json())["parts"]["store"]
            assert response.status == 200, store
            assert store["healthy"] and not store["ready"]
            assert store["summary"].startswith("busy")
            assert (await client.get("/readyz")).status == 503
        assert (await client.get("/readyz")).status == 200


async def test_a_check_no_probe_waited_out_leaves_no_unretrieved_error_in_the_log(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with serve({"DATABASE_URL": dsn, **ONE_CONNECTION}, token=False) as (client, runtime):
        assert (await client.get("/healthz")).status == 200
        assert runtime.pool is not None
        async with runtime.pool.connection() as conn:
            backend = conn.info.backend_pid
        with stopped(backend):
            assert (await client.get("/healthz")).status == 503
            # The check gives up on the server meanwhile, with nobody waiting for it.
            await asyncio.sleep(STORE_CHECK_S + 12)
        assert (await client.get("/healthz")).status == 200
        gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
