"""Fixtures for the deadline and completion tests: the app in-process on a real Postgres."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from streams.runtime import Runtime
from tests.integration.streams.conftest import put_workflow, serve
from tests.workflows_fixtures import LARGE_DEFINITION_ENV, envelope


def timed_workflow(name: str, **review: Any) -> dict[str, Any]:
    """The test workflow whose external review step carries ``review``'s keys."""
    definition = envelope(name=name)
    definition["steps"][2].update(review)
    return definition


@pytest.fixture
async def app(dsn: str) -> AsyncIterator[tuple[TestClient[Any, Any], Runtime]]:
    # Completions from the topic may name their principal here, so one can
    # act as the token's owner ("tester") and another as a stranger.
    # The large definitions of the event-loop tests are checked in time on a busy machine.
    env = {"DATABASE_URL": dsn, "WFJOBS_TRUST_REQUEST_PRINCIPAL": "true", **LARGE_DEFINITION_ENV}
    async with serve(env) as served:
        client, _ = served
        await put_workflow(client, timed_workflow("timed", timeoutMs=60_000))
        await put_workflow(
            client,
            timed_workflow(
                "fallback",
                timeoutMs=60_000,
                fallback={"approved": True, "reviewer": "nobody came"},
            ),
        )
        await put_workflow(client, {**envelope(name="job-deadline"), "jobDeadlineMs": 600_000})
        yield served
