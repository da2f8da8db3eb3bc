"""list-jobs: newest first, filters, limits, and a cursor that covers every row once."""

from __future__ import annotations

import base64
import uuid

import pytest

from schemas.errors import InvalidArgument
from store.records import Job
from store.runs import RunStore, encode_page_token
from tests.integration.store.helpers import submit, submit_many


def _newest_first(jobs: tuple[Job, ...] | list[Job]) -> bool:
    keys = [(job.created_at, job.job_id) for job in jobs]
    return keys == sorted(keys, reverse=True)


async def test_limits_paging_and_order_over_520_jobs(store: RunStore) -> None:
    ids = set(await submit_many(store, 520))

    default = await store.list(limit=0)
    assert len(default.jobs) == 50
    assert _newest_first(default.jobs)
    clamped = await store.list(limit=501)
    assert len(clamped.jobs) == 500
    assert _newest_first(clamped.jobs)
    assert clamped.next_page_token
    rest = await store.list(limit=501, page_token=clamped.next_page_token)
    assert len(rest.jobs) == 20
    assert rest.next_page_token == ""
    assert {job.job_id for job in clamped.jobs + rest.jobs} == ids

    seen: list[Job] = []
    token: str | None = None
    while True:
        page = await store.list(limit=37, page_token=token)
        seen.extend(page.jobs)
        if not page.next_page_token:
            break
        token = page.next_page_token
    assert len(seen) == 520
    assert {job.job_id for job in seen} == ids
    assert _newest_first(seen)


async def test_newest_first_and_filters(store: RunStore) -> None:
    older = (await submit(store, name="tokenize")).job
    middle = (await submit(store, name="embed")).job
    newest = (await submit(store, name="embed")).job
    claimed = await store.claim("w1")  # the oldest: older
    assert claimed is not None and claimed.job_id == older.job_id

    everything = await store.list()
    assert [job.job_id for job in everything.jobs] == [
        newest.job_id,
        middle.job_id,
        older.job_id,
    ]
    assert everything.next_page_token == ""
    by_status = await store.list(status="QUEUED")
    assert [job.job_id for job in by_status.jobs] == [newest.job_id, middle.job_id]
    by_name = await store.list(workflow_name="tokenize")
    assert [job.job_id for job in by_name.jobs] == [older.job_id]
    both = await store.list(status="RUNNING", workflow_name="embed")
    assert both.jobs == ()
    first = await store.list(workflow_name="embed", limit=1)
    assert [job.job_id for job in first.jobs] == [newest.job_id]
    second = await store.list(workflow_name="embed", limit=1, page_token=first.next_page_token)
    assert [job.job_id for job in second.jobs] == [middle.job_id]
    assert second.next_page_token == ""


async def test_bad_arguments_are_refused_with_what_was_wrong(store: RunStore) -> None:
    with pytest.raises(InvalidArgument, match="must not be negative, got -1"):
        await store.list(limit=-1)
    with pytest.raises(InvalidArgument) as refused:
        await store.list(status="DONE")
    assert "unknown status 'DONE'" in refused.value.message
    assert "QUEUED, RUNNING, WAITING, COMPLETED, FAILED, DEAD" in refused.value.message
    with pytest.raises(InvalidArgument, match="workflow name 'embed text' is malformed"):
        await store.list(workflow_name="embed text")
    naive = base64.urlsafe_b64encode(f"2026-01-01T00:00:00|{uuid.uuid4()}".encode()).decode()
    not_a_uuid = base64.urlsafe_b64encode(b"2026-01-01T00:00:00+00:00|42").decode()
    for token in ("not base64!", "bm9wZQ==", naive, not_a_uuid):
        with pytest.raises(InvalidArgument, match=r"page_token .* is malformed"):
            await store.list(page_token=token)


async def test_a_page_after_the_last_job_is_empty(store: RunStore) -> None:
    job = (await submit(store)).job
    page = await store.list(page_token=encode_page_token(job.created_at, job.job_id))
    assert page.jobs == ()
    other = await store.list(page_token=encode_page_token(job.created_at, uuid.UUID(int=0)))
    assert other.jobs == ()
