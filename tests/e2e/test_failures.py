"""Retryable step failures in a worker process: one that heals, one that never does."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import PARTITIONS
from tests.e2e.harness import Stack, dedupe, type_name
from tests.workflows_fixtures import EMBED, REVIEW, TOKENIZE, envelope

pytestmark = pytest.mark.e2e


async def test_unavailable_once_then_success_runs_earlier_steps_once(stack: Stack) -> None:
    worker = await stack.start_worker("w1")
    workflow = envelope(name="e2e-auto", review="invoke")
    await stack.put_workflow(worker, workflow)

    job_id = stack.produce_request(
        workflow["name"], {"text": "try again", "embed_fail": "UNAVAILABLE@1"}
    )
    stack.flush()
    job = await stack.wait_for_job(job_id, {"COMPLETED", "FAILED", "DEAD"})

    assert job.status == "COMPLETED", job
    assert job.attempt == 2
    assert job.verdict == "completed 3 steps: tokenize, embed, review"
    assert [entry["name"] for entry in job.checkpoints] == ["tokenize", "embed", "review"]
    calls = stack.calls_for(job_id)
    assert [(c.method, c.attempt) for c in calls] == [
        (TOKENIZE, 1),
        (EMBED, 1),
        (EMBED, 2),
        (REVIEW, 2),
    ]


async def test_always_unavailable_lands_dead_with_the_error_verbatim(stack: Stack) -> None:
    worker = await stack.start_worker("w1")
    reader = stack.event_reader(PARTITIONS)
    workflow = envelope(name="e2e-auto", review="invoke")
    await stack.put_workflow(worker, workflow)

    job_id = stack.produce_request(workflow["name"], {"text": "never", "embed_fail": "UNAVAILABLE"})
    stack.flush()
    job = await stack.wait_for_job(job_id, {"COMPLETED", "FAILED", "DEAD"})

    expected = "step 'embed': gRPC UNAVAILABLE: test fault UNAVAILABLE"
    assert job.status == "DEAD", job
    assert job.attempt == job.max_attempts == 3
    assert job.error == expected
    assert [entry["name"] for entry in job.checkpoints] == ["tokenize"]
    assert [(c.method, c.attempt) for c in stack.calls_for(job_id)] == [
        (TOKENIZE, 1),
        (EMBED, 1),
        (EMBED, 2),
        (EMBED, 3),
    ]

    await reader.wait(lambda _: any(type_name(e) == "DEAD" for e in reader.for_job(job_id)))
    events = dedupe(reader.for_job(job_id))
    # Each failed attempt with one left publishes RETRY_SCHEDULED, then DEAD.
    assert [type_name(e) for e in events] == [
        "ACCEPTED",
        "STEP_CHECKPOINT",
        "RETRY_SCHEDULED",
        "RETRY_SCHEDULED",
        "DEAD",
    ]
    assert [(e.attempt, e.error) for e in events[2:]] == [
        (1, expected),
        (2, expected),
        (3, expected),
    ]
    reader.close()
