"""Checking a definition's rules in a child process, under a time limit.

Compiling a definition evaluates every rule against probe values of its types
(``workflows.rules``). That is the one part of compilation whose cost the
definition's author controls: a rule can build and walk lists as large as its
text allows, and the CEL engine holds the interpreter lock while it evaluates,
so in the service's own process one such rule would stall every other task
(leases, the Kafka group, the relay) for as long as it runs.

So the service compiles without probes, and a :class:`DefinitionChecker` runs
the full compilation in a child process (``python -m workflows.checker``): one
definition at a time, each given ``timeout_s`` from the moment the child starts
on it. A child that runs past it, or dies (it may use at most
``MEMORY_LIMIT_BYTES``), is killed and the definition refused, naming the rule
it was on; the next check starts a fresh child. Starting the child is not
counted against the limit.

The wire between the two is one JSON object per line: the parent sends
``{"envelope": ..., "limits": {...}}``; the child answers with ``{"at": where}``
before each rule, then ``{"ok": true}``, ``{"error": message, "path": path}``
or ``{"internal": message}``. It writes ``{"ready": true}`` once, at start.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

from schemas.errors import InvalidArgument, Unavailable
from workflows.envelope import DefinitionError
from workflows.rules import RuleLimits

MEMORY_LIMIT_BYTES = 2 * 1024**3
STARTUP_TIMEOUT_S = 60.0
_PROJECT_ROOT = str(Path(__file__).resolve().parents[1])


class DefinitionChecker:
    """One child process that compiles definitions in full; ``check`` blocks."""

    def __init__(self, *, limits: RuleLimits, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.limits = limits
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self.started = 0  # children started so far, for tests and logs

    def check(self, envelope: Mapping[str, Any]) -> None:
        """Raise :class:`DefinitionError` when the full compilation refuses ``envelope``."""
        request = json.dumps(
            {"envelope": envelope, "limits": asdict(self.limits)},
            separators=(",", ":"),
            ensure_ascii=False,
        ).encode("utf-8", "surrogatepass")
        with self._lock:
            process = self._child()
            stdin = process.stdin
            assert stdin is not None
            try:
                stdin.write(request + b"\n")
                stdin.flush()
            except OSError:
                self._stop()
                raise Unavailable("the rule checker process went away; retry") from None
            self._await_verdict(process)

    def _await_verdict(self, process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self.timeout_s
        at = ""
        while True:
            line = self._read_line(process, deadline)
            if line is None:
                self._stop()
                raise DefinitionError(
                    _place(at)
                    + f"checking the definition took longer than {self.timeout_s:g} s, the "
                    "limit (WFJOBS_COMPILE_TIMEOUT_S): a rule is too expensive to evaluate",
                    path="",
                )
            if line == b"":
                code = self._stop()
                raise DefinitionError(
                    _place(at)
                    + f"the process checking the definition died (status {code}): a rule "
                    "needs more memory or time than a check may use",
                )
            reply = json.loads(line)
            if "at" in reply:
                at = str(reply["at"])
                continue
            if reply.get("ok"):
                return
            if "error" in reply:
                raise DefinitionError(str(reply["error"]), path=str(reply.get("path", "")))
            raise RuntimeError(f"the rule checker failed: {reply.get('internal', reply)}")

    def _child(self) -> subprocess.Popen[bytes]:
        if self._process is not None and self._process.poll() is None:
            return self._process
        self._stop()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            part for part in (_PROJECT_ROOT, env.get("PYTHONPATH", "")) if part
        )
        process = subprocess.Popen(
            [sys.executable, "-m", "workflows.checker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=_PROJECT_ROOT,
        )
        self._process = process
        self._buffer = b""
        self.started += 1
        _children.add(process)
        ready = self._read_line(process, time.monotonic() + STARTUP_TIMEOUT_S)
        if not ready or not json.loads(ready).get("ready"):
            self._stop()
            raise Unavailable("the rule checker process did not start; see the worker's log")
        return process

    def _read_line(self, process: subprocess.Popen[bytes], deadline: float) -> bytes | None:
        """The next line; b"" when the child closed its end, None past ``deadline``."""
        stdout = process.stdout
        assert stdout is not None
        fd = stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            readable, _, _ = select.select([fd], [], [], left)
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return b""
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _stop(self) -> int | None:
        process, self._process = self._process, None
        self._buffer = b""
        if process is None:
            return None
        _children.discard(process)
        if process.poll() is None:
            process.kill()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()
        return process.wait()

    def close(self) -> None:
        with self._lock:
            self._stop()


_children: set[subprocess.Popen[bytes]] = set()
_shared: dict[tuple[RuleLimits, float], DefinitionChecker] = {}
_shared_lock = threading.Lock()


def shared_checker(limits: RuleLimits, timeout_s: float) -> DefinitionChecker:
    """The process's checker for these settings: one child per process, not per caller."""
    with _shared_lock:
        checker = _shared.get((limits, timeout_s))
        if checker is None:
            checker = _shared[(limits, timeout_s)] = DefinitionChecker(
                limits=limits, timeout_s=timeout_s
            )
        return checker


@atexit.register
def _kill_children() -> None:
    for process in list(_children):
        if process.poll() is None:
            process.kill()


def _place(at: str) -> str:
    return f"{at}: " if at else ""


# --- the child ------------------------------------------------------------------------


def _serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    # Imported here, after the memory limit is set: the parent never needs it.
    from workflows.compiler import compile_definition

    def send(message: Mapping[str, Any]) -> None:
        stdout.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        stdout.flush()

    send({"ready": True})
    for line in stdin:
        request = json.loads(line)
        try:
            compile_definition(
                request["envelope"],
                limits=RuleLimits(**request["limits"]),
                progress=lambda at: send({"at": at}),
            )
        except DefinitionError as exc:
            send({"error": exc.message, "path": exc.path})
        except InvalidArgument as exc:
            send({"error": exc.message, "path": ""})
        except MemoryError:
            send({"error": "a rule needs more memory than a check may use", "path": ""})
        except Exception as exc:
            send({"internal": f"{type(exc).__name__}: {exc}"})
        else:
            send({"ok": True})


def main() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    _serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main()


__all__ = ["MEMORY_LIMIT_BYTES", "DefinitionChecker", "shared_checker"]
