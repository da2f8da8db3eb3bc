"""Claim loops: take QUEUED jobs, run one segment each, settle the outcome.

Shape: one claimer task and ``loops`` runner tasks per process. The claimer
only claims while some runner is idle, and then as many jobs as there are idle
runners (up to ``batch``) in one statement, so a hungry process fills all its
runners in one round trip while a busy one never hoards leases it cannot run
yet. When a claim comes back short it waits, up to a jittered poll interval,
for the LISTEN connection to announce new work. While claims come back full (a
backlog), a runner whose segment has ended counts as idle during its settle,
so the next job's claim runs while the settle commits instead of after it.

A runner, per job:

1. compiles the snapshot through the process cache (keyed by definition hash);
   a claim carries no snapshot whose workflow the cache holds, and the runner
   reads one only if the cache let it go since;
2. starts a heartbeat that extends the lease every ``heartbeat_s`` while the
   segment runs, each renewal naming the segment's progress (a worker that
   stops heartbeating, because it died, loses the job to the sweeper);
3. takes a slot of the per-target semaphore for the next step's target;
4. runs one segment with the store as the checkpoint observer;
5. settles: Completed -> complete, Parked -> park, and a ``StepFailure`` by
   kind: RETRYABLE -> retry_or_die, VERDICT -> fail(verdict), NON_RETRYABLE ->
   fail(error).

With ``hold_back_last_checkpoint`` (on where the store group-commits), the
last step's checkpoint is held back and written by the settle, in the
statement that completes the job (``RunStore.complete``): nothing runs after
that step, so nothing waits on it being durable sooner, and a crash between
the two runs the step again, as a crash during it would. A failure after it
(an output rule that cannot be evaluated) writes it first; a completion the
database refuses writes the two apart, so a refused response fails the job
naming its step, as it does at any other step.

``LeaseLost`` at any point means another worker owns the job now: drop it,
write nothing. A store outage while checkpointing or settling is not the
job's fault: the job is handed back (requeued now, attempt given back), never
failed. A value the database refuses on every try (a response holding U+0000,
say) is the job's fault: handing it back would loop forever, so the job fails.

Cancel: a renewal answers whether an operator asked to cancel the job. If so,
the heartbeat cancels the segment's task (the running step: an in-process
handler, or a gRPC call with its deadline) and the runner settles the job
CANCELLED. From the request on the store refuses the segment's checkpoints and
settles, so a step finishing at that moment writes nothing; the refusal sends
the runner to the same CANCELLED settle.

The heartbeat is never cancelled while it renews. A pool request cancelled
just as the pool hands it a connection can swallow the cancellation (the
renewal goes on, and on) or lose the connection; so the segment's end is an
event the heartbeat waits on between renewals, a renewal in flight finishes
by itself, and the runner settles without waiting for it longer than
``heartbeat_s``.

A watchdog, ticking without I/O, keeps the two bounds a held job has:

* a segment without progress (no step started or checkpointed) for its
  ``deadlineMs`` plus the lease is stopped and settled as a retryable failure
  (the database refuses to renew it by then, and the sweeper requeues it if
  this worker cannot);
* a job still held ``settle_bound_s`` after its segment ended (or stalled) is
  logged and handed back, and ``health()`` reports it until it is let go;
* a claimed job that no runner took within ``settle_bound_s`` (claimed ahead
  of settles that then hung) is handed back unstarted.

Stopping: no more claims; running segments get ``grace_s`` to finish and
settle; whatever is still running or settling then is cancelled and handed
back, as are claimed jobs no runner had started.

``ClaimLoops`` is a mode service: the claimer, the runners and the watchdog
are its tasks. A claim that fails because the store is away is retried after
the shared backoff; anything else that escapes one of them (a claim the
database refuses, a defect in the watchdog) crashes the service, and with it
the process. A job whose segment or settle goes wrong is the job's business
and is settled or handed back; it never takes a runner down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

import mode

from schemas.errors import InvalidArgument, LeaseLost, UnstorableValue
from store.control import ControlStore
from store.errors import is_outage
from store.history_sql import ErrorClass
from store.records import ClaimedJob, Lease, SegmentProgress
from store.runs import RunStore
from streams import logs
from streams.backoff import Backoff
from streams.convert import timestamp_json
from streams.health import PartHealth
from streams.metrics import ClaimTimings
from streams.tracing import Tracing, now_ns
from workflows.failures import FailureKind, StepFailure
from workflows.invokers import GrpcChannels, HandlerRegistry
from workflows.runner import Completed, Parked, SegmentOutcome, StepTimer, run_segment
from workflows.steps import CompiledWorkflow, Step

log = logging.getLogger(__name__)

# Compiles a job's snapshot (by its hash), off the event loop when it is not cached.
Compile = Callable[[Mapping[str, Any], str | None], Awaitable[CompiledWorkflow]]
# A definition hash's compiled workflow, if the process has it at hand.
Compiled = Callable[[str], CompiledWorkflow | None]
# Takes a step's progress report with the claim it was made under.
ProgressReporter = Callable[[Lease, str, float, str], None]

# How long a stopping claimer may take to finish the claim it has in flight.
# A claim takes milliseconds; one still pending after this is waiting for a
# store that is down, and cancelling it costs at most leases the sweeper frees.
_CLAIM_STOP_TIMEOUT_S = 3.0
# How long a hand-back may take at shutdown before we leave the job to the sweeper.
_HAND_BACK_TIMEOUT_S = 5.0
# The watchdog's longest tick; it does no I/O, so ticking often costs nothing.
_WATCH_INTERVAL_S = 1.0
# The longest pause between claims while the store is away.
_CLAIM_RETRY_CAP_S = 30.0


# What a segment holds when its next step takes no slot.
_NO_SLOT: contextlib.AbstractAsyncContextManager[None] = contextlib.nullcontext()


class _StoreTrouble(Exception):
    """The checkpoint observer could not write: the store's fault, not the job's."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


