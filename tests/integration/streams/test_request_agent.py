"""The request agent's decisions, in-process on a real Postgres (Kafka-free).

The Faust agent around ``RequestHandler`` only feeds it messages and acks them;
the end-to-end tests run it against a real broker.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any

import psycopg
import pytest
from aiokafka.errors import (
    KafkaTimeoutError,  # type: ignore[import-untyped]
    MessageSizeTooLargeError,
    TopicAuthorizationFailedError,
)
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from faust.exceptions import ProducerSendError

from schemas.contract import WorkflowRunRequest
from schemas.errors import NotFound, ResourceExhausted, UnstorableValue
from schemas.serde import RequestDecoder
from store.runs import RunStore
from streams.admission import Admission, QueueDepth
from streams.request_agent import Message, RequestHandler, handle_until_done
from streams.requests_dlq import DLQ_REASON_HEADER
from streams.runtime import Runtime
from streams.settings import Settings
from tests.integration.streams.conftest import Letters, running
from tests.workflows_fixtures import envelope, make_registry


def request(job_id: str, name: str = "stored", **input: Any) -> bytes:
    message = WorkflowRunRequest(job_id=job_id, workflow_name=name)
    message.input.update(input or {"text": "hello"})
    return message.SerializeToString()


@pytest.fixture
def letters() -> Letters:
    return Letters()


@pytest.fixture
def handler(runtime: Runtime, letters: Letters) -> RequestHandler:
    return RequestHandler(runtime, decoder=RequestDecoder(), dead_letter=letters, topic="t")


async def test_a_valid_request_is_submitted_once(handler: RequestHandler, runtime: Runtime) -> None:
    job_id = str(uuid.uuid4())
    first = await handler.handle(job_id.encode(), request(job_id))
    assert first.kind == "submitted"
    again = await handler.handle(job_id.encode(), request(job_id))
    assert again.kind == "existing"
    job = await runtime.require_runs().get(job_id)
    assert job.status == "QUEUED" and job.workflow_name == "stored"


async def test_undecodable_and_invalid_requests_become_dead_letters(
    handler: RequestHandler, letters: Letters
) -> None:
    garbage = b"\xff\xfe definitely not protobuf"
    assert (await handler.handle(b"k1", garbage)).kind == "dead_lettered"
    assert (await handler.handle(b"k2", request("42"))).kind == "dead_lettered"
    assert (await handler.handle(b"k3", request(str(uuid.uuid4()), name=""))).kind == (
        "dead_lettered"
    )
    assert (await handler.handle(b"k4", None)).kind == "dead_lettered"
    keys = [key for key, _, _ in letters.sent]
    assert keys == [b"k1", b"k2", b"k3", b"k4"]
    assert letters.sent[0][1] == garbage
    reasons = [reason for _, _, reason in letters.sent]
    assert "WorkflowRunRequest" in reasons[0]
    assert reasons[1] == "job_id: must be a valid UUID"
    assert "workflow_name" in reasons[2]
    assert "tombstone" in reasons[3]


async def test_unknown_workflows_and_bad_input_are_failed_jobs(
    handler: RequestHandler, runtime: Runtime, letters: Letters
) -> None:
    runs: RunStore = runtime.require_runs()
    unknown = str(uuid.uuid4())
    outcome = await handler.handle(None, request(unknown, name="missing"))
    assert outcome.kind == "failed"
    job = await runs.get(unknown)
    assert job.status == "FAILED"
    assert job.error == "unknown workflow 'missing': no stored definition"

    malformed = str(uuid.uuid4())
    assert (await handler.handle(None, request(malformed, name="has space"))).kind == "failed"
    assert "malformed" in ((await runs.get(malformed)).error or "")

    bad_input = str(uuid.uuid4())
    outcome = await handler.handle(None, request(bad_input, txt="typo"))
    assert outcome.kind == "failed"
    error = (await runs.get(bad_input)).error or ""
    assert "txt" in error
    assert letters.sent == []


async def test_a_store_outage_is_waited_out_not_skipped(
    handler: RequestHandler, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = runtime.require_runs()
    # Every submit writes through this one statement.
    real_submit = runs.write_submits
    failures = {"left": 3}

    async def flaky_submit(*args: Any, **kwargs: Any) -> Any:
        if failures["left"]:
            failures["left"] -= 1
            raise psycopg.OperationalError("connection refused")
        return await real_submit(*args, **kwargs)

    monkeypatch.setattr(runs, "write_submits", flaky_submit)
    job_id = str(uuid.uuid4())
    outcome = await handle_until_done(handler, None, request(job_id), base_s=0.01, cap_s=0.05)
    assert outcome.kind == "submitted"
    assert failures["left"] == 0
    assert (await runs.get(job_id)).status == "QUEUED"


async def test_a_persistent_defect_dead_letters_the_message(
    handler: RequestHandler, letters: Letters, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(
        key: bytes | None, value: bytes | None, trace: Any = None, position: str = ""
    ) -> Any:
        raise TypeError("a bug, not an outage")

    monkeypatch.setattr(handler, "handle", broken)
    outcome = await handle_until_done(handler, b"k", b"v", base_s=0.01, cap_s=0.02)
    assert outcome.kind == "dead_lettered"
    assert letters.sent == [
        (b"k", b"v", "internal error while handling the request: TypeError: a bug, not an outage")
    ]


async def test_a_dead_letter_the_broker_times_out_is_waited_for_and_keeps_its_reason(
    handler: RequestHandler, letters: Letters, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Faust's producer gives up on a send after its own timeout while the
    # broker is away: that is the broker's outage, not a defect of the
    # message, and the dead letter must still say why the request is there.
    timeouts = 4

    async def away_then_back(key: bytes | None, value: bytes | None, reason: str) -> None:
        nonlocal timeouts
        if timeouts:
            timeouts -= 1
            raise KafkaTimeoutError()
        await letters(key, value, reason)

    monkeypatch.setattr(handler, "_dead_letter", away_then_back)
    outcome = await handle_until_done(handler, b"k", b"not a request", base_s=0.01, cap_s=0.02)
    assert outcome.kind == "dead_lettered"
    assert timeouts == 0
    [(key, value, reason)] = letters.sent
    assert (key, value) == (b"k", b"not a request")
    assert "internal error" not in reason and "WorkflowRunRequest" in reason, reason


async def test_an_input_no_json_column_can_store_is_dead_lettered_at_once_naming_where(
    handler: RequestHandler, runtime: Runtime, letters: Letters
) -> None:
    # A Struct carries any double and any text; a job's jsonb input cannot.
    ids = [str(uuid.uuid4()) for _ in range(3)]
    inputs: list[dict[str, Any]] = [
        {"text": "a", "meta": {"tags": ["ok", "b\x00c"]}},
        {"text": "a", "meta": {"la\x00ng": "en"}},
        {"text": math.nan},
    ]
    for job_id, input in zip(ids, inputs, strict=True):
        assert (await handler.handle(b"k", request(job_id, **input))).kind == "dead_lettered"
    assert [reason for _, _, reason in letters.sent] == [
        "input.meta.tags[1] contains U+0000 (NUL), which is not accepted",
        "a field name in input.meta contains U+0000 (NUL), which is not accepted",
        "input.text is not a finite number: JSON has no NaN or Infinity,"
        " and a number must fit a double",
    ]
    for job_id in ids:
        with pytest.raises(NotFound):
            await runtime.require_runs().get(job_id)


async def test_a_request_the_database_refuses_is_dead_lettered_without_retries(
    handler: RequestHandler, runtime: Runtime, letters: Letters, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def refuses(*args: Any, **kwargs: Any) -> Any:
        raise UnstorableValue("the database refused to store a batch of 1 jobs: out of range")

    monkeypatch.setattr(runtime.require_runs(), "write_submits", refuses)
    outcome = await handle_until_done(handler, b"k", request(str(uuid.uuid4())), base_s=5.0)
    assert outcome.kind == "dead_lettered"
    assert [reason for _, _, reason in letters.sent] == [
        "the database refused to store a batch of 1 jobs: out of range"
    ]


class CountingAdmission(Admission):
    """Admission that counts its refusals, for a test to wait on."""

    def __init__(self, cap: int, *, refresh_s: float) -> None:
        super().__init__(cap, refresh_s=refresh_s)
        self.refusals = 0
        self._refused = asyncio.Condition()

    async def check(self, runs: QueueDepth) -> None:
        try:
            await super().check(runs)
        except ResourceExhausted:
            async with self._refused:
                self.refusals += 1
                self._refused.notify_all()
            raise

    async def refused_at_least(self, count: int) -> None:
        async with self._refused:
            await self._refused.wait_for(lambda: self.refusals >= count)


async def test_a_full_backlog_holds_requests_back_until_there_is_room(
    dsn: str, letters: Letters
) -> None:
    async with running(
        {
            "DATABASE_URL": dsn,
            "WFJOBS_ROLES": "api",
            "WFJOBS_WORKER_ID": "agent-test",
            "WFJOBS_MAX_QUEUED_JOBS": "1",
        }
    ) as runtime:
        # Every check reads the store, and each refusal is counted, so the test
        # waits on the agent's retries rather than on a clock.
        admission = CountingAdmission(runtime.admission.cap, refresh_s=0.0)
        runtime.admission = admission
        await runtime.require_definitions().put("stored", envelope(name="stored"))
        handler = RequestHandler(runtime, decoder=RequestDecoder(), dead_letter=letters, topic="t")
        first, second = str(uuid.uuid4()), str(uuid.uuid4())
        assert (await handler.handle(None, request(first))).kind == "submitted"

        # One attempt refuses; a replay of the admitted request is still absorbed.
        with pytest.raises(ResourceExhausted):
            await handler.handle(None, request(second))
        assert (await handler.handle(None, request(first))).kind == "existing"

        # The agent's loop waits (the offset does not move) until a worker
        # takes the queued job, then submits.
        waiting = asyncio.create_task(
            handle_until_done(handler, None, request(second), base_s=0.05, cap_s=0.2)
        )
        await asyncio.wait_for(admission.refused_at_least(admission.refusals + 3), timeout=10)
        assert not waiting.done()
        assert await runtime.require_runs().claim("agent-test") is not None
        outcome = await asyncio.wait_for(waiting, timeout=5)
        assert outcome.kind == "submitted"
        assert (await runtime.require_runs().get(second)).status == "QUEUED"
        assert letters.sent == []


class SizedLetters(Letters):
    """A dead-letter sink that refuses what Faust's producer refuses: a record
    (key, value and the reason header) above its max_request_size, 1 000 000 bytes."""

    async def __call__(self, key: bytes | None, value: bytes | None, reason: str) -> None:
        headers = [(DLQ_REASON_HEADER, reason.encode())]
        if DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers) > 1_000_000:
            # As faust's aiokafka driver wraps aiokafka's refusal.
            too_large = MessageSizeTooLargeError("larger than the maximum request size")
            raise ProducerSendError(f"Error while sending: {too_large!r}") from too_large
        await super().__call__(key, value, reason)


async def test_an_over_long_field_name_is_cut_in_the_reason_so_the_dead_letter_fits(
    runtime: Runtime,
) -> None:
    sized = SizedLetters()
    handler = RequestHandler(runtime, decoder=RequestDecoder(), dead_letter=sized, topic="t")
    value = request(str(uuid.uuid4()), **{"k" * 600_000: math.nan})
    outcome = await handle_until_done(handler, b"k", value, base_s=0.01, cap_s=0.02)
    assert outcome.kind == "dead_lettered"
    [(key, sent, reason)] = sized.sent
    assert (key, sent) == (b"k", value)
    assert (
        reason.startswith("input.kkk")
        and reason.endswith(
            "is not a finite number: JSON has no NaN or Infinity, and a number must fit a double"
        )
        and len(reason) < 400
    )


async def test_a_request_too_large_to_dead_letter_leaves_a_dead_letter_without_its_value(
    runtime: Runtime,
) -> None:
    # The broker takes up to 1 048 588 bytes on the request topic; Faust's
    # producer sends at most 1 000 000, the reason header included.
    sized = SizedLetters()
    handler = RequestHandler(runtime, decoder=RequestDecoder(), dead_letter=sized, topic="t")
    value = b"\xff" * 999_990
    outcome = await asyncio.wait_for(
        handle_until_done(handler, b"k", value, base_s=0.01, cap_s=0.02, position="3:41"),
        timeout=10,
    )
    assert outcome.kind == "dead_lettered"
    [(key, sent, reason)] = sized.sent
    assert (key, sent) == (b"k", None)
    assert reason.startswith("not a WorkflowRunRequest in plain Protobuf: ")
    assert reason.endswith(
        "; the request (999991 bytes) is too large for the dead-letter topic, so its value was"
        " left out: it stays on t at 3:41"
    ), reason


async def test_a_workflow_name_holding_nul_is_dead_lettered_naming_the_field(
    handler: RequestHandler, runtime: Runtime, letters: Letters
) -> None:
    job_id = str(uuid.uuid4())
    outcome = await handler.handle(b"k", request(job_id, name="sto\x00red"))
    assert outcome.kind == "dead_lettered"
    assert [reason for _, _, reason in letters.sent] == [
        "workflow_name contains U+0000 (NUL), which is not accepted"
    ]
    with pytest.raises(NotFound):
        await runtime.require_runs().get(job_id)


async def test_a_trusted_principal_no_token_could_name_is_dead_lettered_naming_the_field(
    dsn: str, letters: Letters
) -> None:
    settings = Settings.from_env(
        {
            "DATABASE_URL": dsn,
            "WFJOBS_ROLES": "api",
            "WFJOBS_WORKER_ID": "agent-test",
            "WFJOBS_TRUST_REQUEST_PRINCIPAL": "true",
        }
    )
    runtime = Runtime(settings, registry=make_registry())
    await runtime.start()
    try:
        await runtime.require_definitions().put("stored", envelope(name="stored"))
        handler = RequestHandler(runtime, decoder=RequestDecoder(), dead_letter=letters, topic="t")
        refused, kept = str(uuid.uuid4()), str(uuid.uuid4())
        for job_id, principal in ((refused, "team a\nforged line"), (kept, "team-a")):
            message = WorkflowRunRequest()
            message.ParseFromString(request(job_id))
            message.principal = principal
            await handler.handle(b"k", message.SerializeToString())
        [(_, _, reason)] = letters.sent
        assert reason.startswith("principal: principal 'team a\\nforged line' is malformed"), reason
        with pytest.raises(NotFound):
            await runtime.require_runs().get(refused)
        assert (await runtime.require_runs().get(kept)).owner == "team-a"
    finally:
        await runtime.stop()


async def test_a_submit_that_waits_on_the_store_past_the_bound_makes_the_agent_unhealthy(
    runtime: Runtime, letters: Letters, dsn: str
) -> None:
    handler = RequestHandler(
        runtime, decoder=RequestDecoder(), dead_letter=letters, topic="t", stuck_after_s=0.5
    )
    job_id = str(uuid.uuid4())
    message = Message(job_id.encode(), request(job_id))
    async with await psycopg.AsyncConnection.connect(dsn) as holder:
        # What a submit meets behind a migration's lock, or on a server gone silent.
        await holder.execute("LOCK TABLE workflow_run IN ACCESS EXCLUSIVE MODE")
        submitting = asyncio.ensure_future(handler.handle_batch([message]))
        await asyncio.sleep(0.2)
        assert not submitting.done()
        assert handler.health().healthy
        await asyncio.sleep(0.5)
        health = handler.health()
        assert not health.healthy
        assert health.detail["request_waiting_s"] >= 0.5
        assert health.summary.startswith("a request batch has waited")
        await holder.rollback()
    [outcome] = await submitting
    assert outcome.kind == "submitted"
    health = handler.health()
    assert health.healthy and health.detail["request_waiting_s"] == 0


async def test_a_dead_letter_the_broker_refuses_for_good_makes_the_agent_unhealthy(
    runtime: Runtime, letters: Letters
) -> None:
    # A dead-letter topic the worker may not write to (no ACL for it) holds the
    # request, and its partition behind it, for good.
    refusing = True

    async def refused_then_taken(key: bytes | None, value: bytes | None, reason: str) -> None:
        if refusing:
            raise TopicAuthorizationFailedError()
        await letters(key, value, reason)

    handler = RequestHandler(
        runtime,
        decoder=RequestDecoder(),
        dead_letter=refused_then_taken,
        topic="t",
        stuck_after_s=0.5,
    )
    handling = asyncio.ensure_future(
        handle_until_done(handler, b"k", b"not a request", base_s=0.01, cap_s=0.05)
    )
    await asyncio.sleep(0.2)
    assert handler.health().healthy
    await asyncio.sleep(0.6)
    health = handler.health()
    assert not handling.done()
    assert not health.healthy, health
    assert health.summary.startswith("a request has failed for"), health.summary
    assert "TopicAuthorizationFailedError" in health.summary, health.summary
    refusing = False
    outcome = await asyncio.wait_for(handling, timeout=5)
    assert outcome.kind == "dead_lettered"
    assert handler.health().healthy
