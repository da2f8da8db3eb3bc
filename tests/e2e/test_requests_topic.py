"""Bad requests on the topic: dead letters and FAILED jobs, and the agent keeps going."""

from __future__ import annotations

import uuid

import httpx
import pytest

from schemas.contract import WorkflowRunRequest
from schemas.serde import encode_request
from streams.request_agent import DLQ_REASON_HEADER
from tests.e2e.conftest import PARTITIONS
from tests.e2e.harness import Stack, dedupe, read_dlq, type_name
from tests.workflows_fixtures import envelope

pytestmark = pytest.mark.e2e


async def test_garbage_bad_uuid_and_unknown_workflow_do_not_stall_the_agent(stack: Stack) -> None:
    worker = await stack.start_worker("w1")
    workflow = envelope(name="e2e-auto", review="invoke")
    async with httpx.AsyncClient(base_url=worker.url, timeout=10) as http:
        put = await http.put(f"/v1/workflows/{workflow['name']}", json={"workflow": workflow})
        assert put.status_code == 200, put.text

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
