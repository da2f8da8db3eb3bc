"""Claim loops in-process against a real Postgres: settle, heartbeat, hand back, stop."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from google.protobuf.message import Message

from schemas.verdicts import StepVerdict
from store.channels import JOBS_QUEUED_CHANNEL
from store.pool import Pool
from store.progress import ProgressStore
from store.records import ClaimedJob, Lease, SegmentProgress
from store.runs import RunStore
from streams.claims import ClaimLoops
from streams.listener import Listener
from streams.progress import ProgressRecorder
from streams.sweeper import Sweeper
from tests.integration.store.helpers import wait_for_lock_wait
from tests.loop_gaps import with_longest_gap
from tests.workflows_fixtures import (
    EMBED,
    REVIEW,
    TOKENIZE,
    CallLog,
    envelope,
    large_envelope,
    make_registry,
)
from workflows.cache import DefinitionCache
from workflows.invokers import HandlerRegistry, StepContext
from workflows.steps import CompiledWorkflow

README = Path(__file__).resolve().parents[3] / "README.md"
REMOTE = "127.0.0.1:9"  # never dialled: the registry serves every method in-process


class Harness:
    def __init__(self, runs: RunStore, registry: HandlerRegistry, calls: CallLog) -> None:
        self.runs = runs
        self.registry = registry
        self.calls = calls
        self.cache = DefinitionCache()

    async def compile(self, envelope: Mapping[str, Any], digest: str | None) -> CompiledWorkflow:
        return await self.cache.get_off_loop(envelope, digest=digest)

    def loops(self, **options: Any) -> ClaimLoops:
        defaults: dict[str, Any] = {
            "worker_id": "w-test",
            "compile": self.compile,
            "registry": self.registry,
            "loops": 2,
            "poll_interval_s": 0.05,
            "heartbeat_s": 0.2,
            "grace_s": 1.0,
        }
        return ClaimLoops(self.runs, **{**defaults, **options})

    async def submit(
        self, workflow: dict[str, Any], input: dict[str, Any], **options: Any
    ) -> uuid.UUID:
        compiled = self.cache.get(workflow)
        job_id = uuid.uuid4()
        await self.runs.submit(
            job_id=job_id,
            workflow_name=compiled.name,
            definition=workflow,
            definition_hash=compiled.definition_hash,
            input=compiled.validate_input(input),
            **options,
        )
        return job_id

    async def wait_status(self, job_id: uuid.UUID, *statuses: str, timeout_s: float = 10.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            job = await self.runs.get(job_id)
            if job.status in statuses:
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} is {job.status}, wanted {statuses}: {job}")
            await asyncio.sleep(0.05)


@pytest.fixture
def harness(pool: Pool) -> Harness:
    calls = CallLog()
    return Harness(RunStore(pool, retry_base_s=0.05, lease_s=2.0), make_registry(calls), calls)


async def test_jobs_complete_park_and_fail_by_kind(harness: Harness) -> None:
    done = await harness.submit(envelope(name="auto", review="invoke"), {"text": "a b c"})
    parked = await harness.submit(envelope(name="review"), {"text": "a b"})
    broken = await harness.submit(
        envelope(name="auto", review="invoke"), {"text": "x", "fail": "NON_RETRYABLE"}
    )
    verdict = await harness.submit(envelope(name="auto", review="invoke"), {"text": "reject it"})
    loops = harness.loops(loops=3)
    await loops.start()
    try:
        completed = await harness.wait_status(done, "COMPLETED")
        assert completed.verdict == "completed 3 steps: tokenize, embed, review"
        waiting = await harness.wait_status(parked, "WAITING")
        assert waiting.outstanding_step == "review"
        failed = await harness.wait_status(broken, "FAILED")
        assert failed.error == "step 'tokenize': test fault NON_RETRYABLE"
        assert failed.verdict is None
        judged = await harness.wait_status(verdict, "FAILED")
        assert judged.verdict is not None and "response.approved" in judged.verdict
    finally:
        await loops.stop()
    assert loops.stats.completed == 1 and loops.stats.parked == 1 and loops.stats.failed == 2


@pytest.mark.parametrize("target", [REMOTE, "local"])
async def test_the_per_target_cap_bounds_concurrent_segments(harness: Harness, target: str) -> None:
    running = 0
    peak = 0
    inner = harness.registry.get(TOKENIZE)
    assert inner is not None

    async def counted(request: Message, ctx: StepContext) -> Any:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            await asyncio.sleep(0.15)
            return await inner(request, ctx)
        finally:
            running -= 1

    harness.registry.register(TOKENIZE, counted, replace=True)
    workflow = envelope(name="capped", target=target, review="invoke")
    jobs = [await harness.submit(workflow, {"text": f"job {n}"}) for n in range(6)]
    loops = harness.loops(loops=6, max_per_target=2)
    await loops.start()
    try:
        for job_id in jobs:
            await harness.wait_status(job_id, "COMPLETED")
    finally:
        await loops.stop()
    assert peak == 2


async def test_a_lost_lease_stops_the_segment_and_writes_nothing(
    harness: Harness, pool: Pool
) -> None:
    job_id = await harness.submit(
        envelope(name="slow", review="invoke"), {"text": "slow", "delay_ms": 3000}
    )
    loops = harness.loops(loops=1, heartbeat_s=0.1)
    await loops.start()
    try:
        await harness.wait_status(job_id, "RUNNING")
        # Another worker's sweeper, its clock past the lease, requeues the job.
        # Judged at that instant rather than by backdating the lease, which
        # the 0.1 s heartbeat could renew before the sweep read it; and tried
        # again while a renewal holds the row, which the sweep skips.
        for _ in range(50):
            past_the_lease = datetime.now(UTC) + timedelta(seconds=harness.runs.lease_s + 5)
            if (await harness.runs.sweep_expired(now=past_the_lease)).requeued:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the sweep never found the job's lease expired")
        swept = time.monotonic()
        for _ in range(250):
            if loops.stats.lease_lost:
                break
            await asyncio.sleep(0.02)
        assert loops.stats.lease_lost == 1
        # Found by the heartbeat, well before the 3 s step would have ended.
        assert time.monotonic() - swept < 1.5
    finally:
        await loops.stop()
    async with pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT event_type FROM workflow_run_events_outbox WHERE job_id = %s ORDER BY id",
            (job_id,),
        )
        # The sweep's RETRY_SCHEDULED only: the worker that lost the lease wrote nothing.
        assert [row[0] for row in await cursor.fetchall()] == ["ACCEPTED", "RETRY_SCHEDULED"]


class FlakyRuns(RunStore):
    """Fails the first checkpoint write the way a dropped connection does."""

    failures = 1

    async def checkpoint(self, lease: Lease, entry: Mapping[str, Any]) -> None:
        if self.failures:
            self.failures -= 1
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        await super().checkpoint(lease, entry)


async def test_a_store_failure_at_checkpoint_hands_the_job_back(pool: Pool) -> None:
    calls = CallLog()
    harness = Harness(FlakyRuns(pool, lease_s=2.0), make_registry(calls), calls)
    job_id = await harness.submit(envelope(name="auto", review="invoke"), {"text": "x y"})
    loops = harness.loops(loops=1)
    await loops.start()
    try:
        job = await harness.wait_status(job_id, "COMPLETED", "FAILED", "DEAD")
    finally:
        await loops.stop()
    assert job.status == "COMPLETED"
    # The failed attempt was given back: the run that completed is attempt 1.
    assert job.attempt == 1
    assert loops.stats.handed_back == 1 and loops.stats.store_errors == 1
    assert calls[TOKENIZE] == 2  # tokenize ran again: its checkpoint never landed


async def test_stop_waits_for_a_short_segment(harness: Harness) -> None:
    job_id = await harness.submit(
        envelope(name="auto", review="invoke"), {"text": "quick", "delay_ms": 300}
    )
    loops = harness.loops(loops=1, grace_s=5.0)
    await loops.start()
    await harness.wait_status(job_id, "RUNNING")
    await loops.stop()
    assert (await harness.runs.get(job_id)).status == "COMPLETED"


async def test_stop_hands_back_a_segment_that_outlives_the_grace(harness: Harness) -> None:
    job_id = await harness.submit(
        envelope(name="auto", review="invoke"), {"text": "slow", "delay_ms": 10_000}
    )
    loops = harness.loops(loops=2, grace_s=0.3)
    await loops.start()
    await harness.wait_status(job_id, "RUNNING")
    started = time.monotonic()
    await loops.stop()
    assert time.monotonic() - started < 3
    job = await harness.runs.get(job_id)
    assert job.status == "QUEUED"
    assert job.attempt == 0 and job.lease_owner is None
    assert loops.stats.handed_back == 1


async def test_stop_hands_back_a_job_whose_settle_outlives_the_grace(
    harness: Harness, pool: Pool, dsn: str
) -> None:
    # The segment ended, but its settle waits on the row (here a lock the test
    # holds; in life a slow store): stopping must not leave the job to its lease.
    async with await psycopg.AsyncConnection.connect(dsn) as holder:

        async def review(request: Any, ctx: StepContext) -> dict[str, Any]:
            await holder.execute(
                "SELECT 1 FROM workflow_run WHERE job_id = %s FOR UPDATE", (ctx.job_id,)
            )
            return {"approved": True, "reviewer": "auto"}

        harness.registry.register(REVIEW, review, replace=True)
        job_id = await harness.submit(envelope(name="auto", review="invoke"), {"text": "late"})
        # The last checkpoint goes with the settle, so the settle is the write that waits.
        loops = harness.loops(loops=1, grace_s=0.3, hold_back_last_checkpoint=True)
        await loops.start()
        await wait_for_lock_wait(pool)
        stopping = asyncio.create_task(loops.stop())
        await asyncio.sleep(1.0)  # past the grace: the settle is given up
        await holder.rollback()
        await stopping

    job = await harness.runs.get(job_id)
    assert job.status == "QUEUED", job
    assert job.attempt == 0 and job.lease_owner is None
    assert [a.outcome for a in await harness.runs.history.attempts(job_id)] == ["HANDED_BACK"]
    assert loops.stats.handed_back == 1


async def test_retryable_failures_back_off_then_die(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = await harness.submit(
        envelope(name="auto", review="invoke"), {"text": "x", "embed_fail": "RETRYABLE"}
    )
    loops = harness.loops(loops=1)
    with caplog.at_level(logging.INFO, logger="streams.claims"):
        await loops.start()
        try:
            job = await harness.wait_status(job_id, "DEAD")
        finally:
            await loops.stop()
    retries = [r.getMessage() for r in caplog.records if "failed, retry at" in r.getMessage()]
    assert len(retries) == 2
    # The instant as every other timestamp the product shows: UTC, with a Z.
    assert all(re.search(r"retry at \d{4}-\d\d-\d\dT[\d:.]+Z: ", line) for line in retries), retries
    assert job.error == "step 'embed': test fault RETRYABLE"
    assert job.attempt == 3
    assert harness.calls[TOKENIZE] == 1 and harness.calls[EMBED] == 3
    assert loops.stats.retried == 2 and loops.stats.dead == 1


async def test_a_retryable_failure_whose_retry_misses_the_deadline_fails_the_job(
    pool: Pool,
) -> None:
    calls = CallLog()
    harness = Harness(RunStore(pool, retry_base_s=120.0, lease_s=2.0), make_registry(calls), calls)
    job_id = await harness.submit(
        envelope(name="auto", review="invoke"),
        {"text": "x", "embed_fail": "RETRYABLE"},
        deadline_ms=60_000,
    )
    loops = harness.loops(loops=1)
    await loops.start()
    try:
        job = await harness.wait_status(job_id, "FAILED", "DEAD")
    finally:
        await loops.stop()
    assert job.status == "FAILED" and job.attempt == 1
    assert job.error.startswith("step 'embed': test fault RETRYABLE; not retried:"), job.error
    assert (loops.stats.failed, loops.stats.retried, loops.stats.dead) == (1, 0, 0)


async def test_notify_wakes_an_idle_claimer_before_its_poll(harness: Harness, dsn: str) -> None:
    listener = Listener(dsn, JOBS_QUEUED_CHANNEL)
    await listener.start()
    loops = harness.loops(
        loops=1, poll_interval_s=30.0, wake=listener.subscribe(JOBS_QUEUED_CHANNEL)
    )
    await loops.start()
    try:
        await asyncio.sleep(0.5)  # the claimer has found nothing and is waiting
        job_id = await harness.submit(envelope(name="auto", review="invoke"), {"text": "now"})
        started = time.monotonic()
        await harness.wait_status(job_id, "COMPLETED", timeout_s=5)
        assert time.monotonic() - started < 5
        assert listener.notifications >= 1
    finally:
        await loops.stop()
        await listener.stop()


async def test_the_sweeper_requeues_an_expired_lease(harness: Harness, pool: Pool) -> None:
    job_id = await harness.submit(envelope(name="auto", review="invoke"), {"text": "x"})
    claimed = await harness.runs.claim("gone-worker")
    assert claimed is not None
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run SET lease_until = now() - interval '1 second' WHERE job_id = %s",
            (job_id,),
        )
    sweeper = Sweeper(harness.runs, interval_s=0.05)
    result = await sweeper.sweep_once()
    job = await harness.runs.get(job_id)
    assert job.status == "QUEUED"
    assert result.requeued == sweeper.requeued == 1
    assert job.error is not None and "gone-worker" in job.error


async def test_a_requeue_is_counted_once_committed_even_if_the_sweep_is_stopped_after_it(
    harness: Harness, pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = await harness.submit(envelope(name="auto", review="invoke"), {"text": "x"})
    assert await harness.runs.claim("gone-worker") is not None
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run SET lease_until = now() - interval '1 second' WHERE job_id = %s",
            (job_id,),
        )
    # The pass after the requeue never returns: the sweep is stopped in it.
    reached = asyncio.Event()

    async def stuck(**_: Any) -> None:
        reached.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(harness.runs, "sweep_deadlines", stuck)
    sweeper = Sweeper(harness.runs, interval_s=60)
    sweep = asyncio.create_task(sweeper.sweep_once())
    await asyncio.wait_for(reached.wait(), timeout=10)
    sweep.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sweep
    assert (await harness.runs.get(job_id)).status == "QUEUED"
    assert sweeper.requeued == 1


async def test_heartbeats_keep_a_step_longer_than_the_lease(pool: Pool) -> None:
    # A one-second lease, a step of two and a half, and a sweeper looking ten
    # times a second: only the heartbeat keeps the job with its worker.
    calls = CallLog()
    harness = Harness(RunStore(pool, retry_base_s=0.05, lease_s=1.0), make_registry(calls), calls)
    job_id = await harness.submit(
        envelope(name="long", review="invoke"), {"text": "long step", "delay_ms": 2500}
    )
    sweeper = Sweeper(harness.runs, interval_s=0.1)
    loops = harness.loops(loops=1, heartbeat_s=0.25)
    await sweeper.start()
    await loops.start()
    try:
        job = await harness.wait_status(job_id, "COMPLETED", "FAILED", "DEAD", timeout_s=15)
    finally:
        await loops.stop()
        await sweeper.stop()
    assert job.status == "COMPLETED", job
    assert job.attempt == 1 and job.lease_owner == "w-test"
    # Sweeps all through the step: on a loaded machine one takes up to a few
    # tenths of a second, so a handful, not the idle rate's twenty-five.
    assert sweeper.sweeps >= 5 and sweeper.requeued == 0
    assert loops.stats.lease_lost == 0
    assert calls[TOKENIZE] == 1


async def test_the_lease_is_renewed_a_heartbeat_after_the_claim_however_long_the_start_took(
    pool: Pool,
) -> None:
    # Between the claim and the segment's start the lease already runs: here a
    # slow compile (a large snapshot; or a wait in line for a runner) takes most
    # of it. The first renewal must not come a whole heartbeat after that.
    calls = CallLog()
    harness = Harness(RunStore(pool, retry_base_s=0.05, lease_s=2.0), make_registry(calls), calls)

    async def slow_compile(envelope: Mapping[str, Any], digest: str | None) -> CompiledWorkflow:
        await asyncio.sleep(1.6)
        return await harness.compile(envelope, digest)

    job_id = await harness.submit(
        envelope(name="slow-start", review="invoke"), {"text": "late start", "delay_ms": 1000}
    )
    sweeper = Sweeper(harness.runs, interval_s=0.1)
    loops = harness.loops(loops=1, heartbeat_s=0.6, compile=slow_compile)
    await sweeper.start()
    await loops.start()
    try:
        job = await harness.wait_status(job_id, "COMPLETED", "FAILED", "DEAD", timeout_s=15)
    finally:
        await loops.stop()
        await sweeper.stop()
    assert job.status == "COMPLETED", job
    assert job.attempt == 1, job
    assert sweeper.requeued == 0 and loops.stats.lease_lost == 0


class RenewalClock(RunStore):
    """The run store, noting when each lease renewal was asked for and each job claimed."""

    renewals: list[float]
    claimed_at: dict[uuid.UUID, float]

    async def claim_batch(self, worker_id: str, limit: int, **options: Any) -> list[ClaimedJob]:
        claimed = await super().claim_batch(worker_id, limit, **options)
        for job in claimed:
            self.claimed_at[job.job_id] = time.monotonic()
        return claimed

    async def extend_lease(
        self, lease: Lease, progress: SegmentProgress | None = None
    ) -> datetime | None:
        self.renewals.append(time.monotonic())
        return await super().extend_lease(lease, progress)


async def test_the_first_renewal_comes_a_heartbeat_in_and_a_shorter_segment_makes_none(
    pool: Pool,
) -> None:
    calls = CallLog()
    runs = RenewalClock(pool, retry_base_s=0.05, lease_s=5.0)
    runs.renewals, runs.claimed_at = [], {}
    harness = Harness(runs, make_registry(calls), calls)
    loops = harness.loops(loops=1, heartbeat_s=0.4)
    await loops.start()
    try:
        short = await harness.submit(envelope(name="short", review=None), {"text": "quick"})
        assert (await harness.wait_status(short, "COMPLETED", "FAILED", "DEAD")).status == (
            "COMPLETED"
        )
        await asyncio.sleep(0.6)  # past the heartbeat a still-pending renewal would have taken
        assert runs.renewals == []
        long = await harness.submit(
            envelope(name="long", review="invoke"), {"text": "long step", "delay_ms": 1200}
        )
        job = await harness.wait_status(long, "COMPLETED", "FAILED", "DEAD", timeout_s=15)
    finally:
        await loops.stop()
    assert job.status == "COMPLETED", job
    # A step of 1.2 s: renewals at about 0.4 and 0.8 s into it, counted from
    # the claim (not the submit, whose wake-up a loaded machine may delay).
    assert len(runs.renewals) >= 2, runs.renewals
    first = runs.renewals[0] - runs.claimed_at[long]
    second = runs.renewals[1] - runs.renewals[0]
    assert 0.35 <= first < 0.7, runs.renewals
    assert 0.35 <= second < 0.8, runs.renewals


async def test_a_response_the_database_refuses_fails_the_job_instead_of_looping(
    harness: Harness,
) -> None:
    # jsonb cannot store U+0000; handing the job back would meet the same
    # refusal on every claim, forever.
    async def refusing_review(request: Message, ctx: StepContext) -> Any:
        return ctx.response_type(approved=True, note="a\x00b")

    harness.registry.register(REVIEW, refusing_review, replace=True)
    job_id = await harness.submit(envelope(name="nul", review="invoke"), {"text": "x y"})
    loops = harness.loops(loops=1)
    await loops.start()
    try:
        job = await harness.wait_status(job_id, "FAILED", "DEAD", timeout_s=5)
    finally:
        await loops.stop()
    assert job.status == "FAILED"
    assert job.error.startswith("step 'review': the database refused to checkpoint step")
    assert [entry["name"] for entry in job.checkpoints] == ["tokenize", "embed"]
    assert loops.stats.handed_back == 0


async def test_a_settle_that_always_fails_spends_attempts_until_dead(
    harness: Harness, pool: Pool
) -> None:
    # Not an outage (the server answers, and refuses): requeueing with the
    # attempt given back would loop forever, so each failure costs an attempt.
    async with pool.connection() as conn:
        await conn.execute(
            """
            CREATE FUNCTION refuse_completion() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'completions are refused here'; END $$;
            CREATE TRIGGER refuse_completion BEFORE UPDATE ON workflow_run FOR EACH ROW
                WHEN (NEW.status = 'COMPLETED') EXECUTE FUNCTION refuse_completion();
            """
        )
    job_id = await harness.submit(envelope(name="stuck", review="invoke"), {"text": "x y"})
    loops = harness.loops(loops=1)
    await loops.start()
    try:
        job = await harness.wait_status(job_id, "DEAD", timeout_s=10)
    finally:
        await loops.stop()
    assert job.attempt == job.max_attempts == 3
    assert "completions are refused here" in job.error
    assert loops.stats.handed_back == 0


PROGRESS_SQL = """
SELECT step_name, fraction, message FROM workflow_run_progress WHERE job_id = %(job_id)s
"""


async def test_handlers_reach_the_row_through_the_claim_loops(harness: Harness, pool: Pool) -> None:
    recorder = ProgressRecorder(ProgressStore(pool), interval_s=0.05)
    loops = harness.loops(progress=recorder.report)
    await recorder.start()
    await loops.start()
    try:
        job_id = await harness.submit(envelope(review=None), {"text": "slow one", "delay_ms": 200})
        await harness.wait_status(job_id, "COMPLETED")
        # The fixture's tokenize lingers in quarters and reports each one; a
        # report that arrives after the job settled is not stored.
        async with pool.connection() as conn:
            stored = await (await conn.execute(PROGRESS_SQL, {"job_id": job_id})).fetchall()
        [(step, fraction, message)] = stored
        assert step == "tokenize" and message == f"{int(fraction * 4)} of 4"
    finally:
        await loops.stop()
        await recorder.stop()


async def test_a_job_claimed_without_its_snapshot_runs_when_its_workflow_left_the_cache(
    harness: Harness,
) -> None:
    workflow = envelope(name="auto", review="invoke")
    job_id = await harness.submit(workflow, {"text": "a b c"})
    digest = harness.cache.get(workflow).definition_hash
    answers: list[bool] = []
    compiled_with: list[Mapping[str, Any]] = []

    def compiled(asked: str) -> CompiledWorkflow | None:
        # Compiled when the claim asks; evicted by the time the runner looks.
        answers.append(not answers)
        return harness.cache.cached(asked) if answers[-1] else None

    async def compile(definition: Mapping[str, Any], given: str | None) -> CompiledWorkflow:
        compiled_with.append(definition)
        return await harness.compile(definition, given)

    loops = harness.loops(compiled=compiled, compile=compile)
    await loops.start()
    try:
        await harness.wait_status(job_id, "COMPLETED")
    finally:
        await loops.stop()
    assert answers == [True, False]
    # The runner read the snapshot the claim left out, and compiled that.
    assert compiled_with == [workflow] and harness.cache.get(workflow).definition_hash == digest


async def test_a_claimed_snapshot_not_yet_compiled_is_compiled_off_the_event_loop(
    harness: Harness,
) -> None:
    # Another process took the submit: this worker meets the snapshot at its
    # claim, and its size is its author's choice, while the loop beats every
    # other job's lease.
    job_id = await harness.submit(large_envelope(), {"text": "a b"})
    harness.cache.clear()
    loops = harness.loops(loops=1)
    await loops.start()
    try:
        waiting, longest = await with_longest_gap(harness.wait_status(job_id, "WAITING"))
    finally:
        await loops.stop()
    assert waiting.outstanding_step == "review"
    assert longest < 0.2, f"the loop was held for {longest:.2f}s"


async def test_a_job_whose_workflow_is_compiled_runs_from_the_cache_alone(harness: Harness) -> None:
    workflow = envelope(name="auto", review="invoke")
    job_id = await harness.submit(workflow, {"text": "a b c"})
    compiled_with: list[Mapping[str, Any]] = []

    async def compile(definition: Mapping[str, Any], given: str | None) -> CompiledWorkflow:
        compiled_with.append(definition)
        return await harness.compile(definition, given)

    loops = harness.loops(compiled=harness.cache.cached, compile=compile)
    await loops.start()
    try:
        await harness.wait_status(job_id, "COMPLETED")
    finally:
        await loops.stop()
    assert compiled_with == []


async def test_the_claims_counter_counts_claims_and_a_resumed_attempt_is_claimed_twice(
    harness: Harness,
) -> None:
    job_id = await harness.submit(envelope(name="review"), {"text": "a b"})
    loops = harness.loops(loops=1)
    await loops.start()
    try:
        await harness.wait_status(job_id, "WAITING")
        result = await harness.runs.complete_step(
            job_id=job_id,
            step_name="review",
            response={"approved": True},
            verify=lambda response: StepVerdict("review", accepted=True, response=response),
        )
        assert result.outcome == "COMPLETED"
        done = await harness.wait_status(job_id, "COMPLETED")
    finally:
        await loops.stop()
    # The complete-step gave the parked attempt back: one attempt, two claims,
    # which is what wfjobs_jobs_claimed_total is documented to count.
    assert done.attempt == 1
    assert loops.stats.claimed == 2
    [row] = [
        line for line in README.read_text().splitlines() if "`wfjobs_jobs_claimed_total`" in line
    ]
    assert "one per claim" in row and "per attempt" not in row
