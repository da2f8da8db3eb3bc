"""Group commit: the commit points concurrent runners have ready, in one statement.

Runners of one process hand their commit points (checkpoints, completes,
parks, fails, retry-or-die) to one ``GroupCommit``, a ``store.gather.Gather``:
whatever is waiting goes out as one statement (``store.group_commit_sql``),
which in autocommit is one transaction and one commit, and the next starts as
soon as that one returns.

Each runner awaits its own row's answer, given only after the commit: the
step is durable before the runner starts the next one. Fencing stays per row:
a row whose lease is gone (or whose job an operator asked to cancel) is left
out by the statement and its runner alone hears ``None`` (the store raises
``LeaseLost``); the others commit. A job has at most one commit point in a
batch, and a bad row is written again alone (``Gather``'s rules); once sent,
a row commits or not with its batch, and fencing orders whatever the runner
writes next.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from store.binary_arrays import binary_array
from store.gather import Gather
from store.group_commit_sql import (
    EVENT_TYPE_PARAMS,
    Kind,
    column_types,
    group_commit_sql,
    param_name,
)
from store.pool import Pool
from store.records import Lease

# What a changed row answers: (status, attempt, max_attempts, run_after); only
# a retry-or-die fills them, the others answer four Nones.
Answer = tuple[str | None, int | None, int | None, datetime | None]


@dataclass(frozen=True, eq=False)
class _Write:
    kind: Kind
    lease: Lease
    values: Mapping[str, Any]


class GroupCommit(Gather[_Write, Answer | None]):
    """One writer per process: see the module docstring.

    ``event_types`` names the outbox ``event_type`` of each parameter in
    ``store.group_commit_sql.EVENT_TYPE_PARAMS``.
    """

    def __init__(self, pool: Pool, event_types: Mapping[str, str]) -> None:
        super().__init__()
        self.pool = pool
        self.event_types = event_types

    async def write(self, kind: Kind, lease: Lease, values: Mapping[str, Any]) -> Answer | None:
        """Write one commit point with the next batch; None when its row did not match.

        ``values`` holds the kind's inputs (``store.group_commit_sql.INPUTS``).
        Returns once the batch committed, or raises what made its write fail.
        """
        return await self.gather(_Write(kind, lease, values))

    def keys(self, item: _Write) -> tuple[Hashable, ...]:
        return (item.lease.job_id,)

    async def send(self, batch: Sequence[_Write]) -> list[Answer | None]:
        kinds = frozenset(write.kind for write in batch)
        single = len(batch) == 1
        params: dict[str, Any] = {}
        for kind in kinds:
            rows = [write for write in batch if write.kind is kind]
            fence: dict[str, list[Any]] = {
                "job_id": [w.lease.job_id for w in rows],
                "worker_id": [w.lease.worker_id for w in rows],
                "attempt": [w.lease.attempt for w in rows],
                "token": [w.lease.token for w in rows],
            }
            for column, sql_type in column_types(kind):
                values = fence[column] if column in fence else [w.values[column] for w in rows]
                name = param_name(kind, column)
                params[name] = values[0] if single else binary_array(sql_type, values)
            for name in EVENT_TYPE_PARAMS[kind]:
                params[name] = self.event_types[name]
        async with self.pool.connection() as conn:
            # Prepared from its first use on each connection: a freshly opened
            # pool would otherwise parse and plan this long statement the first
            # five times on every connection (psycopg's prepare_threshold).
            cursor = await conn.execute(
                group_commit_sql(kinds, single=single), params, prepare=True
            )
            rows_back = await cursor.fetchall()
        answers: dict[Any, Answer] = {row[0]: (row[1], row[2], row[3], row[4]) for row in rows_back}
        return [answers.get(write.lease.job_id) for write in batch]


__all__ = ["Answer", "GroupCommit"]
