"""This process's worker id, held against every other live process (``store.worker_ids``).

A process with the worker or relay role takes its id before any loop that
leases starts, and keeps checking, every ``check_s``, that the session holding
it is still there. Another live process under the same id stops this one, in
one line naming ``WFJOBS_WORKER_ID`` and the holder: at start, before it has
claimed anything, or later, when a lost session could not take the id back
because someone took it meanwhile. A store that cannot be reached is waited
out (every loop waits for it anyway) and the id taken when it answers.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import mode

from schemas.errors import WorkerIdTaken
from store.errors import is_outage
from store.worker_ids import WorkerIdLock

log = logging.getLogger(__name__)


CHECK_TIMEOUT_S = 10.0


class WorkerIdentity(mode.Service):
    def __init__(self, lock: WorkerIdLock, *, check_s: float, **kwargs: Any) -> None:
        if check_s <= 0:
            raise ValueError("check_s must be positive")
        super().__init__(**kwargs)
        self._lock = lock
        self._check_s = check_s

    async def on_start(self) -> None:
        await self._hold()

    async def on_shutdown(self) -> None:
        await self._lock.release()

    @mode.Service.task
    async def _watch(self) -> None:
        while not self.should_stop:
            await self.sleep(self._check_s)
            if not self.should_stop:
                await self._hold()

    async def _hold(self) -> None:
        try:
            # A server that went silent must not hold the check for ever; but a
            # check given up drops the session, and the id with it, so it is
            # bounded by what an outage takes, not by the interval between
            # checks, which a loop running late on a busy machine overshoots.
            async with asyncio.timeout(max(self._check_s, CHECK_TIMEOUT_S)):
                await self._lock.hold()
        except WorkerIdTaken as taken:
            # One line an operator can act on; the error stops the process.
            log.critical("workflow-jobs: refusing to run: %s", taken)
            raise
        except Exception as exc:
            if not is_outage(exc):
                raise
            log.warning(
                "worker id: the store did not answer (%s: %s); trying again in %.0fs",
                type(exc).__name__,
                exc,
                self._check_s,
            )


__all__ = ["WorkerIdentity"]
