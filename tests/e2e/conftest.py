"""Per-test stacks for the end-to-end tests: database, topics, registry, workers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Protocol

import pytest

from store.pool import open_pool
from tests.e2e.harness import Stack, stack_topics
from tests.forkserver import ForkServer

# The requests and events topics have this many partitions; the DLQ has one.
PARTITIONS = 3


class MakeStack(Protocol):
    def __call__(self, *, dsn: str | None = None) -> Awaitable[Stack]: ...


@pytest.fixture
async def make_stack(
    make_database: Callable[[], str],
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    tmp_path: Path,
    fork_server: ForkServer,
) -> AsyncIterator[MakeStack]:
    """Factory: a new stack per call (its own database and topics); all stopped at teardown.

    ``make(dsn=...)`` runs the stack on a database the test prepared instead
    of a new migrated one.
    """
    made: list[Stack] = []

    async def make(*, dsn: str | None = None) -> Stack:
        dsn = dsn or make_database(migrated=True)
        topics = stack_topics(new_topic, kafka_bootstrap, partitions=PARTITIONS)
        pool = await open_pool(dsn, min_size=1, max_size=4)
        tmp = tmp_path / f"stack-{len(made)}" if made else tmp_path
        tmp.mkdir(exist_ok=True)
        made.append(
            Stack(
                dsn=dsn,
                bootstrap=kafka_bootstrap,
                topics=topics,
                tmp=tmp,
                pool=pool,
                launch=fork_server,
            )
        )
        return made[-1]

    try:
        yield make
    finally:
        for built in made:
            built.stop_workers()
            await built.pool.close()


@pytest.fixture
async def stack(make_stack: MakeStack) -> Stack:
    return await make_stack()
