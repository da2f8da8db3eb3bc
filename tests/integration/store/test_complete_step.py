"""complete-step: gated under the row lock, answered once, rejected responses fail the job."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

import pytest

from schemas.contract import EventType, decode_event
from schemas.errors import InvalidArgument, NotFound
from schemas.verdicts import StepVerdict
from store.outbox import Outbox
from store.runs import RunStore
from tests.integration.store.helpers import entry, submit


def accept(response: dict[str, Any]) -> StepVerdict:
    return StepVerdict("review", accepted=True, response=response)


async def _parked(store: RunStore, step: str = "review") -> uuid.UUID:
    await submit(store)
    claimed = await store.claim("w1")
    assert claimed is not None
    await store.checkpoint(claimed.lease, entry("tokenize", ids=[1]))
    await store.park(claimed.lease, step)
    return claimed.job_id


async def test_twenty_concurrent_calls_complete_the_step_once(
    store: RunStore, outbox: Outbox
) -> None:
    job_id = await _parked(store)
    results = await asyncio.gather(
        *(
            store.complete_step(
                job_id=job_id, step_name="review", response={"approved": True}, verify=accept
            )
            for _ in range(20)
        )
    )
    outcomes = sorted(result.outcome for result in results)
    assert outcomes == ["ALREADY_DONE"] * 19 + ["COMPLETED"]

    job = await store.get(job_id)
    assert job.status == "QUEUED"
    assert job.outstanding_step is None
    assert [item["name"] for item in job.checkpoints] == ["tokenize", "review"]
    assert job.checkpoints[-1] == {
        "name": "review",
        "skipped": False,
        "response": {"approved": True},
    }
    assert job.run_after <= job.updated_at
    # Parking and resuming does not spend an attempt.
    assert job.attempt == 0
    events = [decode_event(row.payload) for row in await outbox.events_for(job_id)]
    assert [event.type for event in events].count(EventType.TYPE_STEP_CHECKPOINT) == 2
    assert len(events) == 4

    resumed = await store.claim("w2")
    assert resumed is not None
    assert resumed.job_id == job_id
    assert resumed.lease.attempt == 1
    assert len(resumed.job.checkpoints) == 2


async def test_a_job_in_another_state_answers_wrong_state(store: RunStore) -> None:
    queued = (await submit(store)).job.job_id
    result = await store.complete_step(
        job_id=queued, step_name="review", response={}, verify=accept
    )
    assert result.outcome == "WRONG_STATE"
    assert "is QUEUED" in result.message
    assert result.job.status == "QUEUED"

    parked = await _parked(store, step="review")
    result = await store.complete_step(
        job_id=parked, step_name="sign-off", response={}, verify=accept
    )
    assert result.outcome == "WRONG_STATE"
    assert "WAITING on step 'review'" in result.message
    assert (await store.get(parked)).status == "WAITING"

    # A step that ran as a normal step is done, whatever the job's state.
    result = await store.complete_step(
        job_id=parked, step_name="tokenize", response={}, verify=accept
    )
    assert result.outcome == "ALREADY_DONE"


async def test_a_rejected_response_fails_the_job_with_a_verdict(
    store: RunStore, outbox: Outbox
) -> None:
    job_id = await _parked(store)

    def reject(_response: dict[str, Any]) -> StepVerdict:
        return StepVerdict(
            "review", accepted=False, response={}, violations=("approved: must be true",)
        )

    result = await store.complete_step(
        job_id=job_id, step_name="review", response={"approved": False}, verify=reject
    )
    assert result.outcome == "REJECTED"
    assert "approved: must be true" in result.message
    job = await store.get(job_id)
    # The job as it now is, without the definition: the lock never read it.
    assert result.job == dataclasses.replace(job, definition=None)
    assert job.status == "FAILED"
    assert job.verdict == "approved: must be true"
    assert job.error == "approved: must be true"
    assert [item["name"] for item in job.checkpoints] == ["tokenize"]
    last = decode_event((await outbox.events_for(job_id))[-1].payload)
    assert last.type == EventType.TYPE_FAILED
    assert (last.verdict, last.error, last.step_name) == (
        "approved: must be true",
        "approved: must be true",
        "review",
    )
    again = await store.complete_step(
        job_id=job_id, step_name="review", response={"approved": True}, verify=accept
    )
    assert again.outcome == "WRONG_STATE"
    assert "is FAILED" in again.message


async def test_complete_step_refuses_bad_ids(store: RunStore) -> None:
    with pytest.raises(InvalidArgument, match="job_id must be a UUID"):
        await store.complete_step(job_id="42", step_name="review", response={}, verify=accept)
    with pytest.raises(NotFound):
        await store.complete_step(
            job_id=uuid.uuid4(), step_name="review", response={}, verify=accept
        )
    with pytest.raises(InvalidArgument, match="step_name"):
        await store.complete_step(job_id=uuid.uuid4(), step_name="", response={}, verify=accept)
