"""One Postgres connection that LISTENs: the channels' notifications as they arrive.

``listen`` opens a dedicated autocommit connection (LISTEN does not work
through a pooled connection that goes back to the pool), issues ``LISTEN`` for
every channel, and yields the names of the channels notified, one per
notification. A lost connection ends the iteration with the driver's error;
reconnecting, and how long to wait first, is the caller's business
(``streams.listener``). The channel names live in ``store.channels``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

import psycopg
from psycopg import sql

APPLICATION_NAME = "workflow-jobs listen"


@contextlib.asynccontextmanager
async def listen(
    dsn: str, channels: Sequence[str], *, tick_s: float | None = None
) -> AsyncIterator[AsyncIterator[str]]:
    """Listening on ``channels`` once entered; iterate for the channel of each notification.

    With ``tick_s``, a quiet connection also yields ``""`` every ``tick_s``
    seconds, so a caller can decide to stop listening without a notification.
    """
    if not channels:
        raise ValueError("LISTEN needs at least one channel")
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, application_name=APPLICATION_NAME
    ) as conn:
        for channel in channels:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        # Closed before the connection: a notifies() generator left suspended
        # holds the connection's lock, and closing the connection would wait on it.
        async with contextlib.aclosing(_channels(conn, tick_s)) as notified:
            yield notified


async def _channels(
    conn: psycopg.AsyncConnection[tuple[object, ...]], tick_s: float | None
) -> AsyncGenerator[str, None]:
    while True:
        # Without a timeout notifies() only ends with an error of the connection.
        async with contextlib.aclosing(conn.notifies(timeout=tick_s)) as notifies:
            async for notify in notifies:
                yield notify.channel
        yield ""


__all__ = ["APPLICATION_NAME", "listen"]
