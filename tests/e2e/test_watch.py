"""``wfjobs watch`` against a real worker process: every event once, in order, and
an exit status that says how the job ended."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from typing import Any

import httpx
import pytest

from devstack.processes import free_port
from tests.e2e.harness import Stack
from tests.workflows_fixtures import envelope

pytestmark = pytest.mark.e2e

FLOW = "watch-flow"
OUTBOX_IDS_SQL = """
SELECT id FROM workflow_run_events_outbox WHERE job_id = %(job_id)s ORDER BY id
"""


async def _start(stack: Stack) -> str:
    worker = await stack.start_worker(
        "watch-w1", WFJOBS_PROGRESS_INTERVAL_S="0.1", WFJOBS_WATCH_POLL_S="0.1"
    )
    await stack.put_workflow(worker, envelope(name=FLOW, review=None))
    return worker.url


async def _watch(
    stack: Stack, url: str, job_id: str, *flags: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WFJOBS_TOKEN": stack.token, "WFJOBS_URL": url}
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "cli.main", "watch", *flags, job_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def _submit(url: str, stack: Stack, input: dict[str, Any]) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=10, headers=stack.headers) as http:
        answer = await http.post("/v1/workflow-runs", json={"workflow_name": FLOW, "input": input})
    assert answer.status_code == 201, answer.text
    job_id: str = answer.json()["job"]["job_id"]
    return job_id


async def _outbox_ids(stack: Stack, job_id: str) -> list[str]:
    async with stack.pool.connection() as conn:
        rows = await (await conn.execute(OUTBOX_IDS_SQL, {"job_id": job_id})).fetchall()
    return [str(row[0]) for row in rows]


async def test_watch_prints_every_event_once_in_order_and_exits_with_the_end_state(
    stack: Stack,
) -> None:
    url = await _start(stack)
    # Slow enough for the command to connect while its first step still runs:
    # an ended job's watch shows no progress.
    job_id = await _submit(url, stack, {"text": "watch me run", "delay_ms": 4000})
    done = await _watch(stack, url, job_id, "--json")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    events = [line for line in lines if line["event"] == "message"]
    # Every event the job has, once each, in commit order.
    assert [line["id"] for line in events] == await _outbox_ids(stack, job_id)
    assert [line["data"]["type"] for line in events] == [
        "TYPE_ACCEPTED",
        "TYPE_STEP_CHECKPOINT",
        "TYPE_STEP_CHECKPOINT",
        "TYPE_COMPLETED",
    ]
    # The slow step reported its quarters while the watch was open.
    progress = [line["data"] for line in lines if line["event"] == "progress"]
    assert progress and all(p["step_name"] == "tokenize" for p in progress)
    assert [p["fraction"] for p in progress] == sorted(p["fraction"] for p in progress)
    assert lines[-1] == {"event": "end", "id": "", "data": {"status": "COMPLETED"}}

    # A job that ends FAILED: the timeline says so, and the exit status is 3.
    job_id = await _submit(url, stack, {"text": "watch me fail", "fail": "NON_RETRYABLE"})
    done = await _watch(stack, url, job_id)
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert "ACCEPTED" in done.stdout and "job ended FAILED" in done.stdout
    assert "test fault NON_RETRYABLE" in done.stdout

    # A job nobody has: an error naming it, exit status 1.
    missing = str(uuid.uuid4())
    done = await _watch(stack, url, missing)
    assert done.returncode == 1
    assert "NOT_FOUND" in done.stderr and missing in done.stderr


async def test_a_watch_cut_by_a_dying_worker_resumes_on_the_next_and_misses_nothing(
    stack: Stack,
) -> None:
    port = free_port()
    first = await stack.start_worker("watch-a", WFJOBS_WEB_PORT=str(port))
    await stack.put_workflow(first, envelope(name=FLOW))
    job_id = await _submit(first.url, stack, {"text": "outlive a worker"})
    await stack.wait_for_job(job_id, ["WAITING"])
    env = {**os.environ, "WFJOBS_TOKEN": stack.token, "WFJOBS_URL": first.url}
    watch = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "cli.main",
        "watch",
        "--json",
        job_id,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert watch.stdout is not None
        seen = [json.loads(await watch.stdout.readline()) for _ in range(4)]
        assert seen[-1]["data"]["type"] == "TYPE_WAITING"
        # The stream is cut without a goodbye; the next worker answers on the same port.
        first.kill()
        second = await stack.start_worker(
            "watch-b", WFJOBS_WEB_PORT=str(port), WFJOBS_GROUP=f"{stack.group}-b"
        )
        async with httpx.AsyncClient(base_url=second.url, headers=stack.headers) as http:
            answer = await http.post(
                f"/v1/workflow-runs/{job_id}/steps/review:complete",
                json={"response": {"approved": True, "note": "after the crash"}},
            )
        assert answer.status_code == 200, answer.text
        out, err = await asyncio.wait_for(watch.communicate(), timeout=60)
    finally:
        if watch.returncode is None:
            watch.kill()
            await watch.wait()
    rest, errors = out.decode(), err.decode()
    assert watch.returncode == 0, errors
    lines = seen + [json.loads(line) for line in rest.splitlines()]
    ids = [line["id"] for line in lines if line["event"] == "message"]
    assert ids == await _outbox_ids(stack, job_id)
    assert lines[-1]["data"] == {"status": "COMPLETED"}
