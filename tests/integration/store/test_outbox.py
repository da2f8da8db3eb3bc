"""The relay side: oldest first, one relay per job at a time, per-job order, dead letters."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import defaultdict
from typing import Any

import pytest

from store.outbox import (
    FETCH_PENDING_SQL,
    RELAY_PLANNER_SETTINGS_SQL,
    Outbox,
    OutboxRow,
    Publisher,
    fetch_pending_params,
)
from store.pool import Pool
from store.runs import RunStore
from tests.integration.store.helpers import entry, submit


async def _jobs_with_events(store: RunStore, jobs: int, steps: int) -> dict[uuid.UUID, int]:
    """``jobs`` jobs with an ACCEPTED event and ``steps`` checkpoint events each."""
    for _ in range(jobs):
        await submit(store)
    claimed = await store.claim_batch("w1", jobs)
    assert len(claimed) == jobs
    for step in range(steps):
        await asyncio.gather(
            *(store.checkpoint(job.lease, entry(f"step-{step}", n=step)) for job in claimed)
        )
    return {job.job_id: 1 + steps for job in claimed}


async def test_two_relays_never_share_a_job_and_keep_each_jobs_order(
    store: RunStore, outbox: Outbox
) -> None:
    # Few jobs with many events each, in small batches: a relay that ignored
    # job ownership would quickly take rows of a job the other one holds.
    steps = 8
    for _ in range(6):
        await submit(store)
    claimed = await store.claim_batch("w1", 6)
    topic: dict[uuid.UUID, list[int]] = defaultdict(list)
    in_flight: dict[uuid.UUID, str] = {}
    clashes: list[str] = []
    overlaps = 0
    rng = random.Random(7)
    writing = True

    async def write() -> None:
        # Events keep committing while the relays drain.
        nonlocal writing
        for step in range(steps):
            for job in claimed:
                await store.checkpoint(job.lease, entry(f"step-{step}", n=step))
            await asyncio.sleep(0.005)
        writing = False

    def publisher(name: str) -> Publisher:
        async def publish(rows: list[OutboxRow]) -> list[str | None]:
            nonlocal overlaps
            jobs = {row.job_id for row in rows}
            for job_id in jobs:
                # Recorded, not asserted: the store treats a raising publisher as
                # a failed attempt, which would hide the clash.
                holder = in_flight.get(job_id)
                if holder is not None:
                    clashes.append(f"{name} got rows of job {job_id} while {holder} held them")
                in_flight[job_id] = name
            if len(set(in_flight.values())) > 1:
                overlaps += 1
            await asyncio.sleep(rng.uniform(0, 0.01))
            answers: list[str | None] = []
            broken: set[uuid.UUID] = set()
            for row in rows:
                # Like a real producer: stop sending a job's events after one fails.
                if row.job_id in broken:
                    answers.append("held back")
                elif row.attempts == 0 and row.id % 4 == 0:
                    answers.append("broker timed out")
                    broken.add(row.job_id)
                else:
                    topic[row.job_id].append(row.id)
                    answers.append(None)
            for job_id in jobs:
                in_flight.pop(job_id, None)
            return answers

        return publish

    async def relay(name: str) -> None:
        publish = publisher(name)
        while writing or await outbox.pending_count():
            await outbox.relay_batch(publish, limit=5)

    await asyncio.gather(write(), relay("relay-a"), relay("relay-b"))

    assert overlaps > 0, "the two relays never ran at the same time"
    assert clashes == []
    assert {job_id: len(ids) for job_id, ids in topic.items()} == {
        job.job_id: 1 + steps for job in claimed
    }
    for job_id, ids in topic.items():
        assert ids == sorted(ids), f"job {job_id} reached the topic out of order: {ids}"
        records = await outbox.events_for(job_id)
        assert [record.id for record in records] == ids
        assert all(record.status == "PUBLISHED" for record in records)
        assert all(record.published_at is not None for record in records)


async def test_a_jobs_later_rows_wait_while_an_older_one_is_out_of_reach(
    pool: Pool, store: RunStore, outbox: Outbox
) -> None:
    expected = await _jobs_with_events(store, jobs=2, steps=2)
    blocked, free = list(expected)
    blocked_first = (await outbox.events_for(blocked))[0].id
    handed: list[OutboxRow] = []

    async def publish(rows: list[OutboxRow]) -> list[str | None]:
        handed.extend(rows)
        return [None] * len(rows)

    # Another transaction holds the job's oldest row (as a relay would): the
    # job's newer rows must not go out ahead of it.
    async with pool.connection() as holder, holder.transaction():
        await holder.execute(
            "SELECT id FROM workflow_run_events_outbox WHERE id = %s FOR UPDATE",
            (blocked_first,),
        )
        result = await outbox.relay_batch(publish)
    assert {row.job_id for row in handed} == {free}
    assert (result.fetched, result.published) == (3, 3)

    handed.clear()
    result = await outbox.relay_batch(publish)
    assert [row.job_id for row in handed] == [blocked] * 3
    assert [row.id for row in handed] == sorted(row.id for row in handed)
    assert handed[0].id == blocked_first


async def test_rows_after_a_failed_row_of_their_job_are_held_back(
    store: RunStore, outbox: Outbox
) -> None:
    (job_id,) = await _jobs_with_events(store, jobs=1, steps=2)
    first, *_ = await outbox.events_for(job_id)

    async def fail_the_first(rows: list[OutboxRow]) -> list[str | None]:
        # A careless publisher that acks rows after a failure of their job.
        return ["timed out" if row.id == first.id else None for row in rows]

    result = await outbox.relay_batch(fail_the_first)
    assert (result.fetched, result.published, result.failed, result.held_back) == (3, 0, 1, 2)
    records = await outbox.events_for(job_id)
    assert [(r.status, r.attempts, r.last_error) for r in records] == [
        ("PENDING", 1, "timed out"),
        ("PENDING", 0, None),
        ("PENDING", 0, None),
    ]


async def test_a_row_failing_ten_times_lands_failed_and_the_rest_move_on(
    store: RunStore, outbox: Outbox
) -> None:
    (job_id,) = await _jobs_with_events(store, jobs=1, steps=1)
    poison, after = await outbox.events_for(job_id)

    async def refuse_poison(rows: list[OutboxRow]) -> list[str | None]:
        return [f"rejected #{row.attempts + 1}" if row.id == poison.id else None for row in rows]

    for attempt in range(1, 11):
        result = await outbox.relay_batch(refuse_poison)
        assert result.failed == 1
        assert result.dead_lettered == (1 if attempt == 10 else 0)
    records = await outbox.events_for(job_id)
    assert (records[0].status, records[0].attempts, records[0].last_error) == (
        "FAILED",
        10,
        "rejected #10",
    )
    assert records[1].status == "PENDING"
    result = await outbox.relay_batch(refuse_poison)
    assert (result.fetched, result.published) == (1, 1)
    assert [record.status for record in await outbox.events_for(job_id)] == [
        "FAILED",
        "PUBLISHED",
    ]
    assert await outbox.pending_count() == 0
    assert after.id > poison.id


async def test_a_publisher_that_raises_counts_an_attempt_for_every_row(
    store: RunStore, outbox: Outbox
) -> None:
    (job_id,) = await _jobs_with_events(store, jobs=1, steps=0)

    async def explode(rows: list[OutboxRow]) -> list[str | None]:
        raise ConnectionError("broker unreachable")

    result = await outbox.relay_batch(explode)
    assert result.failed == 1
    (record,) = await outbox.events_for(job_id)
    assert (record.status, record.attempts) == ("PENDING", 1)
    assert record.last_error == "ConnectionError: broker unreachable"


async def test_a_publisher_that_answers_the_wrong_count_changes_nothing(
    store: RunStore, outbox: Outbox
) -> None:
    (job_id,) = await _jobs_with_events(store, jobs=1, steps=1)

    async def short(rows: list[OutboxRow]) -> list[str | None]:
        return [None]

    with pytest.raises(ValueError, match="1 outcomes for 2 rows"):
        await outbox.relay_batch(short)
    assert [(r.status, r.attempts) for r in await outbox.events_for(job_id)] == [
        ("PENDING", 0),
        ("PENDING", 0),
    ]


async def test_an_empty_outbox_does_not_call_the_publisher(outbox: Outbox) -> None:
    async def never(rows: list[OutboxRow]) -> list[str | None]:
        raise AssertionError("called with nothing to publish")

    result = await outbox.relay_batch(never)
    assert result.fetched == 0


# Published rows of 400 jobs: an outbox the relay has caught up with.
CAUGHT_UP_SQL = """
INSERT INTO workflow_run_events_outbox (job_id, event_type, payload, status, attempts, published_at)
SELECT ('00000000-0000-0000-0000-' || lpad(to_hex(mod(n, 400)), 12, '0'))::uuid,
       'STEP_CHECKPOINT', '\\x00', 'PUBLISHED', 1, now()
  FROM generate_series(1, 2000) AS n
