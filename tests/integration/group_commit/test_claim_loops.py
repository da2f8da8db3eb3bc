"""Claim loops on a group-committing store: many runners, each job's commit points intact."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from typing import Any

from google.protobuf.message import Message

from schemas.contract import EventType, decode_event
from store.outbox import Outbox
from store.pool import Pool
from store.runs import RunStore
from streams.claims import ClaimLoops
from tests.workflows_fixtures import REVIEW, CallLog, envelope, make_registry
from workflows.cache import DefinitionCache
from workflows.invokers import HandlerRegistry, StepContext
from workflows.steps import CompiledWorkflow

STEPS = ["tokenize", "embed", "review"]


class Runner:
    def __init__(self, pool: Pool) -> None:
        self.runs = RunStore(pool, retry_base_s=0.05, lease_s=5.0)
        self.registry: HandlerRegistry = make_registry(CallLog())
        self.cache = DefinitionCache()

    async def compile(self, workflow: Mapping[str, Any], digest: str | None) -> CompiledWorkflow:
        return await self.cache.get_off_loop(workflow, digest=digest)

    def loops(self, loops: int) -> ClaimLoops:
        return ClaimLoops(
            self.runs,
            worker_id="w-group",
            compile=self.compile,
            registry=self.registry,
            loops=loops,
            poll_interval_s=0.05,
            heartbeat_s=1.0,
            grace_s=1.0,
            hold_back_last_checkpoint=True,
        )

    async def submit(self, text: str) -> uuid.UUID:
        workflow = envelope(name="grouped", review="invoke")
        compiled = self.cache.get(workflow)
        job_id = uuid.uuid4()
        await self.runs.submit(
            job_id=job_id,
            workflow_name=compiled.name,
            definition=workflow,
            definition_hash=compiled.definition_hash,
            input=compiled.validate_input({"text": text}),
        )
        return job_id

    async def settled(self, job_ids: list[uuid.UUID], timeout_s: float = 20.0) -> None:
        async with asyncio.timeout(timeout_s):
            while True:
                jobs = [await self.runs.get(job_id) for job_id in job_ids]
                if all(job.status not in ("QUEUED", "RUNNING") for job in jobs):
                    return
                await asyncio.sleep(0.05)


async def test_concurrent_runners_share_flushes_and_every_job_keeps_its_events(
    pool: Pool,
) -> None:
    runner = Runner(pool)
    assert runner.runs.group is not None
    job_ids = [await runner.submit(f"job {n} words") for n in range(24)]
    loops = runner.loops(8)
    await loops.start()
    try:
        await runner.settled(job_ids)
    finally:
        await loops.stop()

    outbox = Outbox(pool)
    for job_id in job_ids:
        job = await runner.runs.get(job_id)
        assert job.status == "COMPLETED", job
        assert [entry["name"] for entry in job.checkpoints] == STEPS
        events = [decode_event(r.payload) for r in await outbox.events_for(job_id)]
        assert [(e.type, e.step_name) for e in events] == [
            (EventType.TYPE_ACCEPTED, ""),
            *((EventType.TYPE_STEP_CHECKPOINT, name) for name in STEPS),
            (EventType.TYPE_COMPLETED, ""),
        ]
        (attempt,) = await runner.runs.history.attempts(job_id)
        assert (attempt.outcome, list(attempt.steps)) == ("COMPLETED", STEPS)
    stats = runner.runs.group.stats
    # Two checkpoints plus one completion (carrying the last) per job.
    assert stats.rows == 3 * len(job_ids)
    assert stats.flushes < stats.rows
    assert loops.stats.completed == len(job_ids)


async def test_a_refused_last_response_fails_the_job_naming_its_step(pool: Pool) -> None:
    runner = Runner(pool)

    async def refusing_review(request: Message, ctx: StepContext) -> Any:
        return ctx.response_type(approved=True, note="a\x00b")

    runner.registry.register(REVIEW, refusing_review, replace=True)
    job_id = await runner.submit("x y")
    loops = runner.loops(1)
    await loops.start()
    try:
        await runner.settled([job_id])
    finally:
        await loops.stop()
    job = await runner.runs.get(job_id)
    assert job.status == "FAILED"
    assert job.error.startswith("step 'review': the database refused to checkpoint step")
    assert [entry["name"] for entry in job.checkpoints] == ["tokenize", "embed"]
    assert loops.stats.handed_back == 0
