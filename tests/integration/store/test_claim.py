"""The claim: one statement, SKIP LOCKED, oldest first, never the same job twice."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest

from schemas.errors import InvalidArgument
from store.pool import Pool
from store.records import ClaimedJob
from store.runs import RunStore
from tests.integration.store.helpers import age_rows, submit, submit_many


async def test_eight_claimers_take_each_of_2000_jobs_exactly_once(store: RunStore) -> None:
    ids = await submit_many(store, 2000)
    claimed: list[list[ClaimedJob]] = [[] for _ in range(8)]

    async def claimer(index: int) -> None:
        worker = f"worker-{index}"
        turn = 0
        while True:
            turn += 1
            # Alternate the single and the batch claim so both race each other.
            if (index + turn) % 2:
                one = await store.claim(worker)
                batch = [one] if one is not None else []
            else:
                batch = await store.claim_batch(worker, 1 + (index + turn) % 16)
            if not batch:
                return
            claimed[index].extend(batch)

    await asyncio.gather(*(claimer(index) for index in range(8)))

    taken = [job.job_id for jobs in claimed for job in jobs]
    assert len(taken) == 2000
    assert set(taken) == set(ids)
    assert all(len(jobs) > 0 for jobs in claimed), "every claimer should have won some jobs"
    for index, jobs in enumerate(claimed):
        for job in jobs:
            assert job.lease.worker_id == f"worker-{index}"
            assert job.lease.attempt == 1
            assert job.job.status == "RUNNING"
            assert job.job.lease_owner == f"worker-{index}"
    assert await store.claim("late-worker") is None


async def test_claim_takes_the_oldest_first_and_stamps_the_lease(store: RunStore) -> None:
    first = await submit(store)
    second = await submit(store)
    claimed = await store.claim("w1")
    assert claimed is not None
    assert claimed.job_id == first.job.job_id
    assert claimed.definition == first.job.definition
    job = claimed.job
    assert job.lease_until is not None and job.lease_until > job.updated_at
    lease_s = (job.lease_until - job.updated_at).total_seconds()
    assert lease_s == pytest.approx(store.lease_s)
    batch = await store.claim_batch("w2", 10)
    assert [c.job_id for c in batch] == [second.job.job_id]


async def test_batch_claim_returns_jobs_in_claim_order(store: RunStore) -> None:
    ids = []
    for _ in range(5):
        ids.append((await submit(store)).job.job_id)
    batch = await store.claim_batch("w1", 3)
    assert [c.job_id for c in batch] == ids[:3]


async def test_claim_refuses_a_blank_worker_and_a_bad_limit(store: RunStore) -> None:
    with pytest.raises(InvalidArgument, match="worker_id"):
        await store.claim("  ")
    with pytest.raises(InvalidArgument, match="at least 1"):
        await store.claim_batch("w1", 0)


async def test_claim_skips_a_job_whose_backoff_has_not_passed(store: RunStore) -> None:
    await submit(store, job_id=uuid.uuid4())
    claimed = await store.claim("w1")
    assert claimed is not None
    outcome = await store.retry_or_die(claimed.lease, "UNAVAILABLE: try later")
    assert outcome.status == "QUEUED"
    assert await store.claim("w1") is None


async def test_extending_a_lease_pushes_it_from_the_database_clock(pool: Pool) -> None:
    store = RunStore(pool, lease_s=2.0)
    await submit(store)
    claimed = await store.claim("w1")
    assert claimed is not None and claimed.job.lease_until is not None
    await age_rows(pool, 1.0, claimed.job_id)  # a second of the lease passes
    await store.extend_lease(claimed.lease)
    job = await store.get(claimed.job_id)
    assert job.lease_until is not None
    assert job.lease_until - job.updated_at == timedelta(seconds=2)
    # From now, not from the old deadline, which the second brought 1 s closer.
    assert job.lease_until - (claimed.job.lease_until - timedelta(seconds=1)) >= timedelta(
        seconds=1
    )
    # Nothing else moves: same owner, same attempt, still RUNNING.
    assert (job.status, job.lease_owner, job.attempt) == ("RUNNING", "w1", 1)


async def test_the_backlog_count_stops_at_its_cap(store: RunStore) -> None:
    await submit_many(store, 12)
    assert await store.count_queued(limit=100) == 12
    assert await store.count_queued(limit=5) == 5
    await store.claim_batch("w1", 4)  # RUNNING rows are not backlog
    assert await store.count_queued(limit=100) == 8
    with pytest.raises(ValueError, match="at least 1"):
        await store.count_queued(limit=0)


async def test_a_claim_reads_only_the_snapshots_its_caller_has_not_compiled(
    store: RunStore,
) -> None:
    known = await submit(store, name="compiled-here")
    lacking = await submit(store, name="new-here")
    asked: list[str] = []

    def compiled(digest: str) -> bool:
        asked.append(digest)
        return digest == known.job.definition_hash

    claimed = {job.job_id: job for job in await store.claim_batch("w1", 8, compiled=compiled)}
    assert set(asked) == {"hash-compiled-here", "hash-new-here"}
    # The one compiled here comes without its snapshot, the other with it, as stored.
    assert claimed[known.job.job_id].definition == {}
    assert claimed[lacking.job.job_id].definition == lacking.job.definition
    assert claimed[lacking.job.job_id].job.definition_hash == "hash-new-here"
    assert await store.definition_snapshots(["hash-new-here", "hash-never"]) == {
        "hash-new-here": lacking.job.definition
    }