@dataclass
class ClaimStats:
    claims: int = 0
    claimed: int = 0
    completed: int = 0
    parked: int = 0
    failed: int = 0
    retried: int = 0
    dead: int = 0
    lease_lost: int = 0
    handed_back: int = 0
    store_errors: int = 0
    # Segments stopped for making no progress past their deadline plus the lease.
    stalled: int = 0
    # Jobs the watchdog found still held past the bound after their segment ended.
    held_past_bound: int = 0
    # Jobs settled CANCELLED because an operator asked.
    cancelled: int = 0
    # Claimed jobs handed back unstarted after waiting past the bound for a runner.
    withdrawn: int = 0


@dataclass(eq=False)
class _Holding:
    """One claimed job, from its runner taking it to its settle."""

    lease: Lease
    # The workflow's deadlineMs in seconds, and how long the segment may go
    # without progress: that plus the lease.
    deadline_s: float
    stall_s: float
    progress_at: float
    # When the claim arrived: the lease runs from then, not from the start.
    claimed_at: float
    # Steps started or checkpointed; what renewals report.
    mark: int = 0
    segment: asyncio.Task[Any] | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    ended_at: float | None = None
    stalled_at: float | None = None
    past_bound: bool = False
    # A renewal answered that an operator asked to cancel the job.
    cancel_requested: bool = False
    # The last step's checkpoint, held back to be written with the settle.
    held_back: dict[str, Any] | None = None
    # Waiting for its target's slot: the process's own cap holds it back, and
    # the segments holding the slots are watched themselves, so the wait is
    # not a segment without progress.
    awaiting_slot: bool = False

    def progressed(self, now: float) -> None:
        self.mark += 1
        self.progress_at = now

    def end(self, now: float) -> None:
        if self.ended_at is None:
            self.ended_at = now
        self.ended.set()

    def report(self, now: float) -> SegmentProgress:
        if self.awaiting_slot:
            # A new mark: the store moves a job's progress time only with it.
            self.progressed(now)
        return SegmentProgress(
            mark=self.mark, idle_s=now - self.progress_at, deadline_s=self.deadline_s
        )


