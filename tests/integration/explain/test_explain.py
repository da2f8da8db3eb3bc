"""``explain`` over HTTP and ``wfjobs explain``, one job per state, against the real Postgres.

Each job is put in its state by store calls (as a worker would make them) or
by aging its row's times; the sentences must name the row's own times, its
worker and its error, and offer the commands an operator can run.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from cli.main import main as cli_main
from store.runs import RunStore
from streams.explain import when
from streams.jobs import Jobs, SubmitRequest
from streams.runtime import Runtime
from tests.integration.store.helpers import age_rows
from tests.integration.streams.conftest import parked_job, put_workflow, serve
from tests.workflows_fixtures import envelope

Served = tuple[TestClient[Any, Any], Runtime]


@pytest.fixture
async def served(make_database: Callable[..., str]) -> AsyncIterator[Served]:
    async with serve({"DATABASE_URL": make_database(migrated=True)}) as pair:
        await put_workflow(pair[0])
        yield pair


@pytest.fixture
async def admitting_two(make_database: Callable[..., str]) -> AsyncIterator[Served]:
    env = {"DATABASE_URL": make_database(migrated=True), "WFJOBS_MAX_QUEUED_JOBS": "2"}
    async with serve(env) as pair:
        await put_workflow(pair[0])
        yield pair


async def _submit(client: TestClient[Any, Any], text: str = "explain me") -> str:
    response = await client.post(
        "/v1/workflow-runs", json={"workflow_name": "web-review", "input": {"text": text}}
    )
    assert response.status == 201, await response.text()
    job_id: str = (await response.json())["job"]["job_id"]
    return job_id


async def _explain(client: TestClient[Any, Any], job_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/workflow-runs/{job_id}:explain")
    assert response.status == 200, await response.text()
    answer: dict[str, Any] = await response.json()
    assert answer["job_id"] == job_id
    return answer


def _why(answer: dict[str, Any]) -> str:
    return " ".join(finding["sentence"] for finding in answer.get("why", []))


def _next(answer: dict[str, Any]) -> str:
    return " ".join(finding["sentence"] for finding in answer.get("next", []))


def _commands(answer: dict[str, Any]) -> list[str]:
    return [action["command"] for action in answer.get("actions", [])]


async def _set_past(runs: RunStore, job_id: Any, **ago: str) -> None:
    """Move the row's named times back from now by these intervals (``deadline_at="1 second"``)."""
    assignments = ", ".join(f"{column} = now() - %({column})s::interval" for column in ago)
    async with runs.pool.connection() as conn:
        await conn.execute(
            f"UPDATE workflow_run SET {assignments} WHERE job_id = %(job_id)s",  # type: ignore[arg-type]
            {**ago, "job_id": job_id},
        )


def _runs(runtime: Runtime) -> RunStore:
    return runtime.require_runs()


async def test_queued_in_backoff_names_the_retry_time_worker_and_error(served: Served) -> None:
    client, runtime = served
    job_id = await _submit(client)
    claimed = await _runs(runtime).claim("worker-a")
    assert claimed is not None
    outcome = await _runs(runtime).retry_or_die(claimed.lease, "UNAVAILABLE: embedder down")

    answer = await _explain(client, job_id)
    assert answer["status"] == "QUEUED"
    why = _why(answer)
    assert f"waiting for its retry backoff until {when(outcome.run_after)}" in why
    assert "attempt 1/3 on worker worker-a" in why
    assert "UNAVAILABLE: embedder down (classified retryable)" in why
    assert f"At {when(outcome.run_after)} it becomes claimable" in _next(answer)
    assert answer["why"][0]["evidence"]["run_after"] == when(outcome.run_after)
    assert _commands(answer) == [f"wfjobs cancel {job_id} --reason TEXT"]
    assert [a["outcome"] for a in answer["history"]] == ["RETRY_SCHEDULED"]
    # The retry's event waits for the relay (none runs here).
    assert answer["outbox"]["pending"] == 2 and answer["outbox"].get("failed", 0) == 0
    assert "2 wait in the outbox for the relay" in answer["delivery"]["sentence"]


