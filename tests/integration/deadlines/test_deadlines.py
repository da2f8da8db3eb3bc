"""Whole-job deadlines and step timeouts, enforced by the sweeper on the database's clock.

Rows are judged at a later instant (``now=``) or their deadlines moved into
the past, instead of waiting for time to pass.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from schemas.contract import (
    MIN_EVENT_BYTES,
    EventType,
    StepCompletion,
    StepCompletionResult,
    decode_event,
    timestamp_json,
)
from schemas.errors import LeaseLost
from schemas.serde import MessageDecoder
from store.outbox import Outbox
from store.records import ClaimedJob
from store.runs import RunStore
from streams.completions_agent import CompletionHandler
from streams.runtime import Runtime
from streams.sweeper import Sweeper
from tests.integration.deadlines.conftest import timed_workflow
from tests.integration.streams.conftest import put_workflow
from tests.loop_gaps import with_longest_gap
from tests.workflows_fixtures import large_envelope, tokenize_ids

App = tuple[TestClient[Any, Any], Runtime]


async def _submit(client: TestClient[Any, Any], name: str, **extra: Any) -> dict[str, Any]:
    response = await client.post(
        "/v1/workflow-runs", json={"workflow_name": name, "input": {"text": "hello"}, **extra}
    )
    assert response.status == 201, await response.text()
    job: dict[str, Any] = (await response.json())["job"]
    return job


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def _claim(runs: RunStore, job_id: str) -> ClaimedJob:
    claimed = await runs.claim("deadline-test")
    assert claimed is not None and str(claimed.job.job_id) == job_id
    return claimed


async def _park(runs: RunStore, job_id: str) -> ClaimedJob:
    """Drive ``job_id`` to WAITING on its review step, as a worker's segment would."""
    claimed = await _claim(runs, job_id)
    ids = tokenize_ids("hello")
    await runs.checkpoint(
        claimed.lease,
        {"name": "tokenize", "skipped": False, "response": {"ids": ids, "count": len(ids)}},
    )
    await runs.checkpoint(
        claimed.lease,
        {"name": "embed", "skipped": False, "response": {"vector": [0.5], "dimensions": 1}},
    )
    await runs.park(
        claimed.lease,
        "review",
        request={"text": "hello", "dimensions": 1},
        timeout_ms=60_000,
    )
    return claimed


async def _events(runtime: Runtime, job_id: str) -> list[Any]:
    outbox = Outbox(runtime.require_runs().pool)
    return [decode_event(record.payload) for record in await outbox.events_for(uuid.UUID(job_id))]


def _type(event: Any) -> str:
    return str(EventType.Name(event.type)).removeprefix("TYPE_")


async def test_submit_takes_its_own_deadline_or_the_definitions(app: App) -> None:
    client, _ = app
    own = await _submit(client, "job-deadline", deadline_ms=2000)
    assert _time(own["deadline"]) - _time(own["created_at"]) == timedelta(seconds=2)
    by_definition = await _submit(client, "job-deadline")
    assert _time(by_definition["deadline"]) - _time(by_definition["created_at"]) == timedelta(
        minutes=10
    )
    none = await _submit(client, "timed")
    assert "deadline" not in none

    refused = await client.post(
        "/v1/workflow-runs",
        json={"workflow_name": "timed", "input": {"text": "x"}, "deadline_ms": -1},
    )
    assert refused.status == 400
    assert "deadline_ms" in (await refused.json())["message"]


