"""A job's definition snapshot the process has not compiled yet is compiled on a
compile thread by the verbs that read it, not on the event loop.

Another process may have taken the submit, or the cache moved on since: the
snapshot's size is its author's choice, and the loop serves every other caller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.streams.conftest import serve
from tests.loop_gaps import with_longest_gap
from tests.workflows_fixtures import LARGE_DEFINITION_ENV, large_envelope

pytestmark = pytest.mark.asyncio


async def _submitted(client: Any) -> str:
    response = await client.post(
        "/v1/workflow-runs", json={"workflow": large_envelope(), "input": {"text": "x"}}
    )
    assert response.status == 201, await response.text()
    job_id: str = (await response.json())["job"]["job_id"]
    return job_id


async def _parked_at_review(client: Any, runtime: Any) -> str:
    """A job of the large workflow, its steps before ``review`` checkpointed, parked there."""
    job_id = await _submitted(client)
    runs = runtime.require_runs()
    claimed = await runs.claim("web-test")
    assert claimed is not None and str(claimed.job_id) == job_id
    tokens = {"ids": [1], "count": 1}
    for name in [f"copy{index}" for index in range(61)] + ["tokenize"]:
        await runs.checkpoint(claimed.lease, {"name": name, "skipped": False, "response": tokens})
    embedding = {"vector": [0.5, 0.25, 0.0, 1.0], "dimensions": 4}
    await runs.checkpoint(claimed.lease, {"name": "embed", "skipped": False, "response": embedding})
    await runs.park(claimed.lease, "review")
    return job_id


async def test_a_resume_from_the_snapshot_compiles_it_off_the_event_loop(
    make_database: Callable[..., str],
) -> None:
    async with serve(LARGE_DEFINITION_ENV | {"DATABASE_URL": make_database(migrated=True)}) as (
        client,
        runtime,
    ):
        job_id = await _submitted(client)
        cancelled = await client.post(f"/v1/workflow-runs/{job_id}:cancel", json={})
        assert cancelled.status == 200, await cancelled.text()
        runtime.cache.clear()

        async def resume() -> int:
            response = await client.post(f"/v1/workflow-runs/{job_id}:resume", json={})
            assert response.status == 201, await response.text()
            return response.status

        _, longest = await with_longest_gap(resume())
    assert longest < 0.2, f"the loop was held for {longest:.2f}s"


async def test_a_completion_compiles_the_snapshot_off_the_event_loop(
    make_database: Callable[..., str],
) -> None:
    async with serve(LARGE_DEFINITION_ENV | {"DATABASE_URL": make_database(migrated=True)}) as (
        client,
        runtime,
    ):
        job_id = await _parked_at_review(client, runtime)
        runtime.cache.clear()

        async def complete() -> Any:
            response = await client.post(
                f"/v1/workflow-runs/{job_id}/steps/review:complete",
                json={"response": {"approved": True}},
            )
            assert response.status == 200, await response.text()
            return await response.json()

        answer, longest = await with_longest_gap(complete())
    assert answer["outcome"] == "COMPLETED", answer
    assert longest < 0.2, f"the loop was held for {longest:.2f}s"


async def test_a_completion_repeated_after_the_job_moved_on_compiles_off_the_event_loop(
    make_database: Callable[..., str],
) -> None:
    async with serve(LARGE_DEFINITION_ENV | {"DATABASE_URL": make_database(migrated=True)}) as (
        client,
        runtime,
    ):
        job_id = await _parked_at_review(client, runtime)
        url = f"/v1/workflow-runs/{job_id}/steps/review:complete"
        first = await client.post(url, json={"response": {"approved": True}})
        assert first.status == 200, await first.text()
        # The job is no longer parked, and this process has not kept its snapshot.
        runtime.cache.clear()

        async def complete_again() -> Any:
            response = await client.post(url, json={"response": {"approved": True}})
            assert response.status == 200, await response.text()
            return await response.json()

        answer, longest = await with_longest_gap(complete_again())
    assert answer["outcome"] == "ALREADY_DONE", answer
    assert longest < 0.2, f"the loop was held for {longest:.2f}s"
