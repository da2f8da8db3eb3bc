"""A long-lived loop that dies unexpectedly takes its worker process down, loudly.

Each loop of a real ``faust -A streams.app worker`` runs as a mode service; an
error a loop does not expect (here one injected by ``tests.e2e.broken_loops``
once the process is healthy) must end the process with a non-zero exit and
the error's traceback in its log, instead of leaving it up and looking healthy
with the loop gone.
"""

from __future__ import annotations

import pytest

from tests.e2e.broken_loops import LOOP_ENV, MESSAGE, TRIGGER_ENV
from tests.e2e.harness import HANDLERS_MODULE, Stack, wait_until

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("loop", ["sweeper", "claims", "relay", "loop_lag"])
async def test_a_loop_that_raises_stops_its_process_with_the_error_logged(
    stack: Stack, loop: str
) -> None:
    trigger = stack.tmp / f"break-{loop}"
    worker = await stack.start_worker(
        f"w-{loop}",
        WFJOBS_HANDLERS=f"{HANDLERS_MODULE},tests.e2e.broken_loops",
        **{LOOP_ENV: loop, TRIGGER_ENV: str(trigger)},
    )
    assert worker.exit_code() is None, worker.log_tail()
    trigger.touch()

    async def exited() -> int | None:
        return worker.exit_code()

    try:
        code = await wait_until(exited, timeout_s=30, interval_s=0.2)
    except TimeoutError:
        raise AssertionError(
            f"the worker is still running with its {loop} loop dead\n{worker.log_tail(80)}"
        ) from None
    log = worker.log_path.read_text(errors="replace")
    assert code != 0, log
    message = MESSAGE.format(loop=loop)
    assert f"InjectedDefect: {message}" in log, log
    assert "Traceback (most recent call last)" in log, log