async def test_queued_behind_admission_says_the_queue_is_full(admitting_two: Served) -> None:
    client, runtime = admitting_two
    first = await _submit(client, "one")
    second = await _submit(client, "two")
    refused = await client.post(
        "/v1/workflow-runs", json={"workflow_name": "web-review", "input": {"text": "three"}}
    )
    assert refused.status == 429

    answer = await _explain(client, second)
    run_after = (await _runs(runtime).get(uuid.UUID(second))).run_after
    why = _why(answer)
    assert f"QUEUED and claimable since {when(run_after)}" in why
    assert "1 claimable job(s) are ahead of it" in why
    assert "The queue is full: 2 or more jobs are QUEUED" in why
    assert "WFJOBS_MAX_QUEUED_JOBS=2" in why
    assert "next free worker claims it (attempt 1 of 3)" in _next(answer)
    assert "no claimable job is ahead of it" in _why(await _explain(client, first))


async def test_running_with_a_live_lease_names_worker_lease_and_heartbeat(served: Served) -> None:
    client, runtime = served
    job_id = await _submit(client)
    claimed = await _runs(runtime).claim("worker-live")
    assert claimed is not None
    await _runs(runtime).extend_lease(claimed.lease)
    job = await _runs(runtime).get(uuid.UUID(job_id))
    assert job.lease_until is not None and job.claimed_at is not None

    answer = await _explain(client, job_id)
    why = _why(answer)
    assert "RUNNING attempt 1/3, held by worker worker-live" in why
    assert f"claimed at {when(job.claimed_at)}" in why
    assert f"its lease ends at {when(job.lease_until)}" in why
    assert f"last heard from at {when(job.updated_at)}" in why
    assert answer["why"][0]["evidence"]["worker"] == "worker-live"
    assert f"the lease passes at {when(job.lease_until)}" in _next(answer)
    assert _commands(answer) == [f"wfjobs cancel {job_id} --reason TEXT"]


async def test_running_with_an_expired_lease_says_the_sweeper_takes_it(served: Served) -> None:
    client, runtime = served
    job_id = await _submit(client)
    runs = _runs(runtime)
    claimed = await runs.claim("worker-gone")
    assert claimed is not None
    await age_rows(runs.pool, runs.lease_s + 30, claimed.job_id)
    job = await runs.get(claimed.job_id)
    assert job.lease_until is not None

    answer = await _explain(client, job_id)
    why = _why(answer)
    assert f"the lease of worker worker-gone expired at {when(job.lease_until)}" in why
    assert "s ago)" in why
    assert f"last heard from at {when(job.updated_at)}" in why
    assert "The sweeper takes it on its next pass" in _next(answer)
    assert "requeues it for attempt 2 of 3" in _next(answer)


async def test_waiting_names_the_step_since_when_and_the_complete_command(served: Served) -> None:
    client, runtime = served
    job_id = await parked_job(client, runtime, "review this")
    [parked] = await _runs(runtime).history.attempts(uuid.UUID(job_id))

    answer = await _explain(client, job_id)
    assert answer["status"] == "WAITING"
    why = _why(answer)
    assert f"parked on external step 'review' since {when(parked.ended_at)}" in why
    assert "by worker web-test" in why
    assert "Nothing happens until someone completes step 'review'" in _next(answer)
    assert _commands(answer) == [
        f"wfjobs complete {job_id} review --response JSON",
        f"wfjobs cancel {job_id} --reason TEXT",
    ]
    http = answer["actions"][0]["http"]
    assert http == f'POST /v1/workflow-runs/{job_id}/steps/review:complete {{"response": JSON}}'
    # Sent as written, the JSON filled in, the action completes the step.
    method, path, body = http.split(" ", 2)
    response = await client.request(
        method,
        path,
        data=body.replace("JSON", '{"approved": true}'),
        headers={"Content-Type": "application/json"},
    )
    assert response.status == 200, await response.text()
    assert (await response.json())["outcome"] == "COMPLETED"


