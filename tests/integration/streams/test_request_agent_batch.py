"""The request agent's batches, in-process on a real Postgres (Kafka-free).

A batch is decided message by message as the agent decides one alone, but
submitted in one statement; the Faust loop around it acknowledges the batch's
offsets only after ``handle_batch_until_done`` returns.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any

import psycopg
import pytest

from schemas.contract import WorkflowRunRequest
from schemas.errors import NotFound, UnstorableValue
from schemas.serde import RequestDecoder
from store.outbox import Outbox
from store.pool import Pool
from streams.request_agent import Message, RequestHandler, handle_batch_until_done
from streams.runtime import Runtime
from tests.integration.streams.conftest import Letters
from tests.loop_gaps import with_longest_gap


@pytest.fixture
def letters() -> Letters:
    return Letters()


@pytest.fixture
def handler(runtime: Runtime, letters: Letters) -> RequestHandler:
    return RequestHandler(runtime, decoder=RequestDecoder(), dead_letter=letters, topic="t")


def request(job_id: uuid.UUID | str, name: str = "stored", **input: Any) -> bytes:
    message = WorkflowRunRequest(job_id=str(job_id), workflow_name=name)
    message.input.update(input or {"text": "hello"})
    return message.SerializeToString()


async def rows_of(pool: Pool, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    async with pool.connection() as conn:
        return await (await conn.execute(sql.encode(), params)).fetchall()


async def test_a_mixed_batch_is_decided_as_one_by_one_and_written_in_one_commit(
    handler: RequestHandler, runtime: Runtime, letters: Letters
) -> None:
    runs = runtime.require_runs()
    earlier, good, other, unknown, bad_input, not_json = (uuid.uuid4() for _ in range(6))
    assert (await handler.handle(None, request(earlier))).kind == "submitted"
    garbage = b"\xff\xfe not protobuf"
    messages: list[Message] = [
        Message(b"k1", request(good)),
        Message(b"k2", garbage),
        Message(b"k3", request(unknown, name="missing")),
        Message(b"k4", request(good, text="the same id again")),
        Message(b"k5", request(earlier)),
        Message(b"k6", request(bad_input, txt="typo")),
        Message(b"k7", request("42")),
        Message(b"k8", request(other)),
        Message(b"k9", request(not_json, text="a", meta={"scores": [1.0, math.nan]})),
    ]
    outcomes = await handler.handle_batch(messages)
    assert [outcome.kind for outcome in outcomes] == [
        "submitted",
        "dead_lettered",
        "failed",
        "existing",
        "existing",
        "failed",
        "dead_lettered",
        "submitted",
        "dead_lettered",
    ]
    assert [outcome.job_id for outcome in outcomes] == [
        good,
        None,
        unknown,
        good,
        earlier,
        bad_input,
        None,
        other,
        None,
    ]
    assert [(key, reason) for key, _, reason in letters.sent] == [
        (b"k2", letters.sent[0][2]),
        (b"k7", "job_id: must be a valid UUID"),
        (
            b"k9",
            "input.meta.scores[1] is not a finite number: JSON has no NaN or Infinity,"
            " and a number must fit a double",
        ),
    ]
    assert letters.sent[0][1] == garbage

    # The first request naming an id decides the job.
    assert (await runs.get(good)).input["text"] == "hello"
    assert (await runs.get(unknown)).error == "unknown workflow 'missing': no stored definition"
    assert "txt" in ((await runs.get(bad_input)).error or "")
    assert (await runs.get(other)).status == "QUEUED"
    with pytest.raises(NotFound):
        await runs.get(not_json)

    written = [good, unknown, bad_input, other]
    xmins = await rows_of(
        runs.pool, "SELECT DISTINCT xmin::text FROM workflow_run WHERE job_id = ANY(%s)", written
    )
    assert len(xmins) == 1
    outbox = Outbox(runs.pool)
    for job_id, kind in ((good, "ACCEPTED"), (unknown, "FAILED"), (earlier, "ACCEPTED")):
        assert [record.event_type for record in await outbox.events_for(job_id)] == [kind]


async def test_a_crash_between_the_commit_and_the_offsets_replays_harmlessly(
    runtime: Runtime, letters: Letters
) -> None:
    committed = asyncio.Event()

    async def stalls(key: bytes | None, value: bytes | None, reason: str) -> None:
        # Dead letters are sent after the batch's commit: the process dies here.
        committed.set()
        await asyncio.Event().wait()

    first = RequestHandler(runtime, decoder=RequestDecoder(), dead_letter=stalls, topic="t")
    good, refused = uuid.uuid4(), uuid.uuid4()
    messages: list[Message] = [
        Message(None, request(good)),
        Message(None, request(refused, name="missing")),
        Message(b"dead", b"\xff"),
    ]
    crashed = asyncio.create_task(handle_batch_until_done(first, messages))
    await asyncio.wait_for(committed.wait(), timeout=10)
    crashed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await crashed

    # No offset moved: the next owner of the partition reads the same batch.
    replay = RequestHandler(runtime, decoder=RequestDecoder(), dead_letter=letters, topic="t")
    outcomes = await handle_batch_until_done(replay, messages)
    assert [outcome.kind for outcome in outcomes] == ["existing", "existing", "dead_lettered"]
    assert [key for key, _, _ in letters.sent] == [b"dead"]
    outbox = Outbox(runtime.require_runs().pool)
    assert [r.event_type for r in await outbox.events_for(good)] == ["ACCEPTED"]
    assert [r.event_type for r in await outbox.events_for(refused)] == ["FAILED"]


async def test_a_store_outage_holds_the_whole_batch_until_it_commits(
    handler: RequestHandler, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = runtime.require_runs()
    real = runs.write_submits
    failures = {"left": 3}

    async def flaky(rows: Any) -> Any:
        if failures["left"]:
            failures["left"] -= 1
            raise psycopg.OperationalError("connection refused")
        return await real(rows)

    monkeypatch.setattr(runs, "write_submits", flaky)
    ids = [uuid.uuid4() for _ in range(3)]
    outcomes = await handle_batch_until_done(
        handler, [Message(None, request(job_id)) for job_id in ids], base_s=0.01, cap_s=0.05
    )
    assert [outcome.kind for outcome in outcomes] == ["submitted"] * 3
    assert failures["left"] == 0
    for job_id in ids:
        assert (await runtime.require_runs().get(job_id)).status == "QUEUED"


async def test_a_request_the_store_refuses_is_dead_lettered_alone(
    handler: RequestHandler, runtime: Runtime, letters: Letters, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = runtime.require_runs()
    good, poisoned = uuid.uuid4(), uuid.uuid4()
    real_write = runs.write_submits

    async def refuses_the_poisoned(rows: Any) -> Any:
        # As Postgres refuses a value it cannot store: the whole statement fails.
        if any(row["job_id"] == poisoned for row in rows):
            raise UnstorableValue(f"the database refused to store a batch of {len(rows)} jobs")
        return await real_write(rows)

    monkeypatch.setattr(runs, "write_submits", refuses_the_poisoned)
    messages: list[Message] = [Message(b"good", request(good)), Message(b"bad", request(poisoned))]
    # The batch is handled again one request at a time, the refused one
    # dead-lettered on its first try with the store's reason.
    outcomes = await handle_batch_until_done(handler, messages, base_s=5.0, cap_s=5.0)
    assert [outcome.kind for outcome in outcomes] == ["submitted", "dead_lettered"]
    assert (await runs.get(good)).status == "QUEUED"
    assert letters.sent == [
        (b"bad", messages[1].value, "the database refused to store a batch of 1 jobs")
    ]


async def test_decoding_a_batch_of_large_requests_does_not_hold_the_event_loop(
    handler: RequestHandler, runtime: Runtime
) -> None:
    # Turning a Struct of many values into JSON is pure Python, a good part of
    # a second for a request near the broker's limit; the claim loops,
    # heartbeats and the HTTP verbs share this loop meanwhile.
    ids = [uuid.uuid4() for _ in range(6)]
    messages = [Message(b"k", request(job_id, text="x", xs=list(range(90_000)))) for job_id in ids]
    assert all(len(message.value or b"") > 900_000 for message in messages)
    outcomes, longest = await with_longest_gap(handle_batch_until_done(handler, messages))
    assert [outcome.kind for outcome in outcomes] == ["failed"] * 6  # xs is no input field
    # Held for seconds when the batch was decoded in place; a margin for a busy machine.
    assert longest < 1.0, f"the loop was held for {longest:.2f}s"
