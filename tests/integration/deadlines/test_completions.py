"""Completions from the topic, decided in-process on a real Postgres.

The Faust agent around ``CompletionHandler`` only feeds it values, publishes
the answers and acks; the end-to-end test runs it against a real broker.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any

import psycopg
import pytest
from aiohttp.test_utils import TestClient
from aiokafka.errors import TopicAuthorizationFailedError  # type: ignore[import-untyped]
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from faust.exceptions import ProducerSendError
from psycopg import AsyncConnection

from schemas.contract import StepCompletion, StepCompletionResult
from schemas.errors import Unavailable
from schemas.serde import MessageDecoder
from streams.completions_agent import CompletionHandler, ResultEncoder, answer_until_done
from streams.runtime import Runtime
from tests.integration.deadlines.conftest import timed_workflow
from tests.integration.streams.conftest import parked_job, put_workflow
from tests.loop_gaps import with_longest_gap
from tests.workflows_fixtures import tokenize_ids
from workflows import cache

App = tuple[TestClient[Any, Any], Runtime]
Outcome = StepCompletionResult.Outcome


def completion(
    job_id: str, *, step: str = "review", principal: str = "tester", **response: Any
) -> bytes:
    message = StepCompletion(
        job_id=job_id, step_name=step, principal=principal, request_id=f"req-{step}"
    )
    message.response.update(response or {"approved": True, "reviewer": "ann"})
    return message.SerializeToString()


@pytest.fixture
def handler(app: App) -> CompletionHandler:
    _, runtime = app
    return CompletionHandler(runtime, decoder=MessageDecoder(StepCompletion, topic="t"))


async def _parked(app: App, text: str = "please review") -> str:
    client, runtime = app
    await put_workflow(client)
    return await parked_job(client, runtime, text)


async def test_a_completion_completes_once_then_answers_already_done(
    app: App, handler: CompletionHandler
) -> None:
    _, runtime = app
    job_id = await _parked(app)
    first = await handler.handle(completion(job_id))
    assert (first.outcome, first.job_id, first.step_name, first.request_id) == (
        Outcome.COMPLETED,
        job_id,
        "review",
        "req-review",
    )
    job = await runtime.require_runs().get(job_id)
    assert job.status == "QUEUED" and job.checkpoints[-1]["name"] == "review"
    again = await handler.handle(completion(job_id))
    assert again.outcome == Outcome.ALREADY_DONE, again


async def test_every_other_answer(app: App, handler: CompletionHandler) -> None:
    job_id = await _parked(app)
    garbage = await handler.handle(b"\xff\xfe not a protobuf message")
    assert garbage.outcome == Outcome.INVALID and "StepCompletion" in garbage.message

    bad_id = await handler.handle(completion("not-a-uuid"))
    assert bad_id.outcome == Outcome.INVALID and "job_id" in bad_id.message

    empty = await handler.handle(None)
    assert empty.outcome == Outcome.INVALID

    # A Struct carries any double; JSON, and so the job's checkpoint, cannot.
    not_json = await handler.handle(completion(job_id, approved=True, score=math.inf))
    assert (not_json.outcome, not_json.message) == (
        Outcome.INVALID,
        "response.score is not a finite number: JSON has no NaN or Infinity,"
        " and a number must fit a double",
    )
    nul = await handler.handle(completion(job_id, approved=True, reviewer="a\x00n"))
    assert (nul.outcome, nul.message) == (
        Outcome.INVALID,
        "response.reviewer contains U+0000 (NUL), which is not accepted",
    )
    assert (await app[1].require_runs().get(job_id)).status == "WAITING"

    wrong_step = await handler.handle(completion(job_id, step="nope"))
    assert (wrong_step.outcome, wrong_step.message) == (
        Outcome.NOT_FOUND,
        f"job {job_id}: workflow 'web-review' has no step 'nope'",
    )

    # A worker's step, checkpointed already: not this completion's to answer.
    worker_step = await handler.handle(completion(job_id, step="embed"))
    assert worker_step.outcome == Outcome.WRONG_STATE and "not an external step" in (
        worker_step.message
    )

    misfit = await handler.handle(completion(job_id, approved="perhaps"))
    assert misfit.outcome == Outcome.INVALID and "approved" in misfit.message

    nobody = await handler.handle(completion(str(uuid.uuid4())))
    assert nobody.outcome == Outcome.NOT_FOUND

    stranger = await handler.handle(completion(job_id, principal="mallory"))
    assert stranger.outcome == Outcome.NOT_FOUND

    # A trusted principal no token could name is refused, not looked up.
    forged = await handler.handle(completion(job_id, principal="tester\nforged"))
    assert forged.outcome == Outcome.INVALID and forged.message.startswith(
        "principal: principal 'tester\\nforged' is malformed"
    ), forged.message

    rejected = await handler.handle(completion(job_id, approved=False, reviewer="bob"))
    assert rejected.outcome == Outcome.REJECTED
    # Replayed, as after a crash before its result was acknowledged: the job has FAILED.
    replayed = await handler.handle(completion(job_id, approved=False, reviewer="bob"))
    assert replayed.outcome == Outcome.WRONG_STATE and "is FAILED" in replayed.message


async def test_the_result_is_published_and_an_outage_is_waited_out(
    app: App, handler: CompletionHandler
) -> None:
    job_id = await _parked(app)
    sent: list[tuple[bytes, bytes]] = []
    failures = [Unavailable("the broker is away")]

    async def publish(key: bytes, value: bytes) -> None:
        if failures:
            raise failures.pop()
        sent.append((key, value))

    result = await answer_until_done(
        handler, ResultEncoder(None, "results"), publish, completion(job_id), base_s=0.01
    )
    assert result.outcome == Outcome.COMPLETED
    # The store changed once; the answer was published once the broker was back.
    assert len(sent) == 1 and sent[0][0] == job_id.encode()
    published = StepCompletionResult()
    published.ParseFromString(sent[0][1])
    assert published == result


async def test_a_completion_too_large_to_echo_is_answered_within_the_producers_limit(
    app: App, handler: CompletionHandler
) -> None:
    # Broken fields are echoed on the answer, keyed by the job id: a completion
    # the broker took (under 1 MB) would be answered with more than Faust's
    # producer sends (max_request_size 1 000 000), and refused on every try.
    sent: list[tuple[bytes, bytes]] = []

    async def publish(key: bytes, value: bytes) -> None:
        if DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, []) > 1_000_000:
            raise ProducerSendError("Error while sending: MessageSizeTooLargeError()")
        sent.append((key, value))

    message = StepCompletion(
        job_id="j" * 300_000, step_name="s" * 300_000, request_id="r" * 300_000
    )
    message.response.update({"approved": True})
    oversized = await asyncio.wait_for(
        answer_until_done(
            handler,
            ResultEncoder(None, "results"),
            publish,
            message.SerializeToString(),
            base_s=0.01,
            cap_s=0.02,
        ),
        timeout=10,
    )
    assert oversized.outcome == Outcome.INVALID and "job_id" in oversized.message
    [(key, value)] = sent
    answer = StepCompletionResult.FromString(value)
    assert answer.outcome == Outcome.INVALID and key == answer.job_id.encode()
    assert 0 < len(answer.job_id) <= 200 and answer.job_id == "j" * len(answer.job_id)
    assert 0 < len(answer.step_name) <= 200 and 0 < len(answer.request_id) <= 200


async def test_a_large_completion_is_decided_off_the_event_loop(
    app: App, handler: CompletionHandler
) -> None:
    # Converting a response of many values to JSON is pure Python, about a third
    # of a second near the broker's limit; the rest of the worker shares the loop.
    job_id = await _parked(app)
    value = completion(job_id, approved=True, reviewer="ann", xs=list(range(90_000)))
    assert len(value) > 900_000
    answer, longest = await with_longest_gap(handler.handle(value))
    assert answer.outcome == Outcome.INVALID and "xs" in answer.message  # no such field
    assert longest < 0.2, f"the loop was held for {longest:.2f}s"


async def test_a_completion_that_waits_on_the_store_past_the_bound_makes_the_agent_unhealthy(
    app: App,
) -> None:
    _, runtime = app
    handler = CompletionHandler(
        runtime, decoder=MessageDecoder(StepCompletion, topic="t"), stuck_after_s=0.5
    )
    async with await psycopg.AsyncConnection.connect(runtime.settings.database_url) as holder:
        # What a completion meets behind a migration's lock, or on a server gone silent.
        await holder.execute("LOCK TABLE workflow_run IN ACCESS EXCLUSIVE MODE")
        completing = asyncio.ensure_future(handler.handle(completion(str(uuid.uuid4()))))
        await asyncio.sleep(0.2)
        assert not completing.done()
        assert handler.health().healthy
        await asyncio.sleep(0.5)
        health = handler.health()
        assert not health.healthy
        assert health.detail["completion_waiting_s"] >= 0.5
        assert health.summary.startswith("a completion has waited")
        await holder.rollback()
    assert (await completing).outcome == Outcome.NOT_FOUND
    health = handler.health()
    assert health.healthy and health.detail["completion_waiting_s"] == 0


async def test_complete_step_reads_the_definition_once_and_hashes_none(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A definition may be most of a megabyte: read again under the row lock and
    # hashed there to find its compiled form, it held the lock (and the loop)
    # for milliseconds a call. The row names its hash; one read is enough.
    client, _ = app
    job_id = await _parked(app)
    reads: list[str] = []
    execute = AsyncConnection.execute

    async def counting(self: AsyncConnection[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        if "workflow_definition_snapshot" in str(query):
            reads.append(str(query))
        return await execute(self, query, *args, **kwargs)

    hashed: list[object] = []
    digest = cache.definition_hash

    def hashing(envelope: Any) -> str:
        hashed.append(envelope)
        return digest(envelope)

    monkeypatch.setattr(AsyncConnection, "execute", counting)
    monkeypatch.setattr(cache, "definition_hash", hashing)
    for outcome in ("COMPLETED", "ALREADY_DONE"):
        reads.clear()
        answer = await client.post(
            f"/v1/workflow-runs/{job_id}/steps/review:complete",
            json={"response": {"approved": True, "reviewer": "ann"}},
        )
        assert (answer.status, (await answer.json())["outcome"]) == (200, outcome)
        assert len(reads) == 1, reads
    assert hashed == []


async def _park_review(runtime: Runtime, job_id: str, text: str) -> None:
    runs = runtime.require_runs()
    claimed = await runs.claim("completion-test")
    assert claimed is not None and str(claimed.job_id) == job_id
    ids = tokenize_ids(text)
    for name, response in (
        ("tokenize", {"ids": ids, "count": len(ids)}),
        ("embed", {"vector": [0.5], "dimensions": 1}),
    ):
        await runs.checkpoint(claimed.lease, {"name": name, "skipped": False, "response": response})
    await runs.park(claimed.lease, "review")


async def test_a_step_whose_rules_read_the_input_is_judged_against_it(app: App) -> None:
    client, runtime = app
    await put_workflow(
        client,
        timed_workflow("scoped", validate=["response.approved || input.text == 'let it pass'"]),
    )
    parked = []
    for text in ("let it pass", "hold it"):
        response = await client.post(
            "/v1/workflow-runs", json={"workflow_name": "scoped", "input": {"text": text}}
        )
        job_id = (await response.json())["job"]["job_id"]
        await _park_review(runtime, job_id, text)
        parked.append(job_id)
    answers = []
    for job_id in parked:
        answer = await client.post(
            f"/v1/workflow-runs/{job_id}/steps/review:complete",
            json={"response": {"approved": False, "reviewer": "ann"}},
        )
        answers.append((await answer.json())["outcome"])
    assert answers == ["COMPLETED", "REJECTED"]


async def test_a_completion_that_keeps_hitting_a_defect_is_answered_invalid_with_its_ids(
    app: App, handler: CompletionHandler
) -> None:
    job_id = await _parked(app)

    async def broken(*_: Any) -> StepCompletionResult:
        raise TypeError("a bug, not an outage")

    handler._complete = broken  # type: ignore[method-assign]
    sent: list[tuple[bytes, bytes]] = []

    async def publish(key: bytes, value: bytes) -> None:
        sent.append((key, value))

    result = await answer_until_done(
        handler, ResultEncoder(None, "results"), publish, completion(job_id), base_s=0.01
    )
    # Still keyed by the job and echoing the ids, so its producer can match it.
    assert (result.outcome, result.job_id, result.step_name, result.request_id) == (
        Outcome.INVALID,
        job_id,
        "review",
        "req-review",
    )
    assert result.message == "internal error while completing: TypeError: a bug, not an outage"
    [(key, value)] = sent
    assert key == job_id.encode() and StepCompletionResult.FromString(value) == result
    assert (await app[1].require_runs().get(job_id)).status == "WAITING"


async def test_a_result_the_broker_refuses_for_good_makes_the_agent_unhealthy(app: App) -> None:
    # A results topic the worker may not write to (no ACL for it) holds the
    # completion, and its partition behind it, for good.
    _, runtime = app
    handler = CompletionHandler(
        runtime, decoder=MessageDecoder(StepCompletion, topic="t"), stuck_after_s=0.5
    )
    job_id = await _parked(app)
    refusing = True
    sent: list[tuple[bytes, bytes]] = []

    async def publish(key: bytes, value: bytes) -> None:
        if refusing:
            raise TopicAuthorizationFailedError()
        sent.append((key, value))

    answering = asyncio.ensure_future(
        answer_until_done(
            handler,
            ResultEncoder(None, "results"),
            publish,
            completion(job_id),
            base_s=0.01,
            cap_s=0.05,
        )
    )
    await asyncio.sleep(0.2)
    assert handler.health().healthy
    await asyncio.sleep(0.6)
    health = handler.health()
    assert not answering.done()
    assert not health.healthy, health
    assert health.summary.startswith("a completion has failed for"), health.summary
    assert "TopicAuthorizationFailedError" in health.summary, health.summary
    refusing = False
    result = await asyncio.wait_for(answering, timeout=5)
    assert result.outcome == Outcome.COMPLETED and len(sent) == 1
    assert handler.health().healthy
