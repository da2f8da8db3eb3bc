"""The lease sweeper: every ``WFJOBS_SWEEP_INTERVAL_S``, requeue what dead or stuck workers held.

Every process with the worker role runs one. It takes RUNNING jobs whose lease
expired (their worker died or lost the store) and RUNNING jobs whose segment
stalled: renewed, but without progress for longer than the workflow's deadline
plus the lease (a worker alive but stuck). Several sweeping at once is safe:
the store's sweep locks the rows it settles with ``SKIP LOCKED`` in one
transaction, so each such job is requeued (or settled DEAD) exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime

from store.runs import RunStore, SweepResult
from streams.health import PartHealth

log = logging.getLogger(__name__)


class Sweeper:
    def __init__(
        self,
        runs: RunStore,
        *,
        interval_s: float,
        failure_bound_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``failure_bound_s``: how long sweeps may fail in a row before ``health()``
        says the sweeper is stuck (at least three intervals)."""
        if interval_s <= 0 or failure_bound_s <= 0:
            raise ValueError("interval_s and failure_bound_s must be positive")
        self._runs = runs
        self._interval_s = interval_s
        self._failure_bound_s = max(failure_bound_s, 3 * interval_s)
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self.sweeps = 0
        self.requeued = 0
        self.dead = 0
        self.stalled = 0
        self._last_sweep_at: float | None = None
        self._last_sweep_wall: datetime | None = None
        self._failures = 0
        self._failing_since: float | None = None
        self._last_error = ""

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
        try:
            result = await self._runs.sweep_expired()
        except Exception as exc:
            self._failures += 1
            if self._failing_since is None:
                self._failing_since = self._clock()
            self._last_error = f"{type(exc).__name__}: {exc}"
            raise
        self._failures = 0
        self._failing_since = None
        self._last_sweep_at = self._clock()
        self._last_sweep_wall = datetime.now(UTC)
        self.sweeps += 1
        self.requeued += result.requeued
        self.dead += result.dead
        self.stalled += result.stalled
        if result.requeued or result.dead:
            log.info(
                "sweeper: %d job(s) requeued, %d DEAD (%d of them for a stalled segment)",
                result.requeued,
                result.dead,
                result.stalled,
            )
        return result

    def health(self) -> PartHealth:
        """From memory: when the last sweep answered, and whether sweeps keep failing."""
        now = self._clock()
        failing_for = now - self._failing_since if self._failing_since is not None else 0.0
        stuck = self._failures > 0 and failing_for > self._failure_bound_s
        detail = {
            "last_sweep_at": (
                self._last_sweep_wall.isoformat() if self._last_sweep_wall is not None else None
            ),
            "last_sweep_age_s": (
                round(now - self._last_sweep_at, 3) if self._last_sweep_at is not None else None
            ),
            "sweep_failures_in_a_row": self._failures,
            "sweeps_failing_for_s": round(failing_for, 3),
            "requeued": self.requeued,
            "dead": self.dead,
            "stalled": self.stalled,
        }
        if self._failures:
            summary = (
                f"sweeps failing for {failing_for:.0f}s ({self._failures} in a row): "
                f"{self._last_error}"
            )
        else:
            summary = f"{self.sweeps} sweep(s); {self.stalled} stalled segment(s) requeued"
        running = self._task is not None and not self._task.done()
        return PartHealth(
            "sweeper", healthy=not stuck, ready=running, summary=summary, detail=detail
        )

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
