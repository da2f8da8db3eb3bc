"""Renewals that name their segment's progress, and the sweep of stalled segments.

No test here waits for a clock: progress is dated back through the idle time a
renewal reports, and the sweep is asked about a later instant.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from schemas.contract import EventType, decode_event
from schemas.errors import LeaseLost
from store.outbox import Outbox
from store.pool import Pool
from store.records import ClaimedJob, SegmentProgress, SweepResult
from store.runs import RunStore
from tests.integration.store.helpers import submit

LEASE_S = 30.0
DEADLINE_S = 1.0


async def _db_now(pool: Pool) -> datetime:
    async with pool.connection() as conn:
        row = await (await conn.execute("SELECT now()")).fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


async def _progress_columns(pool: Pool, claimed: ClaimedJob) -> tuple[object, ...]:
    async with pool.connection() as conn:
        row = await (
            await conn.execute(
                "SELECT progress_token, progress_mark, progress_at, stall_at, lease_until"
                " FROM workflow_run WHERE job_id = %s",
                (claimed.job_id,),
            )
        ).fetchone()
    assert row is not None
    return tuple(row)


async def _claimed(store: RunStore, **options: int) -> ClaimedJob:
    await submit(store, **options)
    claimed = await store.claim("w1")
    assert claimed is not None
    return claimed


def _progress(mark: int, idle_s: float = 0.0) -> SegmentProgress:
    return SegmentProgress(mark=mark, idle_s=idle_s, deadline_s=DEADLINE_S)


async def test_a_renewal_records_progress_only_when_the_mark_moves(pool: Pool) -> None:
    store = RunStore(pool, lease_s=LEASE_S)
    claimed = await _claimed(store)
    await store.extend_lease(claimed.lease, _progress(1, idle_s=2.0))
    token, mark, progress_at, stall_at, _ = await _progress_columns(pool, claimed)
    assert (token, mark) == (claimed.lease.token, 1)
    assert isinstance(progress_at, datetime) and isinstance(stall_at, datetime)
    assert stall_at - progress_at == timedelta(seconds=DEADLINE_S + LEASE_S)
    assert await _db_now(pool) - progress_at >= timedelta(seconds=2.0)

    # The same mark again: the lease moves, the progress time does not.
    await store.extend_lease(claimed.lease, _progress(1))
    assert (await _progress_columns(pool, claimed))[2] == progress_at
    # A new mark: progress, dated now.
    await store.extend_lease(claimed.lease, _progress(2))
    assert (await _progress_columns(pool, claimed))[2] > progress_at  # type: ignore[operator]


async def test_a_segment_renewed_without_progress_is_swept_as_stalled(
    pool: Pool, outbox: Outbox
) -> None:
    store = RunStore(pool, lease_s=LEASE_S)
    claimed = await _claimed(store)
    # Last progress 25 s ago: stalled 6 s from now, while the lease runs 30 s.
    await store.extend_lease(claimed.lease, _progress(3, idle_s=25.0))
    now = await _db_now(pool)
    assert await store.sweep_expired() == SweepResult(requeued=0, dead=0, stalled=0)
    assert (await store.sweep_expired(now=now + timedelta(seconds=5))).requeued == 0

    result = await store.sweep_expired(now=now + timedelta(seconds=10))
    assert (result.requeued, result.dead, result.stalled) == (1, 0, 1)
    job = await store.get(claimed.job_id)
    assert job.status == "QUEUED"
    assert job.attempt == 1  # the stalled attempt counts, like an expired one
    assert job.lease_owner is None
    assert job.error == (
        "segment made no progress for longer than its deadline plus the lease "
        "on attempt 1/3 (worker w1)"
    )
    # Its worker can write nothing any more.
    with pytest.raises(LeaseLost):
        await store.extend_lease(claimed.lease, _progress(4))
    events = [decode_event(row.payload) for row in await outbox.events_for(claimed.job_id)]
    assert [event.type for event in events] == [
        EventType.TYPE_ACCEPTED,
        EventType.TYPE_RETRY_SCHEDULED,
    ]
    assert events[1].error == job.error
    [swept] = await store.history.attempts(claimed.job_id)
    assert (swept.outcome, swept.error_class, swept.worker) == ("SWEPT", "stall", "w1")


async def test_a_stalled_segment_on_its_last_attempt_lands_dead(pool: Pool) -> None:
    store = RunStore(pool, lease_s=LEASE_S)
    claimed = await _claimed(store, max_attempts=1)
    await store.extend_lease(claimed.lease, _progress(1, idle_s=1000.0))
    result = await store.sweep_expired()
    assert (result.requeued, result.dead, result.stalled) == (0, 1, 1)
    job = await store.get(claimed.job_id)
    assert job.status == "DEAD"
    assert job.error is not None and job.error.startswith("segment made no progress")


async def test_the_renewal_of_a_stalled_segment_is_refused(pool: Pool) -> None:
    store = RunStore(pool, lease_s=LEASE_S)
    claimed = await _claimed(store)
    # The first report already dates the last progress past deadline plus lease.
    await store.extend_lease(claimed.lease, _progress(1, idle_s=1000.0))
    *_, lease_until = await _progress_columns(pool, claimed)
    # The same mark cannot hold it any longer.
    with pytest.raises(LeaseLost, match="stalled"):
        await store.extend_lease(claimed.lease, _progress(1))
    assert (await _progress_columns(pool, claimed))[-1] == lease_until
    # Progress can: a step was started or checkpointed since.
    await store.extend_lease(claimed.lease, _progress(2))
    assert (await store.sweep_expired()).requeued == 0


async def test_a_new_claim_is_not_judged_by_the_last_claims_progress(pool: Pool) -> None:
    store = RunStore(pool, lease_s=LEASE_S)
    first = await _claimed(store)
    await store.extend_lease(first.lease, _progress(1, idle_s=1000.0))
    assert (await store.sweep_expired()).stalled == 1
    again = await store.claim("w2")
    assert again is not None and again.job_id == first.job_id
    # The row still holds the first claim's stall time, long past.
    assert (await _progress_columns(pool, again))[0] == first.lease.token
    assert (await store.sweep_expired()).requeued == 0
    # Until the new claim reports its own progress, only its lease counts.
    now = await _db_now(pool)
    assert (await store.sweep_expired(now=now + timedelta(seconds=LEASE_S / 2))).requeued == 0
    assert (await store.sweep_expired(now=now + timedelta(seconds=LEASE_S + 1))).requeued == 1


async def test_a_plain_extension_leaves_progress_alone(pool: Pool) -> None:
    store = RunStore(pool, lease_s=LEASE_S)
    claimed = await _claimed(store)
    await store.extend_lease(claimed.lease, _progress(1))
    before = await _progress_columns(pool, claimed)
    await store.extend_lease(claimed.lease)
    after = await _progress_columns(pool, claimed)
    assert after[:4] == before[:4]
    assert after[4] >= before[4]  # type: ignore[operator]
