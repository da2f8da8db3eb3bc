"""What the request and completions agents share: a body that crashes stops the process.

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

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import faust
    from faust.types import StreamT

log = logging.getLogger(__name__)

AgentBody = Callable[["StreamT[bytes]"], Awaitable[None]]


def stopping_on_crash(app: faust.App, what: str, body: AgentBody) -> AgentBody:
    """``body`` as the ``what`` agent: an error escaping it stops ``app``, and the
    agent ends instead of being restarted past the events it held."""

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
            # Logs the traceback; the worker then stops and exits non-zero.
            await app.crash(exc)

    return agent


__all__ = ["stopping_on_crash"]