async def test_failed_names_the_error_its_class_and_the_worker(served: Served) -> None:
    client, runtime = served
    job_id = await _submit(client)
    claimed = await _runs(runtime).claim("worker-f")
    assert claimed is not None
    await _runs(runtime).fail(claimed.lease, error="step 'embed': gRPC INVALID_ARGUMENT: bad text")
    job = await _runs(runtime).get(claimed.job_id)

    answer = await _explain(client, job_id)
    assert answer["status"] == "FAILED"
    assert (
        f"FAILED at {when(job.updated_at)} on attempt 1/3 on worker worker-f: "
        "step 'embed': gRPC INVALID_ARGUMENT: bad text (classified non-retryable)"
    ) in _why(answer)
    assert _commands(answer) == [f"wfjobs resume {job_id}"]


async def test_dead_names_the_attempts_last_error_and_resume_from_the_last_step(
    served: Served,
) -> None:
    client, runtime = served
    job_id = await _submit(client)
    runs = _runs(runtime)
    for attempt, worker in enumerate(("worker-1", "worker-2", "worker-3"), 1):
        claimed = await runs.claim(worker)
        assert claimed is not None and claimed.lease.attempt == attempt
        if attempt == 1:
            await runs.checkpoint(
                claimed.lease,
                {"name": "tokenize", "skipped": False, "response": {"ids": [1], "count": 1}},
            )
        await runs.retry_or_die(claimed.lease, f"UNAVAILABLE: embedder down #{attempt}")
        await age_rows(runs.pool, 3600, claimed.job_id)
    job = await runs.get(uuid.UUID(job_id))
    assert job.status == "DEAD"

    answer = await _explain(client, job_id)
    why = _why(answer)
    assert (
        f"DEAD after 3 attempts of 3, since {when(job.updated_at)}; the last error on worker "
        "worker-3: UNAVAILABLE: embedder down #3, classified retryable."
    ) in why
    assert "attempt 1 on worker-1" in why and "UNAVAILABLE: embedder down #1" in why
    assert _commands(answer) == [
        f"wfjobs resume {job_id}",
        f"wfjobs resume {job_id} --from-step tokenize",
    ]
    assert [a["outcome"] for a in answer["history"]] == [
        "RETRY_SCHEDULED",
        "RETRY_SCHEDULED",
        "DEAD",
    ]


async def test_cancelled_names_the_reason_and_offers_a_resume(served: Served) -> None:
    client, runtime = served
    job_id = await _submit(client)
    await runtime.require_control().cancel(uuid.UUID(job_id), reason="duplicate order")
    job = await _runs(runtime).get(uuid.UUID(job_id))
    assert job.status == "CANCELLED"

    answer = await _explain(client, job_id)
    assert f"CANCELLED at {when(job.updated_at)}" in _why(answer)
    assert "duplicate order" in _why(answer)
    assert _commands(answer) == [f"wfjobs resume {job_id}"]


