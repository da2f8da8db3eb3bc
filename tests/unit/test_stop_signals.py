"""StopSignals: SIGINT and SIGTERM as a request to stop, seen by a waiting loop."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from devstack import processes
from devstack.processes import StopSignals


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_wait_ends_it_as_a_stop_request(signum: int) -> None:
    with StopSignals() as stops:
        threading.Timer(0.05, os.kill, (os.getpid(), signum)).start()
        started = time.monotonic()
        assert stops.wait(10.0)
        assert time.monotonic() - started < 2.0
        assert stops.wait(0.0)


def test_a_signal_that_lands_inside_the_wait_itself_is_seen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The handler may run between any two bytecodes of the waiting thread,
    # here in the middle of the wait's own sleep; it must neither block nor be lost.
    real_sleep = time.sleep
    signalled = []

    def sleep_with_a_signal(seconds: float) -> None:
        if not signalled:
            signalled.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
        real_sleep(seconds)

    monkeypatch.setattr(processes.time, "sleep", sleep_with_a_signal)
    with StopSignals() as stops:
        assert stops.wait(10.0)
    assert signalled


def test_no_request_lets_the_wait_run_its_time_and_the_old_handlers_return() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with StopSignals() as stops:
        started = time.monotonic()
        assert not stops.wait(0.25)
        assert time.monotonic() - started >= 0.25
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
