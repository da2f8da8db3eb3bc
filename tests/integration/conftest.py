"""What most integration tests start from: a fresh, migrated database, a pool on it, the stores."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from store.outbox import Outbox
from store.pool import Pool, open_pool
from store.runs import RunStore


@pytest.fixture
async def dsn(make_database: Callable[..., str]) -> str:
    return make_database(migrated=True)


@pytest.fixture
async def pool(dsn: str) -> AsyncIterator[Pool]:
    opened = await open_pool(dsn, min_size=1, max_size=24)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def store(pool: Pool) -> RunStore:
    return RunStore(pool)


@pytest.fixture
def outbox(pool: Pool) -> Outbox:
    return Outbox(pool)
