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


TRY_LOCK_SQL = f"SELECT pg_try_advisory_lock({_key('%(worker)s::text')})"
UNLOCK_SQL = f"SELECT pg_advisory_unlock({_key('%(worker)s::text')})"

# The session holding the lock, as the server sees it.
HOLDER_SQL = f"""
SELECT a.application_name, host(a.client_addr), a.client_port, a.backend_start
  FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid
 WHERE {held_by_a_session("%(worker)s::text")}
 LIMIT 1
"""


class WorkerIdLock:
    """``worker_id`` held for this process, on a connection of its own."""

    def __init__(self, dsn: str, worker_id: str, *, connect_timeout_s: float = 10.0) -> None:
        self._dsn = dsn
        self._worker_id = worker_id
        self._connect_timeout_s = connect_timeout_s
        self._conn: psycopg.AsyncConnection[Any] | None = None

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
            params = {"worker": self._worker_id}
            row = await (await conn.execute(TRY_LOCK_SQL, params)).fetchone()
            if not (row and row[0]):
                holder = await (await conn.execute(HOLDER_SQL, params)).fetchone()
                raise WorkerIdTaken(self._taken_message(holder))
        except BaseException:
            await conn.close()
            raise
        self._conn = conn

    async def release(self) -> None:
        """Let the id go: at once, rather than when the server has ended the session."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        # Bounded: a server gone silent must not hold up the process's stop.
        with contextlib.suppress(psycopg.Error, TimeoutError):
            async with asyncio.timeout(self._connect_timeout_s):
                await conn.execute(UNLOCK_SQL, {"worker": self._worker_id})
        await conn.close()

    def _taken_message(self, holder: tuple[Any, ...] | None) -> str:
        where = "another live process"
        if holder is not None:
            name, address, port, since = holder
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


__all__ = ["HOLDER_SQL", "TRY_LOCK_SQL", "UNLOCK_SQL", "WorkerIdLock", "held_by_a_session"]
