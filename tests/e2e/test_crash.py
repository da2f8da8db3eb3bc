"""A worker killed mid-step: another one resumes after the lease, from the checkpoints."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import PARTITIONS
from tests.e2e.harness import Stack, dedupe, type_name, wait_until
from tests.workflows_fixtures import EMBED, REVIEW, TOKENIZE, envelope

pytestmark = pytest.mark.e2e


async def test_kill_9_mid_step_resumes_on_another_worker_without_rerunning(stack: Stack) -> None:
    # w1 answers the embed step only after two minutes: it is killed long before.
    first = await stack.start_worker("w1", WFJOBS_E2E_SLOW_METHOD=EMBED, WFJOBS_E2E_SLOW_S="120")
    workflow = envelope(name="e2e-crash", review="invoke")
    await stack.put_workflow(first, workflow)
    job_id = stack.produce_request(workflow["name"], {"text": "survive a crash"})
    stack.flush()

    async def embedding() -> bool | None:
        return True if stack.calls_for(job_id, EMBED) else None

    await wait_until(embedding, timeout_s=30)
    running = await stack.job(job_id)
    assert running.status == "RUNNING" and running.lease_owner == "w1"
    assert [entry["name"] for entry in running.checkpoints] == ["tokenize"]

    first.kill()

    # Its own consumer group: the killed member would otherwise hold the group's
    # rebalance for a session timeout. The job itself is already in the store.
    second = await stack.start_worker("w2", WFJOBS_GROUP=f"{stack.group}-b")
    job = await stack.wait_for_job(job_id, {"COMPLETED", "FAILED", "DEAD"}, timeout_s=40)

    assert job.status == "COMPLETED", job
    assert job.lease_owner == "w2"
    assert job.attempt == 2
    assert [(c.worker, c.method, c.attempt) for c in stack.calls_for(job_id)] == [
        ("w1", TOKENIZE, 1),
        ("w1", EMBED, 1),
        ("w2", EMBED, 2),
        ("w2", REVIEW, 2),
    ]

    reader = stack.event_reader(PARTITIONS)
    await reader.wait(lambda _: any(type_name(e) == "COMPLETED" for e in reader.for_job(job_id)))
    steps = [e.step_name for e in dedupe(reader.for_job(job_id)) if e.step_name]
    assert steps == ["tokenize", "embed", "review"]
    reader.close()
    assert second.stop() == 0, second.log_tail()
