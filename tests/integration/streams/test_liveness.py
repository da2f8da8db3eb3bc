"""Liveness of claimed jobs: a held job always settles or goes back, within a bound.

The claim loops' bounds run on a clock the tests move (``Clock``), so nothing
here waits for time to pass; the database is real throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from schemas.serde import event_serializer
from store.outbox import Outbox
from store.pool import Pool, open_pool
from store.records import Lease, SweepResult
from store.runs import RunStore
from streams.claims import ClaimLoops
from streams.relay import OutboxRelay, producer_config
from streams.sweeper import Sweeper
from tests.workflows_fixtures import EMBED, TOKENIZE, CallLog, envelope, make_registry
from workflows.cache import DefinitionCache
from workflows.steps import CompiledWorkflow

HEARTBEAT_S = 0.2


class OutageAtTheLastCheckpoint(RunStore):
    """The pool's only connection is taken away right after the last checkpoint.

    It stays away until the heartbeat's lease renewal is queued behind it in the
    pool, and comes back as the segment ends: the pool hands it to the renewal
    in the same moment the runner cancels the heartbeat. That is what a pool
    reconnecting after a database restart does to requests queued on it.
    """

    def __init__(self, pool: Pool, *, last_step: str, **options: Any) -> None:
        super().__init__(pool, **options)
        self.last_step = last_step
        self.taken = False
        self.renewal_queued = asyncio.Event()
        self.last_checkpoint_at: float | None = None
        self.settled_at: float | None = None

    async def extend_lease(self, lease: Lease, *args: Any, **kwargs: Any) -> None:
        if self.taken:
            self.renewal_queued.set()
        await super().extend_lease(lease, *args, **kwargs)

    async def checkpoint(self, lease: Lease, entry: Mapping[str, Any]) -> None:
        await super().checkpoint(lease, entry)
        if entry["name"] != self.last_step or self.taken:
            return
        held = await self._pool.getconn()
        self.taken = True
        await self.renewal_queued.wait()
        assert self._pool.get_stats().get("requests_waiting") == 1
        self.last_checkpoint_at = time.monotonic()
        await self._pool.putconn(held)

    async def complete(self, lease: Lease, *, result: dict[str, Any], verdict: str) -> None:
        await super().complete(lease, result=result, verdict=verdict)
        self.settled_at = time.monotonic()


@pytest.fixture
async def one_connection_pool(dsn: str) -> AsyncIterator[Pool]:
    opened = await open_pool(dsn, min_size=1, max_size=1)
    try:
        yield opened
    finally:
        await opened.close()


def claim_loops(runs: RunStore, **options: Any) -> ClaimLoops:
    cache = DefinitionCache()

    async def compile(definition: Mapping[str, Any], digest: str | None) -> CompiledWorkflow:
        return await cache.get_off_loop(definition, digest=digest)

    defaults: dict[str, Any] = {
        "worker_id": "w-live",
        "compile": compile,
        "registry": make_registry(CallLog()),
        "loops": 1,
        "poll_interval_s": 0.05,
        "heartbeat_s": HEARTBEAT_S,
        "grace_s": 1.0,
    }
    return ClaimLoops(runs, **{**defaults, **options})


async def submit(runs: RunStore, workflow: dict[str, Any], text: str) -> uuid.UUID:
    compiled = DefinitionCache().get(workflow)
    job_id = uuid.uuid4()
    await runs.submit(
        job_id=job_id,
        workflow_name=compiled.name,
        definition=workflow,
        definition_hash=compiled.definition_hash,
        input=compiled.validate_input({"text": text}),
    )
    return job_id


async def wait_status(runs: RunStore, job_id: uuid.UUID, *statuses: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        job = await runs.get(job_id)
        if job.status in statuses:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(
                f"job {job_id} is {job.status}, wanted {statuses}; attempt {job.attempt}, "
                f"checkpoints {[entry['name'] for entry in job.checkpoints]}, lease until "
                f"{job.lease_until}, updated at {job.updated_at}, error {job.error!r}"
            )
        await asyncio.sleep(0.05)


async def test_a_heartbeat_cancelled_as_the_pool_hands_it_a_connection_still_stops(
    one_connection_pool: Pool, pool: Pool
) -> None:
    runs = OutageAtTheLastCheckpoint(one_connection_pool, last_step="review", lease_s=30.0)
    # Watched through another pool: the worker's has room for one request only.
    observer = RunStore(pool)
    job_id = await submit(observer, envelope(name="auto", review="invoke"), "a b c")
    loops = claim_loops(runs)
    await loops.start()
    try:
        job = await wait_status(observer, job_id, "COMPLETED", "FAILED", "DEAD", timeout_s=5.0)
    finally:
        await loops.stop()
    assert job.status == "COMPLETED", job
    assert runs.last_checkpoint_at is not None and runs.settled_at is not None
    assert runs.settled_at - runs.last_checkpoint_at < HEARTBEAT_S
    assert loops.stats.completed == 1


class Clock:
    """The claim loops' monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class StoreThatStopsAnswering(RunStore):
    """The first write of ``step``'s checkpoint never comes back."""

    def __init__(self, pool: Pool, *, step: str, **options: Any) -> None:
        super().__init__(pool, **options)
        self.step = step
        self.stuck = asyncio.Event()

    async def checkpoint(self, lease: Lease, entry: Mapping[str, Any]) -> None:
        if entry["name"] == self.step and not self.stuck.is_set():
            self.stuck.set()
            await asyncio.Event().wait()
        await super().checkpoint(lease, entry)


