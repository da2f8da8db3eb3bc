"""Operators see and redrive what failed: FAILED outbox rows and dead-lettered requests.

Against the real Postgres and the real Kafka, through ``wfjobs`` and the HTTP
verbs of a real app; the relay is the runtime's own, built from the settings.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from typing import Any

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from schemas.contract import WorkflowRunRequest
from schemas.serde import RequestDecoder
from store.outbox import Outbox
from streams.request_agent import RequestHandler
from streams.requests_dlq import DLQ_REASON_HEADER, REDRIVEN_FROM_HEADER
from streams.runtime import Runtime
from tests.conftest import NewTopicFactory
from tests.integration.streams.conftest import parked_job, put_workflow, serve
from tests.integration.streams.operator_support import (
    FAST,
    Wfjobs,
    env_for,
    eventually,
    kinds,
    read_events,
    read_topic,
)
from tests.workflows_fixtures import envelope

MARK_FAILED_SQL = """
UPDATE workflow_run_events_outbox
   SET status = 'FAILED', attempts = 1, last_error = 'MSG_SIZE_TOO_LARGE: refused by the test'
 WHERE id = %(id)s
"""


async def _statuses(runtime: Runtime, job_id: str) -> list[str]:
    assert runtime.pool is not None
    return [row.status for row in await Outbox(runtime.pool).events_for(uuid.UUID(job_id))]


async def _error(response: Any, status: int, code: str) -> str:
    assert response.status == status, await response.text()
    body: dict[str, Any] = await response.json()
    assert body["code"] == code, body
    message: str = body["message"]
    return message


async def test_a_failed_outbox_row_is_redriven_and_published_before_its_jobs_later_events(
    dsn: str, kafka_bootstrap: str, new_topic: NewTopicFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = new_topic(kafka_bootstrap, partitions=1)
    # Written with no relay running: job A's first event is made FAILED before
    # anything is published, as a permanent broker refusal would leave it.
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client)
        held = await parked_job(client, runtime, "held back")
        assert runtime.pool is not None
        rows = await Outbox(runtime.pool).events_for(uuid.UUID(held))
        failed_id = rows[0].id
        async with runtime.pool.connection() as conn:
            await conn.execute(MARK_FAILED_SQL, {"id": failed_id})
        response = await client.post(
            "/v1/workflow-runs", json={"workflow_name": "web-review", "input": {"text": "free"}}
        )
        other = (await response.json())["job"]["job_id"]

    env = env_for(dsn, kafka_bootstrap, WFJOBS_ROLES="api,relay", WFJOBS_EVENTS_TOPIC=topic, **FAST)
    async with serve(env) as (client, runtime):
        wfjobs = Wfjobs(str(client.make_url("")), capsys)
        # The other job's event goes out; A's later events wait behind its FAILED one.
        first = await asyncio.to_thread(read_events, kafka_bootstrap, topic, 1)
        assert [event.job_id for event in first] == [other]
        assert await _statuses(runtime, held) == ["FAILED"] + ["PENDING"] * 3

        listed = await wfjobs.json("outbox", "list")
        assert [(e["id"], e["job_id"], e["event_type"]) for e in listed["events"]] == [
            (failed_id, held, "ACCEPTED")
        ]
        assert listed["events"][0]["last_error"].startswith("MSG_SIZE_TOO_LARGE")
        code, out, _ = await wfjobs("outbox", "list", "--job", held)
        assert code == 0 and "MSG_SIZE_TOO_LARGE" in out and str(failed_id) in out

        code, out, _ = await wfjobs("outbox", "redrive", str(failed_id))
        assert code == 0 and "redrove 1 outbox row(s) to PENDING" in out

        async def published() -> bool:
            return await _statuses(runtime, held) == ["PUBLISHED"] * 4

        await eventually(published, "the redriven row and the rows behind it to be published")
        events = await asyncio.to_thread(read_events, kafka_bootstrap, topic, 5)
        ours = [event for event in events if event.job_id == held]
        assert kinds(ours) == ["ACCEPTED", "STEP_CHECKPOINT", "STEP_CHECKPOINT", "WAITING"]
        assert [event.event_id for event in ours] == [row.id for row in rows]
        assert (await wfjobs.json("outbox", "list"))["events"] == []
        # The redriven row still tells what happened to it.
        assert runtime.pool is not None
        history = await Outbox(runtime.pool).events_for(uuid.UUID(held))
        assert history[0].last_error is not None
        assert history[0].last_error.startswith("MSG_SIZE_TOO_LARGE")


async def test_redrive_by_job_and_all_through_http_and_bad_input(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client)
        first = await parked_job(client, runtime, "first")
        assert runtime.pool is not None
        async with runtime.pool.connection() as conn:
            await conn.execute(
                "UPDATE workflow_run_events_outbox SET status = 'FAILED', last_error = 'x'"
            )
        second = await parked_job(client, runtime, "second")
        async with runtime.pool.connection() as conn:
            await conn.execute(
                "UPDATE workflow_run_events_outbox SET status = 'FAILED', last_error = 'y'"
                " WHERE job_id = %(job_id)s",
                {"job_id": uuid.UUID(second)},
            )
        wfjobs = Wfjobs(str(client.make_url("")), capsys)
        page = await wfjobs.json("outbox", "list", "--limit", "5")
        assert len(page["events"]) == 5 and page["next_page_token"]
        rest = await wfjobs.json(
            "outbox", "list", "--limit", "5", "--page-token", page["next_page_token"]
        )
        assert len(rest["events"]) == 3 and rest["next_page_token"] == ""

        by_job = await wfjobs.json("outbox", "redrive", "--job", first)
        assert {row["job_id"] for row in by_job["redriven"]} == {first}
        assert len(by_job["redriven"]) == 4
        assert await _statuses(runtime, first) == ["PENDING"] * 4
        code, out, _ = await wfjobs("outbox", "redrive", "--all")
        assert code == 0 and "redrove 4 outbox row(s)" in out
        assert await _statuses(runtime, second) == ["PENDING"] * 4
        code, out, _ = await wfjobs("outbox", "redrive", "1", "99999")
        assert code == 0 and "not FAILED (left alone)" in out and "99999" in out

        code, _, err = await wfjobs("outbox", "redrive", "--all", "--job", first)
        assert code == 1 and "INVALID_ARGUMENT" in err

        bad: list[tuple[Mapping[str, Any], str]] = [
            ({}, "takes exactly one of ids, job_id, all"),
            ({"ids": [1], "all": True}, "takes exactly one of ids, job_id, all"),
            ({"ids": []}, "ids must be a non-empty list"),
            ({"ids": ["1"]}, "ids must be a non-empty list"),
            ({"ids": [2**63]}, "ids must be outbox row ids, 1 to 9223372036854775807"),
            (
                {"ids": list(range(1, 1002))},
                "ids names 1001 outbox rows; a redrive takes at most 1000",
            ),
            ({"job_id": "nope"}, "job_id must be a UUID"),
            ({"all": "yes"}, "all must be true"),
            ({"everything": True}, "unknown field(s) everything"),
        ]
        for body, says in bad:
            response = await client.post("/v1/outbox:redrive", json=body)
            assert says in await _error(response, 400, "INVALID_ARGUMENT"), body
        for query, says in (
            ({"status": "PENDING"}, "status must be FAILED"),
            ({"limit": "many"}, "limit must be an integer"),
            ({"job_id": "x"}, "job_id must be a UUID"),
            ({"page_token": "abc"}, "page_token 'abc' is malformed"),
            ({"page_token": "\u00b2"}, "page_token '\u00b2' is malformed"),
            ({"colour": "red"}, "unknown query parameter(s) colour"),
        ):
            response = await client.get("/v1/outbox", params=query)
            assert says in await _error(response, 400, "INVALID_ARGUMENT"), query


async def test_a_job_that_does_not_exist_is_not_found_by_the_outbox_verbs(dsn: str) -> None:
    # The client's token is fleet-wide: one that reaches only its own jobs is
    # told the same of another owner's (tests/integration/auth).
    async with serve({"DATABASE_URL": dsn}) as (client, _):
        missing = str(uuid.uuid4())
        listed = await client.get("/v1/outbox", params={"job_id": missing})
        assert await _error(listed, 404, "NOT_FOUND") == f"job {missing} not found"
        redriven = await client.post("/v1/outbox:redrive", json={"job_id": missing})
        assert await _error(redriven, 404, "NOT_FOUND") == f"job {missing} not found"


# ---------------------------------------------------------------------- requests DLQ


def _producer(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "acks": "all"})


def _end_offsets(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "dlq-test-offsets"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in partitions
        )
    finally:
        consumer.close()


def _header(message: Message, name: str) -> bytes | None:
    headers = message.headers() or []
    pairs = list(headers.items()) if isinstance(headers, dict) else headers
    for key, value in pairs:
        if key == name:
            return value if isinstance(value, bytes) else str(value).encode()
    return None


async def test_dead_lettered_requests_are_listed_with_reasons_and_redriven(
    dsn: str, kafka_bootstrap: str, new_topic: NewTopicFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    requests = new_topic(kafka_bootstrap, partitions=1)
    dlq = new_topic(kafka_bootstrap, partitions=2)
    env = env_for(
        dsn, kafka_bootstrap, WFJOBS_REQUESTS_TOPIC=requests, WFJOBS_REQUESTS_DLQ_TOPIC=dlq
    )
    producer = _producer(kafka_bootstrap)

    async def dead_letter(key: bytes | None, value: bytes | None, reason: str) -> None:
        # What the request agent sends, to the real dead-letter topic.
        producer.produce(dlq, key=key, value=value, headers=[(DLQ_REASON_HEADER, reason.encode())])
        assert producer.flush(30) == 0

    async with serve(env) as (client, runtime):
        await runtime.require_definitions().put("stored", envelope(name="stored"))
        handler = RequestHandler(
            runtime, decoder=RequestDecoder(), dead_letter=dead_letter, topic=requests
        )
        garbage = b"\xff\xfe not a request"
        assert (await handler.handle(b"garbage-key", garbage)).kind == "dead_lettered"
        # A good request set aside by a passing fault: redriving it is the fix.
        job_id = str(uuid.uuid4())
        request = WorkflowRunRequest(job_id=job_id, workflow_name="stored")
        request.input.update({"text": "try me again"})
        good = request.SerializeToString()
        await handler.reject(
            job_id.encode(), good, "internal error while handling the request: a passing fault"
        )

        wfjobs = Wfjobs(str(client.make_url("")), capsys)
        listed = await wfjobs.json("dlq", "list")
        assert listed["topic"] == dlq and listed["total"] == 2
        by_key = {message["key"]: message for message in listed["messages"]}
        assert set(by_key) == {"garbage-key", job_id}
        assert "WorkflowRunRequest" in by_key["garbage-key"]["reason"]
        assert by_key["garbage-key"]["job_id"] == "" and by_key["garbage-key"]["size"] == len(
            garbage
        )
        assert by_key[job_id]["reason"].endswith("a passing fault")
        assert (by_key[job_id]["job_id"], by_key[job_id]["workflow_name"]) == (job_id, "stored")
        assert by_key[job_id]["timestamp"]
        code, out, _ = await wfjobs("dlq", "list", "--max", "1")
        assert code == 0 and f"{dlq}: 2 message(s), 1 shown" in out

        position = f"{by_key[job_id]['partition']}:{by_key[job_id]['offset']}"
        code, out, _ = await wfjobs("dlq", "redrive", "--offset", position)
        assert code == 0 and f"redrove 1 dead letter(s) to {requests}" in out and job_id in out
        [redriven] = await asyncio.to_thread(read_topic, kafka_bootstrap, requests, 1)
        assert (redriven.key(), redriven.value()) == (job_id.encode(), good)
        assert _header(redriven, REDRIVEN_FROM_HEADER) == f"{dlq}:{position}".encode()
        # The request agent takes the redriven copy like any request.
        outcome = await handler.handle(redriven.key(), redriven.value())
        assert outcome.kind == "submitted"
        assert (await runtime.require_runs().get(job_id)).status == "QUEUED"

        # A position that holds nothing: refused whole, nothing produced.
        response = await client.post(
            "/v1/requests-dlq:redrive",
            json={"positions": [{"partition": 0, "offset": 0}, {"partition": 1, "offset": 50}]},
        )
        message = await _error(response, 404, "NOT_FOUND")
        assert "1:50" in message and "nothing was redriven" in message
        assert await asyncio.to_thread(_end_offsets, kafka_bootstrap, requests) == 1

        everything = await wfjobs.json("dlq", "redrive", "--all")
        assert {m["key"] for m in everything["redriven"]} == {"garbage-key", job_id}
        assert await asyncio.to_thread(_end_offsets, kafka_bootstrap, requests) == 3

        for body, says in (
            ({}, "takes exactly one of positions, all"),
            ({"positions": []}, "positions must be a non-empty list"),
            ({"positions": ["0:1"]}, "each of positions is"),
            ({"positions": [{"partition": -1, "offset": 0}]}, "each of positions is"),
            ({"positions": [{"partition": 2**31, "offset": 0}]}, "within 0..2147483647"),
            ({"positions": [{"partition": 0, "offset": 2**63}]}, "within 0..9223372036854775807"),
            ({"positions": [{"partition": 0, "offset": 0}], "all": True}, "exactly one of"),
        ):
            response = await client.post("/v1/requests-dlq:redrive", json=body)
            assert says in await _error(response, 400, "INVALID_ARGUMENT"), body
        for query, says in (
            ({"max": "0"}, "max must be within 1..1000"),
            ({"max": "lots"}, "max must be an integer"),
            ({"from": "1"}, "unknown query parameter(s) from"),
        ):
            response = await client.get("/v1/requests-dlq", params=query)
            assert says in await _error(response, 400, "INVALID_ARGUMENT"), query
        for offset in ("nope", "0:²", "0:99999999999999999999"):
            code, _, err = await wfjobs("dlq", "redrive", "--offset", offset)
            assert code == 1 and "PARTITION:OFFSET" in err, (offset, err)


async def test_a_missing_dead_letter_topic_lists_nothing(
    dsn: str, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    env = env_for(dsn, kafka_bootstrap, WFJOBS_REQUESTS_DLQ_TOPIC=f"absent-{uuid.uuid4().hex}")
    async with serve(env) as (client, _):
        listed = await Wfjobs(str(client.make_url("")), capsys).json("dlq", "list")
        assert listed["total"] == 0 and listed["messages"] == []


async def test_dead_lettered_requests_are_listed_a_page_at_a_time(
    dsn: str, kafka_bootstrap: str, new_topic: NewTopicFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    dlq = new_topic(kafka_bootstrap, partitions=2)
    env = env_for(dsn, kafka_bootstrap, WFJOBS_REQUESTS_DLQ_TOPIC=dlq)
    producer = _producer(kafka_bootstrap)
    for partition, count in ((0, 3), (1, 2)):
        for index in range(count):
            producer.produce(
                dlq, key=f"{partition}-{index}".encode(), value=b"x", partition=partition
            )
    assert producer.flush(30) == 0
    async with serve(env) as (client, _):
        listed: list[str] = []
        tokens: list[str] = []
        query = {"max": "2"}
        while True:
            response = await client.get("/v1/requests-dlq", params=query)
            assert response.status == 200, await response.text()
            page = await response.json()
            assert page["total"] == 5
            listed += [message["key"] for message in page["messages"]]
            if not page["next_page_token"]:
                break
            tokens.append(page["next_page_token"])
            query["page_token"] = page["next_page_token"]
        assert listed == ["0-0", "0-1", "0-2", "1-0", "1-1"]
        assert tokens == ["0:2", "1:1"]
        # A page that ends on the last message says there is no next one.
        everything = await (await client.get("/v1/requests-dlq", params={"max": "5"})).json()
        assert len(everything["messages"]) == 5 and everything["next_page_token"] == ""

        wfjobs = Wfjobs(str(client.make_url("")), capsys)
        code, out, _ = await wfjobs("dlq", "list", "--max", "3", "--page-token", "0:1")
        assert code == 0 and "3 shown" in out and "next page: --page-token 1:1" in out
        for token in ("2", "0:x", "0:\u00b2", "-1:0", f"{2**31}:0", " 0:1"):
            response = await client.get("/v1/requests-dlq", params={"page_token": token})
            message = await _error(response, 400, "INVALID_ARGUMENT")
            assert message == (
                f"page_token {token!r} is malformed; pass the next_page_token of a previous answer"
            ), token
