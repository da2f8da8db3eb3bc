"""Cancel through a real worker process and the real Kafka.

One worker with a single runner and a short heartbeat serves the module: a job
whose second step sleeps 30 s holds the runner, so a job submitted after it
stays QUEUED, and a job parked on its review step waits beside them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from devstack.postgres import PostgresService
from store.migrate import migrate
from store.pool import open_pool
from tests.e2e.harness import Stack, dedupe, type_name, wait_until
from tests.forkserver import ForkServer
from tests.workflows_fixtures import TOKENIZE, envelope

pytestmark = pytest.mark.e2e

HEARTBEAT_S = 0.5
SLOW = "cancel-slow"
REVIEW = "cancel-review"
ENDED_SQL = """
SELECT a.ended_at - r.cancel_requested_at, a.outcome, a.error_class
  FROM workflow_run_attempt AS a JOIN workflow_run AS r USING (job_id)
 WHERE a.job_id = %(job_id)s
"""


def slow_workflow() -> dict[str, Any]:
    """tokenize, then a step that sleeps for the input's ``delay_ms``."""
    workflow = envelope(name=SLOW, review=None, output=["ids = tokenize.ids"])
    workflow["steps"] = [
        {"name": "tokenize", "method": TOKENIZE, "target": "local", "rules": ["text = input.text"]},
        {
            "name": "linger",
            "method": TOKENIZE,
            "target": "local",
            "rules": ["text = input.text", "delay_ms = input.delay_ms"],
        },
    ]
    return workflow


@pytest.fixture(scope="module")
async def cancel_stack(
    postgres_server: PostgresService,
    kafka_bootstrap: str,
    tmp_path_factory: pytest.TempPathFactory,
    fork_server: ForkServer,
) -> AsyncIterator[tuple[Stack, str]]:
    dsn = postgres_server.create_database("cancel")
    await migrate(dsn)
    suffix = uuid.uuid4().hex[:10]
    topics = {
        "requests": f"e2e-cancel-requests-{suffix}",
        "dlq": f"e2e-cancel-dlq-{suffix}",
        "events": f"e2e-cancel-events-{suffix}",
        # Made by the worker (WFJOBS_CREATE_TOPICS) before it subscribes.
        "completions": f"e2e-cancel-completions-{suffix}",
        "completion_results": f"e2e-cancel-completion-results-{suffix}",
    }
    pool = await open_pool(dsn, min_size=1, max_size=4)
    stack = Stack(
        dsn=dsn,
        bootstrap=kafka_bootstrap,
        topics=topics,
        tmp=tmp_path_factory.mktemp("cancel"),
        pool=pool,
        launch=fork_server,
    )
    try:
        worker = await stack.start_worker(
            "cancel-w1",
            WFJOBS_CLAIM_LOOPS="1",
            WFJOBS_HEARTBEAT_S=str(HEARTBEAT_S),
            WFJOBS_CREATE_TOPICS="true",
            WFJOBS_TOPIC_PARTITIONS="1",
        )
        await stack.put_workflow(worker, slow_workflow())
        await stack.put_workflow(worker, envelope(name=REVIEW))
        yield stack, worker.url
    finally:
        stack.stop_workers()
        await pool.close()
        postgres_server.drop_database(dsn)


async def _submit(http: httpx.AsyncClient, workflow: str, input: dict[str, Any]) -> str:
    answer = await http.post("/v1/workflow-runs", json={"workflow_name": workflow, "input": input})
    assert answer.status_code == 201, answer.text
    job_id: str = answer.json()["job"]["job_id"]
    return job_id


async def test_queued_waiting_and_running_jobs_are_cancelled_within_two_heartbeats(
    cancel_stack: tuple[Stack, str],
) -> None:
    stack, url = cancel_stack
    reader = stack.event_reader(1)
    async with httpx.AsyncClient(base_url=url, timeout=10, headers=stack.headers) as http:
        waiting = await _submit(http, REVIEW, {"text": "park me"})
        await stack.wait_for_job(waiting, ["WAITING"])
        running = await _submit(http, SLOW, {"text": "sleep in linger", "delay_ms": 30_000})

        async def lingering() -> bool | None:
            return True if len(stack.calls_for(running, TOKENIZE)) == 2 else None

        await wait_until(lingering, timeout_s=30)
        # The only runner sleeps in ``linger``: this one stays QUEUED.
        queued = await _submit(http, SLOW, {"text": "never claimed"})
        assert (await stack.job(queued)).status == "QUEUED"

        answers = await asyncio.gather(
            *(
                http.post(f"/v1/workflow-runs/{job_id}:cancel", json={"reason": f"stop {name}"})
                for name, job_id in (("queued", queued), ("waiting", waiting), ("running", running))
            )
        )
        assert [answer.status_code for answer in answers] == [200, 200, 200]
        assert [answer.json()["outcome"] for answer in answers] == [
            "CANCELLED",
            "CANCELLED",
            "CANCEL_REQUESTED",
        ]

        done = await stack.wait_for_job(running, ["CANCELLED"], timeout_s=10)
        # The worker saw the request on a renewal and settled: the attempt ended
        # (database clock) within two heartbeats of the request.
        async with stack.pool.connection() as conn:
            rows = await (await conn.execute(ENDED_SQL, {"job_id": running})).fetchall()
        assert [(outcome, error_class) for _, outcome, error_class in rows] == [
            ("CANCELLED", "cancel")
        ]
        assert rows[0][0].total_seconds() <= 2 * HEARTBEAT_S, rows
        # The sleeping step's task was cancelled; nothing after it was checkpointed.
        calls = [(call.method, call.attempt) for call in stack.calls_for(running)]
        assert calls == [(TOKENIZE, 1), (TOKENIZE, 1), (f"cancelled:{TOKENIZE}", 1)]
        assert [entry["name"] for entry in done.checkpoints] == ["tokenize"]
        assert done.cancel_reason == "stop running"
        assert stack.calls_for(queued) == []

    def all_cancelled(_: object) -> bool:
        return all(
            any(type_name(event) == "CANCELLED" for event in reader.for_job(job_id))
            for job_id in (queued, waiting, running)
        )

    try:
        await reader.wait(all_cancelled)
        expected = {
            queued: ["ACCEPTED", "CANCELLED"],
            waiting: ["ACCEPTED", "STEP_CHECKPOINT", "STEP_CHECKPOINT", "WAITING", "CANCELLED"],
            running: ["ACCEPTED", "STEP_CHECKPOINT", "CANCELLED"],
        }
        for job_id, kinds in expected.items():
            events = dedupe(reader.for_job(job_id))
            assert [type_name(event) for event in events] == kinds, job_id
            ids = [event.event_id for event in events]
            assert ids == sorted(ids)
        reasons = {
            job_id: dedupe(reader.for_job(job_id))[-1].reason for job_id in (queued, waiting)
        }
        assert reasons == {queued: "stop queued", waiting: "stop waiting"}
    finally:
        reader.close()