async def test_a_segment_without_progress_is_stopped_and_given_up_by_its_worker(
    pool: Pool,
) -> None:
    lease_s, deadline_s = 30.0, 1.0
    runs = StoreThatStopsAnswering(pool, step="embed", lease_s=lease_s, retry_base_s=600.0)
    job_id = await submit(runs, envelope(name="auto", review="invoke", deadline_ms=1000), "a b")
    clock = Clock()
    loops = claim_loops(runs, clock=clock)
    await loops.start()
    try:
        await asyncio.wait_for(runs.stuck.wait(), timeout=5)
        loops.watch_once()
        assert loops.health().detail["running_segments"] == 1
        clock.advance(deadline_s + lease_s - 0.5)
        loops.watch_once()
        assert loops.stats.stalled == 0 and loops.health().healthy
        clock.advance(1.0)
        loops.watch_once()
        job = await wait_status(runs, job_id, "QUEUED", timeout_s=5.0)
    finally:
        await loops.stop()
    # A retryable failure: the attempt counts and the job waits out its backoff.
    assert job.attempt == 1 and job.lease_owner is None
    assert job.error == (
        "the segment made no progress for longer than its deadline of 1000 ms plus the lease"
    )
    assert [entry["name"] for entry in job.checkpoints] == ["tokenize"]
    assert loops.stats.stalled == 1 and loops.stats.retried == 1
    assert loops.stats.held_past_bound == 0
    # The history tells a stalled segment from a failed step.
    [stalled] = await runs.history.attempts(job_id)
    assert (stalled.outcome, stalled.error_class, stalled.error) == (
        "RETRY_SCHEDULED",
        "stall",
        job.error,
    )


async def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.01)


async def test_a_job_waiting_for_its_targets_slot_is_not_stalled_out(pool: Pool) -> None:
    """Two claim loops, one slot: the second job waits while the first makes progress."""
    lease_s, deadline_s = 30.0, 1.0
    runs = RunStore(pool, lease_s=lease_s, retry_base_s=600.0)
    workflow = envelope(name="one-slot", review="invoke", deadline_ms=1000)
    first = await submit(runs, workflow, "a b")
    second = await submit(runs, workflow, "c d")
    registry = make_registry(CallLog())
    gates: asyncio.Queue[asyncio.Event] = asyncio.Queue()
    for method in (TOKENIZE, EMBED):
        inner = registry.get(method)
        assert inner is not None

        async def gated(request: Any, ctx: Any, inner: Any = inner) -> Any:
            gate = asyncio.Event()
            await gates.put(gate)
            await gate.wait()
            return await inner(request, ctx)

        registry.register(method, gated, replace=True)
    clock = Clock()
    loops = claim_loops(runs, clock=clock, registry=registry, loops=2, max_per_target=1)
    await loops.start()
    try:
        # One job's steps run a step at a time, each taking most of the time its
        # segment may go without progress; the other job waits for the slot
        # through two of them.
        for _ in range(2):
            gate = await asyncio.wait_for(gates.get(), timeout=5)
            await _until(lambda: loops.health().detail["running_segments"] == 2)
            await asyncio.sleep(0.05)  # the second segment reaches the slot
            clock.advance(deadline_s + lease_s - 1.0)
            loops.watch_once()
            gate.set()
        assert loops.stats.stalled == 0

        async def open_every_gate() -> None:
            while True:
                (await gates.get()).set()

        opener = asyncio.create_task(open_every_gate())
        try:
            for job_id in (first, second):
                await wait_status(runs, job_id, "COMPLETED", timeout_s=5.0)
        finally:
            opener.cancel()
    finally:
        await loops.stop()
    for job_id in (first, second):
        job = await wait_status(runs, job_id, "COMPLETED", timeout_s=5.0)
        assert job.attempt == 1
    assert loops.stats.stalled == 0 and loops.stats.retried == 0


