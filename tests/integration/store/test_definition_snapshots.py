"""Definition snapshots are stored once per hash; every read finds them by the hash."""

from __future__ import annotations

import base64
import os
import uuid
from typing import Any

from store.pool import Pool
from store.runs import RunStore
from tests.integration.store.helpers import DEFINITION, submit, submit_many


async def scalar(pool: Pool, sql: str) -> Any:
    async with pool.connection() as conn:
        row = await (await conn.execute(sql.encode())).fetchone()
    assert row is not None
    return row[0]


async def test_many_jobs_of_one_definition_store_it_once(pool: Pool, store: RunStore) -> None:
    # About a megabyte, like a definition with a large descriptor set, and
    # random so compression cannot hide a copy.
    descriptor_set = base64.b64encode(os.urandom(750_000)).decode()
    big = {**DEFINITION, "schema": {"descriptorSetBase64": descriptor_set}}
    ids = [uuid.uuid4() for _ in range(30)]
    for job_id in ids:
        result = await store.submit(
            job_id=job_id,
            workflow_name="embed-text",
            definition=big,
            definition_hash="hash-big",
            input={"text": "hello"},
        )
        assert result.created and result.job.definition == big
    await submit_many(store, 20, name="small")

    assert await scalar(pool, "SELECT count(*) FROM workflow_definition_snapshot") == 2
    # Thirty jobs hold no copy of it: their whole table, TOAST included, is
    # smaller than the one stored snapshot.
    jobs_bytes = await scalar(pool, "SELECT pg_total_relation_size('workflow_run')")
    snapshot_bytes = await scalar(
        pool,
        "SELECT pg_column_size(definition) FROM workflow_definition_snapshot"
        " WHERE hash = 'hash-big'",
    )
    assert snapshot_bytes > 700_000
    assert jobs_bytes < snapshot_bytes

    # Every read gets the definition back through the hash.
    assert (await store.get(ids[0])).definition == big
    claimed = await store.claim_batch("w1", 50)
    assert len(claimed) == 50
    by_id = {job.job_id: job for job in claimed}
    assert by_id[ids[-1]].definition == big and by_id[ids[-1]].job.definition == big
    smalls = [job for job in claimed if job.job.workflow_name == "small"]
    assert all(job.definition == {**DEFINITION, "name": "small"} for job in smalls)


async def test_a_repeated_submit_writes_nothing_and_answers_the_stored_job(
    pool: Pool, store: RunStore
) -> None:
    first = (await submit(store)).job
    again = await store.submit(
        job_id=first.job_id,
        workflow_name="embed-text",
        definition={"name": "embed-text", "steps": []},
        definition_hash="hash-other",
        input={"text": "other"},
    )
    assert not again.created
    assert again.job.definition == first.definition
    assert again.job.definition_hash == "hash-embed-text"
    hashes = await scalar(pool, "SELECT array_agg(hash) FROM workflow_definition_snapshot")
    assert hashes == ["hash-embed-text"]


async def test_a_refused_job_names_no_snapshot(pool: Pool, store: RunStore) -> None:
    refused = await store.submit_failed(
        job_id=uuid.uuid4(), workflow_name="missing", input={}, error="no stored workflow"
    )
    assert refused.job.definition is None and refused.job.definition_hash == ""
    assert (await store.get(refused.job.job_id)).definition is None
    assert await scalar(pool, "SELECT count(*) FROM workflow_definition_snapshot") == 0


async def test_the_job_row_holds_no_definition_column(pool: Pool) -> None:
    columns = await scalar(
        pool,
        "SELECT array_agg(column_name::text) FROM information_schema.columns"
        " WHERE table_name = 'workflow_run'",
    )
    assert "workflow_definition" not in columns and "definition_hash" in columns
