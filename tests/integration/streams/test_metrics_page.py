"""``/metrics`` on the app's real web server, in-process, against a real Postgres."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from streams.metrics import SPECS, exported_family
from streams.openapi import OPENAPI_PATH
from tests.integration.store.helpers import submit
from tests.integration.streams.conftest import serve

pytestmark = pytest.mark.asyncio


async def test_metrics_are_served_without_a_token_and_hold_no_job_id(dsn: str) -> None:
    env = {"DATABASE_URL": dsn, "WFJOBS_METRICS_DB_CACHE_S": "0.1"}
    async with serve(env, token=False) as (client, runtime):
        jobs = [(await submit(runtime.require_runs())).job.job_id for _ in range(3)]
        # Auth is on, and a verb without a token is refused ...
        assert (await client.get("/v1/workflow-runs")).status == 401
        # ... but Prometheus scrapes with none.
        response = await client.get("/metrics")
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await response.text()

    families = {family.name: family for family in text_string_to_metric_families(text)}
    exported = {sample.name for family in families.values() for sample in family.samples}
    for name in exported:
        assert exported_family(name) in SPECS, name
    queued = [s for s in families["wfjobs_jobs"].samples if s.labels == {"status": "QUEUED"}]
    assert [s.value for s in queued] == [3.0]
    assert "wfjobs_event_loop_lag_seconds" in exported
    assert "wfjobs_admission_rejections_total" in exported
    # An api process runs no relay, claim loop or sweeper, and exports none of their figures.
    absent = ("wfjobs_relay_", "wfjobs_jobs_", "wfjobs_sweep")
    assert sorted(name for name in families if name.startswith(absent)) == []
    for job_id in jobs:
        assert str(job_id) not in text


async def test_metrics_off_serves_no_page_and_documents_none(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn, "WFJOBS_METRICS": "off"}) as (client, runtime):
        assert runtime.metrics is None
        response = await client.get("/metrics")
        assert response.status == 404
        assert (await response.json())["code"] == "NOT_FOUND"
        document = await (await client.get(OPENAPI_PATH)).json()
        assert "/metrics" not in document["paths"]
