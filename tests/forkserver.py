"""Worker processes forked from an interpreter that has already loaded the service.

Most of what a ``faust -A streams.app worker`` start costs is importing Faust,
aiohttp, aiokafka, psycopg, confluent-kafka, protobuf and gRPC, and the suite
starts dozens of workers. The fork server imports them once, with the
service's own modules except ``streams.app``; each worker is then a fork of it
that takes its environment, working directory and log and runs the command line
the ``faust`` console script runs. ``streams.app`` reads the settings from the
environment when it is imported, which happens in the worker only, so a forked
worker is configured exactly like one started from the script. Tests that are
about the script itself (the install test, the dev stack) still exec it.

Run as ``python -m tests.forkserver``, the server reads one JSON request per
line on stdin and answers one JSON line on stdout:

* ``{"spawn": {"argv": [...], "env": {...}, "cwd": "...", "log": "..."}}``
  -> ``{"pid": N}``;
* ``{"poll": N}`` -> ``{"code": C}``: the exit code once the child has exited
  (minus the signal number if a signal ended it), else ``null``. A child is
  reaped only by a poll that sees it gone, so its pid is not reused before its
  owner knows it exited.

It exits when stdin closes, and Linux kills it when the test process that
started it dies; its children die with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

REPO_ROOT = Path(__file__).resolve().parents[1]

# What ``streams.app`` and a starting worker import, ``streams.app`` excepted.
_PRELOADED = (
    "faust",
    "faust.cli.faust",
    "faust.worker",
    "faust.transport.drivers.aiokafka",
    "faust.web.drivers.aiohttp",
    "streams.broker",
    "streams.completions_agent",
    "streams.http_errors",
    "streams.kafka_security",
    "streams.request_agent",
    "streams.runtime",
    "streams.settings",
    "streams.web",
)

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the thread that forked it exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


# --------------------------------------------------------------------------- server


def _serve(requests: IO[bytes], answers: IO[bytes]) -> dict[str, Any] | None:
    """Answer requests until stdin closes (``None``); in a forked child, its spawn request."""
    children: dict[int, int | None] = {}
    for line in requests:
        request = json.loads(line)
        if "spawn" in request:
            pid = os.fork()
            if pid == 0:
                spawn: dict[str, Any] = request["spawn"]
                return spawn
            children[pid] = None
            answer: dict[str, Any] = {"pid": pid}
        else:
            pid = int(request["poll"])
            if children.get(pid) is None:
                with contextlib.suppress(ChildProcessError):
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        children[pid] = os.waitstatus_to_exitcode(status)
            answer = {"code": children.get(pid)}
        answers.write(json.dumps(answer).encode() + b"\n")
        answers.flush()
    return None


def _become(spawn: Mapping[str, Any], parent: int) -> NoReturn:
    """In a forked child: turn into the worker the request describes."""
    os.setsid()
    _die_with_parent()
    if os.getppid() != parent:  # the server died before the line above
        os._exit(1)
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(number, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(spawn["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    os.chdir(spawn["cwd"])
    os.environ.clear()
    os.environ.update(spawn["env"])
    argv: list[str] = list(spawn["argv"])
    sys.argv = argv
    # Where the console script's own directory would be on the path.
    sys.path[0] = str(Path(argv[0]).parent)
    from faust.cli.faust import cli

    sys.exit(cli())


def main() -> None:
    gc.disable()
    for name in _PRELOADED:
        importlib.import_module(name)
    # Children fork from here: the loaded heap is not the collector's business
    # in them either, and untouched pages stay shared.
    gc.collect()
    gc.freeze()
    gc.enable()
    if threading.active_count() != 1 or len(os.listdir("/proc/self/task")) != 1:
        raise SystemExit("the fork server must be single-threaded to fork safely")
    server = os.getpid()
    spawn = _serve(sys.stdin.buffer, sys.stdout.buffer)
    if spawn is not None:
        _become(spawn, server)


# --------------------------------------------------------------------------- client


class ForkServerError(RuntimeError):
    """The fork server is gone or answered nonsense."""


class ForkedProcess:
    """A worker forked by the server: stopped by its pid like any child of ours."""

    def __init__(self, server: ForkServer, name: str, pid: int, log_path: Path) -> None:
        self._server = server
        self.name = name
        self._pid = pid
        self._log_path = log_path
        self._code: int | None = None

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def log_path(self) -> Path:
        return self._log_path

    def exit_code(self) -> int | None:
        if self._code is None:
            self._code = self._server.poll(self._pid)
        return self._code

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; idempotent."""
        if self.exit_code() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._pid, signal.SIGTERM)
        if self._wait(timeout_s):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._pid, signal.SIGKILL)
        if not self._wait(10.0):
            raise ForkServerError(f"{self.name} (pid {self._pid}) survived SIGKILL")

    def _wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.exit_code() is None:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True


class ForkServer:
    """The client side: a ``Launch`` (see ``devstack.processes``) that forks workers.

    Start it from the main thread: Linux ties the server's life to the thread
    that started it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process = subprocess.Popen(
            [sys.executable, "-u", "-m", "tests.forkserver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=REPO_ROOT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    def __call__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> ForkedProcess:
        spawn = {
            "argv": list(argv),
            "env": dict(os.environ if env is None else env),
            "cwd": str(cwd or Path.cwd()),
            "log": str(log_path),
        }
        pid = self._ask({"spawn": spawn})["pid"]
        return ForkedProcess(self, name, int(pid), log_path)

    def poll(self, pid: int) -> int | None:
        code = self._ask({"poll": pid})["code"]
        return None if code is None else int(code)

    def _ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None
        with self._lock:
            try:
                stdin.write(json.dumps(request).encode() + b"\n")
                stdin.flush()
                line = stdout.readline()
            except (BrokenPipeError, ValueError) as exc:
                raise ForkServerError(f"the fork server is gone: {exc}") from exc
        if not line:
            raise ForkServerError(f"the fork server exited ({self._process.poll()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        """Close its stdin and wait for it; its children are stopped by their owners."""
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(10)
        if self._process.stdout is not None:
            self._process.stdout.close()


if __name__ == "__main__":
    main()