async def test_a_job_deadline_fails_queued_running_and_waiting_jobs(app: App) -> None:
    client, runtime = app
    runs = runtime.require_runs()
    waiting = (await _submit(client, "timed", deadline_ms=60_000))["job_id"]
    await _park(runs, waiting)
    running = (await _submit(client, "timed", deadline_ms=60_000))["job_id"]
    held = await _claim(runs, running)
    queued = (await _submit(client, "timed", deadline_ms=60_000))["job_id"]
    spared = (await _submit(client, "timed", deadline_ms=3_600_000))["job_id"]

    before = await runs.sweep_deadlines(now=held.job.claimed_at)
    assert before.job_deadlines == 0

    later = held.job.claimed_at + timedelta(minutes=5)  # type: ignore[operator]
    swept = await runs.sweep_deadlines(now=later)
    assert (swept.job_deadlines, swept.step_timeouts, swept.fallbacks) == (3, 0, 0)
    for job_id, was in ((queued, "QUEUED"), (running, "RUNNING"), (waiting, "WAITING")):
        job = await runs.get(job_id)
        assert job.status == "FAILED", job
        assert job.error is not None and "deadline passed" in job.error and was in job.error
        assert job.deadline_at is not None
        passed_at = timestamp_json(job.deadline_at)
        assert f"deadline passed at {passed_at} while" in job.error, job.error
        failed = (await _events(runtime, job_id))[-1]
        assert _type(failed) == "FAILED" and failed.deadline == "job"
        assert failed.error == job.error
    assert (await runs.get(spared)).status == "QUEUED"

    # The worker that held the RUNNING job finds its lease gone at its next write.
    with pytest.raises(LeaseLost):
        await runs.checkpoint(
            held.lease, {"name": "tokenize", "skipped": False, "response": {"ids": [1]}}
        )
    # Its attempt ended in the history as DEADLINE_PASSED; the others held none.
    history = await runs.history.attempts(uuid.UUID(running))
    assert [(a.outcome, a.worker, a.error_class) for a in history] == [
        ("DEADLINE_PASSED", "deadline-test", "deadline")
    ]
    assert [a.outcome for a in await runs.history.attempts(uuid.UUID(queued))] == []

    # Settled once: a second pass finds nothing.
    again = await runs.sweep_deadlines(now=later)
    assert (again.job_deadlines, again.step_timeouts) == (0, 0)


@pytest.mark.parametrize("max_attempts", [3, 1])
async def test_a_running_job_past_its_deadline_and_its_lease_fails_instead_of_a_requeue(
    app: App, max_attempts: int
) -> None:
    # A claim never takes a job past its deadline: a requeue (or, on the last
    # attempt, DEAD) would announce a retry or an ending that is not the job's.
    client, runtime = app
    runs = runtime.require_runs()
    job_id = (await _submit(client, "timed", deadline_ms=60_000, max_attempts=max_attempts))[
        "job_id"
    ]
    await _claim(runs, job_id)
    async with runs.pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run SET lease_until = now() - interval '1 second',"
            " deadline_at = now() - interval '1 second' WHERE job_id = %(job_id)s",
            {"job_id": job_id},
        )
    sweeper = Sweeper(runs, interval_s=60)
    await sweeper.sweep_once()

    job = await runs.get(job_id)
    assert job.status == "FAILED", job
    assert job.error is not None and "deadline passed" in job.error
    assert [_type(event) for event in await _events(runtime, job_id)] == ["ACCEPTED", "FAILED"]
    history = await runs.history.attempts(uuid.UUID(job_id))
    assert [(a.outcome, a.error_class) for a in history] == [("DEADLINE_PASSED", "deadline")]
    assert (sweeper.requeued, sweeper.dead, sweeper.deadlines.job_deadlines) == (0, 0, 1)


async def test_the_waiting_event_and_get_job_carry_the_review_request_and_step_deadline(
    app: App,
) -> None:
    client, runtime = app
    job_id = (await _submit(client, "timed"))["job_id"]
    await _park(runtime.require_runs(), job_id)
    shown = (await (await client.get(f"/v1/workflow-runs/{job_id}")).json())["job"]
    assert shown["status"] == "WAITING"
    assert shown["review_request"] == {"text": "hello", "dimensions": 1}
    assert _time(shown["step_deadline"]) > _time(shown["created_at"])
    waiting = (await _events(runtime, job_id))[-1]
    assert _type(waiting) == "WAITING" and waiting.step_name == "review"
    assert dict(waiting.review_request) == {"text": "hello", "dimensions": 1.0}


