"""In-process fixtures for the service's pieces, on a real migrated Postgres.

``serve`` mounts the app's real Faust views: it builds the app with
``streams.app.create_app`` and serves the aiohttp application Faust's web
driver made, on a local port, without starting Kafka consumers. With a store,
the client carries a fleet-wide token with every scope (and ``wfjobs`` run in
the test finds it in ``WFJOBS_TOKEN``), so the verbs are tested with auth on.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from store.tokens import create_token
from streams.app import create_app
from streams.auth import SCOPES
from streams.runtime import Runtime
from streams.settings import Settings
from tests.workflows_fixtures import envelope, make_registry, tokenize_ids


def api_settings(env: Mapping[str, str]) -> Settings:
    return Settings.from_env({"WFJOBS_ROLES": "api", "WFJOBS_WORKER_ID": "web-test", **env})


async def bearer(dsn: str, principal: str, scopes: Iterable[str]) -> dict[str, str]:
    """The ``Authorization`` header of a new token for ``principal`` with ``scopes``."""
    issued = await create_token(dsn, principal, scopes)
    return {"Authorization": f"Bearer {issued.token}"}


@contextlib.asynccontextmanager
async def running(env: Mapping[str, str]) -> AsyncIterator[Runtime]:
    """A started runtime with the settings ``env`` gives and the test handlers, stopped after."""
    runtime = Runtime(Settings.from_env(env), registry=make_registry())
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.stop()


@contextlib.asynccontextmanager
async def serve(
    env: Mapping[str, str], *, token: bool = True
) -> AsyncIterator[tuple[TestClient[Any, Any], Runtime]]:
    """The app's views on a local port; ``token=False`` sends no token."""
    settings = api_settings(env)
    runtime = Runtime(settings, registry=make_registry())
    app = create_app(settings, runtime=runtime)
    await runtime.start()
    headers: dict[str, str] = {}
    if token and settings.store_configured:
        headers = await bearer(settings.database_url, "tester", SCOPES)
    web_app: Any = app.web.web_app  # type: ignore[attr-defined]
    client = TestClient(TestServer(web_app), headers=headers)
    await client.start_server()
    before = os.environ.get("WFJOBS_TOKEN")
    if headers:
        os.environ["WFJOBS_TOKEN"] = headers["Authorization"].removeprefix("Bearer ")
    try:
        yield client, runtime
    finally:
        if headers:
            if before is None:
                os.environ.pop("WFJOBS_TOKEN", None)
            else:
                os.environ["WFJOBS_TOKEN"] = before
        await client.close()
        await runtime.stop()


# The stored workflow the verb tests use: tokenize, embed, then an external review.
WEB_WORKFLOW = envelope(name="web-review")


async def put_workflow(
    client: TestClient[Any, Any], workflow: Mapping[str, Any] = WEB_WORKFLOW
) -> None:
    response = await client.put(
        f"/v1/workflows/{workflow['name']}", json={"workflow": dict(workflow)}
    )
    assert response.status in (200, 201), await response.text()


async def parked_job(client: TestClient[Any, Any], runtime: Runtime, text: str) -> str:
    """A job WAITING on its review step, driven through the store as a worker would.

    It must be the only QUEUED job: the claim here takes the oldest.
    """
    response = await client.post(
        "/v1/workflow-runs", json={"workflow_name": "web-review", "input": {"text": text}}
    )
    assert response.status == 201, await response.text()
    job_id: str = (await response.json())["job"]["job_id"]
    runs = runtime.require_runs()
    claimed = await runs.claim("web-test")
    assert claimed is not None and str(claimed.job_id) == job_id
    ids = tokenize_ids(text)
    await runs.checkpoint(
        claimed.lease,
        {"name": "tokenize", "skipped": False, "response": {"ids": ids, "count": len(ids)}},
    )
    await runs.checkpoint(
        claimed.lease,
        {
            "name": "embed",
            "skipped": False,
            "response": {"vector": [0.5, 0.25, 0.0, 1.0], "dimensions": 4},
        },
    )
    await runs.park(claimed.lease, "review")
    return job_id


class Letters:
    """A dead-letter sink for the request agent's tests: what it was given."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes | None, bytes | None, str]] = []

    async def __call__(self, key: bytes | None, value: bytes | None, reason: str) -> None:
        self.sent.append((key, value, reason))


@pytest.fixture
async def runtime(dsn: str) -> AsyncIterator[Runtime]:
    """An API-role runtime on the test's database with the workflow ``stored`` stored."""
    settings = Settings.from_env(
        {"DATABASE_URL": dsn, "WFJOBS_ROLES": "api", "WFJOBS_WORKER_ID": "agent-test"}
    )
    started = Runtime(settings, registry=make_registry())
    await started.start()
    await started.require_definitions().put("stored", envelope(name="stored"))
    try:
        yield started
    finally:
        await started.stop()
