"""Watching one job over Server-Sent Events, on the server a deployment runs.

The jobs are driven through the store as a worker would (the API process runs
no claim loop), so each test decides exactly when each commit point lands.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from cli.main import main as cli_main
from store.progress import ProgressReport, ProgressStore
from store.records import ClaimedJob
from store.tokens import create_token, revoke_token
from streams import auth
from streams.http_errors import REQUEST_ID_HEADER
from tests.integration.http.conftest import LiveApi, live, parked_job
from tests.integration.streams.conftest import WEB_WORKFLOW

pytestmark = pytest.mark.asyncio


@dataclass(frozen=True)
class Sse:
    event: str
    data: Any
    id: str


async def sse_messages(response: aiohttp.ClientResponse) -> AsyncIterator[Sse]:
    """The messages of an event stream, parsed as the SSE format says (comments dropped)."""
    fields: dict[str, str] = {}
    async for raw in response.content:
        line = raw.decode().rstrip("\n").rstrip("\r")
        if line == "":
            if "data" in fields:
                yield Sse(
                    fields.get("event", "message"), json.loads(fields["data"]), fields.get("id", "")
                )
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")


async def store_review(api: LiveApi) -> None:
    path = api.url + "/v1/workflows/web-review"
    async with api.session.put(path, json={"workflow": WEB_WORKFLOW}, headers=api.auth) as r:
        assert r.status in (200, 201), await r.text()


async def running_review_job(api: LiveApi) -> tuple[str, ClaimedJob]:
    """A job of the stored review workflow, submitted over HTTP and claimed by ``http-test``."""
    await store_review(api)
    body = {"workflow_name": "web-review", "input": {"text": "look"}}
    async with api.session.post(api.url + "/v1/workflow-runs", json=body, headers=api.auth) as r:
        job_id = (await r.json())["job"]["job_id"]
    claimed = await api.runtime.require_runs().claim("http-test")
    assert claimed is not None
    return job_id, claimed


def events_path(job_id: str) -> str:
    return f"/v1/workflow-runs/{job_id}/events"


async def test_a_watch_sends_the_events_so_far_then_live_ones_and_ends_at_the_terminal_one(
    live_api: LiveApi,
) -> None:
    await store_review(live_api)
    job_id = await parked_job(live_api)
    runs = live_api.runtime.require_runs()
    url = live_api.url + events_path(job_id)
    async with live_api.session.get(url, headers=live_api.auth) as response:
        assert response.status == 200
        assert response.content_type == "text/event-stream"
        messages = sse_messages(response)
        seen = [await anext(messages) for _ in range(4)]
        assert [m.data["type"] for m in seen] == [
            "TYPE_ACCEPTED",
            "TYPE_STEP_CHECKPOINT",
            "TYPE_STEP_CHECKPOINT",
            "TYPE_WAITING",
        ]
        assert all(m.event == "message" and m.data["job_id"] == job_id for m in seen)
        ids = [int(m.id) for m in seen]
        assert ids == sorted(ids) and [m.data["event_id"] for m in seen] == [str(i) for i in ids]
        # Live from here: the review is answered, a worker claims and settles.
        answered = await live_api.session.post(
            live_api.url + f"/v1/workflow-runs/{job_id}/steps/review:complete",
            json={"response": {"approved": True, "note": "fine"}},
            headers=live_api.auth,
        )
        assert answered.status == 200, await answered.text()
        claimed = await runs.claim("http-test")
        assert claimed is not None
        await runs.complete(claimed.lease, result={"ok": True}, verdict="done")
        rest = [message async for message in messages]
    assert [m.data.get("type") for m in rest[:-1]] == ["TYPE_STEP_CHECKPOINT", "TYPE_COMPLETED"]
    assert rest[-1].event == "end" and rest[-1].data == {"status": "COMPLETED"}
    # A finished job's watch sends its whole history at once and ends.
    async with live_api.session.get(url, headers=live_api.auth) as again:
        replay = [message async for message in sse_messages(again)]
    assert [m.id for m in replay[:-1]] == [m.id for m in seen + rest[:-1]]


async def test_last_event_id_resumes_after_that_event(live_api: LiveApi) -> None:
    await store_review(live_api)
    job_id = await parked_job(live_api)
    await live_api.runtime.require_control().cancel(uuid.UUID(job_id), reason="enough")
    url = live_api.url + events_path(job_id)
    async with live_api.session.get(url, headers=live_api.auth) as response:
        everything = [m async for m in sse_messages(response)]
    second = everything[1].id
    headers = {**live_api.auth, "Last-Event-ID": second}
    async with live_api.session.get(url, headers=headers) as response:
        resumed = [m async for m in sse_messages(response)]
    assert [m.id for m in resumed] == [m.id for m in everything[2:]]
    assert resumed[-2].data["type"] == "TYPE_CANCELLED"
    async with live_api.session.get(url + f"?after={second}", headers=live_api.auth) as response:
        assert [m.id for m in [m async for m in sse_messages(response)]] == [
            m.id for m in everything[2:]
        ]


async def test_progress_reaches_the_watcher_and_a_lost_claim_cannot_write_it(
    live_api: LiveApi,
) -> None:
    job_id, claimed = await running_review_job(live_api)
    runs = live_api.runtime.require_runs()
    lease = claimed.lease
    progress = ProgressStore(runs.pool)
    stale = ProgressReport(lease.job_id, lease.token - 1, lease.attempt, "tokenize", 0.9, "old")
    assert await progress.record([stale]) == 0
    fresh = ProgressReport(lease.job_id, lease.token, lease.attempt, "tokenize", 0.25, "1 of 4")
    assert await progress.record([fresh]) == 1
    url = live_api.url + events_path(job_id)
    async with live_api.session.get(url, headers=live_api.auth) as response:
        messages = sse_messages(response)
        first = [await anext(messages) for _ in range(2)]
        assert first[0].data["type"] == "TYPE_ACCEPTED"
        assert first[1].event == "progress"
        assert first[1].data["step_name"] == "tokenize"
        assert first[1].data["fraction"] == 0.25 and first[1].data["message"] == "1 of 4"
        await runs.fail(lease, error="gave up")
        rest = [m async for m in messages]
    assert rest[-1].data == {"status": "FAILED"}
    # The claim is gone now: nothing it reports is stored.
    assert await progress.record([fresh]) == 0


async def test_a_bad_watch_request_is_refused_before_any_stream_starts(
    live_api: LiveApi,
) -> None:
    await store_review(live_api)
    job_id = await parked_job(live_api)
    url = live_api.url + events_path(job_id)
    refusals = [
        (url, {"Last-Event-ID": "-1"}, 400, "Last-Event-ID"),
        (url + "?after=x", {}, 400, "after"),
        # Superscript two: a digit to str.isdigit, but no number to int().
        (url + "?after=%C2%B2", {}, 400, "after"),
        (url, {"Last-Event-ID": "\u00b2"}, 400, "Last-Event-ID"),
        (url + "?since=1", {}, 400, "since"),
        (live_api.url + events_path(str(uuid.uuid4())), {}, 404, ""),
        (live_api.url + events_path("not-a-uuid"), {}, 400, "job_id"),
    ]
    for target, extra, status, named in refusals:
        async with live_api.session.get(target, headers={**live_api.auth, **extra}) as r:
            assert r.status == status, await r.text()
            assert r.content_type == "application/json"
            assert named in (await r.json())["message"]
    async with live_api.session.get(url) as r:
        assert r.status == 401


async def test_watchers_past_the_limit_are_told_to_come_back_later(
    make_database: Any,
) -> None:
    async with live({"DATABASE_URL": make_database(migrated=True), "WFJOBS_WATCH_MAX": "1"}) as api:
        await store_review(api)
        job_id = await parked_job(api)
        url = api.url + events_path(job_id)
        async with api.session.get(url, headers=api.auth) as first:
            assert (await anext(sse_messages(first))).data["type"] == "TYPE_ACCEPTED"
            async with api.session.get(url, headers=api.auth) as second:
                assert second.status == 429
                assert "1 watchers" in (await second.json())["message"]
        # The first watcher left; the slot is free again.
        for _ in range(50):
            if api.runtime.require_watch().watchers == 0:
                break
            await asyncio.sleep(0.05)
        async with api.session.get(url, headers=api.auth) as third:
            assert third.status == 200


async def test_watchers_arriving_together_are_held_to_the_limit(make_database: Any) -> None:
    async with live({"DATABASE_URL": make_database(migrated=True), "WFJOBS_WATCH_MAX": "2"}) as api:
        await store_review(api)
        job_id = await parked_job(api)
        url = api.url + events_path(job_id)
        # Each is admitted before the job is read and the stream begins: the
        # place must be taken when admitted, or all of them get in.
        responses = await asyncio.gather(
            *(api.session.get(url, headers=api.auth) for _ in range(6))
        )
        try:
            statuses = sorted(response.status for response in responses)
            assert statuses == [200, 200, 429, 429, 429, 429], statuses
            assert api.runtime.require_watch().watchers == 2
        finally:
            for response in responses:
                response.close()
        for _ in range(50):
            if api.runtime.require_watch().watchers == 0:
                break
            await asyncio.sleep(0.05)
        assert api.runtime.require_watch().watchers == 0
        # A refusal after admission (no such job) gives its place back.
        missing = api.url + events_path(str(uuid.uuid4()))
        for _ in range(3):
            async with api.session.get(missing, headers=api.auth) as r:
                assert r.status == 404, await r.text()
        assert api.runtime.require_watch().watchers == 0
        async with api.session.get(url, headers=api.auth) as again:
            assert again.status == 200


async def test_stopping_the_server_ends_open_watches_at_once(make_database: Any) -> None:
    watcher = aiohttp.ClientSession()
    try:
        async with live({"DATABASE_URL": make_database(migrated=True)}) as api:
            await store_review(api)
            job_id = await parked_job(api)
            response = await watcher.get(api.url + events_path(job_id), headers=api.auth)
            messages = sse_messages(response)
            assert (await anext(messages)).data["type"] == "TYPE_ACCEPTED"
            started = asyncio.get_running_loop().time()
        # The stream ended without an ``end`` message: the client reconnects.
        assert [m.data["type"] for m in [m async for m in messages]] == [
            "TYPE_STEP_CHECKPOINT",
            "TYPE_STEP_CHECKPOINT",
            "TYPE_WAITING",
        ]
        assert asyncio.get_running_loop().time() - started < 5.0
    finally:
        await watcher.close()


async def test_a_watcher_that_stops_reading_gives_its_place_back(live_api: LiveApi) -> None:
    job_id, claimed = await running_review_job(live_api)
    runs = live_api.runtime.require_runs()
    # More than the socket buffers of both ends hold, so the server's writes block.
    for i in range(20):
        entry = {"name": f"step{i}", "skipped": False, "response": {"blob": "x" * 500_000}}
        await runs.checkpoint(claimed.lease, entry)
    watch = live_api.runtime.require_watch()
    watch.write_timeout_s = 1.0
    loop = asyncio.get_running_loop()
    # A client that sends its request and never reads again (a frozen tab, a
    # stalled proxy): its connection stays open and its window shut.
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.setblocking(False)
    try:
        await loop.sock_connect(client, (live_api.host, live_api.port))
        request = (
            f"GET {events_path(job_id)} HTTP/1.1\r\nHost: {live_api.host}\r\n"
            f"Authorization: {live_api.auth['Authorization']}\r\n\r\n"
        )
        await loop.sock_sendall(client, request.encode())
        for _ in range(100):
            if watch.watchers == 1:
                break
            await asyncio.sleep(0.05)
        assert watch.watchers == 1
        for _ in range(200):
            if watch.watchers == 0:
                break
            await asyncio.sleep(0.05)
        assert watch.watchers == 0, "a client that reads nothing still holds its place"
    finally:
        client.close()


async def test_wfjobs_watch_waits_for_a_place_when_the_watchers_are_full(
    make_database: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async with live({"DATABASE_URL": make_database(migrated=True), "WFJOBS_WATCH_MAX": "1"}) as api:
        await store_review(api)
        job_id = await parked_job(api)
        monkeypatch.setenv("WFJOBS_TOKEN", api.auth["Authorization"].removeprefix("Bearer "))
        watch = api.runtime.require_watch()
        url = api.url + events_path(job_id)
        async with api.session.get(url, headers=api.auth) as first:
            assert first.status == 200 and watch.watchers == 1
            # The server answers 429 "retry later": the command does, as it does
            # for a stream that is cut, rather than give up on a live job.
            command = asyncio.ensure_future(
                asyncio.to_thread(cli_main, ["--url", api.url, "watch", job_id])
            )
            await asyncio.sleep(1.5)
            assert not command.done(), capsys.readouterr().err
        await api.runtime.require_control().cancel(uuid.UUID(job_id), reason="enough")
        assert await asyncio.wait_for(command, timeout=20) == 5
    assert "CANCELLED" in capsys.readouterr().out


async def test_a_revoked_token_ends_its_open_watch_within_a_second(
    make_database: Any,
) -> None:
    # A parked job can be watched for days: the token is checked again while it is.
    dsn = make_database(migrated=True)
    async with live({"DATABASE_URL": dsn}) as api:
        await store_review(api)
        job_id = await parked_job(api)
        issued = await create_token(dsn, "http-tester", ["read"])
        headers = {"Authorization": f"Bearer {issued.token}"}
        url = api.url + events_path(job_id)
        async with api.session.get(url, headers=headers) as response:
            assert response.status == 200
            messages = sse_messages(response)
            assert [(await anext(messages)).data["type"] for _ in range(4)][-1] == "TYPE_WAITING"
            await revoke_token(dsn, issued.record.id)
            revoked_at = time.monotonic()
            rest = [m async for m in messages]
            assert time.monotonic() - revoked_at < 1 + auth.VERIFIED_FOR_S + 1
        assert rest == [], "the stream ended without the job's end"
        async with api.session.get(url, headers=headers) as again:
            assert again.status == 401


async def test_the_event_stream_carries_a_request_id_like_every_answer(live_api: LiveApi) -> None:
    await store_review(live_api)
    job_id = await parked_job(live_api)
    await live_api.runtime.require_control().cancel(uuid.UUID(job_id), reason="enough")
    url = live_api.url + events_path(job_id)
    async with live_api.session.get(url, headers=live_api.auth) as response:
        assert response.status == 200
        assert response.headers.get(REQUEST_ID_HEADER), dict(response.headers)
        assert [m async for m in sse_messages(response)][-1].event == "end"


async def test_progress_is_only_sent_while_the_claim_that_reported_it_holds_the_job(
    live_api: LiveApi,
) -> None:
    job_id, claimed = await running_review_job(live_api)
    runs = live_api.runtime.require_runs()
    lease = claimed.lease
    report = ProgressReport(lease.job_id, lease.token, lease.attempt, "tokenize", 0.5, "half")
    assert await ProgressStore(runs.pool).record([report]) == 1
    url = live_api.url + events_path(job_id)

    async def one_pass() -> list[Sse]:
        # Long enough for a running job's first read; a terminal one ends by itself.
        got: list[Sse] = []
        async with live_api.session.get(url, headers=live_api.auth) as response:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.5):
                    async for message in sse_messages(response):
                        got.append(message)
        return got

    assert [m.event for m in await one_pass()] == ["message", "progress"]
    # Requeued for a retry: attempt 1's step is not running any more.
    await runs.retry_or_die(lease, "try again")
    async with runs.pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run SET run_after = now() WHERE job_id = %s", (lease.job_id,)
        )
    assert "progress" not in [m.event for m in await one_pass()]
    again = await runs.claim("http-test")
    assert again is not None and again.lease.attempt == lease.attempt + 1
    assert "progress" not in [m.event for m in await one_pass()]
    second = ProgressReport(lease.job_id, again.lease.token, again.lease.attempt, "embed", 0.5, "")
    assert await ProgressStore(runs.pool).record([second]) == 1
    assert [m.event for m in await one_pass()][-1] == "progress"
    # Handed back and claimed again, under the same attempt number: the new
    # claim has reported nothing yet.
    await runs.hand_back(again.lease)
    third = await runs.claim("http-test")
    assert third is not None and third.lease.attempt == again.lease.attempt
    assert "progress" not in [m.event for m in await one_pass()]
    await runs.fail(third.lease, error="gave up")
    ended = await one_pass()
    assert ended[-1].event == "end" and ended[-1].data == {"status": "FAILED"}
    assert "progress" not in [m.event for m in ended]


async def test_a_head_of_a_watch_answers_its_headers_alone_and_holds_no_place(
    live_api: LiveApi,
) -> None:
    await store_review(live_api)
    job_id = await parked_job(live_api)
    watch = live_api.runtime.watch
    assert watch is not None
    reader, writer = await asyncio.open_connection(live_api.host, live_api.port)
    try:
        authorization = live_api.auth["Authorization"]
        # Both requests on one connection: whatever follows the HEAD's headers
        # is read as the answer to the next.
        writer.write(
            f"HEAD {events_path(job_id)} HTTP/1.1\r\nHost: x\r\nAuthorization: {authorization}"
            "\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
        )
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=10)
    finally:
        writer.close()
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), answer
    assert b"Content-Type: text/event-stream; charset=utf-8" in head
    assert rest.startswith(b"HTTP/1.1 200 "), rest[:200]
    assert watch.watchers == 0