async def test_a_step_timeout_fails_the_job_naming_the_step(app: App) -> None:
    client, runtime = app
    runs = runtime.require_runs()
    job_id = (await _submit(client, "timed"))["job_id"]
    await _park(runs, job_id)
    job = await runs.get(job_id)
    assert job.step_deadline_at is not None

    early = await runs.sweep_deadlines(now=job.step_deadline_at - timedelta(seconds=1))
    assert early.step_timeouts == 0
    swept = await runs.sweep_deadlines(now=job.step_deadline_at)
    assert swept.step_timeouts == 1

    failed_job = await runs.get(job_id)
    assert failed_job.status == "FAILED"
    assert failed_job.error is not None and "step 'review'" in failed_job.error
    # The moment is written as the job's own fields write one.
    passed_at = timestamp_json(job.step_deadline_at)
    assert f"before its timeout passed at {passed_at}" in failed_job.error, failed_job.error
    failed = (await _events(runtime, job_id))[-1]
    assert _type(failed) == "FAILED"
    assert (failed.deadline, failed.step_name) == ("step", "review")


async def test_a_step_timeout_takes_the_declared_fallback_through_the_sweeper(
    app: App,
) -> None:
    client, runtime = app
    runs = runtime.require_runs()
    job_id = (await _submit(client, "fallback"))["job_id"]
    await _park(runs, job_id)
    # The database's clock, with the step's deadline moved into the past.
    async with runs.pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run SET step_deadline_at = now() - interval '1 second'"
            " WHERE job_id = %(job_id)s",
            {"job_id": job_id},
        )
    sweeper = Sweeper(runs, interval_s=60, fallback_of=runtime.step_fallback)
    await sweeper.sweep_once()
    assert sweeper.deadlines.fallbacks == 1

    job = await runs.get(job_id)
    assert job.status == "QUEUED" and job.outstanding_step is None
    assert job.step_deadline_at is None and job.attempt == 0
    assert job.checkpoints[-1] == {
        "name": "review",
        "skipped": False,
        "response": {"approved": True, "reviewer": "nobody came", "note": ""},
    }
    checkpoint = (await _events(runtime, job_id))[-1]
    assert _type(checkpoint) == "STEP_CHECKPOINT" and checkpoint.step_name == "review"
    assert sweeper.health().detail["step_fallbacks_taken"] == 1


async def test_a_fallback_too_large_for_an_event_fails_the_job_and_the_sweep_goes_on(
    app: App,
) -> None:
    client, runtime = app
    runs = runtime.require_runs()
    await put_workflow(
        client,
        timed_workflow(
            "big-fallback",
            timeoutMs=60_000,
            fallback={"approved": True, "reviewer": "x" * (MIN_EVENT_BYTES + 1000)},
        ),
    )
    big = (await _submit(client, "big-fallback"))["job_id"]
    await _park(runs, big)
    other = (await _submit(client, "timed"))["job_id"]
    await _park(runs, other)
    async with runs.pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run SET step_deadline_at = now() - interval '1 second'"
            " WHERE job_id = ANY(%(job_ids)s)",
            {"job_ids": [big, other]},
        )
    # A process whose events are held to the smallest limit.
    small = RunStore(runs.pool, max_event_bytes=MIN_EVENT_BYTES)
    swept = await small.sweep_deadlines(fallback_of=runtime.step_fallback)
    assert (swept.step_timeouts, swept.fallbacks) == (2, 0)

    job = await runs.get(big)
    assert job.status == "FAILED"
    assert job.error is not None and "step 'review'" in job.error
    assert "its fallback was not taken" in job.error and "WFJOBS_MAX_EVENT_BYTES" in job.error
    failed = (await _events(runtime, big))[-1]
    assert _type(failed) == "FAILED" and (failed.deadline, failed.step_name) == ("step", "review")
    assert (await runs.get(other)).status == "FAILED"


async def test_a_pass_over_many_timed_out_steps_reads_their_definition_once(app: App) -> None:
    # Each job names its snapshot by hash; read and hashed per job, a pass over
    # a burst of timeouts held the loop (and the rows' locks) for as many copies.
    client, runtime = app
    runs = runtime.require_runs()
    job_id = (await _submit(client, "fallback"))["job_id"]
    await _park(runs, job_id)
    async with runs.pool.connection() as conn:
        await conn.execute(
            "INSERT INTO workflow_run (job_id, workflow_name, definition_hash, input, status,"
            " attempt, max_attempts, run_after, outstanding_step, checkpoints, step_deadline_at)"
            " SELECT gen_random_uuid(), workflow_name, definition_hash, input, status, attempt,"
            " max_attempts, run_after, outstanding_step, checkpoints, now() - interval '1 second'"
            " FROM workflow_run, generate_series(1, 600) WHERE job_id = %(job_id)s",
            {"job_id": job_id},
        )
    swept, longest = await with_longest_gap(runs.sweep_deadlines(fallback_of=runtime.step_fallback))
    assert swept.fallbacks == 600
    assert longest < 0.2, f"the loop was held for {longest:.2f}s"


