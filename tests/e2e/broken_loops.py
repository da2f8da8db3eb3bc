"""Breaks one long-lived loop of a worker process on demand, for the crash test.

Named in ``WFJOBS_HANDLERS`` after ``tests.e2e.handlers``. On import it wraps
one pass of the loop named by ``WFJOBS_E2E_BROKEN_LOOP`` (``sweeper``,
``claims`` for the claim watchdog, ``relay``, ``loop_lag`` for the metrics'
event-loop probe, ``ownership`` for the watchdog's reading of the request
topic's group, ``request_agent`` and ``completions_agent`` for a Faust
agent's body around one batch of requests or one completion); from the moment
the file named by ``WFJOBS_E2E_BREAK_FILE`` exists, that pass raises
``InjectedDefect``, an error no loop expects. Until then the process runs as
usual, so the test first sees it healthy.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from streams import completions_agent, ownership, request_agent
from streams.claims import ClaimLoops
from streams.loop_lag import LoopLagProbe
from streams.relay import OutboxRelay
from streams.sweeper import Sweeper

LOOP_ENV = "WFJOBS_E2E_BROKEN_LOOP"
TRIGGER_ENV = "WFJOBS_E2E_BREAK_FILE"
MESSAGE = "injected defect in the {loop} loop"


class InjectedDefect(Exception):
    """Stands for a bug: neither an outage nor anything else a loop retries."""


def _armed() -> bool:
    trigger = os.environ.get(TRIGGER_ENV, "")
    return bool(trigger) and Path(trigger).exists()


def _break(loop: str) -> None:
    owner: Any
    owner, method = {
        "request_agent": (request_agent, "handle_batch_until_done"),
        "completions_agent": (completions_agent, "answer_until_done"),
        "ownership": (ownership, "read_ownership"),
        "sweeper": (Sweeper, "sweep_once"),
        "claims": (ClaimLoops, "watch_once"),
        "relay": (OutboxRelay, "relay_once"),
        "loop_lag": (LoopLagProbe, "probe_once"),
    }[loop]
    original = getattr(owner, method)

    def broken(*args: Any, **kwargs: Any) -> Any:
        if _armed():
            raise InjectedDefect(MESSAGE.format(loop=loop))
        return original(*args, **kwargs)

    setattr(owner, method, broken)


if os.environ.get(LOOP_ENV):
    _break(os.environ[LOOP_ENV])