async def test_the_store_does_not_take_a_job_waiting_for_its_slot_as_stalled(pool: Pool) -> None:
    """The renewals of a job waiting for the slot move its progress time in the row."""
    lease_s = 30.0
    runs = RunStore(pool, lease_s=lease_s, retry_base_s=600.0)
    registry = make_registry(CallLog())
    held = asyncio.Event()
    go = asyncio.Event()
    inner = registry.get(TOKENIZE)
    assert inner is not None

    async def holds_the_slot(request: Any, ctx: Any) -> Any:
        if not held.is_set():
            held.set()
            await go.wait()
        return await inner(request, ctx)

    registry.register(TOKENIZE, holds_the_slot, replace=True)
    loops = claim_loops(runs, registry=registry, loops=2, max_per_target=1)
    await loops.start()
    try:
        # A slow job of a workflow with a long deadline takes the one slot; a job
        # whose deadline is one second waits for it.
        await submit(runs, envelope(name="patient", review="invoke", deadline_ms=10_000), "a")
        await asyncio.wait_for(held.wait(), timeout=5)
        waiting = await submit(runs, envelope(name="brief", review="invoke", deadline_ms=1000), "b")
        await _until(lambda: loops.health().detail["running_segments"] == 2)
        await asyncio.sleep(4.0)  # renewals of both jobs, every 0.2 s
        # An instant within both leases, by which a job idle since its wait
        # began would have stalled (a second of deadline plus the lease). It
        # leaves a renewal 1.5 s to come late on a busy machine, and the idle
        # job 1.5 s past its stall.
        instant = datetime.now(UTC) + timedelta(seconds=lease_s - 1.5)
        swept = await runs.sweep_expired(now=instant)
        assert swept.requeued == 0, swept
        assert (await runs.get(waiting)).status == "RUNNING"
        go.set()
        await wait_status(runs, waiting, "COMPLETED", timeout_s=5.0)
    finally:
        go.set()
        await loops.stop()


class SettleThatHangs(RunStore):
    """The first ``complete`` waits until the test lets it go."""

    def __init__(self, pool: Pool, **options: Any) -> None:
        super().__init__(pool, **options)
        self.settling = asyncio.Event()
        self.release = asyncio.Event()

    async def complete(self, lease: Lease, *, result: dict[str, Any], verdict: str) -> None:
        if not self.settling.is_set():
            self.settling.set()
            await self.release.wait()
        await super().complete(lease, result=result, verdict=verdict)


async def test_a_job_held_past_its_bound_after_its_segment_is_reported_and_handed_back(
    pool: Pool,
) -> None:
    runs = SettleThatHangs(pool, lease_s=30.0)
    job_id = await submit(runs, envelope(name="auto", review="invoke"), "a b")
    clock = Clock()
    loops = claim_loops(runs, clock=clock, settle_bound_s=5.0)
    await loops.start()
    try:
        await asyncio.wait_for(runs.settling.wait(), timeout=5)
        clock.advance(4.0)
        loops.watch_once()
        assert loops.health().healthy
        clock.advance(2.0)
        loops.watch_once()
        health = loops.health()
        assert not health.healthy
        assert health.detail["held_past_bound_jobs"] == [str(job_id)]
        assert str(job_id) in health.summary
        # Handed back by the watchdog while the settle still hangs.
        job = await wait_status(runs, job_id, "QUEUED", timeout_s=5.0)
        assert job.attempt == 0
        runs.release.set()
        # The late settle finds the lease gone and writes nothing; the job runs again.
        job = await wait_status(runs, job_id, "COMPLETED", timeout_s=5.0)
    finally:
        await loops.stop()
    assert job.attempt == 1
    assert loops.stats.held_past_bound == 1 and loops.stats.lease_lost == 1
    assert loops.stats.handed_back == 1
    assert loops.health().healthy
    assert loops.health().detail["held_past_bound"] == 0


