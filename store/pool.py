"""The connection pool every store object shares."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Literal, TypedDict, Unpack

from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from store.binary_arrays import register as register_binary_arrays

Pool = AsyncConnectionPool[AsyncConnection[TupleRow]]

DEFAULT_MIN_SIZE = 2
DEFAULT_MAX_SIZE = 10
DEFAULT_TIMEOUT_S = 10.0
APPLICATION_NAME = "workflow-jobs"
PING_SQL = "SELECT 1"


class PoolOptions(TypedDict, total=False):
    """The knobs ``create_pool`` and ``open_pool`` share; each has a default."""

    min_size: int  # DEFAULT_MIN_SIZE
    max_size: int  # DEFAULT_MAX_SIZE
    # How long to wait for a free connection, and for open_pool's first ones.
    timeout_s: float  # DEFAULT_TIMEOUT_S
    # Shown in pg_stat_activity, so a busy database can tell its clients apart.
    application_name: str  # APPLICATION_NAME
    # Session settings every connection takes before it is handed out.
    session: Mapping[str, str]  # none


def connection_kwargs(application_name: str = APPLICATION_NAME) -> dict[str, Any]:
    # Autocommit: a commit point is one statement, so it needs no BEGIN/COMMIT
    # round trips; methods that need several statements open a transaction.
    return {"autocommit": True, "application_name": application_name}


def create_pool(dsn: str, **options: Unpack[PoolOptions]) -> Pool:
    """A pool that is not open yet: ``await pool.open(wait=True)``, or use ``open_pool``."""
    min_size = options.get("min_size", DEFAULT_MIN_SIZE)
    max_size = options.get("max_size", DEFAULT_MAX_SIZE)
    application_name = options.get("application_name", APPLICATION_NAME)
    if max_size < 1 or min_size < 0 or min_size > max_size:
        raise ValueError(
            f"pool sizes must satisfy 0 <= min <= max, max >= 1; got {min_size}, {max_size}"
        )
    session = dict(options.get("session", {}))

    async def configure(conn: AsyncConnection[TupleRow]) -> None:
        register_binary_arrays(conn.adapters)
        # Autocommit, so the settings hold for the session, not one transaction.
        for name, value in session.items():
            await conn.execute("SELECT set_config(%s, %s, false)", (name, value))

    return AsyncConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        timeout=options.get("timeout_s", DEFAULT_TIMEOUT_S),
        kwargs=connection_kwargs(application_name),
        name=application_name,
        configure=configure,
        open=False,
    )


async def open_pool(dsn: str, **options: Unpack[PoolOptions]) -> Pool:
    """An open pool, with ``min_size`` connections established (fails fast if unreachable)."""
    pool = create_pool(dsn, **options)
    await pool.open(wait=True, timeout=pool.timeout)
    return pool


async def ping(pool: Pool, dsn: str, timeout_s: float) -> Literal["ok", "busy"]:
    """Whether the server of ``pool`` (at ``dsn``) answers ``SELECT 1``, all within ``timeout_s``.

    ``"busy"`` when every connection of the pool stayed out at work for half
    the time and the server answered on a connection of its own: a saturated
    pool is no dead store. Raises ``TimeoutError`` when the server did not
    answer in time, else the driver's error.
    """
    async with asyncio.timeout(timeout_s):
        try:
            async with pool.connection(timeout=timeout_s / 2) as conn:
                await conn.execute(PING_SQL)
            return "ok"
        except PoolTimeout:
            pass
        async with await AsyncConnection.connect(dsn, **connection_kwargs()) as own:
            await own.execute(PING_SQL)
        return "busy"
