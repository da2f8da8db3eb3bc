"""The relay side: oldest first, one relay per job at a time, per-job order, dead letters."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import pytest

from store.outbox import (
    LEASE_PENDING_SQL,
    RELAY_SESSION,
    RELAY_SETTINGS_SQL,
    Outbox,
    OutboxRow,
    Publisher,
    PublishFailure,
    lease_pending_params,
)
from store.pool import Pool, create_pool
from store.runs import RunStore
from tests.integration.store.helpers import entry, submit

TIMED_OUT = PublishFailure("timed out", permanent=False)


@pytest.fixture(params=["shared-pool", "relay-connection"])
async def outbox(request: pytest.FixtureRequest, dsn: str, pool: Pool) -> AsyncIterator[Outbox]:
    """Each test twice: leases and settles through the shared pool, and through
    a relay connection holding ``RELAY_SESSION``, as a relaying worker has."""
    if request.param == "shared-pool":
        yield Outbox(pool)
        return
    relay_pool = create_pool(dsn, min_size=1, max_size=1, session=RELAY_SESSION)
    await relay_pool.open(wait=True)
    try:
        yield Outbox(pool, relay_pool=relay_pool)
    finally:
        await relay_pool.close()


async def test_a_relay_connection_holds_the_relay_settings_for_its_session(
    dsn: str, pool: Pool
) -> None:
    relay_pool = create_pool(dsn, min_size=1, max_size=1, session=RELAY_SESSION)
    await relay_pool.open(wait=True)
    try:
        async with relay_pool.connection() as conn:
            for name, value in RELAY_SESSION.items():
                cursor = await conn.execute("SELECT current_setting(%s)", (name,))
                assert await cursor.fetchone() == (value,), name
    finally:
        await relay_pool.close()
    # The shared pool's connections keep the server's settings.
    async with pool.connection() as conn:
        cursor = await conn.execute("SELECT current_setting('enable_bitmapscan')")
        assert await cursor.fetchone() == ("on",)


async def _ack_all(rows: list[OutboxRow]) -> list[PublishFailure | None]:
    return [None] * len(rows)


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
    refused: set[int] = set()
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
        async def publish(rows: list[OutboxRow]) -> list[PublishFailure | None]:
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
            answers: list[PublishFailure | None] = []
            broken: set[uuid.UUID] = set()
            for row in rows:
                # Like a real producer: stop sending a job's events after one fails.
                if row.job_id in broken:
                    answers.append(PublishFailure("held back", permanent=False))
                elif row.id not in refused and row.id % 4 == 0:
                    refused.add(row.id)
                    answers.append(PublishFailure("broker timed out", permanent=False))
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

    async def publish(rows: list[OutboxRow]) -> list[PublishFailure | None]:
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

    async def fail_the_first(rows: list[OutboxRow]) -> list[PublishFailure | None]:
        # A careless publisher that acks rows after a failure of their job.
        return [TIMED_OUT if row.id == first.id else None for row in rows]

    result = await outbox.relay_batch(fail_the_first)
    assert (result.fetched, result.published, result.failed, result.transient) == (3, 0, 0, 1)
    assert result.held_back == 2
    records = await outbox.events_for(job_id)
    # A transient fault spends no attempt; the error is noted for whoever looks.
    assert [(r.status, r.attempts, r.last_error) for r in records] == [
        ("PENDING", 0, "timed out"),
        ("PENDING", 0, None),
        ("PENDING", 0, None),
    ]


async def test_transient_faults_never_spend_an_attempt(store: RunStore, outbox: Outbox) -> None:
    (job_id,) = await _jobs_with_events(store, jobs=1, steps=1)

    async def broker_away(rows: list[OutboxRow]) -> list[PublishFailure | None]:
        return [TIMED_OUT] * len(rows)

    for _ in range(15):
        result = await outbox.relay_batch(broker_away)
        assert (result.fetched, result.transient, result.failed) == (2, 1, 0)
    assert [(r.status, r.attempts) for r in await outbox.events_for(job_id)] == [
        ("PENDING", 0),
        ("PENDING", 0),
    ]


async def test_a_transient_fault_can_ask_for_a_pause_before_the_row_is_tried_again(
    store: RunStore, outbox: Outbox
) -> None:
    (job_id,) = await _jobs_with_events(store, jobs=1, steps=0)

    async def later(rows: list[OutboxRow]) -> list[PublishFailure | None]:
        return [PublishFailure("leader not available", permanent=False, retry_after_s=3600)]

    assert (await outbox.relay_batch(later)).transient == 1

    async def never(rows: list[OutboxRow]) -> list[PublishFailure | None]:
        raise AssertionError("a row handed back for an hour was handed out again")

    assert (await outbox.relay_batch(never)).fetched == 0
    [record] = await outbox.events_for(job_id)
    assert (record.status, record.attempts, record.last_error) == (
        "PENDING",
        0,
        "leader not available",
    )


async def test_a_permanent_failure_fails_the_row_at_once_and_holds_back_its_job(
    pool: Pool, store: RunStore, outbox: Outbox
) -> None:
    expected = await _jobs_with_events(store, jobs=2, steps=2)
    poisoned, healthy = list(expected)
    poison, *later = await outbox.events_for(poisoned)
    topic: list[int] = []

    async def refuse_poison(rows: list[OutboxRow]) -> list[PublishFailure | None]:
        answers: list[PublishFailure | None] = []
        for row in rows:
            if row.id == poison.id:
                answers.append(PublishFailure("MSG_SIZE_TOO_LARGE: too large", permanent=True))
            else:
                topic.append(row.id)
                answers.append(None)
        return answers

    result = await outbox.relay_batch(refuse_poison)
    assert (result.published, result.failed, result.held_back) == (3, 1, 2)
    assert [(d.id, d.job_id, d.reason) for d in result.dead_letters] == [
        (poison.id, poisoned, "MSG_SIZE_TOO_LARGE: too large")
    ]
    records = await outbox.events_for(poisoned)
    assert [(r.status, r.attempts, r.last_error) for r in records] == [
        ("FAILED", 1, "MSG_SIZE_TOO_LARGE: too large"),
        ("PENDING", 0, None),
        ("PENDING", 0, None),
    ]
    assert {r.status for r in await outbox.events_for(healthy)} == {"PUBLISHED"}

    # While the FAILED row stays, its job's later rows are not handed out.
    for _ in range(3):
        assert (await outbox.relay_batch(refuse_poison)).fetched == 0
    assert await outbox.pending_count() == 2

    # A redrive (FAILED back to PENDING, attempts reset) releases the job, in order.
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run_events_outbox SET status = 'PENDING', attempts = 0 WHERE id = %s",
            (poison.id,),
        )
    topic.clear()

    async def publish_all(rows: list[OutboxRow]) -> list[PublishFailure | None]:
        topic.extend(row.id for row in rows)
        return [None] * len(rows)

    assert (await outbox.relay_batch(publish_all)).published == 3
    assert topic == [poison.id, *(r.id for r in later)]


async def test_rows_held_back_by_a_failed_row_never_fill_the_window(
    pool: Pool, store: RunStore, outbox: Outbox
) -> None:
    # One dead-lettered job with more PENDING rows behind its FAILED row than
    # a pass reads: the other jobs must still get through.
    limit = 10
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO workflow_run_events_outbox (job_id, event_type, payload, status)"
            " VALUES ('20000000-0000-0000-0000-000000000001', 'ACCEPTED', '\\x00', 'FAILED')"
        )
        await conn.execute(
            "INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)"
            " SELECT '20000000-0000-0000-0000-000000000001', 'STEP_CHECKPOINT', '\\x00'"
            "   FROM generate_series(1, %s)",
            (limit * 10,),
        )
    (free,) = await _jobs_with_events(store, jobs=1, steps=0)
    handed: list[OutboxRow] = []

    async def publish(rows: list[OutboxRow]) -> list[PublishFailure | None]:
        handed.extend(rows)
        return [None] * len(rows)

    result = await outbox.relay_batch(publish, limit=limit)
    assert result.published == 1
    assert [row.job_id for row in handed] == [free]


async def test_rows_paused_for_a_transient_fault_never_fill_the_window(
    pool: Pool, store: RunStore, outbox: Outbox
) -> None:
    # A partition without a leader: its jobs' rows are handed back to be tried
    # again later, while every other partition takes its events. More of them
    # than a pass reads must not keep the other jobs' events from going out.
    limit = 5
    down = set(await _jobs_with_events(store, jobs=limit * 6, steps=0))

    async def partition_down(rows: list[OutboxRow]) -> list[PublishFailure | None]:
        return [
            PublishFailure("leader not available", permanent=False, retry_after_s=3600)
            if row.job_id in down
            else None
            for row in rows
        ]

    while (await outbox.relay_batch(partition_down, limit=limit)).fetched:
        pass
    assert await outbox.pending_count() == len(down)

    (up,) = await _jobs_with_events(store, jobs=1, steps=0)
    result = await outbox.relay_batch(partition_down, limit=limit)
    assert result.published == 1
    assert [r.status for r in await outbox.events_for(up)] == ["PUBLISHED"]

    # A paused job's later events wait behind its paused row...
    job = min(down)
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)"
            " VALUES (%s, 'STEP_CHECKPOINT', '\\x00')",
            (job,),
        )
    while (await outbox.relay_batch(partition_down, limit=limit)).fetched:
        pass
    assert [r.status for r in await outbox.events_for(job)] == ["PENDING", "PENDING"]

    # ... and once the pauses have passed, every paused job goes out, in order.
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run_events_outbox SET paused_until = now() - interval '1 second'"
            " WHERE paused_until IS NOT NULL"
        )
    handed: list[OutboxRow] = []

    async def partition_back(rows: list[OutboxRow]) -> list[PublishFailure | None]:
        handed.extend(rows)
        return [None] * len(rows)

    while (await outbox.relay_batch(partition_back, limit=limit)).fetched:
        pass
    assert await outbox.pending_count() == 0
    ids = [row.id for row in handed if row.job_id == job]
    assert ids == sorted(ids) and len(ids) == 2
    async with pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT count(*) FROM workflow_run_events_outbox WHERE paused_until IS NOT NULL"
        )
        assert await cursor.fetchone() == (0,)


async def test_a_publisher_that_raises_hands_every_row_back_without_an_attempt(
    store: RunStore, outbox: Outbox
) -> None:
    (job_id,) = await _jobs_with_events(store, jobs=1, steps=0)

    async def explode(rows: list[OutboxRow]) -> list[PublishFailure | None]:
        raise ConnectionError("broker unreachable")

    with pytest.raises(ConnectionError):
        await outbox.relay_batch(explode)
    (record,) = await outbox.events_for(job_id)
    assert (record.status, record.attempts) == ("PENDING", 0)
    assert record.last_error == "ConnectionError: broker unreachable"
    assert (await outbox.relay_batch(_ack_all)).published == 1


async def test_a_publisher_that_answers_the_wrong_count_changes_nothing(
    store: RunStore, outbox: Outbox
) -> None:
    (job_id,) = await _jobs_with_events(store, jobs=1, steps=1)

    async def short(rows: list[OutboxRow]) -> list[PublishFailure | None]:
        return [None]

    with pytest.raises(ValueError, match="1 outcomes for 2 rows"):
        await outbox.relay_batch(short)
    assert [(r.status, r.attempts) for r in await outbox.events_for(job_id)] == [
        ("PENDING", 0),
        ("PENDING", 0),
    ]
    assert (await outbox.relay_batch(_ack_all)).published == 2


async def test_no_transaction_is_open_while_rows_are_published(
    pool: Pool, store: RunStore, outbox: Outbox
) -> None:
    await _jobs_with_events(store, jobs=2, steps=1)
    seen: list[tuple[int, int]] = []

    async def publish(rows: list[OutboxRow]) -> list[PublishFailure | None]:
        async with pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT count(*) FILTER (WHERE xact_start IS NOT NULL),"
                "       count(*) FILTER (WHERE state = 'idle in transaction')"
                "  FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            row = await cursor.fetchone()
        assert row is not None
        seen.append((int(row[0]), int(row[1])))
        return [None] * len(rows)

    result = await outbox.relay_batch(publish)
    assert result.published == 4
    assert seen == [(0, 0)]


async def test_a_relay_that_dies_mid_publish_leaves_its_rows_to_another_after_its_lease(
    pool: Pool, store: RunStore, outbox: Outbox
) -> None:
    (job_id,) = await _jobs_with_events(store, jobs=1, steps=2)
    short_lease = Outbox(pool, lease_s=3600)
    publishing = asyncio.Event()
    never_answers = asyncio.Event()

    async def hang(rows: list[OutboxRow]) -> list[PublishFailure | None]:
        publishing.set()
        await never_answers.wait()
        return [None] * len(rows)

    # The first relay leases the rows and then hangs (as a relay that died would).
    dying = asyncio.create_task(short_lease.relay_batch(hang, owner="relay-a"))
    await publishing.wait()
    topic: list[int] = []

    async def publish(rows: list[OutboxRow]) -> list[PublishFailure | None]:
        topic.extend(row.id for row in rows)
        return [None] * len(rows)

    assert (await outbox.relay_batch(publish, owner="relay-b")).fetched == 0
    # Once the lease has run out (moved into the past here rather than waited
    # for), the second relay takes the rows.
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run_events_outbox SET lease_until = now() - interval '1 second'"
            " WHERE job_id = %s",
            (job_id,),
        )
    assert (await outbox.relay_batch(publish, owner="relay-b")).published == 3
    assert topic == [record.id for record in await outbox.events_for(job_id)]

    # The first relay's late answer changes nothing: its settle is fenced on its lease.
    never_answers.set()
    late = await dying
    assert (late.published, late.lost) == (0, 3)
    assert [(r.status, r.attempts) for r in await outbox.events_for(job_id)] == [
        ("PUBLISHED", 1)
    ] * 3


async def test_an_empty_outbox_does_not_call_the_publisher(outbox: Outbox) -> None:
    async def never(rows: list[OutboxRow]) -> list[PublishFailure | None]:
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
        # The lease exactly as a pass runs it, locks included, rolled back.
        await conn.execute(RELAY_SETTINGS_SQL)
        cursor = await conn.execute(
            ("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + LEASE_PENDING_SQL).encode(),
            lease_pending_params(limit),
        )
        row = await cursor.fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    assert plan["Actual Rows"] == limit
    # Counted, not timed: what one pass reads must be a small multiple of its
    # batch however large the backlog behind it (15 000 rows here).
    assert _rows_read(plan) <= 10 * limit, plan
    # Blocks: besides reading, the lease writes every row it takes (a new row
    # version and its index entries) and probes the FAILED index once per row
    # of the window; still a multiple of the batch, not of the backlog.
    assert plan["Shared Hit Blocks"] + plan["Shared Read Blocks"] <= 25 * limit, plan

    handed: list[OutboxRow] = []

    async def publish(rows: list[OutboxRow]) -> list[PublishFailure | None]:
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

    async def slow_publish(rows: list[OutboxRow]) -> list[PublishFailure | None]:
        holding.set()
        await release.wait()
        topic.extend(row.id for row in rows)
        return [None] * len(rows)

    async def publish(rows: list[OutboxRow]) -> list[PublishFailure | None]:
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


async def test_a_lease_rewrites_each_row_on_its_own_page(
    pool: Pool, store: RunStore, outbox: Outbox
) -> None:
    # Enough rows to fill several pages: at the default fillfactor the leased
    # versions of a full page's rows had to go to other pages, each adding an
    # entry to every index of the table (migration 0014).
    await _jobs_with_events(store, jobs=40, steps=3)
    where_rows_are = (
        "SELECT id, (ctid::text::point)[0]::int FROM workflow_run_events_outbox ORDER BY id"
    )
    async with pool.connection() as conn:
        before: dict[int, int] = dict(await (await conn.execute(where_rows_are)).fetchall())
    assert len(set(before.values())) >= 3, "the rows should span several pages"
    during: dict[int, int] = {}

    async def publish(rows: list[OutboxRow]) -> list[PublishFailure | None]:
        async with pool.connection() as conn:
            during.update(dict(await (await conn.execute(where_rows_are)).fetchall()))
        return [None] * len(rows)

    result = await outbox.relay_batch(publish, limit=len(before))
    assert result.published == len(before)
    moved = {row_id for row_id, page in before.items() if during[row_id] != page}
    assert not moved, f"{len(moved)} of {len(before)} leased rows left their page"