class SettlesThatHang(RunStore):
    """Every ``complete`` waits until the test lets them go."""

    def __init__(self, pool: Pool, *, runners: int, **options: Any) -> None:
        super().__init__(pool, **options)
        self.runners = runners
        self.settling = 0
        self.all_settling = asyncio.Event()
        self.release = asyncio.Event()

    async def complete(self, lease: Lease, *, result: dict[str, Any], verdict: str) -> None:
        self.settling += 1
        if self.settling == self.runners:
            self.all_settling.set()
        await self.release.wait()
        await super().complete(lease, result=result, verdict=verdict)


async def test_a_backlog_claims_the_next_jobs_during_settles_and_hands_them_back_if_none_runs(
    pool: Pool,
) -> None:
    runs = SettlesThatHang(pool, runners=2, lease_s=30.0)
    workflow = envelope(name="auto", review="invoke")
    jobs = [await submit(runs, workflow, text) for text in ("a", "b", "c", "d")]
    clock = Clock()
    loops = claim_loops(runs, clock=clock, loops=2, batch=2, settle_bound_s=5.0)
    await loops.start()
    try:
        # The first claim came back full; while both runners settle, the next
        # two jobs are claimed.
        await asyncio.wait_for(runs.all_settling.wait(), timeout=5)
        for job_id in jobs[2:]:
            await wait_status(runs, job_id, "RUNNING", timeout_s=5.0)
        assert loops.stats.claimed == 4
        # The settles hang past the bound: all four go back, the last two unstarted.
        clock.advance(6.0)
        loops.watch_once()
        settled = [await wait_status(runs, job_id, "QUEUED", timeout_s=5.0) for job_id in jobs]
        assert [job.attempt for job in settled] == [0, 0, 0, 0]
        assert [len(job.checkpoints) for job in settled] == [3, 3, 0, 0]
        assert loops.stats.withdrawn == 2 and loops.stats.held_past_bound == 2
        runs.release.set()
        for job_id in jobs:
            assert (await wait_status(runs, job_id, "COMPLETED", timeout_s=5.0)).attempt == 1
    finally:
        await loops.stop()
    assert [a.outcome for a in await runs.history.attempts(jobs[3])] == [
        "HANDED_BACK",
        "COMPLETED",
    ]


class ClaimsThatFail(RunStore):
    def __init__(self, pool: Pool) -> None:
        super().__init__(pool)
        self.failed = asyncio.Event()

    async def claim_batch(self, worker_id: str, limit: int, **options: Any) -> list[Any]:
        self.failed.set()
        raise psycopg.OperationalError("connection refused")


async def test_claims_failing_past_the_bound_make_the_loops_unhealthy(pool: Pool) -> None:
    runs = ClaimsThatFail(pool)
    clock = Clock()
    loops = claim_loops(runs, clock=clock, claim_failure_bound_s=60.0)
    assert not loops.health().ready
    await loops.start()
    try:
        await asyncio.wait_for(runs.failed.wait(), timeout=5)
        health = loops.health()
        assert health.healthy and health.ready
        assert health.detail["claim_failures_in_a_row"] >= 1
        assert health.detail["last_claim_at"] is None
        clock.advance(61.0)
        health = loops.health()
        assert not health.healthy
        assert health.summary.startswith("claims failing for 61s")
    finally:
        await loops.stop()


class SweepsThatFail(RunStore):
    failing = True

    async def sweep_expired(self, *, limit: int = 1000, now: datetime | None = None) -> SweepResult:
        if self.failing:
            raise psycopg.OperationalError("connection refused")
        return await super().sweep_expired(limit=limit, now=now)


