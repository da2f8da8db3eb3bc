"""The runtime starts the loops its roles ask for, and only those, on a real Postgres."""

from __future__ import annotations

import pytest

from store.channels import JOBS_QUEUED_CHANNEL, OUTBOX_CHANNEL
from streams.runtime import Runtime
from streams.settings import Settings
from tests.workflows_fixtures import make_registry


@pytest.mark.parametrize(
    ("roles", "claims", "relay", "channels"),
    [
        # Watchers of a job listen for themselves, only while watched.
        ("api", False, False, None),
        ("worker", True, False, (JOBS_QUEUED_CHANNEL,)),
        ("relay", False, True, (OUTBOX_CHANNEL,)),
        ("api,worker,relay", True, True, (JOBS_QUEUED_CHANNEL, OUTBOX_CHANNEL)),
    ],
)
async def test_roles_start_their_loops_and_share_one_listener(
    dsn: str,
    roles: str,
    claims: bool,
    relay: bool,
    channels: tuple[str, ...] | None,
) -> None:
    settings = Settings.from_env(
        {"DATABASE_URL": dsn, "WFJOBS_ROLES": roles, "WFJOBS_WORKER_ID": "roles-test"}
    )
    runtime = Runtime(settings, registry=make_registry())
    await runtime.start()
    try:
        await runtime.wait_ready()
        assert (runtime.claims is not None) is claims
        assert (runtime.sweeper is not None) is claims
        assert (runtime.relay is not None) is relay
        if channels is None:
            assert runtime.listener is None
        else:
            assert runtime.listener is not None
            assert runtime.listener.channels == channels
        assert (runtime.watch is not None) is ("api" in roles)
        assert (runtime.progress is not None) is claims
        # Every role can reach the store; the verbs need nothing more.
        assert await runtime.check_store() == ""
    finally:
        await runtime.stop()


async def test_without_a_store_no_loop_starts() -> None:
    runtime = Runtime(Settings.from_env({"WFJOBS_WORKER_ID": "no-store"}), registry=make_registry())
    await runtime.start()
    try:
        assert runtime.claims is None and runtime.relay is None and runtime.listener is None
        assert "DATABASE_URL" in await runtime.check_store()
    finally:
        await runtime.stop()