"""

# A backlog of %(jobs)s jobs with %(per_job)s PENDING rows each, interleaved as
# jobs that run side by side write them: a job's rows lie %(jobs)s ids apart.
BACKLOG_SQL = """
INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)
SELECT job.id, 'STEP_CHECKPOINT', '\\x00'
  FROM generate_series(1, %(per_job)s) AS step,
       LATERAL (SELECT ('10000000-0000-0000-0000-' || lpad(to_hex(j), 12, '0'))::uuid AS id
                  FROM generate_series(1, %(jobs)s) AS j) AS job
 ORDER BY step, job.id
"""


def _rows_read(node: dict[str, Any]) -> float:
    """Outbox rows the plan's scans produced or threw away, over all their loops."""
    read = 0.0
    if node.get("Relation Name") == "workflow_run_events_outbox":
        read = node["Actual Loops"] * (
            node["Actual Rows"]
            + node.get("Rows Removed by Filter", 0)
            + node.get("Rows Removed by Index Recheck", 0)
        )
    return read + sum(_rows_read(child) for child in node.get("Plans", []))


@pytest.mark.parametrize("history", [False, True], ids=["analyzed-empty", "analyzed-caught-up"])
async def test_a_pass_costs_its_batch_not_the_backlog_whatever_the_statistics_say(
    pool: Pool, outbox: Outbox, history: bool
) -> None:
    limit, jobs, per_job = 100, 3000, 5
    async with pool.connection() as conn:
        # The statistics must stay those of a moment without PENDING rows, as
        # after an autovacuum analyze of a caught-up outbox in production.
        await conn.execute("ALTER TABLE workflow_run_events_outbox SET (autovacuum_enabled = off)")
        if history:
            await conn.execute(CAUGHT_UP_SQL.encode())
        await conn.execute("ANALYZE workflow_run_events_outbox")
        await conn.execute(BACKLOG_SQL.encode(), {"jobs": jobs, "per_job": per_job})

    async with pool.connection() as conn, conn.transaction(force_rollback=True):
        # The fetch exactly as a pass runs it, locks included, rolled back.
        await conn.execute(RELAY_PLANNER_SETTINGS_SQL)
        cursor = await conn.execute(
            ("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + FETCH_PENDING_SQL).encode(),
            fetch_pending_params(limit),
        )
        row = await cursor.fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    assert plan["Actual Rows"] == limit
    # Counted, not timed: what one pass reads must be a small multiple of its
    # batch however large the backlog behind it (15 000 rows here).
    assert _rows_read(plan) <= 10 * limit, plan
    assert plan["Shared Hit Blocks"] + plan["Shared Read Blocks"] <= 10 * limit, plan

    handed: list[OutboxRow] = []

    async def publish(rows: list[OutboxRow]) -> list[str | None]:
        handed.extend(rows)
        return [None] * len(rows)

    result = await outbox.relay_batch(publish, limit=limit)
    assert (result.fetched, result.published) == (limit, limit)
    # Oldest first: the batch is the head of the backlog, in id order.
    async with pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT min(id) FROM workflow_run_events_outbox WHERE status = 'PENDING'"
        )
        first_left = await cursor.fetchone()
    assert first_left is not None
    ids = [row.id for row in handed]
    assert ids == sorted(ids)
    assert ids[-1] < first_left[0]
    assert await outbox.pending_count() == jobs * per_job - limit


