"""The lease sweeper: every ``WFJOBS_SWEEP_INTERVAL_S``, requeue what dead workers held.

Every process with the worker role runs one. Several sweeping at once is safe:
the store's sweep locks the rows it settles with ``SKIP LOCKED`` in one
transaction, so each expired lease is requeued (or settled DEAD) exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

from store.runs import RunStore, SweepResult

log = logging.getLogger(__name__)


class Sweeper:
    def __init__(self, runs: RunStore, *, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self._runs = runs
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self.sweeps = 0
        self.requeued = 0
        self.dead = 0

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="lease-sweeper")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def sweep_once(self) -> SweepResult:
        result = await self._runs.sweep_expired()
        self.sweeps += 1
        self.requeued += result.requeued
        self.dead += result.dead
        if result.requeued or result.dead:
            log.info(
                "sweeper: %d expired lease(s) requeued, %d job(s) DEAD",
                result.requeued,
                result.dead,
            )
        return result

    async def _run(self) -> None:
        # A random first delay keeps a fleet started together from sweeping in step.
        await asyncio.sleep(random.uniform(0, self._interval_s))
        while True:
            try:
                await self.sweep_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The next tick tries again; a store outage must not end the loop.
                log.warning("sweeper: sweep failed: %s: %s", type(exc).__name__, exc)
            await asyncio.sleep(self._interval_s)


__all__ = ["Sweeper"]
