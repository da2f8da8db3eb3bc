"""Child processes, ports and readiness for the servers the dev stack and the tests start.

Every child process is stopped from an ``atexit`` hook, and on Linux it is told
to die with its parent, so an aborted run leaves no server behind; the scratch
directories of a run that was killed outright are removed by the next one.
This module, like every launcher, stays importable without Faust: tests and
benchmarks use them before any worker exists.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import ctypes
import os
import pwd
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Protocol, Self

from confluent_kafka.admin import AdminClient

LOOPBACK = "127.0.0.1"
LOG_TAIL_LINES = 40
ERROR_LINES = 15
_ERROR_LINE = re.compile(r"\b(ERROR|FATAL|PANIC)\b|Exception|Caused by")


class ServiceError(RuntimeError):
    """A service could not be started; the message carries the reason and log tail."""


# --------------------------------------------------------------------------- processes


# Below Linux's default ephemeral range (32768-60999): the kernel never hands
# these to an outgoing connection, so a server stopped and started again on its
# port (a broker outage in a test) finds it still free unless another random
# draw took it meanwhile.
_SERVER_PORTS = range(20000, 32768)


class StopSignals:
    """SIGINT and SIGTERM as a request to stop, for a process that runs until told.

    The handler only sets a flag. A ``threading.Event`` set from a signal
    handler can deadlock the process: the handler runs on the main thread
    between any two bytecodes, so it may run while that same thread, inside
    ``Event.wait``, holds the event's lock, which ``set`` then waits for
    forever. The previous handlers come back on exit.
    """

    _SIGNALS = (signal.SIGINT, signal.SIGTERM)
    # How soon a sleeping ``wait`` notices a request: ``time.sleep`` resumes
    # after a handler returns, so it sleeps in slices.
    _SLICE_S = 0.1

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}

    def __enter__(self) -> Self:
        for signum in self._SIGNALS:
            self._previous[signum] = signal.signal(signum, self._request)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _request(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, less once a stop is requested; whether one was."""
        deadline = time.monotonic() + seconds
        while not self.requested and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, self._SLICE_S))
        return self.requested


def free_port(host: str = LOOPBACK) -> int:
    """A port free right now, for a server (the caller must tolerate a race)."""
    while True:
        port = random.choice(_SERVER_PORTS)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port


def port_free(port: int, host: str = LOOPBACK) -> bool:
    """Whether a server could listen on ``port`` now.

    Checked the way the worker (aiohttp, through asyncio), Tansu and Postgres
    bind, with SO_REUSEADDR: connections of the previous run linger in
    TIME_WAIT for a minute and must not move a restarted server to another port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


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


class ChildProcess(Protocol):
    """What the stack needs of a child process, whoever started it."""

    @property
    def pid(self) -> int: ...

    @property
    def log_path(self) -> Path: ...

    def exit_code(self) -> int | None: ...

    def stop(self, timeout_s: float = 15.0) -> None: ...


class Launch(Protocol):
    """Starts ``argv`` as a child logging to ``log_path``, like :class:`ManagedProcess`."""

    def __call__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> ChildProcess: ...


def wait_until_ready(
    ready: Callable[[], bool],
    *,
    process: ChildProcess,
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


class ServiceBase(abc.ABC):
    """What the services share: a child process, a scratch directory, ``with`` support."""

    _process: ManagedProcess | None = None
    _workdir: Path | None = None
    # Services holding a process or a directory, so the exit hook can release them.
    _holding: set[ServiceBase] = set()

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
    for service in list(ServiceBase._holding):
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


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def broker_answers(bootstrap: str, timeout_s: float, *, cluster_id: str | None = None) -> bool:
    """Whether a Kafka broker answers metadata at ``bootstrap`` (of ``cluster_id``, if given).

    A broker restarted on its old port must not take another's answer for its
    own: while it was down, a broker another test started may have drawn that
    port from the free ones.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except Exception:  # KafkaException and friends: not ready yet
        return False
    if cluster_id is not None and metadata.cluster_id != cluster_id:
        return False
    return bool(metadata.brokers)


def java_executable() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise ServiceError("Apache Kafka needs a Java 17+ runtime, and `java` is not on PATH")
    return found
