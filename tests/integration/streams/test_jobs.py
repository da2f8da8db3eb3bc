"""Every way in reaches the same verbs: HTTP and the requests topic share ``Jobs.submit_many``.

The HTTP verbs run on the app's real views and the request agent's handler on
the same runtime, against a real Postgres.
"""

from __future__ import annotations

import dataclasses
import inspect
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from schemas.contract import WorkflowRunRequest
from schemas.errors import Unavailable
from schemas.serde import RequestDecoder
from store.outbox import Outbox
from store.records import ClaimedJob, Job
from streams.jobs import Jobs
from streams.request_agent import Message, RequestHandler
from streams.runtime import Runtime
from tests.integration.streams.conftest import parked_job, put_workflow, serve
from tests.loop_gaps import with_longest_gap
from tests.workflows_fixtures import envelope, tokenize_ids, with_a_step

pytestmark = pytest.mark.asyncio

# Columns that name, date or own one job; everything else two equal submits share.
_PER_JOB = {"job_id", "created_at", "updated_at", "run_after", "owner"}


def _spy(monkeypatch: pytest.MonkeyPatch, verb: str) -> list[dict[str, Any]]:
    """Record the arguments of every call of ``Jobs.<verb>``, defaults filled in."""
    real: Callable[..., Any] = getattr(Jobs, verb)
    signature = inspect.signature(real)
    calls: list[dict[str, Any]] = []

    async def recording(self: Jobs, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        calls.append({k: v for k, v in bound.arguments.items() if k != "self"})
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(Jobs, verb, recording)
    return calls


def _handler(runtime: Runtime, letters: list[str]) -> RequestHandler:
    async def dead_letter(key: bytes | None, value: bytes | None, reason: str) -> None:
        letters.append(reason)

    return RequestHandler(
        runtime, decoder=RequestDecoder(), dead_letter=dead_letter, topic="requests"
    )


def _request(job_id: uuid.UUID, workflow_name: str, text: str) -> bytes:
    message = WorkflowRunRequest(job_id=str(job_id), workflow_name=workflow_name)
    message.input.update({"text": text})
    return message.SerializeToString()


def _shape(job: Job) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(job).items() if k not in _PER_JOB}


async def test_http_and_the_requests_topic_submit_through_the_same_verb(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ``Jobs.submit`` (the HTTP verb) is a batch of one of ``submit_many``, which
    # the request agent calls with each batch it reads: both reach it.
    calls = _spy(monkeypatch, "submit_many")
    letters: list[str] = []
    over_http, from_topic = uuid.uuid4(), uuid.uuid4()
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client)
        response = await client.post(
            "/v1/workflow-runs",
            json={
                "job_id": str(over_http),
                "workflow_name": "web-review",
                "input": {"text": "the same words"},
            },
        )
        assert response.status == 201, await response.text()
        [outcome] = await _handler(runtime, letters).handle_batch(
            [
                Message(
                    str(from_topic).encode(), _request(from_topic, "web-review", "the same words")
                )
            ]
        )
        assert outcome.kind == "submitted" and outcome.job_id == from_topic

        runs = runtime.require_runs()
        http_job, topic_job = await runs.get(over_http), await runs.get(from_topic)
        assert http_job.status == "QUEUED"
        assert _shape(http_job) == _shape(topic_job)
        # The HTTP caller's principal owns its job; the topic's configured one owns the other.
        assert (http_job.owner, topic_job.owner) == ("tester", "kafka")
        assert runtime.pool is not None
        outbox = Outbox(runtime.pool)
        http_events = await outbox.events_for(over_http)
        topic_events = await outbox.events_for(from_topic)
        assert [e.event_type for e in http_events] == [e.event_type for e in topic_events]
        assert [e.event_type for e in http_events] == ["ACCEPTED"]
    assert letters == []

    http_call, topic_call = calls
    # The one difference: nobody waits on a request from the topic, so a
    # refusal there is recorded as a FAILED job instead of answered.
    assert (http_call.pop("record_refusals"), topic_call.pop("record_refusals")) == (False, True)
    # A fleet-wide token may answer with any owner's job; the topic always may.
    assert (http_call.pop("owner_only"), topic_call.pop("owner_only")) == (False, False)
    # The way in is what a submit span records.
    assert (http_call.pop("via"), topic_call.pop("via")) == ("http", "kafka")
    assert http_call.keys() == topic_call.keys() == {"requests"}
    [http_request], [topic_request] = http_call["requests"], topic_call["requests"]
    http_fields, topic_fields = dataclasses.asdict(http_request), dataclasses.asdict(topic_request)
    assert (http_fields.pop("job_id"), topic_fields.pop("job_id")) == (over_http, from_topic)
    assert (http_fields.pop("owner"), topic_fields.pop("owner")) == ("tester", "kafka")
    assert http_fields == topic_fields
    assert http_fields == {
        "input": {"text": "the same words"},
        "workflow": None,
        "workflow_name": "web-review",
        "max_attempts": None,
        "deadline_ms": None,
        "trace": None,
    }


