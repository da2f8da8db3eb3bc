"""In-process fixtures for the service's pieces, on a real migrated Postgres.

``serve`` mounts the app's real Faust views: it builds the app with
``streams.app.create_app`` and serves the aiohttp application Faust's web
driver made, on a local port, without starting Kafka consumers.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from store.migrate import migrate
from streams.app import create_app
from streams.runtime import Runtime
from streams.settings import Settings
from tests.workflows_fixtures import make_registry


@pytest.fixture
async def dsn(make_database: Callable[[], str]) -> str:
    url = make_database()
    await migrate(url)
    return url


def api_settings(env: Mapping[str, str]) -> Settings:
    return Settings.from_env({"WFJOBS_ROLES": "api", "WFJOBS_WORKER_ID": "web-test", **env})


@contextlib.asynccontextmanager
async def serve(env: Mapping[str, str]) -> AsyncIterator[tuple[TestClient[Any, Any], Runtime]]:
    settings = api_settings(env)
    runtime = Runtime(settings, registry=make_registry())
    app = create_app(settings, runtime=runtime)
    await runtime.start()
    web_app: Any = app.web.web_app  # type: ignore[attr-defined]
    client = TestClient(TestServer(web_app))
    await client.start_server()
    try:
        yield client, runtime
    finally:
        await client.close()
        await runtime.stop()
