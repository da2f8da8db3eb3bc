"""Fixtures for the group commit tests: a fresh, migrated database per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from store.pool import Pool, open_pool


@pytest.fixture
async def dsn(make_database: Callable[[], str]) -> str:
    url = make_database(migrated=True)
    return url


@pytest.fixture
async def pool(dsn: str) -> AsyncIterator[Pool]:
    opened = await open_pool(dsn, min_size=1, max_size=8)
    try:
        yield opened
    finally:
        await opened.close()
