"""A fresh, migrated database per test, a pool on it, and a run store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from store.outbox import Outbox
from store.pool import Pool, open_pool
from store.runs import RunStore


@pytest.fixture
async def pool(make_database: Callable[..., str]) -> AsyncIterator[Pool]:
    opened = await open_pool(make_database(migrated=True), min_size=1, max_size=4)
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
