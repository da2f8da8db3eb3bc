"""The API as a deployment serves it: Faust's own web server, in-process, on 127.0.0.1.

``live_api`` starts the app's web service the way ``faust worker`` does (the
server Faust runs, its runner and connection handler, its built-in blueprints),
against a real migrated Postgres, with auth on and a token that carries every
scope. No Kafka client starts: the process has the ``api`` role only.
"""

from __future__ import annotations

import contextlib
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from store.tokens import create_token
from streams.app import create_app
from streams.auth import SCOPES
from streams.runtime import Runtime
from streams.settings import Settings
from tests.workflows_fixtures import make_registry, tokenize_ids


@dataclass(frozen=True)
class LiveApi:
    url: str
    host: str
    port: int
    # The Authorization header of a token with every scope.
    auth: Mapping[str, str]
    runtime: Runtime
    session: aiohttp.ClientSession
    web_app: Any


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def live(env: Mapping[str, str]) -> AsyncIterator[LiveApi]:
    port = _free_port()
    settings = Settings.from_env(
        {
            "WFJOBS_ROLES": "api",
            "WFJOBS_WORKER_ID": "http-test",
            "WFJOBS_WEB_HOST": "127.0.0.1",
            "WFJOBS_WEB_PORT": str(port),
            **env,
        }
    )
    assert settings.auth_enabled
    runtime = Runtime(settings, registry=make_registry())
    app = create_app(settings, runtime=runtime)
    web: Any = app.web  # type: ignore[attr-defined]
    await runtime.start()
    await web.start()
    issued = await create_token(settings.database_url, "http-tester", SCOPES)
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
    try:
        yield LiveApi(
            url=f"http://127.0.0.1:{port}",
            host="127.0.0.1",
            port=port,
            auth={"Authorization": f"Bearer {issued.token}"},
            runtime=runtime,
            session=session,
            web_app=web.web_app,
        )
    finally:
        await session.close()
        await web.stop()
        await runtime.stop()


@pytest.fixture
async def live_api(make_database: Callable[..., str]) -> AsyncIterator[LiveApi]:
    async with live({"DATABASE_URL": make_database(migrated=True)}) as api:
        yield api


async def parked_job(api: LiveApi) -> str:
    """A job WAITING on the review step of ``web-review`` (stored already), driven
    through the store as a worker would. It must be the only QUEUED job."""
    body = {"workflow_name": "web-review", "input": {"text": "look"}}
    async with api.session.post(api.url + "/v1/workflow-runs", json=body, headers=api.auth) as r:
        assert r.status == 201, await r.text()
        job_id: str = (await r.json())["job"]["job_id"]
    runs = api.runtime.require_runs()
    claimed = await runs.claim("http-test")
    assert claimed is not None and str(claimed.job_id) == job_id
    ids = tokenize_ids("look")
    for name, response in (
        ("tokenize", {"ids": ids, "count": len(ids)}),
        ("embed", {"vector": [0.5, 0.25, 0.0, 1.0], "dimensions": 4}),
    ):
        await runs.checkpoint(claimed.lease, {"name": name, "skipped": False, "response": response})
    await runs.park(claimed.lease, "review")
    return job_id


@pytest.fixture
async def live_api_with_kafka(
    make_database: Callable[..., str], kafka_bootstrap: str
) -> AsyncIterator[LiveApi]:
    """``live_api`` whose dead-letter verbs read a real broker (a topic of their own)."""
    env = {
        "DATABASE_URL": make_database(migrated=True),
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "WFJOBS_REQUESTS_TOPIC": f"http-fuzz-{uuid.uuid4().hex[:12]}",
    }
    async with live(env) as api:
        yield api
