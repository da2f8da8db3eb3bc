"""A batch of submits: one statement, one commit, each row as a single submit would store it."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from schemas.contract import decode_event
from schemas.errors import UnstorableValue
from store.outbox import Outbox
from store.pool import Pool
from store.runs import RunStore
from store.submit_batch import submit_rows
from tests.integration.store.helpers import DEFINITION


def queued(store: RunStore, job_id: uuid.UUID, **overrides: Any) -> dict[str, Any]:
    arguments: dict[str, Any] = {
        "job_id": job_id,
        "workflow_name": "embed-text",
        "definition": DEFINITION,
        "definition_hash": "hash-a",
        "input": {"text": "hello"},
        **overrides,
    }
    return store.submit_params(**arguments)


async def rows_of(pool: Pool, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    async with pool.connection() as conn:
        return await (await conn.execute(sql.encode(), params)).fetchall()


async def test_a_batch_stores_queued_and_refused_rows_with_their_events(
    pool: Pool, store: RunStore, outbox: Outbox
) -> None:
    good, other, refused = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    other_definition = {**DEFINITION, "name": "other"}
    results = await submit_rows(
        pool,
        [
            queued(store, good, owner="alice", deadline_ms=60_000),
            queued(
                store,
                other,
                workflow_name="other",
                definition=other_definition,
                definition_hash="hash-b",
            ),
            store.submit_failed_params(
                job_id=refused,
                workflow_name="missing",
                input={"text": "x"},
                error="unknown workflow 'missing': no stored definition",
            ),
        ],
    )
    assert [result.created for result in results] == [True, True, True]
    assert [result.job.job_id for result in results] == [good, other, refused]
    assert [result.job.status for result in results] == ["QUEUED", "QUEUED", "FAILED"]
    assert results[0].job.definition == DEFINITION and results[0].job.owner == "alice"
    assert results[0].job.deadline_at is not None
    assert results[2].job.error == "unknown workflow 'missing': no stored definition"

    # The same rows a single submit writes: read back through the snapshot.
    assert (await store.get(other)).definition == other_definition
    assert (await store.get(refused)).definition is None
    snapshots = await rows_of(pool, "SELECT hash FROM workflow_definition_snapshot ORDER BY hash")
    assert snapshots == [("hash-a",), ("hash-b",)]
    for job_id, event_type in ((good, "ACCEPTED"), (other, "ACCEPTED"), (refused, "FAILED")):
        records = await outbox.events_for(job_id)
        assert [record.event_type for record in records] == [event_type]
        assert decode_event(records[0].payload).job_id == str(job_id)


async def test_existing_jobs_are_answered_and_nothing_is_written_twice(
    pool: Pool, store: RunStore, outbox: Outbox
) -> None:
    before = (await store.submit(**_single(uuid.uuid4()))).job
    fresh = uuid.uuid4()
    results = await submit_rows(
        pool, [queued(store, before.job_id, input={"text": "changed"}), queued(store, fresh)]
    )
    assert [result.created for result in results] == [False, True]
    assert results[0].job.input == {"text": "hello"}
    assert results[0].job.definition == DEFINITION

    # A replay of the whole batch (its offsets were never committed) creates nothing.
    again = await submit_rows(pool, [queued(store, before.job_id), queued(store, fresh)])
    assert [result.created for result in again] == [False, False]
    assert [record.event_type for record in await outbox.events_for(fresh)] == ["ACCEPTED"]
    assert [record.event_type for record in await outbox.events_for(before.job_id)] == ["ACCEPTED"]
    count = await rows_of(pool, "SELECT count(*) FROM workflow_run")
    assert count == [(2,)]


async def test_a_batch_is_one_transaction(pool: Pool, store: RunStore) -> None:
    ids = [uuid.uuid4() for _ in range(50)]
    await submit_rows(pool, [queued(store, job_id) for job_id in ids])
    xmins = await rows_of(
        pool, "SELECT DISTINCT xmin::text FROM workflow_run WHERE job_id = ANY(%s)", ids
    )
    assert len(xmins) == 1
    outbox_xmins = await rows_of(
        pool,
        "SELECT DISTINCT xmin::text FROM workflow_run_events_outbox WHERE job_id = ANY(%s)",
        ids,
    )
    assert outbox_xmins == xmins


async def test_a_repeated_job_id_in_one_batch_is_refused(pool: Pool, store: RunStore) -> None:
    job_id = uuid.uuid4()
    with pytest.raises(ValueError, match="same job_id twice"):
        await submit_rows(pool, [queued(store, job_id), queued(store, job_id)])


async def test_a_value_the_database_refuses_fails_the_whole_batch(
    pool: Pool, store: RunStore
) -> None:
    good, bad = uuid.uuid4(), uuid.uuid4()
    with pytest.raises(UnstorableValue):
        await submit_rows(
            pool, [queued(store, good), queued(store, bad, input={"text": "nul \u0000 here"})]
        )
    assert await rows_of(pool, "SELECT count(*) FROM workflow_run") == [(0,)]


def _single(job_id: uuid.UUID) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "workflow_name": "embed-text",
        "definition": DEFINITION,
        "definition_hash": "hash-a",
        "input": {"text": "hello"},
    }
