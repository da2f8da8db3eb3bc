"""Events above the size limit are refused before they commit, on every path.

The claim-loop tests run the real runtime (claim loops and relay) against the
real Postgres and Kafka: a job whose step answers too much fails, with the
limit in its error, and every outbox row it wrote is published; none is FAILED.
"""

from __future__ import annotations

import uuid
from typing import Any

from schemas.contract import WorkflowRunRequest
from schemas.serde import RequestDecoder
from store.outbox import Outbox
from streams.request_agent import RequestHandler
from streams.runtime import Runtime
from tests.conftest import NewTopicFactory
from tests.integration.streams.conftest import parked_job, put_workflow, serve
from tests.integration.streams.operator_support import (
    env_for,
    eventually,
    kinds,
    read_events,
    running,
)
from tests.workflows_fixtures import envelope

SMALL_LIMIT = 20_000


async def _settled(runtime: Runtime, job_id: uuid.UUID) -> Any:
    runs = runtime.require_runs()

    async def probe() -> Any:
        job = await runs.get(job_id)
        return job if job.status in ("COMPLETED", "FAILED", "DEAD", "WAITING") else None

    return await eventually(probe, f"job {job_id} to settle")


async def _all_published(runtime: Runtime, job_id: uuid.UUID) -> list[str]:
    assert runtime.pool is not None
    outbox = Outbox(runtime.pool)

    async def probe() -> list[str] | None:
        rows = await outbox.events_for(job_id)
        assert all(row.status != "FAILED" for row in rows), rows
        if rows and all(row.status == "PUBLISHED" for row in rows):
            return [row.event_type for row in rows]
        return None

    return await eventually(probe, f"every event of job {job_id} to be published")


async def _submit(runtime: Runtime, workflow: dict[str, Any], text: str) -> uuid.UUID:
    compiled = runtime.compile(workflow)
    job_id = uuid.uuid4()
    await runtime.require_runs().submit(
        job_id=job_id,
        workflow_name=compiled.name,
        definition=workflow,
        definition_hash=compiled.definition_hash,
        input=compiled.validate_input({"text": text}),
    )
    return job_id


async def test_an_oversized_step_response_fails_its_job_and_leaves_no_failed_row(
    dsn: str, kafka_bootstrap: str, new_topic: NewTopicFactory
) -> None:
    topic = new_topic(kafka_bootstrap, partitions=1)
    env = env_for(dsn, kafka_bootstrap, WFJOBS_ROLES="worker,relay", WFJOBS_EVENTS_TOPIC=topic)
    async with running(env) as runtime:
        # 200 kB of input, well inside every limit; tokenized, one id per word
        # (about 11 bytes each in the event), the response is past 1 MB.
        job_id = await _submit(runtime, envelope(name="auto", review="invoke"), "a " * 100_000)
        job = await _settled(runtime, job_id)
        assert job.status == "FAILED", job
        assert job.error.startswith("step 'tokenize': the STEP_CHECKPOINT event of step")
        assert "above the event size limit of 990,000 bytes (WFJOBS_MAX_EVENT_BYTES)" in job.error
        assert "its response alone is" in job.error
        assert job.attempt == 1 and job.checkpoints == ()
        assert await _all_published(runtime, job_id) == ["ACCEPTED", "FAILED"]
    events = read_events(kafka_bootstrap, topic, 2)
    assert kinds(events) == ["ACCEPTED", "FAILED"]
    assert events[1].error == job.error


