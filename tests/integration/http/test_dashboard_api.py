"""What the dashboard reads besides the verbs: the fleet overview, a parked step's
form, and its own files with their policy."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from store.tokens import create_token
from streams.auth import READ
from tests.integration.http.conftest import LiveApi, parked_job
from tests.integration.http.test_watch import store_review
from tests.integration.streams.conftest import serve
from tests.loop_gaps import with_longest_gap
from tests.workflows_fixtures import LARGE_DEFINITION_ENV, large_envelope

pytestmark = pytest.mark.asyncio


async def _get(api: LiveApi, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with api.session.get(api.url + path, headers=headers or api.auth) as response:
        return response.status, await response.json()


async def test_the_fleet_counts_every_status_and_shows_workers_only_fleet_wide(
    live_api: LiveApi,
) -> None:
    await store_review(live_api)
    parked = await parked_job(live_api)
    queued = {"workflow_name": "web-review", "input": {"text": "wait"}}
    async with live_api.session.post(
        live_api.url + "/v1/workflow-runs", json=queued, headers=live_api.auth
    ) as r:
        assert r.status == 201
    runs = live_api.runtime.require_runs()
    held = await runs.claim("fleet-worker")
    assert held is not None
    status, fleet = await _get(live_api, "/v1/fleet")
    assert status == 200, fleet
    assert fleet["jobs_by_status"] == {
        "QUEUED": 0,
        "RUNNING": 1,
        "WAITING": 1,
        "COMPLETED": 0,
        "FAILED": 0,
        "DEAD": 0,
        "CANCELLED": 0,
    }
    assert fleet["jobs_by_status_last_5m"]["WAITING"] == 1
    assert [w["worker"] for w in fleet["workers"]] == ["fleet-worker"]
    assert fleet["outbox"]["pending"] >= 4 and fleet["outbox"]["failed"] == 0
    # An owner-only token counts its own jobs (none here), and sees no worker or outbox.
    other = await create_token(live_api.runtime.settings.database_url, "someone-else", [READ])
    status, own = await _get(live_api, "/v1/fleet", {"Authorization": f"Bearer {other.token}"})
    assert status == 200
    assert set(own["jobs_by_status"].values()) == {0}
    assert "workers" not in own and "outbox" not in own
    assert parked


async def test_the_form_of_a_parked_step_lists_its_response_fields(live_api: LiveApi) -> None:
    await store_review(live_api)
    job_id = await parked_job(live_api)
    status, form = await _get(live_api, f"/v1/workflow-runs/{job_id}/steps/review:form")
    assert status == 200, form
    assert form["parked_here"] is True
    assert [(f["name"], f["kind"]) for f in form["fields"]] == [
        ("approved", "boolean"),
        ("reviewer", "string"),
        ("note", "string"),
    ]
    status, refused = await _get(live_api, f"/v1/workflow-runs/{job_id}/steps/tokenize:form")
    assert status == 400 and "not an external step" in refused["message"]
    status, refused = await _get(live_api, f"/v1/workflow-runs/{job_id}/steps/nope:form")
    assert status == 404 and "has no step 'nope'" in refused["message"]
    status, _ = await _get(live_api, f"/v1/workflow-runs/{uuid.uuid4()}/steps/review:form")
    assert status == 404


async def test_the_form_of_a_definition_not_cached_is_compiled_off_the_event_loop(
    make_database: Callable[..., str],
) -> None:
    async with serve(LARGE_DEFINITION_ENV | {"DATABASE_URL": make_database(migrated=True)}) as (
        client,
        runtime,
    ):
        submitted = await client.post(
            "/v1/workflow-runs", json={"workflow": large_envelope(), "input": {"text": "x"}}
        )
        assert submitted.status == 201, await submitted.text()
        job_id = (await submitted.json())["job"]["job_id"]
        runtime.cache.clear()  # another process took the submit, or the cache moved on

        async def form() -> Any:
            response = await client.get(f"/v1/workflow-runs/{job_id}/steps/review:form")
            assert response.status == 200, await response.text()
            return await response.json()

        answer, longest = await with_longest_gap(form())
    assert answer["response_type"] == "jobs.test.ReviewResult" and not answer["parked_here"]
    assert longest < 0.2, f"the loop was held for {longest:.2f}s"


async def test_the_dashboard_files_are_served_with_a_strict_policy(live_api: LiveApi) -> None:
    async with live_api.session.get(live_api.url + "/dashboard", allow_redirects=False) as r:
        assert r.status == 308 and r.headers["Location"] == "/dashboard/"
    for path, media in (
        ("/dashboard/", "text/html"),
        ("/dashboard/app.js", "text/javascript"),
        ("/dashboard/app.css", "text/css"),
    ):
        async with live_api.session.get(live_api.url + path) as r:
            assert r.status == 200 and r.content_type == media
            assert "script-src 'self'" in r.headers["Content-Security-Policy"]
            assert len(await r.read()) > 500
    async with live_api.session.get(live_api.url + "/dashboard/secrets.txt") as r:
        assert r.status == 404