async def test_a_fallback_from_a_snapshot_not_yet_compiled_is_read_off_the_event_loop(
    app: App,
) -> None:
    # After a restart, or once the cache moved on, a parked job's snapshot is
    # compiled again to read its fallback; its size is its author's choice.
    client, runtime = app
    runs = runtime.require_runs()
    workflow = large_envelope()
    workflow["steps"][-1].update(timeoutMs=60_000, fallback={"approved": True})
    response = await client.post(
        "/v1/workflow-runs", json={"workflow": workflow, "input": {"text": "hello"}}
    )
    assert response.status == 201, await response.text()
    job_id = (await response.json())["job"]["job_id"]
    async with runs.pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run SET status = 'WAITING', outstanding_step = 'review',"
            " step_deadline_at = now() - interval '1 second' WHERE job_id = %(job_id)s",
            {"job_id": job_id},
        )
    runtime.cache.clear()
    swept, longest = await with_longest_gap(runs.sweep_deadlines(fallback_of=runtime.step_fallback))
    assert swept.fallbacks == 1
    assert longest < 0.2, f"the loop was held for {longest:.2f}s"


async def _shown(client: TestClient[Any, Any], job_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/workflow-runs/{job_id}")
    assert response.status == 200, await response.text()
    job: dict[str, Any] = (await response.json())["job"]
    return job


async def _step_deadline_passes(runs: RunStore, job_id: str) -> None:
    async with runs.pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run SET step_deadline_at = now() - interval '1 second'"
            " WHERE job_id = %(job_id)s",
            {"job_id": job_id},
        )


async def test_a_job_that_leaves_waiting_shows_no_review_request_or_step_deadline(
    app: App,
) -> None:
    # Both belong to the parked step: once the job moves on, a reviewer's
    # request and a deadline nobody enforces any more would only mislead.
    client, runtime = app
    runs = runtime.require_runs()
    # Every job parked first: a claim takes the oldest QUEUED job.
    parked: dict[str, ClaimedJob] = {}
    for job_id, name, extra in (
        ("accepted", "timed", {}),
        ("rejected", "timed", {}),
        ("cancelled", "timed", {}),
        ("fallback", "fallback", {}),
        ("timed_out", "timed", {}),
        ("overdue", "timed", {"deadline_ms": 60_000}),
    ):
        submitted = (await _submit(client, name, **extra))["job_id"]
        parked[job_id] = await _park(runs, submitted)
    ids = {way: str(claimed.job_id) for way, claimed in parked.items()}
    for job_id in ids.values():
        assert (await _shown(client, job_id))["review_request"]

    answer = await client.post(
        f"/v1/workflow-runs/{ids['accepted']}/steps/review:complete",
        json={"response": {"approved": True, "reviewer": "ann"}},
    )
    assert (await answer.json())["outcome"] == "COMPLETED"
    answer = await client.post(
        f"/v1/workflow-runs/{ids['rejected']}/steps/review:complete",
        json={"response": {"approved": False, "reviewer": "ann"}},
    )
    assert (await answer.json())["outcome"] == "REJECTED"
    answer = await client.post(f"/v1/workflow-runs/{ids['cancelled']}:cancel", json={})
    assert (await answer.json())["outcome"] == "CANCELLED"
    later = parked["overdue"].job.claimed_at + timedelta(minutes=5)  # type: ignore[operator]
    for way in ("fallback", "timed_out"):
        await _step_deadline_passes(runs, ids[way])
    swept = await runs.sweep_deadlines(fallback_of=runtime.step_fallback)
    assert (swept.job_deadlines, swept.step_timeouts, swept.fallbacks) == (0, 1, 1)
    assert (await runs.sweep_deadlines(now=later)).job_deadlines == 1

    left = {
        "accepted": "QUEUED",
        "rejected": "FAILED",
        "cancelled": "CANCELLED",
        "fallback": "QUEUED",
        "timed_out": "FAILED",
        "overdue": "FAILED",
    }
    for way, status in left.items():
        shown = await _shown(client, ids[way])
        assert shown["status"] == status, way
        assert "review_request" not in shown and "step_deadline" not in shown, (way, shown)
        job = await runs.get(ids[way])
        assert (job.review_request, job.step_deadline_at) == (None, None), way

    # Claimed again, a requeued job shows nothing of the step it left.
    claimed = await _claim(runs, ids["accepted"])
    assert (claimed.job.review_request, claimed.job.step_deadline_at) == (None, None)