class ClaimLoops(mode.Service):
    def __init__(
        self,
        runs: RunStore,
        *,
        worker_id: str,
        compile: Compile,
        registry: HandlerRegistry,
        compiled: Compiled | None = None,
        loops: int = 4,
        batch: int = 8,
        poll_interval_s: float = 1.0,
        heartbeat_s: float = 100.0,
        max_per_target: int = 8,
        wake: asyncio.Event | None = None,
        channels: GrpcChannels | None = None,
        settle_bound_s: float = 30.0,
        claim_failure_bound_s: float = 60.0,
        grace_s: float = 10.0,
        hold_back_last_checkpoint: bool = False,
        progress: ProgressReporter | None = None,
        clock: Callable[[], float] = time.monotonic,
        tracing: Tracing | None = None,
        timings: ClaimTimings | None = None,
        **kwargs: Any,
    ) -> None:
        """``settle_bound_s``: longest a job may stay held once its segment ended
        before the watchdog hands it back; ``claim_failure_bound_s``: how long
        claims may fail in a row before ``health()`` says the loops are stuck;
        ``grace_s``: how long running segments may finish when the loops stop;
        ``hold_back_last_checkpoint``: write the last step's checkpoint with the
        completion (see the module docstring); ``progress``: where the steps'
        progress reports go (``streams.progress``), with the claim that runs them;
        ``clock``: the monotonic clock of every bound here;
        ``tracing``: spans of every claim, segment and step (None: none);
        ``timings``: the histograms to observe (``None``, metrics off: nothing is timed);
        ``compiled``: the workflows compiled already, by definition hash, so
        that claims need not read their snapshots (``RunStore.claim_batch``)."""
        if loops < 1 or batch < 1 or max_per_target < 1:
            raise ValueError("loops, batch and max_per_target must be at least 1")
        if heartbeat_s <= 0 or settle_bound_s <= 0 or claim_failure_bound_s <= 0:
            raise ValueError(
                "heartbeat_s, settle_bound_s and claim_failure_bound_s must be positive"
            )
        if not worker_id.strip():
            raise ValueError("worker_id must not be blank")
        super().__init__(**kwargs)
        self._runs = runs
        self._control = ControlStore.beside(runs)
        self._worker_id = worker_id
        self._compile = compile
        self._compiled = compiled
        self._has_compiled: Callable[[str], bool] | None = (
            None if compiled is None else (lambda digest: compiled(digest) is not None)
        )
        self._registry = registry
        self._loops = loops
        self._batch = batch
        self._poll_interval_s = poll_interval_s
        self._claim_backoff = Backoff(poll_interval_s, max(poll_interval_s, _CLAIM_RETRY_CAP_S))
        self._grace_s = grace_s
        self._hold_back_last = hold_back_last_checkpoint
        self._tracing = tracing
        self._heartbeat_s = heartbeat_s
        self._max_per_target = max_per_target
        self._wake = wake if wake is not None else asyncio.Event()
        self._channels = channels
        self._progress = progress
        self._queue: asyncio.Queue[ClaimedJob] = asyncio.Queue()
        self._idle = loops
        # Jobs whose runner gave its place back when the segment ended, before
        # the settle's commit: the next job is claimed while that commit runs.
        self._settling_early: set[Lease] = set()
        # Whether the last claim found all it asked for: a backlog, so claiming
        # ahead of a settle finds work for the runner.
        self._backlogged = False
        # Claimed jobs no runner has taken yet, since when; and those the
        # watchdog handed back for waiting too long, for the runner to skip.
        self._waiting_since: dict[Lease, float] = {}
        self._withdrawn: set[Lease] = set()
        self._has_idle = asyncio.Event()
        self._has_idle.set()
        self._stopping = False
        self._claimer: asyncio.Future[None] | None = None
        self._runners: list[asyncio.Future[None]] = []
        self._busy: set[asyncio.Future[Any]] = set()
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._settle_bound_s = settle_bound_s
        self._claim_failure_bound_s = claim_failure_bound_s
        self._clock = clock
        self._holdings: set[_Holding] = set()
        self._watchdog: asyncio.Future[None] | None = None
        self._pending: set[asyncio.Task[Any]] = set()
        # Claim health: when the last claim answered, and since when claims fail.
        self._last_claim_at: float | None = None
        self._last_claim_wall: datetime | None = None
        self._claim_failures = 0
        self._failing_since: float | None = None
        # Since when the claim statement in flight has waited: one that never
        # answers (a lock, a server gone without a word) fails nothing.
        self._claim_started_at: float | None = None
        self._timings = timings
        self.stats = ClaimStats()

    # ------------------------------------------------------------------ lifecycle

    async def on_start(self) -> None:
        # Service tasks, kept by handle: stopping treats each kind differently.
        self._claimer = self.add_future(self._claim_forever())
        self._runners = [self.add_future(self._run_forever()) for _ in range(self._loops)]
        self._watchdog = self.add_future(self._watch_forever())
        log.info("claim loops started: %d runner(s), worker %s", self._loops, self._worker_id)

    def wake(self) -> None:
        """Look for work now instead of at the end of the idle wait."""
        self._wake.set()

    async def on_stop(self) -> None:
        """Stop claiming, let running segments finish for ``grace_s``, hand back the rest."""
        if self._stopping:
            return
        self._stopping = True
        grace_s = self._grace_s
        self._wake.set()
        self._has_idle.set()
        claimer, self._claimer = self._claimer, None
        if claimer is not None:
            # Let an in-flight claim finish: cancelling it could commit leases
            # we never see, which would then sit until their lease expired.
            done, _ = await asyncio.wait({claimer}, timeout=_CLAIM_STOP_TIMEOUT_S)
            if not done:
                claimer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await claimer
        busy = [task for task in self._runners if task in self._busy]
        for task in self._runners:
            if task not in self._busy:
                task.cancel()
        if busy:
            log.info("waiting up to %.1fs for %d running segment(s)", grace_s, len(busy))
            _, pending = await asyncio.wait(busy, timeout=grace_s)
            for task in pending:
                task.cancel()
        if self._runners:
            await asyncio.wait(self._runners)
        self._runners = []
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
        while not self._queue.empty():
            lease = self._queue.get_nowait().lease
            if lease not in self._withdrawn:
                await self._hand_back(lease, "never started")
        if self._pending:
            await asyncio.wait(self._pending, timeout=_HAND_BACK_TIMEOUT_S)
        log.info("claim loops stopped: %s", self.stats)

    # ------------------------------------------------------------------ claiming

    async def _claim_forever(self) -> None:
        while not self._stopping:
            await self._has_idle.wait()
            if self._stopping:
                break
            want = min(self._batch, self._idle)
            # Cleared before the claim: a notification that arrives during it
            # is kept for the wait below instead of being lost.
            self._wake.clear()
            started_ns = now_ns() if self._tracing is not None else 0
            try:
                claimed = await self._claim(want)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                failures = self._claim_backoff.failures + 1
                self._claim_failures = failures
                if self._failing_since is None:
                    self._failing_since = self._clock()
                self.stats.store_errors += 1
                if failures == 1 or failures % 10 == 0:
                    log.warning(
                        "claim failed (%d in a row): %s: %s", failures, type(exc).__name__, exc
                    )
                await self._pause(self._claim_backoff.next())
                continue
            self._claim_backoff.reset()
            self._claim_failures = 0
            self._failing_since = None
            self._last_claim_at = self._clock()
            self._last_claim_wall = datetime.now(UTC)
            self.stats.claims += 1
            self.stats.claimed += len(claimed)
            if self._tracing is not None:
                ended_ns = now_ns()
                for job in claimed:
                    self._tracing.claimed(job, started_ns, ended_ns)
            if self._timings is not None:
                _observe_claims(self._timings, claimed)
            # A single runner is left out: a job claimed ahead would wait for
            # that same runner, however long its settle takes.
            self._backlogged = self._loops > 1 and len(claimed) == want
            queued_at = self._clock()
            for job in claimed:
                self._idle -= 1
                self._waiting_since[job.lease] = queued_at
                self._queue.put_nowait(job)
            if self._idle <= 0:
                self._has_idle.clear()
            if len(claimed) < want:
                await self._pause(self._poll_interval_s * random.uniform(0.5, 1.0))

    async def _claim(self, want: int) -> list[ClaimedJob]:
        self._claim_started_at = self._clock()
        try:
            return await self._runs.claim_batch(self._worker_id, want, compiled=self._has_compiled)
        finally:
            self._claim_started_at = None

    async def _pause(self, seconds: float) -> None:
        if self._stopping:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)

    # ------------------------------------------------------------------ running

    async def _run_forever(self) -> None:
        task: asyncio.Future[Any] | None = asyncio.current_task()
        assert task is not None
        while not self._stopping:
            claimed = await self._queue.get()
            claimed_at = self._waiting_since.pop(claimed.lease, None)
            if claimed.lease in self._withdrawn:
                # Handed back by the watchdog while it waited: not ours to run.
                self._withdrawn.discard(claimed.lease)
                self._free_a_runner()
                continue
            self._busy.add(task)
            if self._stopping:
                # Busy while it hands back: stopping cancels idle runners, and
                # a cancel here would leave the write to finish uncounted.
                try:
                    await self._hand_back(claimed.lease, "never started")
                finally:
                    self._busy.discard(task)
                continue
            try:
                await self.process(claimed, claimed_at=claimed_at)
            except asyncio.CancelledError:
                # Shutdown ran out of grace, in the segment or in its settle: what
                # did not commit goes back now, not once the lease has passed.
                await self._hand_back(claimed.lease, "shutdown")
                raise
            except Exception:
                # ``process`` settles every outcome itself; reaching here is a
                # defect. Keep the runner alive and let the job go back.
                log.exception("job %s: unexpected error in the claim loop", claimed.job_id)
                await self._hand_back(claimed.lease, "unexpected error")
            finally:
                self._busy.discard(task)
                if claimed.lease in self._settling_early:
                    self._settling_early.discard(claimed.lease)
                else:
                    self._free_a_runner()

    def _free_a_runner(self) -> None:
        self._idle += 1
        self._has_idle.set()

    def _claim_next_while_settling(self, lease: Lease) -> None:
        """The runner's segment ended: claim its next job while the settle commits.

        Only while claims come back full: then the settle is one more commit
        the next job would wait for, and claiming after it puts a second one
        in line. The job claimed early waits in the queue for the first runner
        free, normally as long as a settle takes; one that waits past the
        settle bound (every runner stuck in a store that does not answer) is
        handed back by the watchdog rather than left to its lease.
        """
        if self._backlogged and lease not in self._settling_early:
            self._settling_early.add(lease)
            self._free_a_runner()

    async def process(self, claimed: ClaimedJob, *, claimed_at: float | None = None) -> None:
        """Run one claimed job's segment and settle it; never raises for the job's sake.

        ``claimed_at``: when the claim arrived, on ``clock`` (None: now).
        Its log lines name the job (``streams.logs``), and with tracing on its
        ``segment`` span is current throughout, so step spans nest under it.
        """
        if claimed_at is None:
            claimed_at = self._clock()
        with logs.about_job(claimed.job_id, claimed.lease.attempt):
            if self._tracing is None:
                await self._process(claimed, claimed_at)
                return
            with self._tracing.segment(claimed):
                await self._process(claimed, claimed_at)

    async def _process(self, claimed: ClaimedJob, claimed_at: float) -> None:
        lease = claimed.lease
        job = claimed.job
        digest = job.definition_hash or None
        workflow = None
        if not claimed.definition and digest is not None and self._compiled is not None:
            workflow = self._compiled(digest)
        try:
            if workflow is None:
                definition = claimed.definition
                if not definition and digest is not None:
                    # Claimed without its snapshot, and the compiled form has
                    # since left the cache: read the snapshot after all.
                    definition = (await self._runs.definition_snapshots([digest])).get(digest, {})
                workflow = await self._compile(definition, digest)
            step = workflow.next_step(job.checkpoints)
        except StepFailure as failure:
            await self._settle_failure(lease, failure)
            return
        except InvalidArgument as exc:
            # The snapshot was compiled at submit; failing now means the engine
            # changed under a live job. Retrying cannot help.
            await self._settle_failure(
                lease,
                StepFailure(
                    FailureKind.NON_RETRYABLE, "", f"the job's definition no longer compiles: {exc}"
                ),
            )
            return

        deadline_s = workflow.deadline_ms / 1000.0
        holding = _Holding(
            lease,
            deadline_s=deadline_s,
            stall_s=deadline_s + self._runs.lease_s,
            progress_at=self._clock(),
            claimed_at=claimed_at,
        )
        self._holdings.add(holding)
        try:
            await self._run_held(claimed, workflow, step, holding)
        finally:
            self._holdings.discard(holding)

    async def _run_held(
        self,
        claimed: ClaimedJob,
        workflow: CompiledWorkflow,
        step: Step | None,
        holding: _Holding,
    ) -> None:
        lease = holding.lease
        job = claimed.job
        segment = asyncio.create_task(
            self._segment(claimed, workflow, step, holding), name=f"segment-{job.job_id}"
        )
        holding.segment = segment
        lost = asyncio.Event()
        beat: asyncio.Task[None] | None = None

        def start_heartbeat() -> None:
            nonlocal beat
            beat = asyncio.create_task(self._heartbeat(holding, lost), name="heartbeat")

        # The first renewal is due a heartbeat after the claim, so the task
        # starts then: the many segments that end sooner never make one. Not a
        # heartbeat after the start: a wait for a runner or a slow compile
        # would leave the lease that much less for the renewals.
        first_in = self._heartbeat_s - (self._clock() - holding.claimed_at)
        first_beat = asyncio.get_running_loop().call_later(max(first_in, 0.0), start_heartbeat)
        begun = self._clock()
        try:
            try:
                outcome = await segment
            finally:
                ended = self._clock()
                holding.end(ended)
                first_beat.cancel()
                if self._timings is not None:
                    timings = self._timings
                    timings.observe(timings.segment_duration, (job.workflow_name,), ended - begun)
                if beat is not None:
                    await self._let_heartbeat_finish(beat, lease)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and not current.cancelling():
                if lost.is_set():
                    # The heartbeat found the lease gone and stopped the segment.
                    self.stats.lease_lost += 1
                    return
                if holding.cancel_requested:
                    # The heartbeat read a cancel request and stopped the segment.
                    if not await self._cancelled_instead(lease):
                        self.stats.lease_lost += 1
                    return
                if holding.stalled_at is not None:
                    # The watchdog stopped a segment that made no progress.
                    self.stats.stalled += 1
                    await self._settle_failure(
                        lease, _stall_failure(holding), error_class=ErrorClass.STALL
                    )
                    return
            # Shutdown ran out of grace: the runner hands the job back, and the
            # next claim resumes from the checkpoints.
            raise
        except LeaseLost as exc:
            # A checkpoint refused: the lease is gone, or the job was asked to cancel.
            if await self._cancelled_instead(lease):
                return
            self.stats.lease_lost += 1
            log.info("job %s dropped: %s", job.job_id, exc)
            return
        except _StoreTrouble as trouble:
            self.stats.store_errors += 1
            log.warning("job %s: checkpoint failed (%s); handing it back", job.job_id, trouble)
            await self._hand_back(lease, "store failure")
            return
        except StepFailure as failure:
            await self._settle_failure(lease, failure, held_back=holding.held_back)
            return
        except Exception as exc:
            # Not a classified step failure: a defect in this process. Counted
            # as a retryable attempt so a passing bug cannot strand the job.
            log.exception("job %s: segment raised unexpectedly", job.job_id)
            await self._settle_failure(
                lease,
                StepFailure(FailureKind.RETRYABLE, "", f"{type(exc).__name__}: {exc}"),
                held_back=holding.held_back,
            )
            return
        self._claim_next_while_settling(lease)
        await self._settle(lease, outcome, held_back=holding.held_back)

    def _slot(self, step: Step | None) -> contextlib.AbstractAsyncContextManager[Any]:
        """The per-target cap, taken for the next step's target.

        The cap protects what sits behind a target (one box per model) from the
        whole fleet; in-process handlers share the ``local`` target, since they
        often wrap such a service themselves. A segment that goes on to other
        targets keeps the slot it started with: a documented approximation.
        The semaphore itself is the context: a generator around it cost every
        segment more than the semaphore does.
        """
        if step is None or step.external:
            return _NO_SLOT
        target = step.remote_target or step.target or "local"
        slot = self._slots.get(target)
        if slot is None:
            slot = self._slots[target] = asyncio.Semaphore(self._max_per_target)
        return slot

    async def _segment(
        self,
        claimed: ClaimedJob,
        workflow: CompiledWorkflow,
        step: Step | None,
        holding: _Holding,
    ) -> SegmentOutcome:
        lease = claimed.lease
        last = workflow.steps[-1] if workflow.steps and self._hold_back_last else None

        async def on_checkpoint(entry: dict[str, Any]) -> None:
            if last is not None and not last.external and entry.get("name") == last.name:
                # Nothing runs after the last step: its checkpoint goes with the
                # settle, in the complete's statement, and no later than it.
                holding.held_back = entry
                holding.progressed(self._clock())
                return
            try:
                await self._runs.checkpoint(lease, entry)
                # Checkpointed, and the next step starts right away: progress.
                holding.progressed(self._clock())
            except LeaseLost:
                raise
            except UnstorableValue as exc:
                # The step's response itself cannot be stored: every retry would
                # meet the same refusal, so this is the job's defect, not an outage.
                raise StepFailure(
                    FailureKind.NON_RETRYABLE, str(entry.get("name", "")), exc.message
                ) from exc
            except Exception as exc:
                if is_outage(exc):
                    raise _StoreTrouble(exc) from exc
                # Neither an outage nor a refused value: a defect that would
                # recur. Spend an attempt so the job ends DEAD instead of looping.
                raise StepFailure(
                    FailureKind.RETRYABLE,
                    str(entry.get("name", "")),
                    f"checkpoint failed: {type(exc).__name__}: {exc}",
                ) from exc

        on_step: StepTimer | None = None
        if self._timings is not None:
            timings = self._timings
            workflow_name = claimed.job.workflow_name

            def on_step(name: str, seconds: float, answered: bool) -> None:
                labels = (workflow_name, name, "ok" if answered else "error")
                timings.observe(timings.step_duration, labels, seconds)

        slot = self._slot(step)
        holding.awaiting_slot = True
        async with slot:
            holding.awaiting_slot = False
            holding.progressed(self._clock())
            return await run_segment(
                workflow,
                claimed.job.input,
                claimed.job.checkpoints,
                job_id=str(claimed.job.job_id),
                attempt=lease.attempt,
                on_checkpoint=on_checkpoint,
                registry=self._registry,
                channels=self._channels,
                progress=None if self._progress is None else partial(self._progress, lease),
                observe_step=self._tracing.step if self._tracing is not None else None,
                on_step=on_step,
            )

    async def _heartbeat(self, holding: _Holding, lost: asyncio.Event) -> None:
        """Renew the lease now, then every ``heartbeat_s``, until the segment ends or stalls.

        Started a heartbeat after the claim (``_run_held``). The end is
        awaited as an event, never delivered as a cancellation: see the module
        docstring. A renewal in flight when the segment ends finishes (or
        fails) on its own, and the loop stops right after it.
        """
        lease = holding.lease
        failures = 0
        while not holding.ended.is_set() and holding.stalled_at is None:
            try:
                cancel_requested_at = await self._runs.extend_lease(
                    lease, holding.report(self._clock())
                )
            except LeaseLost as exc:
                if holding.ended.is_set():
                    return
                log.warning("job %s: lease lost while running (%s); stopping it", lease.job_id, exc)
                lost.set()
                if holding.segment is not None:
                    holding.segment.cancel()
                return
            except Exception as exc:
                if holding.ended.is_set():
                    return
                # The lease still has time left; the next beat tries again.
                failures += 1
                log.warning(
                    "job %s: lease extension failed (%d in a row): %s",
                    lease.job_id,
                    failures,
                    exc,
                )
            else:
                failures = 0
                if cancel_requested_at is not None and not holding.ended.is_set():
                    log.info(
                        "job %s: cancel requested at %s; stopping its segment",
                        lease.job_id,
                        timestamp_json(cancel_requested_at),
                    )
                    holding.cancel_requested = True
                    if holding.segment is not None:
                        holding.segment.cancel()
                    return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._heartbeat_s):
                    await holding.ended.wait()

    async def _let_heartbeat_finish(self, beat: asyncio.Task[None], lease: Lease) -> None:
        """Wait for the heartbeat to notice the segment's end, at most ``heartbeat_s``."""
        if beat.done():
            return
        try:
            await asyncio.wait({beat}, timeout=self._heartbeat_s)
        finally:
            if not beat.done():
                # A renewal is still waiting on the store. It stops once it
                # returns; the settle does not wait for it, and fencing orders
                # the two writes whichever lands first.
                log.warning(
                    "job %s: a lease renewal is still in flight as the segment ended; "
                    "settling without it",
                    lease.job_id,
                )
                self._keep(beat)

    # ------------------------------------------------------------------ watchdog

    async def _watch_forever(self) -> None:
        interval = min(self._heartbeat_s, _WATCH_INTERVAL_S)
        # Plain sleeps: the watchdog keeps watching through the shutdown grace,
        # until ``on_stop`` cancels it.
        while True:
            await asyncio.sleep(interval)
            # No I/O and no expected failure: anything raised here is a defect,
            # and a process whose watchdog is gone must not look healthy.
            self.watch_once()

    def watch_once(self) -> None:
        """Stop stalled segments; hand back jobs held past the bound after their segment.

        No I/O: it reads the runners' holdings and starts hand-backs as tasks.
        """
        now = self._clock()
        for holding in list(self._holdings):
            # Its lines, and the hand-back task's, name the job like the runner's do.
            with logs.about_job(holding.lease.job_id, holding.lease.attempt):
                self._watch(holding, now)
        for lease, since in list(self._waiting_since.items()):
            if now - since > self._settle_bound_s:
                with logs.about_job(lease.job_id, lease.attempt):
                    self._withdraw(lease, now - since)

    def _withdraw(self, lease: Lease, waited_s: float) -> None:
        """Hand back a claimed job that no runner took within the settle bound."""
        del self._waiting_since[lease]
        self._withdrawn.add(lease)
        self.stats.withdrawn += 1
        log.error(
            "job %s: claimed %.1fs ago and no runner took it (bound %.1fs); handing it back",
            lease.job_id,
            waited_s,
            self._settle_bound_s,
        )
        self._keep(
            asyncio.get_running_loop().create_task(
                self._hand_back(lease, "waited past its bound"), name=f"hand-back-{lease.job_id}"
            )
        )

    def _watch(self, holding: _Holding, now: float) -> None:
        job_id = holding.lease.job_id
        if holding.ended_at is None and holding.stalled_at is None:
            idle = now - holding.progress_at
            if idle > holding.stall_s and holding.segment is not None and not holding.awaiting_slot:
                holding.stalled_at = now
                log.warning(
                    "job %s: segment made no progress for %.1fs, longer than its deadline "
                    "(%.1fs) plus the lease; stopping it",
                    job_id,
                    idle,
                    holding.deadline_s,
                )
                holding.segment.cancel()
            return
        since = holding.ended_at if holding.ended_at is not None else holding.stalled_at
        assert since is not None
        if holding.past_bound or now - since <= self._settle_bound_s:
            return
        holding.past_bound = True
        self.stats.held_past_bound += 1
        log.error(
            "job %s: still held %.1fs after its segment %s (bound %.1fs); handing it back",
            job_id,
            now - since,
            "ended" if holding.ended_at is not None else "stalled",
            self._settle_bound_s,
        )
        self._keep(
            asyncio.get_running_loop().create_task(
                self._hand_back(holding.lease, "held past its bound"),
                name=f"hand-back-{job_id}",
            )
        )

    def _keep(self, task: asyncio.Task[Any]) -> None:
        """Hold a reference to a task nobody awaits, and collect its outcome."""
        self._pending.add(task)

        def collected(done: asyncio.Task[Any]) -> None:
            self._pending.discard(done)
            if not done.cancelled():
                done.exception()

        task.add_done_callback(collected)

    # ------------------------------------------------------------------ health

    def health(self) -> PartHealth:
        """From memory: the claims' state, running segments, jobs held past their bound."""
        now = self._clock()
        past = sorted(str(h.lease.job_id) for h in self._holdings if h.past_bound)
        running = sum(1 for h in self._holdings if h.ended_at is None)
        failing_for = now - self._failing_since if self._failing_since is not None else 0.0
        claims_stuck = self._claim_failures > 0 and failing_for > self._claim_failure_bound_s
        claim_since = self._claim_started_at
        waiting_for = now - claim_since if claim_since is not None else 0.0
        claim_hung = waiting_for > self._claim_failure_bound_s
        detail: dict[str, Any] = {
            "last_claim_at": (
                timestamp_json(self._last_claim_wall) if self._last_claim_wall is not None else None
            ),
            "last_claim_age_s": (
                round(now - self._last_claim_at, 3) if self._last_claim_at is not None else None
            ),
            "claim_failures_in_a_row": self._claim_failures,
            "claims_failing_for_s": round(failing_for, 3),
            "claim_waiting_s": round(waiting_for, 3),
            "running_segments": running,
            "held_past_bound": len(past),
            "held_past_bound_jobs": past,
        }
        if past:
            summary = f"{len(past)} job(s) held past their bound: {', '.join(past[:5])}"
        elif claims_stuck:
            summary = f"claims failing for {failing_for:.0f}s ({self._claim_failures} in a row)"
        elif claim_hung:
            summary = f"a claim has waited {waiting_for:.0f}s for the store"
        elif self._claim_failures:
            summary = f"claims failing ({self._claim_failures} in a row)"
        else:
            summary = f"{running} segment(s) running"
        started = self._claimer is not None and not self._stopping
        return PartHealth(
            "claims",
            healthy=not past and not claims_stuck and not claim_hung,
            ready=started,
            summary=summary,
            detail=detail,
        )

    # ------------------------------------------------------------------ settling

    @contextlib.asynccontextmanager
    async def _settling(self, lease: Lease) -> AsyncIterator[None]:
        """Around every settle: a lost lease drops the job; see ``_settle_error`` for the rest."""
        try:
            yield
        except LeaseLost as exc:
            if await self._cancelled_instead(lease):
                return
            self.stats.lease_lost += 1
            log.info("job %s dropped at settle: %s", lease.job_id, exc)
        except UnstorableValue as exc:
            # The outcome itself (say, a result the database refuses) can never
            # be written: the job fails with that reason instead.
            try:
                await self._runs.fail(lease, error=exc.message)
                self.stats.failed += 1
            except LeaseLost:
                # Refused by the fence, as every write is once a cancel was asked.
                if not await self._cancelled_instead(lease):
                    self.stats.lease_lost += 1
            except Exception as again:
                await self._settle_error(lease, again)
        except Exception as exc:
            await self._settle_error(lease, exc)

    async def _settle(
        self, lease: Lease, outcome: SegmentOutcome, *, held_back: dict[str, Any] | None = None
    ) -> None:
        """``held_back``: the last step's checkpoint, not written yet."""
        async with self._settling(lease):
            if isinstance(outcome, Completed) and held_back is not None:
                try:
                    await self._runs.complete(
                        lease,
                        result=outcome.result,
                        verdict=outcome.verdict,
                        last_checkpoint=held_back,
                    )
                except UnstorableValue:
                    # The step's response or the result: written apart, the
                    # refusal names the one at fault.
                    await self._checkpoint_held_back(lease, held_back)
                    await self._runs.complete(lease, result=outcome.result, verdict=outcome.verdict)
                self.stats.completed += 1
            elif isinstance(outcome, Completed):
                await self._runs.complete(lease, result=outcome.result, verdict=outcome.verdict)
                self.stats.completed += 1
            elif isinstance(outcome, Parked):
                if held_back is not None:
                    await self._checkpoint_held_back(lease, held_back)
                await self._runs.park(
                    lease,
                    outcome.step_name,
                    request=outcome.request,
                    timeout_ms=outcome.timeout_ms,
                )
                self.stats.parked += 1
            else:  # pragma: no cover - the runner has exactly two outcomes
                raise TypeError(f"unknown segment outcome {outcome!r}")

    async def _settle_failure(
        self,
        lease: Lease,
        failure: StepFailure,
        *,
        error_class: ErrorClass = ErrorClass.RETRYABLE,
        held_back: dict[str, Any] | None = None,
    ) -> None:
        """``error_class`` is what the history records for a retryable failure;
        ``held_back`` the last step's checkpoint, written first (the step did
        run; what failed came after it)."""
        error = str(failure)
        async with self._settling(lease):
            if held_back is not None:
                await self._checkpoint_held_back(lease, held_back)
            if failure.kind is FailureKind.RETRYABLE:
                outcome = await self._runs.retry_or_die(lease, error, error_class=error_class)
                if outcome.dead:
                    self.stats.dead += 1
                    log.warning(
                        "job %s DEAD after %d attempt(s): %s", lease.job_id, outcome.attempt, error
                    )
                elif not outcome.retried:
                    self.stats.failed += 1
                    log.warning(
                        "job %s FAILED: %s; its deadline passes before a retry", lease.job_id, error
                    )
                else:
                    self.stats.retried += 1
                    log.info(
                        "job %s: attempt %d/%d failed, retry at %s: %s",
                        lease.job_id,
                        outcome.attempt,
                        outcome.max_attempts,
                        timestamp_json(outcome.run_after),
                        error,
                    )
            elif failure.kind is FailureKind.VERDICT:
                await self._runs.fail(lease, verdict=error)
                self.stats.failed += 1
            else:
                await self._runs.fail(lease, error=error)
                self.stats.failed += 1
                log.warning("job %s FAILED: %s", lease.job_id, error)

    async def _checkpoint_held_back(self, lease: Lease, entry: dict[str, Any]) -> None:
        """The held-back checkpoint on its own; a refusal names its step, as a
        checkpoint written during the segment does."""
        try:
            await self._runs.checkpoint(lease, entry)
        except UnstorableValue as exc:
            step = str(entry.get("name", ""))
            raise UnstorableValue(
                str(StepFailure(FailureKind.NON_RETRYABLE, step, exc.message))
            ) from exc

    async def _settle_error(self, lease: Lease, exc: BaseException) -> None:
        """A settle failed. An outage hands the job back untouched; anything else
        would fail the same way again, so it spends an attempt (and ends DEAD
        when none is left) rather than requeueing the job forever."""
        self.stats.store_errors += 1
        reason = f"{type(exc).__name__}: {exc}"
        if is_outage(exc):
            log.warning("job %s: could not settle (%s); handing it back", lease.job_id, reason)
            await self._hand_back(lease, "settle failed")
            return
        log.error("job %s: could not settle (%s); counting the attempt", lease.job_id, reason)
        try:
            outcome = await self._runs.retry_or_die(lease, f"could not settle: {reason}")
        except LeaseLost:
            if not await self._cancelled_instead(lease):
                self.stats.lease_lost += 1
        except Exception as again:
            log.warning(
                "job %s: %s: %s; the sweeper will requeue it when the lease expires",
                lease.job_id,
                type(again).__name__,
                again,
            )
        else:
            if outcome.dead:
                self.stats.dead += 1
            elif outcome.retried:
                self.stats.retried += 1
            else:
                self.stats.failed += 1

    async def _hand_back(self, lease: Lease, why: str) -> None:
        """Requeue now with the attempt given back; if that fails too, the sweeper will."""
        # Shielded, so a timeout never cancels the pool request (see the
        # module docstring); kept, so its outcome is collected.
        write = asyncio.ensure_future(self._runs.hand_back(lease))
        self._keep(write)
        try:
            await asyncio.wait_for(asyncio.shield(write), timeout=_HAND_BACK_TIMEOUT_S)
            self.stats.handed_back += 1
            log.info("job %s handed back (%s)", lease.job_id, why)
        except LeaseLost:
            # A job asked to cancel is not handed back: it ends here.
            if not await self._cancelled_instead(lease):
                self.stats.lease_lost += 1
        except Exception as exc:
            log.warning(
                "job %s: hand-back failed (%s: %s); the sweeper will requeue it when the "
                "lease expires",
                lease.job_id,
                type(exc).__name__,
                exc,
            )

    async def _cancelled_instead(self, lease: Lease) -> bool:
        """After a fenced write found no row: settle the job CANCELLED if an operator
        asked to cancel it (and it is still this lease's). True when settled.

        The other fenced writes refuse a job asked to cancel, so this is where
        the cancel lands whatever the segment was doing when the request came.
        """
        try:
            settled = await self._control.settle_cancelled(lease)
        except Exception as exc:
            log.warning(
                "job %s: could not settle its cancel (%s: %s); the sweeper settles it once "
                "the lease passes",
                lease.job_id,
                type(exc).__name__,
                exc,
            )
            return False
        if settled:
            self.stats.cancelled += 1
            log.info("job %s CANCELLED (attempt %d)", lease.job_id, lease.attempt)
        return settled


def _observe_claims(timings: ClaimTimings, claimed: list[ClaimedJob]) -> None:
    """Each job's wait from claimable to claimed, both instants on the database clock."""
    for item in claimed:
        job = item.job
        if job.claimed_at is not None:
            waited = (job.claimed_at - job.run_after).total_seconds()
            timings.observe(timings.claim_latency, (job.workflow_name,), max(waited, 0.0))


def _stall_failure(holding: _Holding) -> StepFailure:
    return StepFailure(
        FailureKind.RETRYABLE,
        "",
        f"the segment made no progress for longer than its deadline of "
        f"{holding.deadline_s * 1000:.0f} ms plus the lease",
    )


__all__ = ["ClaimLoops", "ClaimStats", "Compile"]