async def test_explain_and_get_from_the_command_line(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    client, runtime = served
    job_id = await _submit(client)
    claimed = await _runs(runtime).claim("worker-cli")
    assert claimed is not None
    await _runs(runtime).retry_or_die(claimed.lease, "UNAVAILABLE: try later")
    url = str(client.make_url(""))

    async def wfjobs(*argv: str) -> tuple[int, str]:
        capsys.readouterr()
        code = await asyncio.to_thread(cli_main, ["--url", url, *argv])
        return code, capsys.readouterr().out

    code, out = await wfjobs("explain", job_id)
    assert code == 0
    assert "waiting for its retry backoff" in out and "worker-cli" in out
    assert f"wfjobs cancel {job_id}" in out
    code, out = await wfjobs("--json", "explain", job_id)
    assert code == 0 and json.loads(out)["status"] == "QUEUED"

    code, out = await wfjobs("get", job_id)
    assert code == 0
    assert "history" in out and "RETRY_SCHEDULED" in out and "UNAVAILABLE: try later" in out
    code, out = await wfjobs("--json", "get", job_id)
    [attempt] = json.loads(out)["job"]["history"]
    assert attempt["worker"] == "worker-cli" and attempt["error_class"] == "retryable"


async def test_an_unknown_job_and_a_bad_id_are_refused(served: Served) -> None:
    client, _ = served
    assert (await client.get(f"/v1/workflow-runs/{uuid.uuid4()}:explain")).status == 404
    assert (await client.get("/v1/workflow-runs/not-a-uuid:explain")).status == 400


async def test_a_failure_while_no_worker_held_the_job_is_not_pinned_on_an_attempt(
    served: Served,
) -> None:
    client, runtime = served
    runs = _runs(runtime)
    # Its whole-job deadline passes while it is parked on the review step.
    parked = await parked_job(client, runtime, "parked past its deadline")
    await _set_past(runs, parked, deadline_at="1 second")
    assert (await runs.sweep_deadlines()).job_deadlines == 1
    job = await runs.get(uuid.UUID(parked))
    assert job.status == "FAILED" and job.error is not None

    answer = await _explain(client, parked)
    why = _why(answer)
    assert f"FAILED at {when(job.updated_at)}: a deadline passed: {job.error}." in why
    assert "on worker" not in why and "classified None" not in why
    assert answer["why"][0]["evidence"]["error_class"] == "deadline"

    # Its deadline passes while it waits out a retry's backoff.
    queued = await _submit(client, "in backoff past its deadline")
    claimed = await runs.claim("worker-r")
    assert claimed is not None and str(claimed.job_id) == queued
    await runs.retry_or_die(claimed.lease, "UNAVAILABLE: embedder down")
    await _set_past(runs, queued, deadline_at="1 second")
    assert (await runs.sweep_deadlines()).job_deadlines == 1
    job = await runs.get(uuid.UUID(queued))
    why = _why(await _explain(client, queued))
    assert f"FAILED at {when(job.updated_at)}: a deadline passed: {job.error}." in why
    assert "classified retryable" not in why

    # A reviewer's response its validate rules reject.
    rejected = await parked_job(client, runtime, "rejected by review")
    response = await client.post(
        f"/v1/workflow-runs/{rejected}/steps/review:complete",
        json={"response": {"approved": False}},
    )
    assert (await response.json())["outcome"] == "REJECTED"
    job = await runs.get(uuid.UUID(rejected))
    answer = await _explain(client, rejected)
    why = _why(answer)
    assert (
        f"FAILED at {when(job.updated_at)}: the response to step 'review' was rejected by "
        f"its validate rules: {job.error}."
    ) in why
    assert "on worker" not in why
    assert answer["why"][0]["evidence"]["error_class"] == "verdict"


async def test_a_job_already_resumed_offers_its_run_not_another_resume(served: Served) -> None:
    client, runtime = served
    job_id = await parked_job(client, runtime, "resumed once")
    await runtime.require_control().cancel(uuid.UUID(job_id), reason="wrong reviewer")
    response = await client.post(f"/v1/workflow-runs/{job_id}:resume", json={})
    assert response.status == 201, await response.text()
    run = (await response.json())["job"]["job_id"]

    answer = await _explain(client, job_id)
    assert f"It was already resumed by job {run}" in _next(answer)
    assert _commands(answer) == [f"wfjobs explain {run}"]
    assert answer["actions"][0]["http"] == f"GET /v1/workflow-runs/{run}:explain"
    # What the resume actions would have offered changes nothing.
    again = await client.post(f"/v1/workflow-runs/{job_id}:resume", json={"from_step": "embed"})
    assert again.status == 200 and (await again.json())["job"]["job_id"] == run


async def test_an_expired_lease_past_the_jobs_deadline_is_not_promised_a_requeue(
    served: Served,
) -> None:
    # The sweeper fails such a job: no claim would take it again.
    client, runtime = served
    runs = _runs(runtime)
    job_id = await _submit(client, "lease and deadline behind it")
    claimed = await runs.claim("worker-gone")
    assert claimed is not None
    await _set_past(runs, job_id, lease_until="2 seconds", deadline_at="1 second")
    job = await runs.get(uuid.UUID(job_id))
    assert job.deadline_at is not None
    following = _next(await _explain(client, job_id))
    assert "requeues it" not in following and "DEAD" not in following
    assert f"Its whole-job deadline passed at {when(job.deadline_at)}" in following


async def test_a_lease_or_deadline_already_past_is_left_to_the_sweepers_next_pass(
    served: Served,
) -> None:
    client, runtime = served
    runs = _runs(runtime)
    # Asked to cancel, and its worker let the lease pass: nobody renews it any more.
    running = await _submit(client, "gone quiet")
    claimed = await runs.claim("worker-quiet")
    assert claimed is not None
    await runtime.require_control().cancel(claimed.job_id, reason="stuck")
    await age_rows(runs.pool, runs.lease_s + 30, claimed.job_id)
    answer = await _explain(client, running)
    assert "sees the request on its next heartbeat" not in _next(answer)
    assert "the sweeper settles the job CANCELLED on its next pass" in _next(answer)

    # Parked, with both its step deadline and its whole-job deadline behind it.
    waiting = await parked_job(client, runtime, "deadlines behind it")
    await _set_past(runs, waiting, step_deadline_at="2 seconds", deadline_at="1 second")
    job = await runs.get(uuid.UUID(waiting))
    assert job.step_deadline_at is not None and job.deadline_at is not None
    following = _next(await _explain(client, waiting))
    assert f"Its step deadline passed at {when(job.step_deadline_at)}" in following
    assert f"Its whole-job deadline passed at {when(job.deadline_at)}" in following
    assert "passes at" not in following


async def test_a_queued_job_past_its_deadline_is_not_promised_a_claim(served: Served) -> None:
    client, runtime = served
    runs = _runs(runtime)
    job_id = await _submit(client, "queued past its deadline")
    await _set_past(runs, job_id, deadline_at="1 second")
    job = await runs.get(uuid.UUID(job_id))
    assert job.deadline_at is not None
    answer = await _explain(client, job_id)
    why, following = _why(answer), _next(answer)
    assert f"its whole-job deadline passed at {when(job.deadline_at)}" in why
    assert "no worker may claim it" in why
    assert "claims it" not in following and "claimable" not in why
    assert f"Its whole-job deadline passed at {when(job.deadline_at)}" in following
    # Nor does it count as a job ahead of the next one in claim order.
    behind = await _submit(client, "queued behind it")
    assert "no claimable job is ahead of it" in _why(await _explain(client, behind))
    claimed = await runs.claim("worker-late")
    assert claimed is not None and str(claimed.job_id) == behind


async def test_the_http_resume_an_ended_job_is_offered_runs_as_written(served: Served) -> None:
    client, runtime = served
    runs = _runs(runtime)
    job_id = await _submit(client, "run the action")
    claimed = await runs.claim("worker-h")
    assert claimed is not None
    await runs.fail(claimed.lease, error="step 'embed': mapping broke")

    [action] = (await _explain(client, job_id))["actions"]
    assert action["command"] == f"wfjobs resume {job_id}"
    method, path, *body = action["http"].split(" ", 2)
    response = await client.request(
        method, path, data=body[0] if body else None, headers={"Content-Type": "application/json"}
    )
    assert response.status == 201, (action["http"], await response.text())


async def test_a_job_refused_at_submit_is_offered_the_resume_that_can_run_it(
    served: Served,
) -> None:
    client, runtime = served
    # A request named the workflow before anyone had stored it.
    job_id = uuid.uuid4()
    request = SubmitRequest(job_id, {"text": "too early"}, "late-review", owner="tester")
    await Jobs(runtime).submit_many([request], record_refusals=True, via="kafka")
    await put_workflow(client, envelope(name="late-review"))

    [action] = (await _explain(client, str(job_id)))["actions"]
    assert action["command"] == f"wfjobs resume {job_id} --current-definition"
    method, path, body = action["http"].split(" ", 2)
    response = await client.request(
        method, path, data=body, headers={"Content-Type": "application/json"}
    )
    assert response.status == 201, (action["http"], await response.text())


async def test_a_cancel_request_does_not_pass_for_word_from_the_worker(served: Served) -> None:
    client, runtime = served
    runs = _runs(runtime)
    job_id = await _submit(client, "silent worker")
    claimed = await runs.claim("worker-silent")
    assert claimed is not None
    # The worker was last heard from ten minutes ago.
    await _set_past(runs, claimed.job_id, updated_at="10 minutes")
    heard = (await runs.get(claimed.job_id)).updated_at
    result = await runtime.require_control().cancel(claimed.job_id, reason="stuck")
    assert result.outcome == "CANCEL_REQUESTED"
    assert result.job.updated_at == heard

    answer = await _explain(client, job_id)
    assert f"last heard from at {when(heard)}" in _why(answer)
    assert answer["why"][0]["evidence"]["last_heartbeat"] == when(heard)
