"""Bad requests on the topic: dead letters and FAILED jobs, and the agent keeps going."""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer

from schemas.contract import WorkflowRunRequest
from schemas.serde import encode_request
from store.definitions import DefinitionStore
from streams.requests_dlq import DLQ_REASON_HEADER
from tests.e2e.conftest import PARTITIONS
from tests.e2e.harness import Stack, dedupe, read_dlq, type_name, wait_until
from tests.workflows_fixtures import envelope

pytestmark = pytest.mark.e2e


async def test_garbage_bad_uuid_and_unknown_workflow_do_not_stall_the_agent(stack: Stack) -> None:
    worker = await stack.start_worker("w1")
    workflow = envelope(name="e2e-auto", review="invoke")
    await stack.put_workflow(worker, workflow)

    # One key for all four, so they share a partition and arrive in this order.
    key = b"one-partition"
    garbage = b"\xff\xfe this is not a protobuf message"
    bad_uuid = encode_request(
        WorkflowRunRequest(job_id="not-a-uuid", workflow_name=workflow["name"]),
        registry=stack.registry,
        topic=stack.requests_topic,
    )
    unknown_id = uuid.uuid4()
    unknown = encode_request(
        WorkflowRunRequest(job_id=str(unknown_id), workflow_name="no-such-workflow"),
        registry=stack.registry,
        topic=stack.requests_topic,
    )
    good = WorkflowRunRequest(job_id=str(uuid.uuid4()), workflow_name=workflow["name"])
    good.input.update({"text": "still flowing"})
    for value in (
        garbage,
        bad_uuid,
        unknown,
        encode_request(good, registry=stack.registry, topic=stack.requests_topic),
    ):
        stack.produce_keyed(stack.requests_topic, key=key, value=value)
    stack.flush()

    done = await stack.wait_for_job(good.job_id, {"COMPLETED", "FAILED", "DEAD"})
    assert done.status == "COMPLETED", done

    failed = await stack.wait_for_job(unknown_id, {"FAILED"})
    assert failed.workflow_name == "no-such-workflow"
    assert failed.error is not None and "unknown workflow 'no-such-workflow'" in failed.error

    letters = read_dlq(stack.bootstrap, stack.dlq_topic, 1, count=2, timeout_s=20)
    assert [(m.key(), m.value()) for m in letters] == [(key, garbage), (key, bad_uuid)]
    reasons = [dict(m.headers() or [])[DLQ_REASON_HEADER].decode() for m in letters]
    assert "cannot decode" in reasons[0] or "not a WorkflowRunRequest" in reasons[0], reasons
    assert "job_id" in reasons[1] and "UUID" in reasons[1], reasons

    reader = stack.event_reader(PARTITIONS)
    await reader.wait(lambda _: bool(reader.for_job(unknown_id)))
    events = dedupe(reader.for_job(unknown_id))
    assert [type_name(e) for e in events] == ["FAILED"]
    assert events[0].error == failed.error
    reader.close()

    # A replayed request is idempotent on job_id. A fresh one behind it, in the
    # same partition, completing proves the replay was consumed first.
    replay = good.SerializeToString()
    behind = WorkflowRunRequest(job_id=str(uuid.uuid4()), workflow_name=workflow["name"])
    behind.input.update({"text": "after the replay"})
    stack.produce_keyed(stack.requests_topic, key=key, value=replay)
    stack.produce_keyed(stack.requests_topic, key=key, value=behind.SerializeToString())
    stack.flush()
    await stack.wait_for_job(behind.job_id, {"COMPLETED"})
    records = await stack.outbox.events_for(uuid.UUID(good.job_id))
    assert [r.event_type for r in records] == [
        "ACCEPTED",
        "STEP_CHECKPOINT",
        "STEP_CHECKPOINT",
        "STEP_CHECKPOINT",
        "COMPLETED",
    ]