async def test_a_completion_after_the_fallback_was_taken_is_told_it_was_not_used(
    app: App,
) -> None:
    client, runtime = app
    runs = runtime.require_runs()
    job_id = (await _submit(client, "fallback"))["job_id"]
    await _park(runs, job_id)
    await _step_deadline_passes(runs, job_id)
    assert (await runs.sweep_deadlines(fallback_of=runtime.step_fallback)).fallbacks == 1

    human = {"approved": True, "reviewer": "ann", "note": "late, but here"}
    late = await client.post(
        f"/v1/workflow-runs/{job_id}/steps/review:complete", json={"response": human}
    )
    assert late.status == 409, await late.text()
    body = await late.json()
    assert body["code"] == "WRONG_STATE"
    assert "fallback" in body["message"] and "not used" in body["message"]
    handler = CompletionHandler(runtime, decoder=MessageDecoder(StepCompletion, topic="t"))
    message = StepCompletion(job_id=job_id, step_name="review", principal="tester")
    message.response.update(human)
    answer = await handler.handle(message.SerializeToString())
    assert answer.outcome == StepCompletionResult.Outcome.WRONG_STATE, answer
    job = await runs.get(job_id)
    assert job.checkpoints[-1]["response"]["reviewer"] == "nobody came"

    # The fallback's own response is what the step holds: that one is done.
    same = await client.post(
        f"/v1/workflow-runs/{job_id}/steps/review:complete",
        json={"response": {"approved": True, "reviewer": "nobody came"}},
    )
    assert (same.status, (await same.json())["outcome"]) == (200, "ALREADY_DONE")


async def test_a_replayed_completion_of_a_step_with_a_fallback_is_already_done(
    app: App,
) -> None:
    client, runtime = app
    job_id = (await _submit(client, "fallback"))["job_id"]
    await _park(runtime.require_runs(), job_id)
    human = {"approved": True, "reviewer": "ann"}
    for outcome in ("COMPLETED", "ALREADY_DONE"):
        answer = await client.post(
            f"/v1/workflow-runs/{job_id}/steps/review:complete", json={"response": human}
        )
        assert (answer.status, (await answer.json())["outcome"]) == (200, outcome)


async def test_a_claim_does_not_start_a_job_whose_deadline_has_passed(app: App) -> None:
    # Its steps would run only to be thrown away (their side effects not):
    # the sweeper fails it where it waits, as it does any QUEUED job past its deadline.
    client, runtime = app
    runs = runtime.require_runs()
    overdue = (await _submit(client, "timed", deadline_ms=60_000))["job_id"]
    in_time = (await _submit(client, "timed", deadline_ms=3_600_000))["job_id"]
    async with runs.pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run SET deadline_at = now() - interval '1 second'"
            " WHERE job_id = %(job_id)s",
            {"job_id": overdue},
        )
    claimed = await runs.claim_batch("deadline-test", 10)
    assert [str(job.job_id) for job in claimed] == [in_time]
    assert (await runs.get(overdue)).status == "QUEUED"
    assert (await runs.sweep_deadlines()).job_deadlines == 1
    failed = await runs.get(overdue)
    assert failed.status == "FAILED" and failed.error is not None
    assert "deadline passed" in failed.error
    assert [a.outcome for a in await runs.history.attempts(uuid.UUID(overdue))] == []
