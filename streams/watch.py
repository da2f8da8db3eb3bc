"""Watching one job: its events so far, then live ones, until it is terminal.

Each watcher reads the job's outbox rows after the last id it sent, with the
job's status and latest progress (``store.job_feed``: one statement, one
snapshot). It reads again when an outbox notification arrives (accepted, parked and
settled jobs notify) or after ``poll_s``, which is how step checkpoints and
progress reach it: they notify no one, to keep NOTIFY's commit serialization
off the hot path. Every watcher of the process waits on one wake-up, so a
notification costs one read per watcher, not one LISTEN connection per
watcher.

The notifications come from the process's LISTEN connection when it has one
on the outbox channel anyway (a relay's). Otherwise the watchers listen only
while there are any: Postgres runs a small transaction in every listening
backend for each notification it delivers, which an API replica nobody
watches through should not pay for every job. The connection opens with the
first watcher and closes once none has been left for ``listen_idle_s``.

A watch reads Postgres only: it needs no Kafka consumer, works on every API
replica, and resumes after any event id (``Last-Event-ID``). Events already
removed by outbox retention are not replayed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import mode

from schemas.contract import decode_event, to_json
from schemas.errors import ResourceExhausted
from store.channels import OUTBOX_CHANNEL
from store.errors import is_outage
from store.job_feed import FeedEvent, JobFeed
from store.notify import listen
from store.progress import Progress
from streams.backoff import Backoff
from streams.convert import timestamp_json

log = logging.getLogger(__name__)

# Decoding an event this large to JSON takes long enough to be done off the loop.
_DECODE_OFF_LOOP_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Frame:
    """One Server-Sent Events message; ``event`` empty means the default ("message")."""

    data: str
    event: str = ""
    id: str = ""

    def encode(self) -> bytes:
        lines = []
        if self.id:
            lines.append(f"id: {self.id}")
        if self.event:
            lines.append(f"event: {self.event}")
        # JSON text holds no raw newline, so the data is a single line.
        lines.append(f"data: {self.data}")
        return ("\n".join(lines) + "\n\n").encode()


# A comment line: keeps proxies from closing an idle stream, ignored by clients.
KEEPALIVE = b": keep-alive\n\n"


def event_json(event: FeedEvent) -> str:
    message = decode_event(event.payload)
    message.event_id = event.id
    return json.dumps(to_json(message), separators=(",", ":"))


def progress_json(progress: Progress) -> str:
    return json.dumps(
        {
            "attempt": progress.attempt,
            "step_name": progress.step_name,
            "fraction": progress.fraction,
            "message": progress.message,
            "updated_at": timestamp_json(progress.updated_at),
        },
        separators=(",", ":"),
    )


class _Place:
    """A watcher's place, given back once however its stream ends."""

    def __init__(self, leave: Callable[[], None]) -> None:
        self._leave: Callable[[], None] | None = leave

    def give_back(self) -> None:
        leave, self._leave = self._leave, None
        if leave is not None:
            leave()


class WatchStream:
    """One watcher's frames; closing it gives its place back, even unread."""

    def __init__(self, frames: AsyncGenerator[bytes], place: _Place) -> None:
        self._frames = frames
        self._place = place

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> bytes:
        return await anext(self._frames)

    async def aclose(self) -> None:
        try:
            await self._frames.aclose()
        finally:
            # A generator never started runs no ``finally`` of its own.
            self._place.give_back()


