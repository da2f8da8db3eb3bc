"""The event size limit: an oversized event is refused before anything commits."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from schemas.contract import (
    DEFAULT_MAX_EVENT_BYTES,
    EventType,
    build_event,
    decode_event,
    encode_event,
)
from schemas.errors import EventTooLarge, UnstorableValue
from schemas.verdicts import StepVerdict
from store.outbox import Outbox
from store.pool import Pool
from store.records import ClaimedJob
from store.runs import RunStore
from tests.integration.store.helpers import DEFINITION, entry, submit

LIMIT = 20_000


@pytest.fixture
def small(pool: Pool) -> RunStore:
    """A store whose event limit a test can pass with a few kilobytes."""
    return RunStore(pool, max_event_bytes=LIMIT)


def accept(response: dict[str, Any]) -> StepVerdict:
    return StepVerdict("review", accepted=True, response=response)


async def _claimed(store: RunStore) -> ClaimedJob:
    await submit(store)
    claimed = await store.claim("w1")
    assert claimed is not None
    return claimed


def _ids(count: int) -> list[int]:
    # About 11 bytes per id in an event's Struct.
    return list(range(count))


async def test_an_oversized_checkpoint_is_refused_and_nothing_is_written(
    small: RunStore, outbox: Outbox
) -> None:
    claimed = await _claimed(small)
    with pytest.raises(EventTooLarge) as refused:
        await small.checkpoint(claimed.lease, entry("tokenize", ids=_ids(5_000)))
    message = refused.value.message
    assert "STEP_CHECKPOINT event of step 'tokenize'" in message
    assert f"above the event size limit of {LIMIT:,} bytes (WFJOBS_MAX_EVENT_BYTES)" in message
    assert "its response alone is" in message
    # The claim loop treats it like any value that can never be stored.
    assert isinstance(refused.value, UnstorableValue)
    assert refused.value.code == "PAYLOAD_TOO_LARGE"
    job = await small.get(claimed.job_id)
    assert job.status == "RUNNING" and job.checkpoints == ()
    assert [row.event_type for row in await outbox.events_for(claimed.job_id)] == ["ACCEPTED"]


async def test_an_oversized_result_is_refused_and_the_job_can_fail_instead(
    small: RunStore, outbox: Outbox
) -> None:
    claimed = await _claimed(small)
    with pytest.raises(EventTooLarge, match=r"COMPLETED event .* its result alone is"):
        await small.complete(claimed.lease, result={"ids": _ids(5_000)}, verdict="done")
    assert (await small.get(claimed.job_id)).status == "RUNNING"
    await small.fail(claimed.lease, error="the result is too large")
    rows = await outbox.events_for(claimed.job_id)
    assert [row.event_type for row in rows] == ["ACCEPTED", "FAILED"]


async def test_failure_texts_are_cut_so_their_event_always_fits(
    small: RunStore, outbox: Outbox
) -> None:
    claimed = await _claimed(small)
    huge = "é" * 1_000_000  # two bytes each in UTF-8
    await small.fail(claimed.lease, error=huge, verdict=huge)
    job = await small.get(claimed.job_id)
    assert job.status == "FAILED" and job.error is not None
    assert job.error.startswith("éé") and job.error.endswith("2,000,000 bytes in all, cut]")
    assert len(job.error.encode()) <= LIMIT // 4
    failed = [row for row in await outbox.events_for(claimed.job_id) if row.event_type == "FAILED"]
    assert len(failed) == 1 and len(failed[0].payload) <= LIMIT
    event = decode_event(failed[0].payload)
    assert event.error == job.error == job.verdict == event.verdict


async def test_a_dead_event_with_a_huge_error_fits(small: RunStore, outbox: Outbox) -> None:
    await submit(small, max_attempts=1)
    claimed = await small.claim("w1")
    assert claimed is not None
    outcome = await small.retry_or_die(claimed.lease, "x" * 5_000_000)
    assert outcome.dead
    rows = await outbox.events_for(claimed.job_id)
    assert rows[-1].event_type == "DEAD" and len(rows[-1].payload) <= LIMIT


async def test_an_oversized_input_is_refused_at_submit_and_nothing_is_written(
    small: RunStore, outbox: Outbox
) -> None:
    job_id = uuid.uuid4()
    with pytest.raises(EventTooLarge) as refused:
        await small.submit(
            job_id=job_id,
            workflow_name="embed-text",
            definition=DEFINITION,
            definition_hash="h",
            input={"text": "word " * 5_000},
        )
    assert f"the input of job {job_id} (as JSON) would be 25,011 bytes" in refused.value.message
    assert f"limit of {LIMIT:,} bytes" in refused.value.message
    assert await outbox.events_for(job_id) == []
    assert (await small.list()).jobs == ()


async def test_an_oversized_external_response_leaves_the_job_waiting(
    small: RunStore, outbox: Outbox
) -> None:
    claimed = await _claimed(small)
    await small.park(claimed.lease, "review")
    before = await outbox.events_for(claimed.job_id)
    with pytest.raises(EventTooLarge, match="STEP_CHECKPOINT event of step 'review'"):
        await small.complete_step(
            job_id=claimed.job_id,
            step_name="review",
            response={"notes": ["n"] * 5_000},
            verify=accept,
        )
    job = await small.get(claimed.job_id)
    assert job.status == "WAITING" and job.outstanding_step == "review" and job.checkpoints == ()
    assert len(await outbox.events_for(claimed.job_id)) == len(before)


async def test_an_event_just_inside_the_default_limit_is_written(
    store: RunStore, outbox: Outbox
) -> None:
    claimed = await _claimed(store)
    # Each further id adds the same 11 bytes, so one probe finds the largest
    # list whose event still fits.
    base = _checkpoint_size(claimed, _ids(80_000))
    ids = _ids(80_000 + (DEFAULT_MAX_EVENT_BYTES - base) // 11)
    await store.checkpoint(claimed.lease, entry("tokenize", ids=ids))
    rows = await outbox.events_for(claimed.job_id)
    assert rows[-1].event_type == "STEP_CHECKPOINT"
    assert DEFAULT_MAX_EVENT_BYTES - 11 < len(rows[-1].payload) <= DEFAULT_MAX_EVENT_BYTES
    with pytest.raises(EventTooLarge):
        await store.checkpoint(claimed.lease, entry("embed", ids=[*ids, 0]))


def _checkpoint_size(claimed: ClaimedJob, ids: list[int]) -> int:
    event = build_event(
        job_id=claimed.job_id,
        event_type=EventType.TYPE_STEP_CHECKPOINT,
        workflow_name=claimed.lease.workflow_name,
        attempt=claimed.lease.attempt,
        occurred_at=datetime.now(UTC),
        step_name="tokenize",
        response={"ids": ids},
    )
    return len(encode_event(event))


def test_the_limit_has_a_floor(pool: Pool) -> None:
    with pytest.raises(ValueError, match="max_event_bytes must be at least 16384"):
        RunStore(pool, max_event_bytes=1_000)
