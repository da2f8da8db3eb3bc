"""list-jobs answers with summaries: a page stays small whatever its jobs carry."""

from __future__ import annotations

import base64
import os
import uuid

from store.records import JobSummary
from tests.integration.streams.conftest import serve


def blob(size: int) -> str:
    # Random, so neither compression nor JSON can make it small.
    return base64.b64encode(os.urandom(size * 3 // 4)).decode()


async def test_a_page_with_a_megabyte_job_stays_small(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        runs = runtime.require_runs()
        heavy = uuid.uuid4()
        await runs.submit(
            job_id=heavy,
            workflow_name="heavy",
            definition={"name": "heavy", "schema": {"descriptorSetBase64": blob(900_000)}},
            definition_hash="hash-heavy",
            input={"text": blob(300_000)},
        )
        claimed = await runs.claim("w1")
        assert claimed is not None and claimed.job_id == heavy
        await runs.checkpoint(
            claimed.lease, {"name": "embed", "skipped": False, "response": {"v": blob(300_000)}}
        )
        await runs.complete(claimed.lease, result={"out": blob(300_000)}, verdict="done")
        light = uuid.uuid4()
        await runs.submit(
            job_id=light,
            workflow_name="light",
            definition={"name": "light", "steps": []},
            definition_hash="hash-light",
            input={"text": "hi"},
        )

        page = await runs.list()
        assert all(isinstance(job, JobSummary) for job in page.jobs)
        assert [job.job_id for job in page.jobs] == [light, heavy]

        listed = await client.get("/v1/workflow-runs")
        assert listed.status == 200
        body = await listed.read()
        assert len(body) < 4096, len(body)
        jobs = (await listed.json())["jobs"]
        assert [job["job_id"] for job in jobs] == [str(light), str(heavy)]
        summary = jobs[1]
        assert summary["status"] == "COMPLETED" and summary["verdict"] == "done"
        assert summary["attempt"] == 1 and "updated_at" in summary
        assert not {"checkpoints", "input", "result"} & set(summary)

        # get-job still answers with the whole job.
        full = await client.get(f"/v1/workflow-runs/{heavy}")
        assert full.status == 200
        job = (await full.json())["job"]
        assert len(await full.read()) > 900_000
        assert job["checkpoints"][0]["name"] == "embed"
        assert set(job["input"]) == {"text"} and set(job["result"]) == {"out"}
