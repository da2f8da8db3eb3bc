"""Group commit: the commit points concurrent runners have ready, in one statement.

Runners of one process hand their commit points (checkpoints, completes,
parks, fails, retry-or-die) to one ``GroupCommit``. It writes whatever is
waiting as one statement (``store.group_commit_sql``), which in autocommit is
one transaction and one commit, and starts the next as soon as that one
returns: there is no timer, so a lone runner waits no longer than it did for
its own statement, and runners that finish together share a round trip and a
WAL flush.

Each runner awaits its own row's answer, given only after the commit: the
step is durable before the runner starts the next one. Fencing stays per row:
a row whose lease is gone (or whose job an operator asked to cancel) is left
out by the statement and its runner alone hears ``None`` (the store raises
``LeaseLost``); the others commit.

One bad row must not sink the batch: when a statement of several rows fails
for anything but the database being away, nothing was written (it is one
statement), so each row is written again on its own and only the row at fault
gets the error. An outage fails every row of the batch: each runner hands its
job back, as it would have with its own statement.

A runner cancelled while it waits (its segment stopped) is dropped if its
row was not sent yet; once sent, the row commits or not with its batch, and
fencing orders whatever the runner writes next.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg.errors

from store.errors import is_outage
from store.group_commit_sql import EVENT_TYPE_PARAMS, Kind, columns, group_commit_sql, param_name
from store.pool import Pool
from store.records import Lease

log = logging.getLogger(__name__)

# What a changed row answers: (status, attempt, max_attempts, run_after); only
# a retry-or-die fills them, the others answer four Nones.
Answer = tuple[str | None, int | None, int | None, datetime | None]


@dataclass(eq=False)
class _Write:
    kind: Kind
    lease: Lease
    values: Mapping[str, Any]
    answer: asyncio.Future[Answer | None]


@dataclass
class GroupCommitStats:
    # Statements sent (each one commit), and the commit points they carried.
    flushes: int = 0
    rows: int = 0
    # Batches written again row by row after one row made the statement fail.
    split: int = 0
    largest: int = 0


@dataclass(eq=False)
class GroupCommit:
    """One writer per process: see the module docstring.

    ``event_types`` names the outbox ``event_type`` of each parameter in
    ``store.group_commit_sql.EVENT_TYPE_PARAMS``.
    """

    pool: Pool
    event_types: Mapping[str, str]
    stats: GroupCommitStats = field(default_factory=GroupCommitStats)
    _waiting: list[_Write] = field(default_factory=list)
    _writer: asyncio.Task[None] | None = None

    async def write(self, kind: Kind, lease: Lease, values: Mapping[str, Any]) -> Answer | None:
        """Write one commit point with the next batch; None when its row did not match.

        ``values`` holds the kind's inputs (``store.group_commit_sql.INPUTS``).
        Returns once the batch committed, or raises what made its write fail.
        """
        answer: asyncio.Future[Answer | None] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Write(kind, lease, values, answer))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(
                self._write_while_waiting(), name="group-commit"
            )
        return await answer

    async def _write_while_waiting(self) -> None:
        while self._waiting:
            batch = self._take()
            if not batch:
                continue
            try:
                await self._flush(batch)
            except BaseException as exc:
                # Nothing escapes to a runner's wait unanswered: a cancelled
                # writer (the loop is closing) cancels the waits.
                for write in batch:
                    if write.answer.done():
                        continue
                    if isinstance(exc, Exception):
                        write.answer.set_exception(exc)
                    else:
                        write.answer.cancel()
                if not isinstance(exc, Exception):
                    for write in self._waiting:
                        write.answer.cancel()
                    self._waiting.clear()
                    raise

    def _take(self) -> list[_Write]:
        """Everything waiting that is still wanted, one commit point per job.

        A second commit point of a job waits for the next batch: one
        statement never changes a row twice.
        """
        batch: list[_Write] = []
        later: list[_Write] = []
        jobs: set[UUID] = set()
        for write in self._waiting:
            if write.answer.cancelled():
                continue
            if write.lease.job_id in jobs:
                later.append(write)
                continue
            jobs.add(write.lease.job_id)
            batch.append(write)
        self._waiting = later
        return batch

    async def _flush(self, batch: list[_Write]) -> None:
        try:
            answers = await self._send(batch)
        except Exception as exc:
            if len(batch) == 1 or not _worth_splitting(exc):
                for write in batch:
                    if not write.answer.done():
                        write.answer.set_exception(exc)
                return
            self.stats.split += 1
            log.info(
                "a group commit of %d rows failed (%s: %s); writing them one by one",
                len(batch),
                type(exc).__name__,
                exc,
            )
            for write in batch:
                if write.answer.cancelled():
                    continue
                await self._flush([write])
            return
        for write in batch:
            if not write.answer.done():
                write.answer.set_result(answers.get(write.lease.job_id))

    async def _send(self, batch: list[_Write]) -> dict[UUID, Answer]:
        kinds = frozenset(write.kind for write in batch)
        params: dict[str, Any] = {}
        for kind in kinds:
            rows = [write for write in batch if write.kind is kind]
            fence = {
                "job_id": [w.lease.job_id for w in rows],
                "worker_id": [w.lease.worker_id for w in rows],
                "attempt": [w.lease.attempt for w in rows],
                "token": [w.lease.token for w in rows],
            }
            for column in columns(kind):
                params[param_name(kind, column)] = (
                    fence[column] if column in fence else [w.values[column] for w in rows]
                )
            for name in EVENT_TYPE_PARAMS[kind]:
                params[name] = self.event_types[name]
        async with self.pool.connection() as conn:
            # Prepared from its first use on each connection: a freshly opened
            # pool would otherwise parse and plan this long statement the first
            # five times on every connection (psycopg's prepare_threshold).
            cursor = await conn.execute(group_commit_sql(kinds), params, prepare=True)
            rows_back = await cursor.fetchall()
        self.stats.flushes += 1
        self.stats.rows += len(batch)
        self.stats.largest = max(self.stats.largest, len(batch))
        return {row[0]: (row[1], row[2], row[3], row[4]) for row in rows_back}


def _worth_splitting(exc: BaseException) -> bool:
    """Whether the rows may fare better on their own: not when the store is away.

    A deadlock or serialization failure is the batch's, not the store's.
    """
    return not is_outage(exc) or isinstance(exc, psycopg.errors.TransactionRollback)


__all__ = ["Answer", "GroupCommit", "GroupCommitStats"]
