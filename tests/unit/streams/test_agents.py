"""An agent that dies takes its process down, even when the stop after it hangs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from streams.agents import EXIT_STOP_HUNG

# A process whose agent dies while its app's stop never finishes: the crash is
# asked for and nothing comes of it, as when a client library's shutdown waits
# on a consumer whose agent is gone.
HUNG_STOP = textwrap.dedent(
    """
    import asyncio, logging, sys

    import streams.agents as agents

    agents.STOP_MARGIN_S = 0.0
    logging.basicConfig(stream=sys.stderr, level=logging.INFO)


    class StopThatHangs:
        async def crash(self, exc):
            await asyncio.Event().wait()


    async def body(stream):
        raise RuntimeError("a bug in the agent")


    agent = agents.stopping_on_crash(StopThatHangs(), "request", body, grace_s=1.0)
    asyncio.run(agent(None))
    """
)


def test_a_worker_whose_stop_hangs_after_an_agent_died_exits_anyway() -> None:
    root = Path(__file__).resolve().parents[3]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", HUNG_STOP],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == EXIT_STOP_HUNG, done.stderr
    assert time.monotonic() - started < 30
    assert "the request agent died (RuntimeError: a bug in the agent)" in done.stderr
    assert "did not stop within 1s of its request agent's death; exiting" in done.stderr
