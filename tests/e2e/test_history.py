"""A job that struggles leaves a trace: its history, its retry events, its explanation.

One worker process, the real Kafka: a step that fails twice with UNAVAILABLE
and then answers makes three attempts in the job's history and two
RETRY_SCHEDULED events on the events topic, each naming the error and the
next run time the history recorded.
"""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.conftest import PARTITIONS
from tests.e2e.harness import Stack, dedupe, type_name
from tests.workflows_fixtures import envelope

pytestmark = pytest.mark.e2e


async def test_two_retries_then_success_show_three_attempts_and_two_retry_events(
    stack: Stack,
) -> None:
    worker = await stack.start_worker("w1")
    reader = stack.event_reader(PARTITIONS)
    workflow = envelope(name="e2e-history", review="invoke")
    await stack.put_workflow(worker, workflow)

    job_id = stack.produce_request(
        workflow["name"], {"text": "third time lucky", "embed_fail": "UNAVAILABLE@2"}
    )
    stack.flush()
    job = await stack.wait_for_job(job_id, {"COMPLETED", "FAILED", "DEAD"})
    assert job.status == "COMPLETED", job

    expected = "step 'embed': gRPC UNAVAILABLE: test fault UNAVAILABLE"
    async with httpx.AsyncClient(base_url=worker.url, timeout=10, headers=stack.headers) as http:
        got = await http.get(f"/v1/workflow-runs/{job_id}")
        assert got.status_code == 200, got.text
        history = got.json()["job"]["history"]
        explained = await http.get(f"/v1/workflow-runs/{job_id}:explain")
        assert explained.status_code == 200, explained.text
    assert [(a["attempt"], a["worker"], a["outcome"]) for a in history] == [
        (1, "w1", "RETRY_SCHEDULED"),
        (2, "w1", "RETRY_SCHEDULED"),
        (3, "w1", "COMPLETED"),
    ]
    assert [a.get("steps", []) for a in history] == [["tokenize"], [], ["embed", "review"]]
    assert [(a.get("error"), a.get("error_class")) for a in history] == [
        (expected, "retryable"),
        (expected, "retryable"),
        (None, None),
    ]
    for attempt in history:
        assert attempt["claimed_at"] <= attempt["ended_at"]
    assert "COMPLETED" in explained.json()["why"][0]["sentence"]

    await reader.wait(lambda _: any(type_name(e) == "COMPLETED" for e in reader.for_job(job_id)))
    events = dedupe(reader.for_job(job_id))
    assert [type_name(e) for e in events] == [
        "ACCEPTED",
        "STEP_CHECKPOINT",
        "RETRY_SCHEDULED",
        "RETRY_SCHEDULED",
        "STEP_CHECKPOINT",
        "STEP_CHECKPOINT",
        "COMPLETED",
    ]
    retries = [e for e in events if type_name(e) == "RETRY_SCHEDULED"]
    assert [(e.attempt, e.error) for e in retries] == [(1, expected), (2, expected)]
    # The event's next run time is the one the row took and the history kept.
    recorded = await stack.runs.history.attempts(job.job_id)
    assert [e.next_run_at.ToDatetime().isoformat() for e in retries] == [
        a.next_run_at.replace(tzinfo=None).isoformat() for a in recorded[:2] if a.next_run_at
    ]
    reader.close()