async def test_sweeps_failing_past_the_bound_make_the_sweeper_unhealthy(pool: Pool) -> None:
    runs = SweepsThatFail(pool)
    clock = Clock()
    sweeper = Sweeper(runs, interval_s=1.0, failure_bound_s=60.0, clock=clock)
    with pytest.raises(psycopg.OperationalError):
        await sweeper.sweep_once()
    assert sweeper.health().healthy
    clock.advance(61.0)
    health = sweeper.health()
    assert not health.healthy
    assert health.detail["sweep_failures_in_a_row"] == 1
    assert "connection refused" in health.summary
    runs.failing = False
    await sweeper.sweep_once()
    health = sweeper.health()
    assert health.healthy and health.detail["last_sweep_age_s"] == 0


@contextlib.asynccontextmanager
async def table_locked(dsn: str, table: str) -> AsyncIterator[None]:
    """Every statement on ``table`` waits while inside: what a claim or a sweep
    meets behind a migration's lock, or on a connection whose server is gone
    without a word (a failover, a partition), until TCP gives up hours later."""
    async with await psycopg.AsyncConnection.connect(dsn) as holder:
        await holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        yield
        await holder.rollback()


async def test_a_claim_that_hangs_past_the_bound_makes_the_loops_unhealthy(
    dsn: str, pool: Pool
) -> None:
    runs = ClaimsThatHang(pool)
    clock = Clock()
    loops = claim_loops(runs, clock=clock, claim_failure_bound_s=60.0)
    async with table_locked(dsn, "workflow_run"):
        await loops.start()
        try:
            await asyncio.wait_for(runs.claiming.wait(), timeout=5)
            assert loops.health().healthy
            clock.advance(61.0)
            health = loops.health()
            assert not health.healthy
            assert health.detail["claim_waiting_s"] == 61.0
            assert health.summary.startswith("a claim has waited 61s")
        finally:
            stopping = asyncio.ensure_future(loops.stop())
    await stopping
    assert loops.health().detail["claim_waiting_s"] == 0


class ClaimsThatHang(RunStore):
    def __init__(self, pool: Pool) -> None:
        super().__init__(pool)
        self.claiming = asyncio.Event()

    async def claim_batch(self, worker_id: str, limit: int, **options: Any) -> list[Any]:
        self.claiming.set()
        return await super().claim_batch(worker_id, limit, **options)


async def test_a_sweep_that_hangs_past_the_bound_makes_the_sweeper_unhealthy(
    dsn: str, pool: Pool
) -> None:
    clock = Clock()
    sweeper = Sweeper(RunStore(pool), interval_s=1.0, failure_bound_s=60.0, clock=clock)
    async with table_locked(dsn, "workflow_run"):
        sweeping = asyncio.ensure_future(sweeper.sweep_once())
        await asyncio.sleep(0.3)
        assert not sweeping.done()
        assert sweeper.health().healthy
        clock.advance(61.0)
        health = sweeper.health()
        assert not health.healthy
        assert health.detail["sweep_waiting_s"] == 61.0
        assert health.summary.startswith("a sweep has waited 61s")
    await sweeping
    assert sweeper.health().healthy


async def test_a_relay_pass_that_waits_on_the_store_past_the_bound_makes_it_unhealthy(
    dsn: str, pool: Pool
) -> None:
    # No broker is dialled: the pass waits on its lease, before any publish.
    relay = OutboxRelay(
        Outbox(pool),
        producer_config=producer_config("127.0.0.1:9"),
        topic="workflow-run-events",
        serializer=event_serializer(registry=None, topic="workflow-run-events"),
        stuck_after_s=0.5,
    )
    async with table_locked(dsn, "workflow_run_events_outbox"):
        passing = asyncio.ensure_future(relay.relay_once())
        await asyncio.sleep(0.2)
        assert not passing.done()
        assert relay.health().healthy
        await asyncio.sleep(0.5)
        health = relay.health()
        assert not health.healthy
        assert health.detail["pass_waiting_s"] >= 0.5
        assert health.summary.startswith("a relay pass has waited")
    await passing
    health = relay.health()
    assert health.healthy and health.detail["pass_waiting_s"] == 0
    await relay.stop()
