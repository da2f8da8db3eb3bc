"""One writer that sends what concurrent callers have ready as one statement.

The shape both group commits share (``store.group_commit`` for a running
job's commit points, ``store.submit_group`` for submits): callers hand their
item to one ``Gather`` and await its answer; one writer task takes whatever is
waiting, sends it as one statement (one round trip, one commit, one WAL
flush), answers every caller after the commit, and starts on whatever arrived
meanwhile. There is no timer: callers that arrive together share one
statement, and a caller that finds nothing in flight and no one else arriving
in its turn of the event loop sends its statement itself, with no writer to
hand over to.

Items that name the same key (a job) never go in one batch: a later one waits
for the next, so no statement changes a row twice.

One bad item must not sink the batch: when a statement of several items fails
for anything but the database being away, nothing was written (it is one
statement), so each item is sent again on its own and only the one at fault
gets the error. An outage fails every item of the batch, as it would have
failed each one's own statement.

A caller cancelled while it waits is dropped if its item was not sent yet;
once sent, the item commits or not with its batch.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import psycopg.errors

from store.errors import is_outage

log = logging.getLogger(__name__)

Item = TypeVar("Item")
Answer = TypeVar("Answer")


@dataclass
class GatherStats:
    # Statements sent (each one commit), and the items they carried.
    flushes: int = 0
    rows: int = 0
    # Batches sent again item by item after one item made the statement fail.
    split: int = 0
    largest: int = 0


@dataclass(eq=False)
class _Waiting(Generic[Item, Answer]):
    item: Item
    answer: asyncio.Future[Answer]


class Gather(ABC, Generic[Item, Answer]):
    """The writer loop; a subclass says how items are keyed, sized and sent."""

    # Items one statement carries at most (by ``size``); one item always goes.
    max_batch: int = 10_000

    def __init__(self) -> None:
        self.stats = GatherStats()
        self._waiting: list[_Waiting[Item, Answer]] = []
        self._writer: asyncio.Task[None] | None = None
        # A caller is sending, or about to send, its item alone (``_alone``).
        self._leading = False

    # ------------------------------------------------------------ for subclasses

    @abstractmethod
    def keys(self, item: Item) -> Iterable[Hashable]:
        """What ``item`` changes; two items sharing a key never share a batch."""

    def size(self, item: Item) -> int:
        """The rows ``item`` puts in a statement."""
        return 1

    @abstractmethod
    async def send(self, items: Sequence[Item]) -> list[Answer]:
        """Write ``items`` in one statement; their answers, in order."""

    # ------------------------------------------------------------ the writer

    async def gather(self, item: Item) -> Answer:
        """Write ``item`` with the next batch; its answer once the batch committed."""
        loop = asyncio.get_running_loop()
        if (
            not self._leading
            and not self._waiting
            and (self._writer is None or self._writer.done())
        ):
            alone = await self._alone(item)
            if alone is not None:
                return alone[0]
            # Others arrived in the same turn: the item goes first in their batch.
            answer: asyncio.Future[Answer] = loop.create_future()
            self._waiting.insert(0, _Waiting(item, answer))
        else:
            answer = loop.create_future()
            self._waiting.append(_Waiting(item, answer))
        if not self._leading:
            self._ensure_writer()
        return await answer

    def _ensure_writer(self) -> None:
        """A writer for what waits, unless one is running."""
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(
                self._write_while_waiting(), name=type(self).__name__
            )

    async def _alone(self, item: Item) -> tuple[Answer] | None:
        """Send ``item`` in this task if no other caller arrives in this turn of the loop.

        A hand-over to the writer costs a task and two more turns of the loop
        (the writer starting, the caller waking): about 0.1 ms on this
        project's benchmark machine after a quiet spell, on every commit point
        that comes alone, as a paced job's all do. Callers that arrive in the
        same turn still share a statement: then None, and the item is theirs to
        batch. Whatever arrives during this statement waits for the writer
        started when it returns. Cancelled mid-statement, the item commits or
        not, as in a batch.
        """
        self._leading = True
        try:
            await asyncio.sleep(0)
            if self._waiting:
                return None
            [answer] = await self.send([item])
        finally:
            self._leading = False
            if self._waiting:
                self._ensure_writer()
        self.stats.flushes += 1
        self.stats.rows += 1
        self.stats.largest = max(self.stats.largest, 1)
        return (answer,)

    async def _write_while_waiting(self) -> None:
        while self._waiting:
            batch = self._take()
            if not batch:
                continue
            try:
                await self._flush(batch)
            except BaseException as exc:
                # Nothing escapes to a caller's wait unanswered: a cancelled
                # writer (the loop is closing) cancels the waits.
                for waiting in batch:
                    if waiting.answer.done():
                        continue
                    if isinstance(exc, Exception):
                        waiting.answer.set_exception(exc)
                    else:
                        waiting.answer.cancel()
                if not isinstance(exc, Exception):
                    for waiting in self._waiting:
                        waiting.answer.cancel()
                    self._waiting.clear()
                    raise

    def _take(self) -> list[_Waiting[Item, Answer]]:
        """Everything waiting that is still wanted, no key twice, up to ``max_batch`` rows."""
        batch: list[_Waiting[Item, Answer]] = []
        later: list[_Waiting[Item, Answer]] = []
        taken: set[Hashable] = set()
        rows = 0
        for waiting in self._waiting:
            if waiting.answer.cancelled():
                continue
            keys = set(self.keys(waiting.item))
            size = self.size(waiting.item)
            if (batch and rows + size > self.max_batch) or not taken.isdisjoint(keys):
                later.append(waiting)
                continue
            taken |= keys
            rows += size
            batch.append(waiting)
        self._waiting = later
        return batch

    async def _flush(self, batch: list[_Waiting[Item, Answer]]) -> None:
        try:
            answers = await self.send([waiting.item for waiting in batch])
        except Exception as exc:
            if len(batch) == 1 or not _worth_splitting(exc):
                for waiting in batch:
                    if not waiting.answer.done():
                        waiting.answer.set_exception(exc)
                return
            self.stats.split += 1
            log.info(
                "a batch of %d writes failed (%s: %s); sending them one by one",
                len(batch),
                type(exc).__name__,
                exc,
            )
            for waiting in batch:
                if waiting.answer.cancelled():
                    continue
                await self._flush([waiting])
            return
        self.stats.flushes += 1
        self.stats.rows += len(batch)
        self.stats.largest = max(self.stats.largest, len(batch))
        for waiting, answer in zip(batch, answers, strict=True):
            if not waiting.answer.done():
                waiting.answer.set_result(answer)


def _worth_splitting(exc: BaseException) -> bool:
    """Whether the items may fare better on their own: not when the store is away.

    A deadlock or serialization failure is the batch's, not the store's.
    """
    return not is_outage(exc) or isinstance(exc, psycopg.errors.TransactionRollback)


__all__ = ["Gather", "GatherStats"]