async def test_a_request_too_large_to_dead_letter_does_not_hold_its_partition(
    stack: Stack,
) -> None:
    worker = await stack.start_worker("w1")
    workflow = envelope(name="e2e-auto", review="invoke")
    await stack.put_workflow(worker, workflow)

    # The broker takes it (its default limit is 1 048 588 bytes), but copied
    # with the reason header it is more than the worker's producer sends.
    key = b"one-partition"
    huge = b"\xff" * 1_020_000
    large = Producer({"bootstrap.servers": stack.bootstrap, "message.max.bytes": 1_048_000})
    large.produce(stack.requests_topic, key=key, value=huge)
    assert large.flush(10) == 0
    behind = WorkflowRunRequest(job_id=str(uuid.uuid4()), workflow_name=workflow["name"])
    behind.input.update({"text": "behind the huge one"})
    stack.produce_keyed(stack.requests_topic, key=key, value=behind.SerializeToString())
    stack.flush()

    done = await stack.wait_for_job(behind.job_id, {"COMPLETED", "FAILED", "DEAD"}, timeout_s=60)
    assert done.status == "COMPLETED", done
    [letter] = read_dlq(stack.bootstrap, stack.dlq_topic, 1, count=1, timeout_s=20)
    assert (letter.key(), letter.value()) == (key, None)
    reason = dict(letter.headers() or [])[DLQ_REASON_HEADER].decode()
    assert reason.startswith("not a WorkflowRunRequest"), reason
    assert "the request (1020013 bytes) is too large for the dead-letter topic, so its value" in (
        reason
    )
    # The first message of whichever partition the key picks.
    assert re.search(rf"left out: it stays on {re.escape(stack.requests_topic)} at \d+:0$", reason)


async def test_the_offset_moves_only_after_the_row_commits(stack: Stack) -> None:
    first = await stack.start_worker("w1")
    workflow = envelope(name="e2e-auto", review="invoke")
    await stack.put_workflow(first, workflow)

    async with stack.pool.connection() as lock, lock.transaction():
        # Nothing can write a job row while this transaction holds the table.
        await lock.execute("LOCK TABLE workflow_run IN ACCESS EXCLUSIVE MODE")
        job_id = stack.produce_request(workflow["name"], {"text": "wait for the row"})
        stack.flush()

        async def inserting() -> bool | None:
            # Another connection: inside a transaction pg_stat_activity is a snapshot.
            async with stack.pool.connection() as conn:
                cursor = await conn.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    " AND query LIKE %s",
                    ("%INSERT INTO workflow_run %",),
                )
                row = await cursor.fetchone()
            return True if row is not None and row[0] > 0 else None

        # The agent has the request and waits on the insert.
        await wait_until(inserting, timeout_s=30, interval_s=0.2)
        # A clean stop: the consumer commits what it acknowledged and leaves the group.
        await asyncio.to_thread(first.stop, timeout_s=30)

    # Same group: it starts from the committed offset, so it only sees the
    # request again if that offset never moved past it.
    await stack.start_worker("w2")
    job = await stack.wait_for_job(job_id, {"COMPLETED", "FAILED", "DEAD"}, timeout_s=60)
    assert job.status == "COMPLETED", job
    assert job.lease_owner == "w2"


async def test_requests_waiting_together_are_submitted_at_most_a_batch_max_per_commit(
    stack: Stack,
) -> None:
    workflow = envelope(name="e2e-batched", review="invoke")
    await DefinitionStore(stack.pool).put(workflow["name"], workflow)
    # All waiting before the worker starts: with the default (500) a batch could take them all.
    job_ids = [
        stack.produce_request(workflow["name"], {"text": f"request {n}"}, job_id=uuid.uuid4())
        for n in range(12)
    ]
    stack.flush()
    await stack.start_worker("w1", WFJOBS_REQUEST_BATCH_MAX="3", WFJOBS_CLAIM_LOOPS="0")

    async def submitted() -> list[tuple[Any, int]] | None:
        # A batch is one statement and one commit, so its rows share now().
        async with stack.pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT created_at, count(*) FROM workflow_run WHERE job_id = ANY(%s)"
                " GROUP BY created_at",
                (job_ids,),
            )
            commits = await cursor.fetchall()
        return commits if sum(count for _, count in commits) == len(job_ids) else None

    commits = await wait_until(submitted, timeout_s=60, interval_s=0.2)
    assert max(count for _, count in commits) <= 3, commits
