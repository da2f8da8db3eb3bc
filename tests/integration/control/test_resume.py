"""Resume, in-process against a real Postgres: the HTTP verbs, the use case and the CLI.

Ended jobs are made the way workers make them (claim, checkpoint, settle
through the run store); the resume then goes through the app's real views.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from aiohttp.test_utils import TestClient

from cli.main import main as cli_main
from schemas.contract import EventType, WorkflowRunEvent, timestamp_json
from store.control import resume_job_id
from store.outbox import Outbox
from streams.jobs import Jobs, SubmitRequest
from streams.runtime import Runtime
from tests.integration.streams.conftest import WEB_WORKFLOW, bearer, put_workflow, serve
from tests.workflows_fixtures import tokenize_ids

pytestmark = pytest.mark.asyncio

TOKENIZE_ENTRY = {"name": "tokenize", "skipped": False, "response": {}}
EMBED_RESPONSE = {"vector": [0.5, 0.25, 0.0, 1.0], "dimensions": 4}


@pytest.fixture
async def dsn(make_database: Callable[..., str]) -> str:
    return make_database(migrated=True)


async def _json(response: Any) -> dict[str, Any]:
    body: dict[str, Any] = await response.json()
    return body


async def _submit(
    client: TestClient[Any, Any],
    text: str,
    *,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> str:
    response = await client.post(
        "/v1/workflow-runs",
        json={"workflow_name": "web-review", "input": {"text": text}, **extra},
        headers=headers,
    )
    assert response.status == 201, await response.text()
    job_id: str = (await _json(response))["job"]["job_id"]
    return job_id


async def ended_job(
    client: TestClient[Any, Any],
    runtime: Runtime,
    text: str,
    *,
    steps: Sequence[str] = ("tokenize",),
    end: str = "DEAD",
    headers: dict[str, str] | None = None,
) -> str:
    """A job that checkpointed ``steps`` and then ended ``end`` (DEAD or FAILED)."""
    job_id = await _submit(client, text, headers=headers, max_attempts=1)
    runs = runtime.require_runs()
    claimed = await runs.claim_batch("resume-test", 100)
    ours = [item for item in claimed if str(item.job_id) == job_id]
    for other in claimed:
        if str(other.job_id) != job_id:
            await runs.hand_back(other.lease)
    assert len(ours) == 1
    lease = ours[0].lease
    ids = tokenize_ids(text)
    responses = {"tokenize": {"ids": ids, "count": len(ids)}, "embed": EMBED_RESPONSE}
    for step in steps:
        await runs.checkpoint(lease, {"name": step, "skipped": False, "response": responses[step]})
    if end == "DEAD":
        outcome = await runs.retry_or_die(lease, "step 'embed': gRPC UNAVAILABLE: down")
        assert outcome.dead
    else:
        await runs.fail(lease, error="step 'embed': mapping broke")
    return job_id


async def _resume(
    client: TestClient[Any, Any], job_id: str, body: dict[str, Any] | None = None, **kw: Any
) -> Any:
    return await client.post(f"/v1/workflow-runs/{job_id}:resume", json=body or {}, **kw)


def _decode(payload: bytes) -> WorkflowRunEvent:
    return WorkflowRunEvent.FromString(payload)


async def test_resume_of_a_dead_job_is_a_new_run_linked_both_ways(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client)
        original_id = await ended_job(client, runtime, "resume me")
        runs = runtime.require_runs()
        before = await runs.get(original_id)

        response = await _resume(client, original_id)
        assert response.status == 201, await response.text()
        answer = await _json(response)
        assert answer["created"] is True
        new = answer["job"]
        assert new["job_id"] == str(resume_job_id(uuid.UUID(original_id), ""))
        assert new["resumed_from"] == original_id
        assert new["status"] == "QUEUED"

        run = await runs.get(new["job_id"])
        assert run.attempt == 0 and run.max_attempts == before.max_attempts == 1
        assert run.owner == "tester"
        assert run.checkpoints == before.checkpoints
        assert run.input == before.input
        assert run.definition_hash == before.definition_hash
        assert run.definition == before.definition
        assert run.resumed_from == before.job_id and run.resumed_by is None
        assert run.error is None and run.verdict is None

        after = await runs.get(original_id)
        # The original keeps every column but the link.
        assert after.resumed_by == run.job_id
        assert replace(after, resumed_by=None) == before

        got = await _json(await client.get(f"/v1/workflow-runs/{original_id}"))
        assert got["job"]["resumed_by"] == str(run.job_id)
        assert got["job"]["status"] == "DEAD"

        outbox = Outbox(runtime.pool)  # type: ignore[arg-type]
        original_events = await outbox.events_for(uuid.UUID(original_id))
        assert [row.event_type for row in original_events] == [
            "ACCEPTED",
            "STEP_CHECKPOINT",
            "DEAD",
            "RESUMED",
        ]
        resumed_event = _decode(original_events[-1].payload)
        assert resumed_event.type == EventType.TYPE_RESUMED
        assert resumed_event.resumed_by == str(run.job_id)
        assert resumed_event.attempt == before.attempt
        new_events = await outbox.events_for(run.job_id)
        assert [row.event_type for row in new_events] == ["ACCEPTED"]
        accepted = _decode(new_events[0].payload)
        assert accepted.resumed_from == original_id and accepted.attempt == 0
        assert original_events[-1].id > new_events[0].id > original_events[-2].id

        # Both rows and both events were written by one transaction; no
        # snapshot was stored for the run (it names the original's).
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            rows = await (
                await conn.execute(
                    "SELECT xmin::text FROM workflow_run WHERE job_id = ANY(%(ids)s)"
                    " UNION ALL SELECT xmin::text FROM workflow_run_events_outbox"
                    " WHERE id = ANY(%(events)s)",
                    {
                        "ids": [before.job_id, run.job_id],
                        "events": [original_events[-1].id, new_events[0].id],
                    },
                )
            ).fetchall()
            assert len(rows) == 4 and len({row[0] for row in rows}) == 1
            snapshots = await (
                await conn.execute("SELECT count(*) FROM workflow_definition_snapshot")
            ).fetchone()
            assert snapshots == (1,)

        # The run is claimable and resumes after the kept checkpoint.
        claimed = await runs.claim("resume-test")
        assert claimed is not None and claimed.job_id == run.job_id
        assert claimed.job.attempt == 1
        workflow = runtime.compile(claimed.definition, claimed.job.definition_hash)
        step = workflow.next_step(claimed.job.checkpoints)
        assert step is not None and step.name == "embed"


async def test_one_request_key_makes_one_run_and_a_job_is_resumed_once(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client)
        original_id = await ended_job(client, runtime, "once only", end="FAILED")

        # The same key, sent many times at once: one run, made by one of them.
        answers = await asyncio.gather(
            *(_resume(client, original_id, {"request_key": "k1"}) for _ in range(8))
        )
        statuses = sorted(response.status for response in answers)
        assert statuses == [200] * 7 + [201]
        bodies = [await _json(response) for response in answers]
        assert {body["job"]["job_id"] for body in bodies} == {
            str(resume_job_id(uuid.UUID(original_id), "k1"))
        }
        assert sum(body.get("created", False) for body in bodies) == 1

        # Another key finds the job resumed already, and says by which run.
        other = await _resume(client, original_id, {"request_key": "k2"})
        body = await _json(other)
        assert other.status == 409 and body["code"] == "FAILED_PRECONDITION"
        assert bodies[0]["job"]["job_id"] in body["message"]
        assert "already resumed" in body["message"]

        # Different keys racing: exactly one wins.
        second_id = await ended_job(client, runtime, "race me")
        raced = await asyncio.gather(
            *(_resume(client, second_id, {"request_key": f"r{n}"}) for n in range(8))
        )
        assert sorted(response.status for response in raced) == [201] + [409] * 7
        outbox = Outbox(runtime.pool)  # type: ignore[arg-type]
        events = await outbox.events_for(uuid.UUID(second_id))
        assert [row.event_type for row in events].count("RESUMED") == 1


async def test_from_step_keeps_the_checkpoints_before_it(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client)
        original_id = await ended_job(client, runtime, "from here", steps=("tokenize", "embed"))
        response = await _resume(
            client, original_id, {"from_step": "embed", "max_attempts": 4, "request_key": "a"}
        )
        assert response.status == 201, await response.text()
        job = (await _json(response))["job"]
        assert [entry["name"] for entry in job["checkpoints"]] == ["tokenize"]
        assert job["max_attempts"] == 4

        second_id = await ended_job(client, runtime, "from start", steps=("tokenize", "embed"))
        response = await _resume(client, second_id, {"from_step": "tokenize"})
        assert response.status == 201
        assert (await _json(response))["job"].get("checkpoints", []) == []

        third_id = await ended_job(client, runtime, "no such step")
        response = await _resume(client, third_id, {"from_step": "summarize"})
        body = await _json(response)
        assert response.status == 400 and body["code"] == "INVALID_ARGUMENT"
        assert body["message"].startswith("from_step:")
        assert "'summarize'" in body["message"] and "tokenize, embed, review" in body["message"]
        # A refused resume wrote nothing.
        assert (await runtime.require_runs().get(third_id)).resumed_by is None


async def test_the_current_definition_must_fit_the_kept_checkpoints(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client)
        first = await ended_job(client, runtime, "renamed", steps=("tokenize", "embed"))
        second = await ended_job(client, runtime, "renamed too", steps=("tokenize", "embed"))
        runs = runtime.require_runs()
        original = await runs.get(first)

        # The current definition calls the second step "vectorize".
        renamed = json.loads(json.dumps(WEB_WORKFLOW))
        renamed["steps"][1]["name"] = "vectorize"
        renamed["steps"][2]["rules"] = ["text = input.text", "dimensions = vectorize.dimensions"]
        renamed["output"] = ["ids = tokenize.ids", "vector = vectorize.vector"]
        await put_workflow(client, renamed)

        refused = await _resume(client, first, {"use_current_definition": True})
        body = await _json(refused)
        assert refused.status == 400 and body["code"] == "INVALID_ARGUMENT"
        assert "'embed'" in body["message"] and "'vectorize'" in body["message"]
        assert (await runs.get(first)).resumed_by is None

        # Re-running from the renamed step keeps only what still fits.
        response = await _resume(
            client, first, {"use_current_definition": True, "from_step": "vectorize"}
        )
        assert response.status == 201, await response.text()
        run = await runs.get((await _json(response))["job"]["job_id"])
        assert [entry["name"] for entry in run.checkpoints] == ["tokenize"]
        assert run.definition == renamed
        assert run.definition_hash != original.definition_hash

        # The original snapshot is still the default.
        response = await _resume(client, second)
        assert response.status == 201
        kept = await runs.get((await _json(response))["job"]["job_id"])
        assert kept.definition_hash == original.definition_hash
        assert [entry["name"] for entry in kept.checkpoints] == ["tokenize", "embed"]


async def test_only_ended_jobs_of_ones_own_can_be_resumed(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client)
        queued = await _submit(client, "still queued")
        response = await _resume(client, queued)
        body = await _json(response)
        assert response.status == 409 and body["code"] == "FAILED_PRECONDITION"
        assert "is QUEUED" in body["message"] and f"wfjobs cancel {queued}" in body["message"]

        missing = await _resume(client, str(uuid.uuid4()))
        assert missing.status == 404

        dead = await ended_job(client, runtime, "someone else's")
        stranger = await bearer(dsn, "stranger", ["submit", "read"])
        response = await _resume(client, dead, headers=stranger)
        assert response.status == 404, await response.text()
        reader = await bearer(dsn, "tester", ["read"])
        response = await _resume(client, dead, headers=reader)
        assert response.status == 403

        for body, field in (
            ({"job_id": str(uuid.uuid4())}, "job_id"),
            ({"request_key": "x" * 201}, "request_key"),
            ({"max_attempts": 101}, "max_attempts"),
            ({"bogus": 1}, "bogus"),
        ):
            response = await _resume(client, dead, body)
            answer = await _json(response)
            assert response.status == 400, answer
            assert field in answer["message"]

        # A job refused at submit has no snapshot: only the current definition runs it.
        refused = await runtime.require_runs().submit_failed(
            job_id=uuid.uuid4(),
            workflow_name="web-review",
            input={"text": "refused"},
            error="unknown workflow",
        )
        response = await _resume(client, str(refused.job.job_id))
        body = await _json(response)
        assert response.status == 409 and "use_current_definition" in body["message"]
        response = await _resume(client, str(refused.job.job_id), {"use_current_definition": True})
        assert response.status == 201, await response.text()


async def test_a_run_another_owner_made_is_not_shown_to_the_jobs_owner(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client)
        own = await bearer(dsn, "someone", ["submit", "read"])
        original = await ended_job(client, runtime, "mine", headers=own)
        # An operator (fleet-wide) resumes it with the default key: the run is theirs.
        made = await _resume(client, original)
        assert made.status == 201, await made.text()
        run = (await _json(made))["job"]
        assert run["owner"] == "tester"

        # The same resume from the job's owner names the run as any other
        # resume would, and shows nothing of a job the owner cannot read.
        response = await _resume(client, original, headers=own)
        body = await _json(response)
        assert response.status == 409, body
        assert body["code"] == "FAILED_PRECONDITION" and run["job_id"] in body["message"]
        assert "already resumed" in body["message"]
        assert (await client.get(f"/v1/workflow-runs/{run['job_id']}", headers=own)).status == 404
        # The operator who made it is still answered with it.
        again = await _resume(client, original)
        assert again.status == 200 and (await _json(again))["job"]["job_id"] == run["job_id"]


async def test_bulk_resume_by_filter(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client)
        dead = [await ended_job(client, runtime, f"dead {n}") for n in range(3)]
        failed = await ended_job(client, runtime, "failed", end="FAILED")
        cutoff = datetime.now(UTC)
        late = await ended_job(client, runtime, "late")
        await _submit(client, "queued, left alone")

        response = await client.post(
            "/v1/workflow-runs:resume",
            json={"statuses": ["DEAD"], "created_before": cutoff.isoformat()},
        )
        assert response.status == 200, await response.text()
        answer = await _json(response)
        assert [job["resumed_from"] for job in answer["resumed"]] == dead
        assert answer.get("refused", []) == []

        # Nothing is resumed twice; the rest of the filter picks up the others.
        response = await client.post(
            "/v1/workflow-runs:resume", json={"workflow_name": "web-review"}
        )
        answer = await _json(response)
        assert sorted(job["resumed_from"] for job in answer["resumed"]) == sorted([failed, late])
        again = await _json(await client.post("/v1/workflow-runs:resume", json={}))
        assert again.get("resumed", []) == []

        refused = await client.post("/v1/workflow-runs:resume", json={"statuses": ["RUNNING"]})
        body = await _json(refused)
        assert refused.status == 400 and "statuses" in body["message"]

        own = await bearer(dsn, "someone", ["submit"])
        response = await client.post(
            "/v1/workflow-runs:resume", json={"owner": "tester"}, headers=own
        )
        assert response.status == 403


async def test_jobs_refused_at_submit_do_not_hold_a_bulk_resume_back(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        # The oldest FAILED jobs have no snapshot: a request named a workflow
        # no one had stored.
        refused = [uuid.uuid4() for _ in range(2)]
        await Jobs(runtime).submit_many(
            [
                SubmitRequest(job_id, {"text": "a"}, "web-review", owner="tester")
                for job_id in refused
            ],
            record_refusals=True,
            via="kafka",
        )
        await put_workflow(client)
        failed = await ended_job(client, runtime, "failed", end="FAILED")

        body = {"statuses": ["FAILED"], "limit": 2}
        answer = await _json(await client.post("/v1/workflow-runs:resume", json=body))
        assert [job["resumed_from"] for job in answer["resumed"]] == [failed]
        assert answer["refused"] == []
        # With the stored definition they can run now, and are resumed.
        current = {**body, "use_current_definition": True}
        answer = await _json(await client.post("/v1/workflow-runs:resume", json=current))
        # Written in one statement, they are as old as each other.
        resumed = sorted(job["resumed_from"] for job in answer["resumed"])
        assert resumed == sorted(str(job_id) for job_id in refused)


async def test_jobs_of_a_workflow_never_stored_do_not_hold_back_a_resume_with_the_current_one(
    dsn: str,
) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        ghosts = [uuid.uuid4() for _ in range(2)]
        await Jobs(runtime).submit_many(
            [SubmitRequest(job_id, {"text": "a"}, "ghost", owner="tester") for job_id in ghosts],
            record_refusals=True,
            via="kafka",
        )
        await put_workflow(client)
        failed = await ended_job(client, runtime, "failed", end="FAILED")

        body = {"statuses": ["FAILED"], "limit": 2, "use_current_definition": True}
        answer = await _json(await client.post("/v1/workflow-runs:resume", json=body))
        assert [job["resumed_from"] for job in answer["resumed"]] == [failed]
        assert answer["refused"] == []


async def test_the_resume_command(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client)
        original = await ended_job(client, runtime, "from the shell", steps=("tokenize", "embed"))
        url = str(client.make_url(""))

        async def wfjobs(*argv: str) -> tuple[int, str]:
            capsys.readouterr()
            code = await asyncio.to_thread(cli_main, ["--url", url, *argv])
            return code, capsys.readouterr().out

        code, out = await wfjobs("resume", original, "--from-step", "embed", "--key", "cli")
        new_id = str(resume_job_id(uuid.UUID(original), "cli"))
        assert code == 0, out
        assert f"job {original} resumed as job {new_id}" in out and "1 checkpoint(s) kept" in out
        code, out = await wfjobs("--json", "resume", original, "--key", "cli")
        assert code == 0 and json.loads(out)["job"]["job_id"] == new_id
        code, out = await wfjobs("resume", original, "--key", "other")
        assert code == 1

        other = await ended_job(client, runtime, "bulk from the shell", end="FAILED")
        code, out = await wfjobs("resume", "--status", "FAILED", "--workflow", "web-review")
        assert code == 0 and "resumed 1 job(s)" in out and other in out
        code, _ = await wfjobs("resume")
        assert code == 1


async def test_a_resumed_run_continues_the_trace_of_the_job_it_resumes(dsn: str) -> None:
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client)
        original_id = await ended_job(
            client, runtime, "trace me", headers={"traceparent": traceparent}
        )
        runs = runtime.require_runs()
        assert (await runs.get(original_id)).traceparent == traceparent
        resumed = await _json(await _resume(client, original_id))
        run = await runs.get(resumed["job"]["job_id"])
        assert run.resumed_from is not None and str(run.resumed_from) == original_id
        assert run.traceparent == traceparent


async def test_a_resumed_run_has_the_whole_job_deadline_the_job_was_given(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client)
        await put_workflow(client, {**WEB_WORKFLOW, "name": "timed", "jobDeadlineMs": 90_000})
        runs = runtime.require_runs()
        # Its own deadline_ms; the definition's jobDeadlineMs; none at all.
        own = await _submit(client, "own deadline", deadline_ms=60_000)
        response = await client.post(
            "/v1/workflow-runs", json={"workflow_name": "timed", "input": {"text": "defined"}}
        )
        assert response.status == 201, await response.text()
        by_definition = (await _json(response))["job"]["job_id"]
        without = await _submit(client, "no deadline")

        for job_id, span_s in ((own, 60), (by_definition, 90), (without, None)):
            await runtime.require_control().cancel(uuid.UUID(job_id))
            response = await _resume(client, job_id)
            assert response.status == 201, await response.text()
            run = await runs.get(uuid.UUID((await _json(response))["job"]["job_id"]))
            if span_s is None:
                assert run.deadline_at is None
            else:
                # Counted from the resume, as a submit counts it.
                assert run.deadline_at is not None
                assert (run.deadline_at - run.created_at).total_seconds() == span_s


async def test_a_job_being_cancelled_is_not_sent_to_cancel_again(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client)
        job_id = await _submit(client, "being cancelled")
        claimed = await runtime.require_runs().claim("resume-test")
        assert claimed is not None and str(claimed.job_id) == job_id
        asked = await runtime.require_control().cancel(claimed.job_id, reason="wrong input")
        assert asked.outcome == "CANCEL_REQUESTED" and asked.job.cancel_requested_at is not None

        response = await _resume(client, job_id)
        body = await _json(response)
        assert response.status == 409 and body["code"] == "FAILED_PRECONDITION"
        assert "is RUNNING" in body["message"]
        assert (
            f"asked to cancel at {timestamp_json(asked.job.cancel_requested_at)} "
            in body["message"]
        )
        assert "wfjobs cancel" not in body["message"]
