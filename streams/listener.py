"""One LISTEN connection per process, fanned out to every loop that waits on it.

Postgres notifications only shorten waits: each subscriber gets its own
``asyncio.Event`` that is set on every notification of its channel (and once
after each (re)connect, since anything sent while we were not listening is
lost). Loops clear their event before they look for work and wait on it, with
a timeout, when they find none; polling stays the fallback when the connection
is down.

The claim loops (new QUEUED work) and the outbox relay (new events) share the
one connection: a process holds one listening backend whatever its roles. The
connection itself is ``store.notify``; this service keeps it open, reconnecting
after an outage with the shared backoff. Anything but an outage is a defect
and crashes the service, and with it the process.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import mode

from store.errors import is_outage
from store.notify import listen
from streams.backoff import Backoff

log = logging.getLogger(__name__)

# The longest pause between reconnects while the store is away.
RETRY_CAP_S = 30.0


class Listener(mode.Service):
    def __init__(self, dsn: str, *channels: str, retry_s: float = 1.0, **kwargs: Any) -> None:
        if not channels:
            raise ValueError("a listener needs at least one channel")
        super().__init__(**kwargs)
        self._dsn = dsn
        self._channels = tuple(dict.fromkeys(channels))
        self._backoff = Backoff(retry_s, RETRY_CAP_S)
        self._subscribers: dict[str, list[asyncio.Event]] = {name: [] for name in self._channels}
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

    @mode.Service.task
    async def _listen(self) -> None:
        while not self.should_stop:
            try:
                async with listen(self._dsn, self._channels) as notified:
                    self._backoff.reset()
                    self._wake(self._channels)
                    async for channel in notified:
                        self.notifications += 1
                        self._wake((channel,))
            except Exception as exc:
                if not is_outage(exc):
                    raise
                if self._backoff.failures == 0:
                    log.warning(
                        "LISTEN %s lost (%s); polling until it is back",
                        ", ".join(self._channels),
                        exc,
                    )
            await self.sleep(self._backoff.next())


__all__ = ["Listener"]
