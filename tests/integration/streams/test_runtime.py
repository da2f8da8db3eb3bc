"""The runtime starts the loops its roles ask for, and only those, on a real Postgres."""

from __future__ import annotations

import pytest

from store.channels import JOBS_QUEUED_CHANNEL, OUTBOX_CHANNEL
from tests.integration.streams.conftest import running


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
    async with running(
        {"DATABASE_URL": dsn, "WFJOBS_ROLES": roles, "WFJOBS_WORKER_ID": "roles-test"}
    ) as runtime:
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
        # The group commit and the grouped submits write through connections
        # of their own where this process writes them.
        runs = runtime.require_runs()
        assert runs.group is not None and runs.submits is not None
        assert (runtime.commit_pool is not None) is claims
        assert runs.group.pool is (runtime.commit_pool if claims else runtime.pool)
        submits = "api" in roles or "worker" in roles
        assert (runtime.submit_pool is not None) is submits
        assert runs.submits.pool is (runtime.submit_pool if submits else runtime.pool)
        # Every role can reach the store; the verbs need nothing more.
        assert await runtime.check_store() == ""


async def test_without_group_commit_no_writer_has_a_connection_of_its_own(dsn: str) -> None:
    async with running(
        {
            "DATABASE_URL": dsn,
            "WFJOBS_ROLES": "api,worker",
            "WFJOBS_WORKER_ID": "no-group-commit",
            "WFJOBS_GROUP_COMMIT": "false",
        }
    ) as runtime:
        await runtime.wait_ready()
        assert runtime.commit_pool is None and runtime.submit_pool is None
        assert runtime.claim_pool is not None


async def test_without_a_store_no_loop_starts() -> None:
    async with running({"WFJOBS_WORKER_ID": "no-store"}) as runtime:
        assert runtime.claims is None and runtime.relay is None and runtime.listener is None
        assert "DATABASE_URL" in await runtime.check_store()
