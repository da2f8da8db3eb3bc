"""Retention passes beside running claim loops and a running relay.

Every pass judges ages a year ahead, so everything settled and published is
fair game the moment it is: a pass that took anything live would leave a job
that never completes or an event that never reaches the topic.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka import Consumer

from schemas.contract import EventType, WorkflowRunEvent
from store.outbox import Outbox
from store.pool import Pool
from store.retention import RetentionPolicy, RetentionStore
from store.runs import RunStore
from store.states import TERMINAL
from streams.claims import ClaimLoops
from streams.relay import build_relay
from streams.retention import RetentionLoop
from streams.settings import Settings
from tests.conftest import NewTopicFactory
from tests.workflows_fixtures import CallLog, envelope, make_registry
from workflows.cache import DefinitionCache
from workflows.steps import CompiledWorkflow

pytestmark = pytest.mark.kafka

JOBS = 40
EXPECTED = [
    EventType.TYPE_ACCEPTED,
    EventType.TYPE_STEP_CHECKPOINT,
    EventType.TYPE_STEP_CHECKPOINT,
    EventType.TYPE_STEP_CHECKPOINT,
    EventType.TYPE_COMPLETED,
]


def consume_until(
    bootstrap: str, topic: str, done: Mapping[uuid.UUID, int], timeout_s: float = 90.0
) -> dict[uuid.UUID, list[WorkflowRunEvent]]:
    """Every event on ``topic`` until each job in ``done`` has its COMPLETED."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"retention-test-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    events: dict[uuid.UUID, list[WorkflowRunEvent]] = defaultdict(list)
    completed: set[uuid.UUID] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while completed != set(done):
            assert time.monotonic() < deadline, f"{len(completed)}/{len(done)} jobs completed"
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            event = WorkflowRunEvent.FromString(message.value())
            job_id = uuid.UUID(event.job_id)
            events[job_id].append(event)
            if event.type == EventType.TYPE_COMPLETED:
                completed.add(job_id)
    finally:
        consumer.close()
    return events


async def test_nothing_live_is_deleted_while_jobs_run_and_events_flow(
    dsn: str, pool: Pool, kafka_bootstrap: str, new_topic: NewTopicFactory
) -> None:
    topic = new_topic(kafka_bootstrap, 3, prefix="retention")
    runs = RunStore(pool, retry_base_s=0.05, lease_s=5.0)
    cache = DefinitionCache()

    async def compile(definition: Mapping[str, Any], digest: str | None) -> CompiledWorkflow:
        return await cache.get_off_loop(definition, digest=digest)

    loops = ClaimLoops(
        runs,
        worker_id="w-retention",
        compile=compile,
        registry=make_registry(CallLog()),
        loops=4,
        poll_interval_s=0.05,
        heartbeat_s=1.0,
        grace_s=1.0,
    )
    settings = Settings.from_env(
        {
            "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "WFJOBS_EVENTS_TOPIC": topic,
            "WFJOBS_RELAY_INTERVAL_S": "0.05",
            "WFJOBS_RELAY_BATCH": "7",
        }
    )
    relay = build_relay(settings, Outbox(pool))
    # Everything a second old goes, judged a year ahead: only the state of a
    # row can keep it.
    second = timedelta(seconds=1)
    retention = RetentionLoop(
        RetentionStore(pool, batch=5),
        RetentionPolicy(outbox=second, jobs=dict.fromkeys(TERMINAL, second)),
        interval_s=60.0,
    )
    ahead = datetime.now(UTC) + timedelta(days=365)
    stop = asyncio.Event()

    async def passes() -> int:
        count = 0
        while not stop.is_set():
            result = await retention.run_once(now=ahead)
            assert result is not None and result.ran
            count += 1
            # Yield to the loops and the relay between passes.
            await asyncio.sleep(0.01)
        return count

    workflow = envelope(name="auto", review="invoke")
    compiled = cache.get(workflow)
    await loops.start()
    await relay.start()
    running = asyncio.create_task(passes())
    try:
        ids = [uuid.uuid4() for _ in range(JOBS)]
        for job_id in ids:
            await runs.submit(
                job_id=job_id,
                workflow_name=compiled.name,
                definition=workflow,
                definition_hash=compiled.definition_hash,
                input={"text": f"job {job_id.hex[:6]}"},
            )
        events = await asyncio.to_thread(
            consume_until, kafka_bootstrap, topic, dict.fromkeys(ids, 1)
        )
        # Every row is marked PUBLISHED once the broker acked it.
        outbox = Outbox(pool)
        deadline = time.monotonic() + 30
        while await outbox.pending_count():
            assert time.monotonic() < deadline, "the relay left rows PENDING"
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        pass_count = await running
        await loops.stop()
        await relay.stop()

    assert pass_count > 1
    for job_id in ids:
        # At least once: a redelivery may repeat an event, never skip or reorder one.
        first = {event.event_id: event.type for event in reversed(events[job_id])}
        ordered = [first[event_id] for event_id in sorted(first)]
        assert ordered == EXPECTED, (job_id, ordered)
        seen = list(dict.fromkeys(event.event_id for event in events[job_id]))
        assert seen == sorted(seen), (job_id, seen)
    assert loops.stats.completed == JOBS
    assert loops.stats.lease_lost == 0 and loops.stats.failed == 0
    # Once everything is published, one more pass takes every job, every row
    # and the snapshot: the retention was live all along, not idle.
    final = await retention.run_once(now=ahead)
    assert final is not None and final.ran
    async with pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT (SELECT count(*) FROM workflow_run),"
            " (SELECT count(*) FROM workflow_run_events_outbox),"
            " (SELECT count(*) FROM workflow_definition_snapshot)"
        )
        assert await cursor.fetchone() == (0, 0, 0)
    assert retention.deleted == JOBS * (1 + len(EXPECTED)) + 1
