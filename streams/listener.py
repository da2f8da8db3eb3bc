"""One LISTEN connection per process, fanned out to every loop that waits on it.

Postgres notifications only shorten waits: each subscriber gets its own
``asyncio.Event`` that is set on every notification of its channel (and once
after each (re)connect, since anything sent while we were not listening is
lost). Loops clear their event before they look for work and wait on it, with
a timeout, when they find none; polling stays the fallback when the connection
is down.

The claim loops (new QUEUED work) and the outbox relay (new events) share the
one connection: a process holds one listening backend whatever its roles.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg
from psycopg import sql

log = logging.getLogger(__name__)


class Listener:
    def __init__(self, dsn: str, *channels: str, retry_s: float = 1.0) -> None:
        if not channels:
            raise ValueError("a listener needs at least one channel")
        self._dsn = dsn
        self._channels = tuple(dict.fromkeys(channels))
        self._retry_s = retry_s
        self._subscribers: dict[str, list[asyncio.Event]] = {name: [] for name in self._channels}
        self._task: asyncio.Task[None] | None = None
        self.notifications = 0

    @property
    def channels(self) -> tuple[str, ...]:
        return self._channels

    def subscribe(self, channel: str) -> asyncio.Event:
        """An event set on every notification of ``channel`` and after every reconnect."""
        if channel not in self._subscribers:
            raise ValueError(f"not listening on {channel!r}; channels: {self._channels}")
        event = asyncio.Event()
        self._subscribers[channel].append(event)
        return event

    def _wake(self, channels: tuple[str, ...]) -> None:
        for channel in channels:
            for event in self._subscribers.get(channel, ()):
                event.set()

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"listen-{','.join(self._channels)}"
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
                    for channel in self._channels:
                        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    failures = 0
                    self._wake(self._channels)
                    async for notify in conn.notifies():
                        self.notifications += 1
                        self._wake((notify.channel,))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                if failures == 1:
                    log.warning(
                        "LISTEN %s lost (%s); polling until it is back",
                        ", ".join(self._channels),
                        exc,
                    )
            await asyncio.sleep(min(30.0, self._retry_s * 2 ** min(failures, 5)))


__all__ = ["Listener"]
