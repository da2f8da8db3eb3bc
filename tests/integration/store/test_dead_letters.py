"""FAILED outbox rows: listed oldest first, redriven to PENDING with a wake-up."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from schemas.errors import InvalidArgument
from store.channels import OUTBOX_CHANNEL
from store.dead_letters import OutboxDeadLetters
from store.outbox import Outbox
from store.pool import Pool
from store.runs import RunStore
from tests.integration.store.helpers import entry, submit

MARK_FAILED_SQL = """
UPDATE workflow_run_events_outbox
   SET status = 'FAILED', attempts = 10, last_error = %(error)s
 WHERE id = ANY(%(ids)s::bigint[])
"""


@pytest.fixture
def dead_letters(pool: Pool) -> OutboxDeadLetters:
    return OutboxDeadLetters(pool)


async def _job_with_events(store: RunStore) -> uuid.UUID:
    """A parked job: ACCEPTED, STEP_CHECKPOINT and WAITING rows."""
    await submit(store)
    claimed = await store.claim("w1")
    assert claimed is not None
    await store.checkpoint(claimed.lease, entry("tokenize", ids=[1, 2]))
    await store.park(claimed.lease, "review")
    return claimed.job_id


async def _fail(pool: Pool, ids: list[int], error: str = "broker said no") -> None:
    async with pool.connection() as conn:
        await conn.execute(MARK_FAILED_SQL, {"ids": ids, "error": error})


async def _ids(outbox: Outbox, job_id: uuid.UUID) -> list[int]:
    return [row.id for row in await outbox.events_for(job_id)]


async def test_failed_rows_are_listed_oldest_first_paged_and_by_job(
    store: RunStore, outbox: Outbox, pool: Pool, dead_letters: OutboxDeadLetters
) -> None:
    first, second = await _job_with_events(store), await _job_with_events(store)
    first_ids, second_ids = await _ids(outbox, first), await _ids(outbox, second)
    await _fail(pool, [first_ids[0], second_ids[1], second_ids[2]])

    page = await dead_letters.list_failed(limit=2)
    assert [event.id for event in page.events] == [first_ids[0], second_ids[1]]
    assert page.events[0].job_id == first and page.events[0].event_type == "ACCEPTED"
    assert page.events[0].attempts == 10 and page.events[0].last_error == "broker said no"
    rest = await dead_letters.list_failed(limit=2, page_token=page.next_page_token)
    assert [event.id for event in rest.events] == [second_ids[2]] and rest.next_page_token == ""

    only = await dead_letters.list_failed(job_id=str(second))
    assert [event.id for event in only.events] == second_ids[1:]
    assert (await dead_letters.list_failed(job_id=uuid.uuid4())).events == ()

    with pytest.raises(InvalidArgument, match="page_token 'x' is malformed"):
        await dead_letters.list_failed(page_token="x")
    with pytest.raises(InvalidArgument, match="limit must not be negative"):
        await dead_letters.list_failed(limit=-1)
    with pytest.raises(InvalidArgument, match="job_id must be a UUID"):
        await dead_letters.list_failed(job_id="nope")


async def test_redrive_by_id_resets_attempts_keeps_the_error_and_wakes_the_relays(
    store: RunStore, outbox: Outbox, pool: Pool, dsn: str, dead_letters: OutboxDeadLetters
) -> None:
    job_id = await _job_with_events(store)
    ids = await _ids(outbox, job_id)
    await _fail(pool, ids[:2])
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute(f"LISTEN {OUTBOX_CHANNEL}")
        redriven = await dead_letters.redrive_ids([ids[0], ids[2], 999_999])
        notification = await asyncio.wait_for(anext(listener.notifies()), timeout=10)
    assert notification.channel == OUTBOX_CHANNEL
    assert redriven.events == ((ids[0], job_id),)
    # A PENDING row and an unknown id are reported and left alone.
    assert redriven.not_failed == (ids[2], 999_999)
    rows = {row.id: row for row in await outbox.events_for(job_id)}
    assert rows[ids[0]].status == "PENDING" and rows[ids[0]].attempts == 0
    assert rows[ids[0]].last_error == "broker said no"
    assert rows[ids[1]].status == "FAILED"
    assert rows[ids[2]].status == "PENDING"


async def test_redrive_a_job_or_everything(
    store: RunStore, outbox: Outbox, pool: Pool, dead_letters: OutboxDeadLetters
) -> None:
    first, second = await _job_with_events(store), await _job_with_events(store)
    first_ids, second_ids = await _ids(outbox, first), await _ids(outbox, second)
    await _fail(pool, first_ids + second_ids[:1])

    by_job = await dead_letters.redrive_job(first)
    assert by_job.ids == tuple(first_ids)
    assert [event.id for event in (await dead_letters.list_failed()).events] == second_ids[:1]
    everything = await dead_letters.redrive_all()
    assert everything.events == ((second_ids[0], second),)
    assert (await dead_letters.list_failed()).events == ()
    # Nothing left: a second redrive changes nothing.
    assert (await dead_letters.redrive_all()).events == ()


async def test_redrive_never_touches_a_published_row(
    store: RunStore, outbox: Outbox, pool: Pool, dead_letters: OutboxDeadLetters
) -> None:
    job_id = await _job_with_events(store)
    ids = await _ids(outbox, job_id)
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE workflow_run_events_outbox SET status = 'PUBLISHED', published_at = now()"
            " WHERE id = %(id)s",
            {"id": ids[0]},
        )
    assert (await dead_letters.redrive_ids([ids[0]])).not_failed == (ids[0],)
    assert (await dead_letters.redrive_job(job_id)).events == ()
    assert (await outbox.events_for(job_id))[0].status == "PUBLISHED"
    with pytest.raises(InvalidArgument, match="ids must name at least one"):
        await dead_letters.redrive_ids([])
    with pytest.raises(InvalidArgument, match=r"ids names 1001 outbox rows; .* at most 1000"):
        await dead_letters.redrive_ids(range(1, 1002))
    for outside in (0, 2**63):
        with pytest.raises(InvalidArgument, match=r"outbox row ids, 1 to 9223372036854775807"):
            await dead_letters.redrive_ids([1, outside])