async def test_an_unknown_stored_workflow_is_refused_over_http_and_recorded_from_the_topic(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _spy(monkeypatch, "submit")
    letters: list[str] = []
    over_http, from_topic = uuid.uuid4(), uuid.uuid4()
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        response = await client.post(
            "/v1/workflow-runs",
            json={"job_id": str(over_http), "workflow_name": "missing", "input": {"text": "x"}},
        )
        assert response.status == 404, await response.text()
        assert (await response.json())["code"] == "NOT_FOUND"
        outcome = await _handler(runtime, letters).handle(
            None, _request(from_topic, "missing", "x")
        )
        assert outcome.kind == "failed"
        assert outcome.reason == "unknown workflow 'missing': no stored definition"
        assert (await client.get(f"/v1/workflow-runs/{over_http}")).status == 404
        failed = await runtime.require_runs().get(from_topic)
        assert failed.status == "FAILED" and failed.error == outcome.reason
    assert [call["workflow_name"] for call in calls] == ["missing", "missing"]
    assert [call["record_refusals"] for call in calls] == [False, True]
    assert letters == []


async def test_the_complete_step_view_delegates_to_the_verb(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _spy(monkeypatch, "complete_step")
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client)
        job_id = await parked_job(client, runtime, "review me")
        response = await client.post(
            f"/v1/workflow-runs/{job_id}/steps/review:complete",
            json={"response": {"approved": True, "note": "fine"}},
        )
        assert response.status == 200, await response.text()
        assert (await response.json())["outcome"] == "COMPLETED"
    assert calls == [
        {
            "job_id": uuid.UUID(job_id),
            "step_name": "review",
            "response": {"approved": True, "note": "fine"},
            # The fixture's token is fleet-wide: every owner's job.
            "owner": None,
        }
    ]


async def claimed_past_embed(
    client: TestClient[Any, Any], runtime: Runtime, workflow: dict[str, Any]
) -> tuple[str, ClaimedJob]:
    """A job of ``workflow`` (an inline or a stored one) submitted over HTTP,
    claimed, with its tokenize and embed steps checkpointed."""
    response = await client.post("/v1/workflow-runs", json={**workflow, "input": {"text": "hi"}})
    assert response.status == 201, await response.text()
    job_id = (await response.json())["job"]["job_id"]
    runs = runtime.require_runs()
    claimed = await runs.claim("web-test")
    assert claimed is not None
    for name, answer in (
        ("tokenize", {"ids": tokenize_ids("hi"), "count": 1}),
        ("embed", {"vector": [0.5, 0.25, 0.0, 1.0], "dimensions": 4}),
    ):
        await runs.checkpoint(claimed.lease, {"name": name, "skipped": False, "response": answer})
    return job_id, claimed


async def test_a_completion_read_just_before_its_job_parks_on_the_step_is_judged(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The review's validate rule reads the input, which a completion is judged
    # against as read before the row lock. Read RUNNING, the job parks on the
    # step before the lock is taken: the completion counts all the same.
    workflow = envelope(name="web-review")
    workflow["steps"][2]["validate"] = ["response.approved && input.text != ''"]
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client, workflow)
        job_id, claimed = await claimed_past_embed(client, runtime, {"workflow_name": "web-review"})
        runs = runtime.require_runs()
        read = runs.get

        async def read_then_park(job: uuid.UUID | str) -> Job:
            found = await read(job)
            if found.status == "RUNNING":
                await runs.park(claimed.lease, "review")
            return found

        monkeypatch.setattr(runs, "get", read_then_park)
        response = await client.post(
            f"/v1/workflow-runs/{job_id}/steps/review:complete",
            json={"response": {"approved": True, "note": "fine"}},
        )
        assert response.status == 200, await response.text()
        assert (await response.json())["outcome"] == "COMPLETED"
        monkeypatch.undo()
        job = await runs.get(job_id)
        assert job.status == "QUEUED"
        assert [entry["name"] for entry in job.checkpoints] == ["tokenize", "embed", "review"]


async def test_a_completion_is_judged_off_the_event_loop(dsn: str) -> None:
    # Judging a response costs what its sender and the rules' author choose:
    # the engine's filter copies its list as it grows, so this takes a second,
    # in a deployment whose cost limit allows it (the default refuses it).
    workflow = with_a_step(answers="jobs.test.Embedding", external=True)
    workflow["steps"][-1]["validate"] = [
        "size(response.vector.filter(x, x >= 0.0)) == size(response.vector)"
    ]
    async with serve({"DATABASE_URL": dsn, "WFJOBS_RULE_MAX_COST": str(10**8)}) as (
        client,
        runtime,
    ):
        job_id, claimed = await claimed_past_embed(client, runtime, {"workflow": workflow})
        runs = runtime.require_runs()
        await runs.park(claimed.lease, "answer")
        vector = [index + 0.5 for index in range(4000)]

        async def complete() -> Any:
            answered = await client.post(
                f"/v1/workflow-runs/{job_id}/steps/answer:complete",
                json={"response": {"vector": vector, "dimensions": len(vector)}},
            )
            assert answered.status == 200, await answered.text()
            return await answered.json()

        answer, longest = await with_longest_gap(complete())
    assert answer["outcome"] == "COMPLETED", answer
    assert longest < 0.2, f"the loop was held for {longest:.2f}s"


async def test_an_unreachable_store_is_unavailable_to_every_way_in(dsn: str) -> None:
    missing = dsn.rsplit("/", 1)[0] + "/no_such_database"
    letters: list[str] = []
    env = {"DATABASE_URL": missing, "WFJOBS_POOL_TIMEOUT_S": "0.5"}
    async with serve(env, token=False) as (_, runtime):
        jobs = Jobs(runtime)
        with pytest.raises(Unavailable, match=r"^the store is unreachable"):
            await jobs.get_job(uuid.uuid4())
        # The request agent waits an Unavailable out rather than dead-lettering.
        with pytest.raises(Unavailable, match=r"^the store is unreachable"):
            await _handler(runtime, letters).handle(None, _request(uuid.uuid4(), "any", "x"))
    assert letters == []