async def test_an_oversized_result_fails_its_job_with_the_reason(
    dsn: str, kafka_bootstrap: str, new_topic: NewTopicFactory
) -> None:
    topic = new_topic(kafka_bootstrap, partitions=1)
    env = env_for(
        dsn,
        kafka_bootstrap,
        WFJOBS_ROLES="worker,relay",
        WFJOBS_EVENTS_TOPIC=topic,
        WFJOBS_MAX_EVENT_BYTES=str(SMALL_LIMIT),
    )
    # Every step's event fits; the result repeats the tokens and does not.
    workflow = envelope(
        name="doubled", review=None, output=["ids = tokenize.ids", "again = tokenize.ids"]
    )
    async with running(env) as runtime:
        job_id = await _submit(runtime, workflow, "b " * 1_200)
        job = await _settled(runtime, job_id)
        assert job.status == "FAILED", job
        assert job.error.startswith("the COMPLETED event of job")
        assert f"above the event size limit of {SMALL_LIMIT:,} bytes" in job.error
        assert "its result alone is" in job.error
        assert [entry["name"] for entry in job.checkpoints] == ["tokenize", "embed"]
        published = await _all_published(runtime, job_id)
        assert published == ["ACCEPTED", "STEP_CHECKPOINT", "STEP_CHECKPOINT", "FAILED"]
    assert kinds(read_events(kafka_bootstrap, topic, 4))[-1] == "FAILED"


async def test_oversized_input_and_step_response_answer_413_and_write_nothing(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn, "WFJOBS_MAX_EVENT_BYTES": str(SMALL_LIMIT)}) as (
        client,
        runtime,
    ):
        await put_workflow(client)
        job_id = str(uuid.uuid4())
        response = await client.post(
            "/v1/workflow-runs",
            json={
                "workflow_name": "web-review",
                "job_id": job_id,
                "input": {"text": "w " * 15_000},
            },
        )
        assert response.status == 413, await response.text()
        body = await response.json()
        assert body["code"] == "PAYLOAD_TOO_LARGE"
        assert f"the input of job {job_id} (as JSON) would be" in body["message"]
        assert f"the event size limit of {SMALL_LIMIT:,} bytes" in body["message"]
        assert (await client.get(f"/v1/workflow-runs/{job_id}")).status == 404
        assert (await runtime.require_runs().list()).jobs == ()

        parked = await parked_job(client, runtime, "answer me")
        assert runtime.pool is not None
        outbox = Outbox(runtime.pool)
        before = await outbox.events_for(uuid.UUID(parked))
        response = await client.post(
            f"/v1/workflow-runs/{parked}/steps/review:complete",
            json={"response": {"approved": True, "note": "n" * 25_000}},
        )
        assert response.status == 413, await response.text()
        body = await response.json()
        assert body["code"] == "PAYLOAD_TOO_LARGE"
        assert "STEP_CHECKPOINT event of step 'review'" in body["message"]
        assert f"limit of {SMALL_LIMIT:,} bytes" in body["message"]
        job = await runtime.require_runs().get(parked)
        assert job.status == "WAITING" and job.outstanding_step == "review"
        assert [entry["name"] for entry in job.checkpoints] == ["tokenize", "embed"]
        assert len(await outbox.events_for(uuid.UUID(parked))) == len(before)


async def test_an_oversized_request_from_the_topic_becomes_a_failed_job(dsn: str) -> None:
    letters: list[str] = []

    async def dead_letter(key: bytes | None, value: bytes | None, reason: str) -> None:
        letters.append(reason)

    env = {"DATABASE_URL": dsn, "WFJOBS_ROLES": "api", "WFJOBS_MAX_EVENT_BYTES": str(SMALL_LIMIT)}
    async with running(env) as runtime:
        await runtime.require_definitions().put("stored", envelope(name="stored"))
        handler = RequestHandler(
            runtime, decoder=RequestDecoder(), dead_letter=dead_letter, topic="requests"
        )
        job_id = str(uuid.uuid4())
        request = WorkflowRunRequest(job_id=job_id, workflow_name="stored")
        request.input.update({"text": "w " * 15_000})
        outcome = await handler.handle(job_id.encode(), request.SerializeToString())
        assert outcome.kind == "failed" and letters == []
        job = await runtime.require_runs().get(job_id)
        assert job.status == "FAILED"
        assert job.error is not None and f"limit of {SMALL_LIMIT:,} bytes" in job.error
