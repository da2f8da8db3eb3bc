"""The connection pool every store object shares."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

Pool = AsyncConnectionPool[AsyncConnection[TupleRow]]

DEFAULT_MIN_SIZE = 2
DEFAULT_MAX_SIZE = 10
APPLICATION_NAME = "workflow-jobs"


def connection_kwargs(application_name: str = APPLICATION_NAME) -> dict[str, Any]:
    # Autocommit: a commit point is one statement, so it needs no BEGIN/COMMIT
    # round trips; methods that need several statements open a transaction.
    return {"autocommit": True, "application_name": application_name}


def create_pool(
    dsn: str,
    *,
    min_size: int = DEFAULT_MIN_SIZE,
    max_size: int = DEFAULT_MAX_SIZE,
    timeout_s: float = 30.0,
    application_name: str = APPLICATION_NAME,
) -> Pool:
    """A pool that is not open yet: ``await pool.open(wait=True)``, or use ``open_pool``."""
    if max_size < 1 or min_size < 0 or min_size > max_size:
        raise ValueError(
            f"pool sizes must satisfy 0 <= min <= max, max >= 1; got {min_size}, {max_size}"
        )
    return AsyncConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        timeout=timeout_s,
        kwargs=connection_kwargs(application_name),
        name=application_name,
        open=False,
    )


async def open_pool(
    dsn: str,
    *,
    min_size: int = DEFAULT_MIN_SIZE,
    max_size: int = DEFAULT_MAX_SIZE,
    timeout_s: float = 30.0,
    application_name: str = APPLICATION_NAME,
) -> Pool:
    """An open pool, with ``min_size`` connections established (fails fast if unreachable)."""
    pool = create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        timeout_s=timeout_s,
        application_name=application_name,
    )
    await pool.open(wait=True, timeout=timeout_s)
    return pool