async def test_a_backlog_of_one_job_larger_than_the_window_drains_in_order_with_two_relays(
    store: RunStore, outbox: Outbox
) -> None:
    # One job with far more PENDING rows than the fetch window (four batches)
    # and two relays at once: the one that does not hold the job's head must
    # come away empty rather than take rows behind it, and the job's rows must
    # reach the "topic" in commit order, every one exactly once.
    await submit(store)
    claimed = await store.claim("w1")
    assert claimed is not None
    for step in range(120):
        await store.checkpoint(claimed.lease, entry(f"step-{step}", n=step))
    expected = [row.id for row in await outbox.events_for(claimed.job_id)]
    assert len(expected) == 121

    topic: list[int] = []
    holding = asyncio.Event()
    release = asyncio.Event()

    async def slow_publish(rows: list[OutboxRow]) -> list[str | None]:
        holding.set()
        await release.wait()
        topic.extend(row.id for row in rows)
        return [None] * len(rows)

    async def publish(rows: list[OutboxRow]) -> list[str | None]:
        topic.extend(row.id for row in rows)
        return [None] * len(rows)

    first = asyncio.create_task(outbox.relay_batch(slow_publish, limit=25))
    await holding.wait()
    second = await outbox.relay_batch(publish, limit=25)
    assert second.fetched == 0
    release.set()
    assert (await first).published == 25
    while (await outbox.relay_batch(publish, limit=25)).fetched:
        pass
    assert topic == expected
