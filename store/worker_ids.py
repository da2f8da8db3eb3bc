"""One live process per worker id: a session advisory lock keyed by the id.

A worker id is the ``lease_owner`` of every job its process holds (and of the
outbox rows its relay leases): two live processes under one id would renew,
settle and sweep each other's jobs as their own. So a process that leases
holds a session advisory lock keyed by its id, on a connection of its own, for
as long as it runs. A second process under the same id finds the lock taken
and is told which process holds it (the holder names its pid and host in its
connection's ``application_name``).

The lock lives and dies with its session: a process that is killed (even by
SIGKILL) frees its id as soon as the server sees the connection close, so a
restart under the same id is not held up, and the fleet view reads the same
locks to tell a worker that is alive from one whose jobs only wait for their
leases to pass. Advisory locks belong to one database, so fleets on other
databases of the server never meet.

A session this process gave up on (a check that timed out against a server
gone silent, a connection cut by the network) can outlive its client on the
server, and its lock with it, for as long as TCP takes to notice. The process
knows that session (its backend's pid and start), so when it finds the id held
by it, it ends it and takes the id again, rather than taking itself for a
second process under its own id.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from typing import Any

import psycopg

from schemas.contract import timestamp_json
from schemas.errors import WorkerIdTaken

# What the holder's connection is called: "<prefix>pid <pid> on <host>".
APPLICATION_PREFIX = "workflow-jobs id: "


def _key(worker: str) -> str:
    """The lock key of the worker id the SQL expression ``worker`` gives: 64 bits
    of its hash, in the one-bigint form of the advisory lock functions."""
    return f"hashtextextended({worker}, 0)"


def held_by_a_session(worker: str) -> str:
    """A condition on ``pg_locks AS l``: the row of the lock of ``worker`` (an SQL
    expression), granted to some session of this database."""
    key = _key(worker)
    # A one-bigint key shows as its high and low halves, objsubid 1.
    return f"""l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND l.classid = ((({key}) >> 32) & 4294967295)::oid
   AND l.objid = (({key}) & 4294967295)::oid"""


# The lock, and which session took it: the one this process would know as lost.
TRY_LOCK_SQL = f"""
SELECT pg_try_advisory_lock({_key("%(worker)s::text")}), a.pid, a.backend_start
  FROM pg_stat_activity AS a
 WHERE a.pid = pg_backend_pid()
"""
UNLOCK_SQL = f"SELECT pg_advisory_unlock({_key('%(worker)s::text')})"

# The session holding the lock, as the server sees it.
HOLDER_SQL = f"""
SELECT a.pid, a.backend_start, a.application_name, host(a.client_addr), a.client_port
  FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid
 WHERE {held_by_a_session("%(worker)s::text")}
 LIMIT 1
"""

# Ends this process's own lost session; waits for it to go, up to the milliseconds given.
END_LOST_SESSION_SQL = "SELECT pg_terminate_backend(%(pid)s, %(wait_ms)s)"
END_LOST_SESSION_WAIT_MS = 1_000
# How long a release waits for the server to unlock before it just closes.
RELEASE_WAIT_S = 2.0


class WorkerIdLock:
    """``worker_id`` held for this process, on a connection of its own."""

    def __init__(self, dsn: str, worker_id: str, *, connect_timeout_s: float = 10.0) -> None:
        self._dsn = dsn
        self._worker_id = worker_id
        self._connect_timeout_s = connect_timeout_s
        self._conn: psycopg.AsyncConnection[Any] | None = None
        # The server's (pid, backend_start) of the session holding the id, and
        # of sessions given up on since: the server may not have ended them yet.
        self._session: tuple[int, Any] | None = None
        self._lost: set[tuple[int, Any]] = set()

    @property
    def held(self) -> bool:
        return self._conn is not None

    async def hold(self) -> None:
        """Take the id, or check that the session holding it is still there.

        Raises ``WorkerIdTaken`` when another session holds it, and the
        driver's error when the store cannot be reached; after a lost session
        the next call takes the id again.
        """
        if self._conn is not None:
            try:
                await self._conn.execute("SELECT 1")
                return
            except BaseException:
                # Lost, or in an unknown state after a cancel: the next call starts over.
                conn, self._conn = self._conn, None
                if self._session is not None:
                    self._lost.add(self._session)
                    self._session = None
                await conn.close()
                raise
        name = f"{APPLICATION_PREFIX}pid {os.getpid()} on {socket.gethostname()}"
        conn = await psycopg.AsyncConnection.connect(
            self._dsn,
            autocommit=True,
            connect_timeout=max(1, round(self._connect_timeout_s)),
            application_name=name[:63],
        )
        try:
            session = await self._try_lock(conn)
            if session is None:
                holder = await (await conn.execute(HOLDER_SQL, self._params)).fetchone()
                if holder is not None and (holder[0], holder[1]) in self._lost:
                    session = await self._end_lost_session(conn, (holder[0], holder[1]))
                else:
                    raise WorkerIdTaken(self._taken_message(holder))
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        self._session = session
        self._lost.clear()

    @property
    def _params(self) -> dict[str, Any]:
        return {"worker": self._worker_id}

    async def _try_lock(self, conn: psycopg.AsyncConnection[Any]) -> tuple[int, Any] | None:
        """This session's (pid, backend_start) if it took the id, else None."""
        row = await (await conn.execute(TRY_LOCK_SQL, self._params)).fetchone()
        return (row[1], row[2]) if row and row[0] else None

    async def _end_lost_session(
        self, conn: psycopg.AsyncConnection[Any], lost: tuple[int, Any]
    ) -> tuple[int, Any]:
        """End a session of this process's that still holds the id, then take it."""
        pid, _ = lost
        await conn.execute(END_LOST_SESSION_SQL, {"pid": pid, "wait_ms": END_LOST_SESSION_WAIT_MS})
        session = await self._try_lock(conn)
        if session is None:
            # Told to end, it has not yet (a server that is itself stalled): an
            # outage, waited out like any other, not a second process.
            raise psycopg.OperationalError(
                f"worker id {self._worker_id!r} is still held by this process's own"
                f" lost session (server pid {pid}), which the server has not ended yet"
            )
        return session

    async def release(self) -> None:
        """Let the id go: at once, rather than when the server has ended the session."""
        conn, self._conn = self._conn, None
        self._session = None
        self._lost.clear()
        if conn is None:
            return
        # Bounded, and short: a server gone silent must not hold up the
        # process's stop, and closing the connection lets the id go anyway.
        with contextlib.suppress(psycopg.Error, TimeoutError):
            async with asyncio.timeout(min(self._connect_timeout_s, RELEASE_WAIT_S)):
                await conn.execute(UNLOCK_SQL, {"worker": self._worker_id})
        await conn.close()

    def _taken_message(self, holder: tuple[Any, ...] | None) -> str:
        where = "another live process"
        if holder is not None:
            _, since, name, address, port = holder
            name = str(name or "")
            if name.startswith(APPLICATION_PREFIX):
                where = f"the live process {name.removeprefix(APPLICATION_PREFIX)}"
            elif name:
                where = f"the live process of connection {name!r}"
            if address:
                where += f" (connected from {address}:{port}"
                where += f" since {timestamp_json(since)})" if since else ")"
        return (
            f"WFJOBS_WORKER_ID {self._worker_id!r} is in use by {where}; give every "
            "process of the fleet its own id"
        )


__all__ = [
    "END_LOST_SESSION_SQL",
    "HOLDER_SQL",
    "TRY_LOCK_SQL",
    "UNLOCK_SQL",
    "WorkerIdLock",
    "held_by_a_session",
]
