"""The lease sweeper: every ``WFJOBS_SWEEP_INTERVAL_S``, requeue what dead or stuck workers held.

Every process with the worker role runs one. It takes RUNNING jobs whose lease
expired (their worker died or lost the store) and RUNNING jobs whose segment
stalled: renewed, but without progress for longer than the workflow's deadline
plus the lease (a worker alive but stuck). It also enforces deadlines
(``RunStore.sweep_deadlines``): a live job past its whole-job deadline and a
WAITING job past its step's timeout fail (or the step takes its fallback),
judged against the database's clock. Several sweeping at once is safe:
the store's sweep locks the rows it settles with ``SKIP LOCKED`` in one
transaction, so each such job is requeued (or settled DEAD) exactly once.
A RUNNING job an operator asked to cancel is never requeued: once its lease
has passed (its worker did not settle it) it is settled CANCELLED instead.

A sweep that fails because the store is away is retried on the next tick;
any other failure is a defect and crashes the service, and with it the process.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import mode

from store.control import ControlStore
from store.errors import is_outage
from store.records import DeadlineSweep, FallbackLookup, SweepResult
from store.runs import RunStore
from streams.convert import timestamp_json
from streams.health import PartHealth

log = logging.getLogger(__name__)


class Sweeper(mode.Service):
    def __init__(
        self,
        runs: RunStore,
        *,
        interval_s: float,
        failure_bound_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        fallback_of: FallbackLookup | None = None,
        **kwargs: Any,
    ) -> None:
        """``failure_bound_s``: how long sweeps may fail in a row before ``health()``
        says the sweeper is stuck (at least three intervals). ``fallback_of``
        finds a timed-out step's declared fallback in its job's definition."""
        if interval_s <= 0 or failure_bound_s <= 0:
            raise ValueError("interval_s and failure_bound_s must be positive")
        super().__init__(**kwargs)
        self._runs = runs
        # Cancel-requested RUNNING jobs whose worker let the lease pass.
        self._control = ControlStore.beside(runs)
        self.cancelled = 0
        self._fallback_of = fallback_of
        self.deadlines = DeadlineSweep()
        self._interval_s = interval_s
        self._failure_bound_s = max(failure_bound_s, 3 * interval_s)
        self._clock = clock
        self.sweeps = 0
        self.requeued = 0
        self.dead = 0
        self.stalled = 0
        self._last_sweep_at: float | None = None
        self._last_sweep_wall: datetime | None = None
        self._failures = 0
        self._failing_since: float | None = None
        self._last_error = ""
        # Since when the sweep in flight has waited: one that never answers (a
        # lock, a server gone without a word) fails nothing.
        self._sweep_started_at: float | None = None

    async def sweep_once(self) -> SweepResult:
        # Each pass is counted as soon as it committed: a stop that lands between
        # two passes must not lose what the first one did.
        self._sweep_started_at = self._clock()
        try:
            cancelled = await self._control.sweep_cancelled()
            self._count_cancelled(cancelled)
            result = await self._runs.sweep_expired()
            self._count_expired(result)
            deadlines = await self._runs.sweep_deadlines(fallback_of=self._fallback_of)
            self._count_deadlines(deadlines)
        except Exception as exc:
            self._failures += 1
            if self._failing_since is None:
                self._failing_since = self._clock()
            self._last_error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._sweep_started_at = None
        self._failures = 0
        self._failing_since = None
        self._last_sweep_at = self._clock()
        self._last_sweep_wall = datetime.now(UTC)
        self.sweeps += 1
        return result

    def _count_cancelled(self, cancelled: int) -> None:
        self.cancelled += cancelled
        if cancelled:
            log.info("sweeper: %d job(s) asked to cancel settled CANCELLED", cancelled)

    def _count_expired(self, result: SweepResult) -> None:
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

    def _count_deadlines(self, deadlines: DeadlineSweep) -> None:
        self.deadlines = DeadlineSweep(
            job_deadlines=self.deadlines.job_deadlines + deadlines.job_deadlines,
            step_timeouts=self.deadlines.step_timeouts + deadlines.step_timeouts,
            fallbacks=self.deadlines.fallbacks + deadlines.fallbacks,
        )
        if deadlines.job_deadlines or deadlines.step_timeouts or deadlines.fallbacks:
            log.info(
                "sweeper: %d job(s) FAILED past their deadline, %d past a step's timeout; "
                "%d step(s) took their fallback",
                deadlines.job_deadlines,
                deadlines.step_timeouts,
                deadlines.fallbacks,
            )

    def health(self) -> PartHealth:
        """From memory: when the last sweep answered, and whether sweeps keep failing."""
        now = self._clock()
        failing_for = now - self._failing_since if self._failing_since is not None else 0.0
        sweep_since = self._sweep_started_at
        waiting_for = now - sweep_since if sweep_since is not None else 0.0
        hung = waiting_for > self._failure_bound_s
        stuck = (self._failures > 0 and failing_for > self._failure_bound_s) or hung
        detail = {
            "last_sweep_at": (
                timestamp_json(self._last_sweep_wall) if self._last_sweep_wall is not None else None
            ),
            "last_sweep_age_s": (
                round(now - self._last_sweep_at, 3) if self._last_sweep_at is not None else None
            ),
            "sweep_failures_in_a_row": self._failures,
            "sweeps_failing_for_s": round(failing_for, 3),
            "sweep_waiting_s": round(waiting_for, 3),
            "requeued": self.requeued,
            "dead": self.dead,
            "stalled": self.stalled,
            "cancelled": self.cancelled,
            "job_deadlines_passed": self.deadlines.job_deadlines,
            "step_timeouts_passed": self.deadlines.step_timeouts,
            "step_fallbacks_taken": self.deadlines.fallbacks,
        }
        if hung:
            summary = f"a sweep has waited {waiting_for:.0f}s for the store"
        elif self._failures:
            summary = (
                f"sweeps failing for {failing_for:.0f}s ({self._failures} in a row): "
                f"{self._last_error}"
            )
        else:
            summary = f"{self.sweeps} sweep(s); {self.stalled} stalled segment(s) requeued"
        running = self.started and not self.should_stop
        return PartHealth(
            "sweeper", healthy=not stuck, ready=running, summary=summary, detail=detail
        )

    @mode.Service.task
    async def _run(self) -> None:
        # A random first delay keeps a fleet started together from sweeping in step.
        await self.sleep(random.uniform(0, self._interval_s))
        while not self.should_stop:
            try:
                await self.sweep_once()
            except Exception as exc:
                if not is_outage(exc):
                    raise
                # The next tick tries again; a store outage must not end the loop.
                log.warning("sweeper: sweep failed: %s: %s", type(exc).__name__, exc)
            await self.sleep(self._interval_s)


__all__ = ["Sweeper"]
