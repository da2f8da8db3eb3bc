"""One LISTEN connection per process, fanned out to every loop that waits on it.

Postgres notifications only shorten waits: each subscriber gets its own
``asyncio.Event`` that is set on every notification (and once after each
(re)connect, since anything sent while we were not listening is lost). Loops
clear their event before they look for work and wait on it, with a timeout,
when they find none; polling stays the fallback when the connection is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg
from psycopg import sql

log = logging.getLogger(__name__)


class Listener:
    def __init__(self, dsn: str, channel: str, *, retry_s: float = 1.0) -> None:
        self._dsn = dsn
        self._channel = channel
        self._retry_s = retry_s
        self._subscribers: list[asyncio.Event] = []
        self._task: asyncio.Task[None] | None = None
        self.notifications = 0

    def subscribe(self) -> asyncio.Event:
        event = asyncio.Event()
        self._subscribers.append(event)
        return event

    def _wake_all(self) -> None:
        for event in self._subscribers:
            event.set()

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"listen-{self._channel}"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._dsn, autocommit=True, application_name="workflow-jobs listen"
                ) as conn:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
                    failures = 0
                    self._wake_all()
                    async for _ in conn.notifies():
                        self.notifications += 1
                        self._wake_all()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                if failures == 1:
                    log.warning("LISTEN %s lost (%s); polling until it is back", self._channel, exc)
            await asyncio.sleep(min(30.0, self._retry_s * 2 ** min(failures, 5)))


__all__ = ["Listener"]
