"""What the request and completions agents share: a body that crashes stops the
process, which errors a message waits out, and when an attempt waits too long.

Faust's default supervisor restarts a crashed agent on the same stream. The
events the dead body had read but not acknowledged are then never handled
again while the process lives (the restarted body reads on after them), and
no offset can be committed past them: requests wait unsubmitted, completions
unanswered, behind a process that looks healthy. So an agent is a loop like
the others: an error its body does not handle (the body waits out outages
itself) is logged in one line naming the agent and crashes the app, and the
worker exits non-zero. The unacknowledged events stay on their topic for
whoever owns their partitions next, whose idempotent submit or complete-step
absorbs what had already been done.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING

from aiokafka.errors import KafkaError, KafkaTimeoutError  # type: ignore[import-untyped]

from schemas.errors import ResourceExhausted, Unavailable
from store.errors import is_outage
from streams.health import PartHealth

if TYPE_CHECKING:
    import faust
    from faust.types import StreamT

log = logging.getLogger(__name__)

AgentBody = Callable[["StreamT[bytes]"], Awaitable[None]]

# How long one attempt at a message may wait for an answer before /healthz
# calls its agent stuck: the claim loops' and the sweeper's bound.
STUCK_AFTER_S = 60.0


class AttemptClock:
    """Since when an agent's attempt in flight has waited, and whether that is stuck.

    An attempt that never answers (a submit behind a lock, a server gone
    without a word) fails nothing, so nothing retries it, and the partition
    behind it waits for good; an outage or a full backlog, tried again, is
    not stuck.
    """

    def __init__(self, part: str, what: str, *, stuck_after_s: float = STUCK_AFTER_S) -> None:
        """``part`` names the health entry; ``what`` the attempt, in its summary."""
        if stuck_after_s <= 0:
            raise ValueError("stuck_after_s must be positive")
        self._part = part
        self._what = what
        self._stuck_after_s = stuck_after_s
        self._started_at: float | None = None
        # Since when one message has kept failing, each try answered at once
        # (not an outage it waits out): a dead letter the broker refuses for
        # good is tried again forever, and its partition waits behind it.
        self._failing_since: float | None = None
        self._failing = ("", "")

    @contextlib.contextmanager
    def attempt(self) -> Iterator[None]:
        self._started_at = time.monotonic()
        try:
            yield
        finally:
            self._started_at = None

    def failed(self, what: str, why: str) -> None:
        """A try at ``what`` (the message in hand) failed, ``why``."""
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        self._failing = (what, why)

    def done(self) -> None:
        """The message in hand is handled: it fails no more."""
        self._failing_since = None
        self._failing = ("", "")

    def health(self, detail_key: str) -> PartHealth:
        now = time.monotonic()
        since = self._started_at
        waiting_for = now - since if since is not None else 0.0
        hung = waiting_for > self._stuck_after_s
        failing_since = self._failing_since
        failing_for = now - failing_since if failing_since is not None else 0.0
        failing = failing_for > self._stuck_after_s
        detail = {detail_key: round(waiting_for, 3)}
        if failing_since is not None:
            detail["failing_s"] = round(failing_for, 3)
        if hung:
            summary = f"{self._what} has waited {waiting_for:.0f}s for an answer"
        elif failing:
            what, why = self._failing
            summary = f"{what} has failed for {failing_for:.0f}s: {why}"
        else:
            summary = "ok"
        return PartHealth(
            self._part, healthy=not hung and not failing, summary=summary, detail=detail
        )


def worth_waiting_out(exc: BaseException) -> bool:
    """Try the same message again later: the store, registry or broker is away or full."""
    if isinstance(exc, KafkaError):
        # A send of the agent's own (a dead letter, an answer): the broker away
        # (Faust's producer gives up on a send after its own timeout) or between
        # leaders says nothing about the message. What it refuses for good is
        # a defect here.
        return bool(exc.retriable) or isinstance(exc, KafkaTimeoutError)
    return is_outage(exc) or isinstance(exc, Unavailable | ResourceExhausted)


# The exit status of a worker whose stop never finished (after a crash, or asked for).
EXIT_STOP_HUNG = 1
# Beyond the loops' grace, for the clients' own shutdown (flushes, leaving the group).
STOP_MARGIN_S = 30.0


def stopping_on_crash(app: faust.App, what: str, body: AgentBody, *, grace_s: float) -> AgentBody:
    """``body`` as the ``what`` agent: an error escaping it stops ``app``, and the
    agent ends instead of being restarted past the events it held.

    Should the stop itself not finish ``STOP_MARGIN_S`` after the loops' own
    ``grace_s`` (``WFJOBS_SHUTDOWN_GRACE_S``) is up (a client library's
    shutdown that waits on a consumer whose agent is gone), the process exits
    anyway: a worker with a dead agent must not linger looking alive while its
    partitions wait for a member that will never read them.
    """

    async def agent(stream: StreamT[bytes]) -> None:
        try:
            await body(stream)
        except Exception as exc:
            cause: BaseException = exc
            # The request agent's body is a task group: name the error inside it.
            while isinstance(cause, BaseExceptionGroup) and cause.exceptions:
                cause = cause.exceptions[0]
            log.critical(
                "workflow-jobs: the %s agent died (%s: %s); stopping the worker",
                what,
                type(cause).__name__,
                cause,
            )
            exit_unless_stopped_within(grace_s + STOP_MARGIN_S, f"its {what} agent's death")
            # Logs the traceback; the worker then stops and exits non-zero.
            await app.crash(exc)

    return agent


def exit_unless_stopped_within(seconds: float, since: str) -> None:
    """Exit the process ``seconds`` from now unless it has exited by then.

    ``since`` says what began the stop, for the log line."""

    # A thread, not the event loop: a stop that hangs may hold the loop too.
    def exit_now() -> None:
        log.critical(
            "workflow-jobs: the worker did not stop within %.0fs of %s; exiting",
            seconds,
            since,
        )
        logging.shutdown()
        os._exit(EXIT_STOP_HUNG)

    timer = threading.Timer(seconds, exit_now)
    timer.daemon = True  # a stop that finishes in time exits without waiting for it
    timer.start()


__all__ = [
    "EXIT_STOP_HUNG",
    "STOP_MARGIN_S",
    "STUCK_AFTER_S",
    "AttemptClock",
    "exit_unless_stopped_within",
    "stopping_on_crash",
    "worth_waiting_out",
]
