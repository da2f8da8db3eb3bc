"""Every commit point writes exactly one outbox row with the change; a failure leaves neither."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

from schemas.contract import EventType, WorkflowRunEvent, decode_event, to_json, with_event_id
from schemas.errors import ContractViolation, InvalidArgument, NotFound, UnstorableValue
from schemas.verdicts import StepVerdict
from store.outbox import Outbox
from store.pool import Pool
from store.records import ClaimedJob
from store.runs import RunStore
from tests.integration.store.helpers import DEFINITION, age_rows, entry, submit

# Test-only sabotage: the outbox insert, always the last write of a commit
# point's statement, raises; the row change in the same statement must vanish.
REFUSE_OUTBOX_SQL = """
CREATE FUNCTION refuse_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'outbox refused by the test';
END
$$;
CREATE TRIGGER refuse_outbox BEFORE INSERT ON workflow_run_events_outbox
    FOR EACH ROW EXECUTE FUNCTION refuse_outbox();
"""
ALLOW_OUTBOX_SQL = "DROP TRIGGER refuse_outbox ON workflow_run_events_outbox"


def accept(response: dict[str, Any]) -> StepVerdict:
    return StepVerdict("review", accepted=True, response={**response, "normalized": True})


def reject(_response: dict[str, Any]) -> StepVerdict:
    return StepVerdict(
        "review", accepted=False, response={}, violations=("approved: must be true",)
    )


async def _events(outbox: Outbox, job_id: uuid.UUID) -> list[WorkflowRunEvent]:
    rows = await outbox.events_for(job_id)
    for row in rows:
        assert row.status == "PENDING"
        assert decode_event(with_event_id(row.payload, row.id)).event_id == row.id
        assert row.event_type == EventType.Name(decode_event(row.payload).type).removeprefix(
            "TYPE_"
        )
    return [decode_event(row.payload) for row in rows]


async def _claimed(store: RunStore, **kwargs: Any) -> ClaimedJob:
    await submit(store, **kwargs)
    claimed = await store.claim("w1")
    assert claimed is not None
    return claimed


async def test_submit_writes_one_accepted_event_and_is_idempotent(
    store: RunStore, outbox: Outbox
) -> None:
    job_id = uuid.uuid4()
    first = await submit(store, job_id=job_id)
    assert first.created
    assert first.job.status == "QUEUED"
    assert first.job.attempt == 0
    assert first.job.max_attempts == store.default_max_attempts
    assert first.job.definition == DEFINITION
    again = await store.submit(
        job_id=job_id,
        workflow_name="other",
        definition={"name": "other"},
        definition_hash="x",
        input={"different": True},
    )
    assert not again.created
    assert again.job == first.job

    (event,) = await _events(outbox, job_id)
    assert event.type == EventType.TYPE_ACCEPTED
    assert event.job_id == str(job_id)
    assert event.workflow_name == "embed-text"
    assert event.attempt == 0
    assert event.HasField("occurred_at")


async def test_concurrent_submits_of_one_id_create_one_job(store: RunStore, outbox: Outbox) -> None:
    job_id = uuid.uuid4()
    results = await asyncio.gather(*(submit(store, job_id=job_id) for _ in range(10)))
    assert sum(result.created for result in results) == 1
    assert all(result.job == results[0].job for result in results)
    assert len(await outbox.events_for(job_id)) == 1


async def test_submit_failed_records_a_failed_job_once(store: RunStore, outbox: Outbox) -> None:
    job_id = uuid.uuid4()
    error = "no stored workflow named 'nope'"
    first = await store.submit_failed(
        job_id=job_id, workflow_name="nope", input={"a": 1}, error=error
    )
    assert first.created
    assert first.job.status == "FAILED"
    assert first.job.error == error
    assert first.job.definition is None
    again = await store.submit_failed(job_id=job_id, workflow_name="nope", input={}, error="x")
    assert not again.created
    (event,) = await _events(outbox, job_id)
    assert event.type == EventType.TYPE_FAILED
    assert event.error == error


async def test_submit_refuses_bad_input(store: RunStore) -> None:
    with pytest.raises(InvalidArgument, match="workflow name 'bad name' is malformed"):
        await submit(store, name="bad name")
    with pytest.raises(InvalidArgument, match="max_attempts"):
        await submit(store, max_attempts=-1)
    with pytest.raises(InvalidArgument, match="job_id must be a UUID"):
        await store.get("not-a-uuid")
    with pytest.raises(NotFound):
        await store.get(uuid.uuid4())


async def test_each_worker_commit_point_writes_exactly_one_event(
    store: RunStore, outbox: Outbox
) -> None:
    claimed = await _claimed(store)
    lease = claimed.lease
    await store.extend_lease(lease)  # not a commit point: no event
    await store.checkpoint(lease, entry("tokenize", ids=[4811, 9902]))
    await store.checkpoint(lease, {"name": "embed", "skipped": True, "response": {}})
    await store.park(lease, "review")

    job = await store.get(lease.job_id)
    assert job.status == "WAITING"
    assert job.outstanding_step == "review"
    assert job.lease_until is None
    assert [item["name"] for item in job.checkpoints] == ["tokenize", "embed"]
    assert job.checkpoints[0]["response"] == {"ids": [4811, 9902]}

    accepted, step1, step2, waiting = await _events(outbox, lease.job_id)
    assert accepted.type == EventType.TYPE_ACCEPTED
    assert step1.type == EventType.TYPE_STEP_CHECKPOINT
    assert (step1.step_name, step1.skipped, step1.attempt) == ("tokenize", False, 1)
    assert to_json(step1.response) == {"ids": [4811.0, 9902.0]}
    assert (step2.step_name, step2.skipped) == ("embed", True)
    assert waiting.type == EventType.TYPE_WAITING
    assert waiting.step_name == "review"

    result = await store.complete_step(
        job_id=lease.job_id, step_name="review", response={"approved": True}, verify=accept
    )
    assert result.outcome == "COMPLETED"
    resumed = await _events(outbox, lease.job_id)
    assert len(resumed) == 5
    assert resumed[-1].type == EventType.TYPE_STEP_CHECKPOINT
    assert to_json(resumed[-1].response) == {"approved": True, "normalized": True}

    again = await store.claim("w2")
    assert again is not None
    await store.complete(again.lease, result={"vector": [0.5]}, verdict="embedded 2 tokens")
    done = await store.get(lease.job_id)
    assert done.status == "COMPLETED"
    assert done.verdict == "embedded 2 tokens"
    assert done.result == {"vector": [0.5]}
    final = (await _events(outbox, lease.job_id))[-1]
    assert final.type == EventType.TYPE_COMPLETED
    assert final.verdict == "embedded 2 tokens"
    assert to_json(final.result) == {"vector": [0.5]}
    assert len(await outbox.events_for(lease.job_id)) == 6


async def test_failures_write_one_event_with_the_error_verbatim(
    store: RunStore, outbox: Outbox
) -> None:
    error_job = await _claimed(store)
    await store.fail(error_job.lease, error="mapping: no field 'txt' in input")
    job = await store.get(error_job.job_id)
    assert (job.status, job.error, job.verdict) == (
        "FAILED",
        "mapping: no field 'txt' in input",
        None,
    )
    (_, failed) = await _events(outbox, error_job.job_id)
    assert failed.type == EventType.TYPE_FAILED
    assert failed.error == "mapping: no field 'txt' in input"

    verdict_job = await _claimed(store)
    await store.fail(verdict_job.lease, verdict="ids: must not be empty")
    job = await store.get(verdict_job.job_id)
    assert (job.status, job.verdict) == ("FAILED", "ids: must not be empty")
    (_, failed) = await _events(outbox, verdict_job.job_id)
    assert (failed.verdict, failed.error) == ("ids: must not be empty", "ids: must not be empty")

    dead_job = await _claimed(store, max_attempts=1)
    outcome = await store.retry_or_die(dead_job.lease, "UNAVAILABLE: tokenizer down")
    assert outcome.dead
    (_, dead) = await _events(outbox, dead_job.job_id)
    assert dead.type == EventType.TYPE_DEAD
    assert dead.error == "UNAVAILABLE: tokenizer down"


async def test_row_changes_without_a_commit_point_write_no_event(
    store: RunStore, outbox: Outbox
) -> None:
    claimed = await _claimed(store)
    await store.extend_lease(claimed.lease)
    await store.hand_back(claimed.lease)
    again = await store.claim("w2")
    assert again is not None
    assert again.lease.attempt == 1  # the handed-back attempt did not count
    # A renewal, a hand-back and a claim publish nothing; a retry publishes
    # RETRY_SCHEDULED, so consumers see a job struggling before it is DEAD.
    assert len(await outbox.events_for(claimed.job_id)) == 1
    outcome = await store.retry_or_die(again.lease, "UNAVAILABLE")
    assert outcome.status == "QUEUED"
    events = [decode_event(row.payload) for row in await outbox.events_for(claimed.job_id)]
    assert [event.type for event in events] == [
        EventType.TYPE_ACCEPTED,
        EventType.TYPE_RETRY_SCHEDULED,
    ]


async def test_a_settle_without_its_required_text_is_refused_loudly(store: RunStore) -> None:
    claimed = await _claimed(store)
    with pytest.raises(ContractViolation, match="verdict"):
        await store.complete(claimed.lease, result={}, verdict="")
    with pytest.raises(ContractViolation, match="error"):
        await store.fail(claimed.lease)
    with pytest.raises(InvalidArgument, match="checkpoint entry"):
        await store.checkpoint(claimed.lease, {"name": "x", "response": {}})
    assert (await store.get(claimed.job_id)).status == "RUNNING"


async def test_a_commit_point_that_fails_midway_leaves_no_change_and_no_event(
    pool: Pool, store: RunStore, outbox: Outbox
) -> None:
    running = await _claimed(store)
    await store.checkpoint(running.lease, entry("tokenize", ids=[1]))
    parked = await _claimed(store)
    await store.park(parked.lease, "review")
    last_try = await _claimed(store, max_attempts=1)
    jobs = [running.job_id, parked.job_id, last_try.job_id]
    before = {job_id: await store.get(job_id) for job_id in jobs}
    counts = {job_id: len(await outbox.events_for(job_id)) for job_id in jobs}

    async with pool.connection() as conn:
        await conn.execute(REFUSE_OUTBOX_SQL.encode())
    lease = running.lease
    new_id = uuid.uuid4()
    sabotaged: dict[str, Callable[[], Awaitable[object]]] = {
        "submit": lambda: submit(store, job_id=new_id),
        "submit_failed": lambda: store.submit_failed(
            job_id=new_id, workflow_name="nope", input={}, error="unknown"
        ),
        "checkpoint": lambda: store.checkpoint(lease, entry("embed", v=[1])),
        "park": lambda: store.park(lease, "review"),
        "complete": lambda: store.complete(lease, result={}, verdict="ok"),
        "fail": lambda: store.fail(lease, error="boom"),
        "retry_or_die (DEAD)": lambda: store.retry_or_die(last_try.lease, "UNAVAILABLE"),
        "complete_step": lambda: store.complete_step(
            job_id=parked.job_id, step_name="review", response={}, verify=accept
        ),
        "complete_step (rejected)": lambda: store.complete_step(
            job_id=parked.job_id, step_name="review", response={}, verify=reject
        ),
    }
    for what, call in sabotaged.items():
        with pytest.raises(psycopg.errors.RaiseException, match="outbox refused"):
            await call()
            pytest.fail(f"{what} succeeded although its event could not be written")
    async with pool.connection() as conn:
        await conn.execute(ALLOW_OUTBOX_SQL)

    with pytest.raises(NotFound):
        await store.get(new_id)
    for job_id in jobs:
        assert await store.get(job_id) == before[job_id]
        assert len(await outbox.events_for(job_id)) == counts[job_id]
    # The same writes go through once the outbox accepts rows again.
    await store.checkpoint(lease, entry("embed", v=[1]))
    assert len(await outbox.events_for(lease.job_id)) == counts[lease.job_id] + 1


async def test_a_verifier_that_raises_changes_nothing(store: RunStore, outbox: Outbox) -> None:
    parked = await _claimed(store)
    await store.park(parked.lease, "review")
    before = await store.get(parked.job_id)

    def explode(_response: dict[str, Any]) -> StepVerdict:
        raise RuntimeError("engine bug")

    with pytest.raises(RuntimeError, match="engine bug"):
        await store.complete_step(
            job_id=parked.job_id, step_name="review", response={}, verify=explode
        )
    assert await store.get(parked.job_id) == before
    assert len(await outbox.events_for(parked.job_id)) == 2


async def test_a_sweep_that_fails_midway_leaves_no_change_and_no_event(
    pool: Pool, outbox: Outbox
) -> None:
    # One expired lease with attempts left (requeued, RETRY_SCHEDULED) and one
    # on its last attempt (DEAD): one transaction, so both or neither.
    store = RunStore(pool)
    retried = await _claimed(store)
    last = await _claimed(store, max_attempts=1)
    jobs = [retried.job_id, last.job_id]
    await age_rows(pool, store.lease_s + 1, *jobs)
    before = {job_id: await store.get(job_id) for job_id in jobs}

    async with pool.connection() as conn:
        await conn.execute(REFUSE_OUTBOX_SQL.encode())
    with pytest.raises(psycopg.errors.RaiseException, match="outbox refused"):
        await store.sweep_expired()
    async with pool.connection() as conn:
        await conn.execute(ALLOW_OUTBOX_SQL)

    for job_id in jobs:
        assert await store.get(job_id) == before[job_id]
        assert len(await outbox.events_for(job_id)) == 1  # ACCEPTED only
    result = await store.sweep_expired()
    assert (result.requeued, result.dead) == (1, 1)


async def test_a_value_the_database_refuses_is_unstorable_not_an_outage(pool: Pool) -> None:
    # jsonb cannot hold U+0000: the same write would fail on every retry.
    store = RunStore(pool)
    await submit(store)
    claimed = await store.claim("w1")
    assert claimed is not None
    with pytest.raises(UnstorableValue, match="checkpoint step 'tokenize'"):
        await store.checkpoint(claimed.lease, entry("tokenize", note="a\x00b"))
    with pytest.raises(UnstorableValue, match="result"):
        await store.complete(claimed.lease, result={"note": "a\x00b"}, verdict="done")
    # Errors quoting such bytes are still recorded, escaped.
    await store.fail(claimed.lease, error="handler said a\x00b")
    job = await store.get(claimed.job_id)
    assert job.status == "FAILED" and job.error == "handler said a\\u0000b"
    assert job.checkpoints == ()