class JobWatch(mode.Service):
    """The watchers of this process, and the one wake-up they share."""

    def __init__(
        self,
        feed: JobFeed,
        *,
        wake: asyncio.Event | None = None,
        dsn: str = "",
        listen_idle_s: float = 30.0,
        poll_s: float = 1.0,
        keepalive_s: float = 15.0,
        write_timeout_s: float = 30.0,
        max_watchers: int = 256,
        page: int = 200,
        clock: Callable[[], float] = time.monotonic,
        **kwargs: Any,
    ) -> None:
        """``wake``: set on every outbox notification by a LISTEN connection the
        process keeps anyway; without it, ``dsn`` is listened on while watched.
        ``write_timeout_s``: how long a client may leave a frame untaken before
        its stream is cut (``streams.web.stream_events``)."""
        super().__init__(**kwargs)
        self._feed = feed
        self._wake = wake
        self._dsn = dsn
        self._listen_idle_s = listen_idle_s
        self._watched = asyncio.Event()
        self._unwatched_at: float | None = None
        self._listen_backoff = Backoff(poll_s, 30.0)
        # Whether this service holds a LISTEN connection right now.
        self.listening = False
        self._poll_s = poll_s
        self._keepalive_s = keepalive_s
        self.write_timeout_s = write_timeout_s
        self._max_watchers = max_watchers
        self._page = page
        self._clock = clock
        # Made on first use: the service may be built before its event loop runs.
        self._current_tick: asyncio.Future[None] | None = None
        self._closing = False
        self.watchers = 0

    @property
    def _tick(self) -> asyncio.Future[None]:
        """Resolved at the next wake-up; a watcher takes it before it reads."""
        if self._current_tick is None:
            self._current_tick = asyncio.get_running_loop().create_future()
        return self._current_tick

    def _signal(self) -> None:
        tick, self._current_tick = self._current_tick, None
        if tick is not None and not tick.done():
            tick.set_result(None)

    @mode.Service.task
    async def _fan_out(self) -> None:
        if self._wake is not None:
            while not self.should_stop:
                await self._wake.wait()
                self._wake.clear()
                self._signal()
        elif self._dsn:
            while not self.should_stop:
                await self._watched.wait()
                await self._listen_while_watched()

    async def _listen_while_watched(self) -> None:
        try:
            tick_s = min(self._poll_s, self._listen_idle_s)
            async with listen(self._dsn, (OUTBOX_CHANNEL,), tick_s=tick_s) as notified:
                self.listening = True
                self._listen_backoff.reset()
                # Whatever was sent before we listened is read by the next pass.
                self._signal()
                async for channel in notified:
                    if channel:
                        self._signal()
                    if self._idle_long_enough():
                        self._watched.clear()
                        return
        except Exception as exc:
            if not is_outage(exc):
                raise
            log.debug("watch: LISTEN lost (%s); polling meanwhile", exc)
            await self.sleep(self._listen_backoff.next())
        finally:
            self.listening = False

    def _idle_long_enough(self) -> bool:
        return (
            self.watchers == 0
            and self._unwatched_at is not None
            and self._clock() - self._unwatched_at >= self._listen_idle_s
        )

    def close_streams(self) -> None:
        """End every stream now (the web server is shutting down)."""
        self._closing = True
        self._signal()

    async def on_stop(self) -> None:
        self.close_streams()

    def admit(self) -> None:
        """Refuse a new watcher past the limit, before any response starts."""
        if self.watchers >= self._max_watchers:
            raise ResourceExhausted(
                f"this process already serves {self._max_watchers} watchers (the limit); "
                "retry later or watch through another API replica"
            )

    def frames(
        self,
        job_id: UUID,
        *,
        after: int,
        connected: Callable[[], bool] = lambda: True,
        authorized: Callable[[], Awaitable[bool]] | None = None,
    ) -> WatchStream:
        """A place among the watchers, and the stream's bytes: events after
        ``after``, progress, keep-alives, then ``end``.

        The place is taken here, refused past the limit, before the caller
        awaits anything: taken only once the stream began, every watcher of a
        burst would pass the limit while the others wait to start. It is given
        back when the stream ends or is closed, read or not. ``connected`` is
        asked before every read: a client that went away frees its place at
        once, not at the next write that would fail. So is ``authorized``: a
        stream may last as long as a parked job, and ends once the caller's
        token no longer lets it watch (revoked), without an ``end``.
        """
        self.admit()
        self.watchers += 1
        self._unwatched_at = None
        self._watched.set()
        place = _Place(self._leave)
        return WatchStream(self._held(job_id, after, connected, authorized, place), place)

    def _leave(self) -> None:
        self.watchers -= 1
        if self.watchers == 0:
            self._unwatched_at = self._clock()

    async def _held(
        self,
        job_id: UUID,
        after: int,
        connected: Callable[[], bool],
        authorized: Callable[[], Awaitable[bool]] | None,
        place: _Place,
    ) -> AsyncGenerator[bytes]:
        try:
            async for frame in self._frames(job_id, after, connected, authorized):
                yield frame
        finally:
            place.give_back()

    async def _frames(
        self,
        job_id: UUID,
        after: int,
        connected: Callable[[], bool],
        authorized: Callable[[], Awaitable[bool]] | None,
    ) -> AsyncIterator[bytes]:
        sent_progress: Progress | None = None
        quiet_since = self._clock()
        while not self._closing and connected():
            tick = self._tick
            try:
                # Bounded: a token check or a read the database never answers
                # (behind a lock, or on a connection whose server went without
                # a word) must not hold back the keep-alives; it counts as an
                # outage (TimeoutError).
                async with asyncio.timeout(self._keepalive_s):
                    if authorized is not None and not await authorized():
                        return
                    page = await self._feed.read(job_id, after=after, limit=self._page)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                # The stream stays open, and kept alive, until the store is back.
                log.debug("watch of %s: store unavailable (%r); retrying", job_id, exc)
            else:
                if page is None:
                    # Removed by retention while watched: nothing more will come.
                    yield Frame(json.dumps({"status": "", "gone": True}), event="end").encode()
                    return
                for event in page.events:
                    if len(event.payload) > _DECODE_OFF_LOOP_BYTES:
                        data = await asyncio.to_thread(event_json, event)
                    else:
                        data = event_json(event)
                    yield Frame(data, id=str(event.id)).encode()
                    after = event.id
                    quiet_since = self._clock()
                if page.progress is not None and page.progress != sent_progress:
                    sent_progress = page.progress
                    yield Frame(progress_json(page.progress), event="progress").encode()
                    quiet_since = self._clock()
                if page.finished:
                    yield Frame(json.dumps({"status": str(page.status)}), event="end").encode()
                    return
                if page.truncated:
                    continue
            if self._clock() - quiet_since >= self._keepalive_s:
                yield KEEPALIVE
                quiet_since = self._clock()
            await self._wait(tick)

    async def _wait(self, tick: asyncio.Future[None]) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(tick), self._poll_s)


__all__ = ["KEEPALIVE", "Frame", "JobWatch", "WatchStream", "event_json", "progress_json"]
