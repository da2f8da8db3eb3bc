"""Concurrent submits written together: one statement and one commit for all that wait.

Every submit of a process (an HTTP submit, a batch from the requests topic,
``RunStore.submit``) hands its rows to one ``SubmitGroup``, a
``store.gather.Gather``: while one statement is in flight the next callers'
rows wait, and go out together as one ``store.submit_batch`` statement when it
returns. A caller's answer comes after the commit, as with its own statement,
so an accepted job is durable before anyone hears of it.

A caller's rows stay one unit: they share the batch's commit, and a batch
whose statement fails is sent again caller by caller, so a refused value fails
the caller that sent it and no other. Two callers naming the same job never
share a statement; the second is answered from the first's row, as if it had
come later.

Besides the round trips, this spares the submits a queue behind each other's
commits: each submit notifies the claim loops and the relay, and Postgres
serializes the commits of notifying transactions until each one's WAL is
flushed (see migration 0004), so concurrent submits used to wait for one flush
each, in turn.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from store.gather import Gather
from store.pool import Pool
from store.records import SubmitResult
from store.submit_batch import submit_rows

Rows = Sequence[Mapping[str, Any]]


class SubmitGroup(Gather[Rows, list[SubmitResult]]):
    """One writer of submits per store: see the module docstring."""

    # A statement's rows at most; a larger caller's batch still goes whole, alone.
    max_batch = 1000

    def __init__(self, pool: Pool) -> None:
        super().__init__()
        self.pool = pool

    async def write(self, rows: Rows) -> list[SubmitResult]:
        """``store.submit_batch.submit_rows`` for ``rows``, sharing a statement with
        whatever other submits wait; the answers are in ``rows`` order."""
        if not rows:
            return []
        return await self.gather(rows)

    def keys(self, item: Rows) -> list[Hashable]:
        return [row["job_id"] for row in item]

    def size(self, item: Rows) -> int:
        return len(item)

    async def send(self, items: Sequence[Rows]) -> list[list[SubmitResult]]:
        results = await submit_rows(self.pool, [row for rows in items for row in rows])
        answers: list[list[SubmitResult]] = []
        start = 0
        for rows in items:
            answers.append(results[start : start + len(rows)])
            start += len(rows)
        return answers


__all__ = ["SubmitGroup"]
