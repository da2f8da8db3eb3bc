"""Deadlines and the human step, end to end: real worker processes, real Kafka.

One stack for the module. Its first process is a paused fleet: a worker with
``WFJOBS_CLAIM_LOOPS=0``, which sweeps (leases and deadlines), relays and
consumes the request and completion topics but claims nothing. The first test
needs exactly that; the later ones add a worker that claims (``claimer``), so
the tests run in file order.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from devstack.postgres import PostgresService
from devstack.stack import WorkerProcess
from schemas.contract import StepCompletion, StepCompletionResult
from schemas.serde import MessageDecoder, open_registry
from store.migrate import migrate
from store.pool import open_pool
from tests.e2e.harness import Stack, dedupe, read_dlq, type_name
from tests.forkserver import ForkServer
from tests.workflows_fixtures import envelope

pytestmark = pytest.mark.e2e

PARTITIONS = 2
Outcome = StepCompletionResult.Outcome


def _workflow(name: str, timeout_ms: int) -> dict[str, Any]:
    definition = envelope(name=name)
    definition["steps"][2]["timeoutMs"] = timeout_ms
    return definition


# Times out soon after it parks; reviewed, parked for as long as the test needs.
TIMED = _workflow("e2e-timed", 1500)
REVIEWED = _workflow("e2e-reviewed", 600_000)


def _create_topics(bootstrap: str, *specs: tuple[str, int]) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = {prefix: f"{prefix}-{uuid.uuid4().hex[:10]}" for prefix, _ in specs}
    futures = admin.create_topics(
        [NewTopic(names[prefix], partitions, 1) for prefix, partitions in specs],
        operation_timeout=30,
    )
    for future in futures.values():
        future.result(timeout=30)
    deadline = time.monotonic() + 30
    for name in names.values():
        while True:
            meta = admin.list_topics(topic=name, timeout=5).topics.get(name)
            if (
                meta is not None
                and meta.partitions
                and all(p.leader >= 0 for p in meta.partitions.values())
            ):
                break
            assert time.monotonic() < deadline, f"topic {name} has no leaders"
            time.sleep(0.05)
    return names


class DeadlineStack(Stack):
    paused: WorkerProcess
    claiming: WorkerProcess | None = None


@pytest.fixture(scope="module")
async def stack(
    postgres_server: PostgresService,
    kafka_bootstrap: str,
    tmp_path_factory: pytest.TempPathFactory,
    fork_server: ForkServer,
) -> AsyncIterator[DeadlineStack]:
    dsn = postgres_server.create_database("deadlines")
    await migrate(dsn)
    topics = _create_topics(
        kafka_bootstrap,
        ("e2e-requests", PARTITIONS),
        ("e2e-requests-dlq", 1),
        ("e2e-events", PARTITIONS),
        ("e2e-completions", PARTITIONS),
        ("e2e-completion-results", 1),
    )
    pool = await open_pool(dsn, min_size=1, max_size=4)
    built = DeadlineStack(
        dsn=dsn,
        bootstrap=kafka_bootstrap,
        topics={
            "requests": topics["e2e-requests"],
            "dlq": topics["e2e-requests-dlq"],
            "events": topics["e2e-events"],
            "completions": topics["e2e-completions"],
            "completion_results": topics["e2e-completion-results"],
        },
        tmp=tmp_path_factory.mktemp("deadlines"),
        pool=pool,
        launch=fork_server,
    )
    try:
        built.paused = await built.start_worker("paused", WFJOBS_CLAIM_LOOPS="0")
        for workflow in (TIMED, REVIEWED):
            await built.put_workflow(built.paused, workflow)
        yield built
    finally:
        built.stop_workers()
        await pool.close()
        AdminClient({"bootstrap.servers": kafka_bootstrap}).delete_topics(list(topics.values()))
        postgres_server.drop_database(dsn)


@pytest.fixture(scope="module")
async def claimer(stack: DeadlineStack) -> WorkerProcess:
    stack.claiming = await stack.start_worker("claimer")
    return stack.claiming


async def test_a_job_deadline_fails_a_job_stuck_behind_a_paused_fleet(
    stack: DeadlineStack,
) -> None:
    async with httpx.AsyncClient(
        base_url=stack.paused.url, timeout=10, headers=stack.headers
    ) as http:
        submitted = await http.post(
            "/v1/workflow-runs",
            json={"workflow_name": TIMED["name"], "input": {"text": "stuck"}, "deadline_ms": 2000},
        )
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["job"]["job_id"]
        failed = await stack.wait_for_job(job_id, {"FAILED"}, timeout_s=20)
        shown = (await http.get(f"/v1/workflow-runs/{job_id}")).json()["job"]
    # Nobody ever claimed it: it failed in the queue, on the database's clock.
    assert failed.attempt == 0 and failed.deadline_at is not None
    assert failed.updated_at >= failed.deadline_at
    assert failed.error is not None and "deadline passed" in failed.error
    assert shown["status"] == "FAILED" and "deadline" in shown

    reader = stack.event_reader(PARTITIONS)
    await reader.wait(lambda _: len(dedupe(reader.for_job(job_id))) >= 2)
    events = dedupe(reader.for_job(job_id))
    reader.close()
    assert [type_name(event) for event in events] == ["ACCEPTED", "FAILED"]
    assert events[-1].deadline == "job" and events[-1].error == failed.error


async def test_an_external_step_timeout_fails_the_job_naming_the_step(
    stack: DeadlineStack, claimer: WorkerProcess
) -> None:
    job_id = stack.produce_request(TIMED["name"], {"text": "nobody answers"})
    stack.flush()
    failed = await stack.wait_for_job(job_id, {"FAILED"}, timeout_s=30)
    assert failed.outstanding_step == "review"
    assert failed.error is not None and "step 'review'" in failed.error

    reader = stack.event_reader(PARTITIONS)
    await reader.wait(lambda _: "FAILED" in [type_name(e) for e in reader.for_job(job_id)])
    events = dedupe(reader.for_job(job_id))
    reader.close()
    assert [type_name(e) for e in events] == [
        "ACCEPTED",
        "STEP_CHECKPOINT",
        "STEP_CHECKPOINT",
        "WAITING",
        "FAILED",
    ]
    assert (events[-1].deadline, events[-1].step_name) == ("step", "review")


async def test_the_review_request_travels_and_completions_come_from_the_topic(
    stack: DeadlineStack, claimer: WorkerProcess
) -> None:
    job_id = stack.produce_request(REVIEWED["name"], {"text": "please look"})
    stack.flush()
    await stack.wait_for_job(job_id, {"WAITING"}, timeout_s=30)

    # The request the review step's rules built, on get-job and on the WAITING event.
    async with httpx.AsyncClient(base_url=claimer.url, timeout=10, headers=stack.headers) as http:
        shown = (await http.get(f"/v1/workflow-runs/{job_id}")).json()["job"]
    assert shown["review_request"] == {"text": "please look", "dimensions": 4}
    assert "step_deadline" in shown
    reader = stack.event_reader(PARTITIONS)
    await reader.wait(lambda _: "WAITING" in [type_name(e) for e in reader.for_job(job_id)])
    waiting = [e for e in dedupe(reader.for_job(job_id)) if type_name(e) == "WAITING"]
    reader.close()
    assert dict(waiting[0].review_request) == {"text": "please look", "dimensions": 4.0}

    completion = StepCompletion(job_id=str(job_id), step_name="review", request_id="first")
    completion.response.update({"approved": True, "reviewer": "ann"})
    stack.produce_keyed(
        stack.completions_topic, key=str(job_id).encode(), value=completion.SerializeToString()
    )
    stack.flush()
    done = await stack.wait_for_job(job_id, {"COMPLETED", "FAILED"}, timeout_s=30)
    assert done.status == "COMPLETED", done
    assert done.result is not None and done.result["reviewer"] == "ann"

    completion.request_id = "second"
    stack.produce_keyed(
        stack.completions_topic, key=str(job_id).encode(), value=completion.SerializeToString()
    )
    stack.flush()
    # The results are framed through the same (in-process mock) registry the
    # workers use, its schemas registered in the same order.
    registry = open_registry(
        stack.registry_url,
        events_topic=stack.events_topic,
        requests_topic=stack.requests_topic,
        completions_topic=stack.completions_topic,
        completion_results_topic=stack.completion_results_topic,
    )
    decoder = MessageDecoder(StepCompletionResult, registry, topic=stack.completion_results_topic)
    messages = read_dlq(stack.bootstrap, stack.completion_results_topic, 1, count=2, timeout_s=30)
    results = [decoder.decode(message.value()) for message in messages]
    assert [(r.request_id, r.outcome) for r in results] == [
        ("first", Outcome.COMPLETED),
        ("second", Outcome.ALREADY_DONE),
    ]
    assert {message.key() for message in messages} == {str(job_id).encode()}
    assert all(r.job_id == str(job_id) and r.step_name == "review" for r in results)
