"""A worker told to stop while its database has gone silent still stops.

Silence is made by stopping (``SIGSTOP``) every process of the test's own
Postgres server: sockets stay open, new connections are taken in by the
kernel, and nothing answers, as after a failover or a network partition,
until TCP gives up hours later. An
orchestrator would kill a worker that overstays its grace; this checks that
it does not need to, and that the sessions it gives up on do not make it take
itself for a second process under its own worker id.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from devstack.postgres import PostgresService
from store.migrate import migrate
from streams.agents import EXIT_STOP_HUNG, STOP_MARGIN_S
from tests.e2e.conftest import MakeStack
from tests.e2e.harness import Stack, wait_until
from tests.workflows_fixtures import EMBED, envelope

pytestmark = pytest.mark.e2e

GRACE_S = 2.0


def _server_processes(dsn: str) -> list[int]:
    """The postmaster of ``dsn``'s server and every process it has forked."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    postmaster = _parent(row[0])
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError):
                if _parent(int(entry.name)) == postmaster:
                    children.append(int(entry.name))
    return [postmaster, *children]


def _parent(pid: int) -> int:
    # The command name, in parentheses, may hold spaces: the fields after it are plain.
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


@contextlib.contextmanager
def silenced(processes: list[int]) -> Iterator[None]:
    for pid in processes:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[PostgresService]:
    # The whole server goes silent, so it is this module's alone.
    with PostgresService("") as server:
        yield server


@pytest.fixture
async def silent_stack(own_postgres: PostgresService, make_stack: MakeStack) -> Stack:
    dsn = own_postgres.create_database("silent")
    await migrate(dsn)
    return await make_stack(dsn=dsn)


async def test_a_stop_while_the_store_never_answers_ends_by_itself(
    silent_stack: Stack,
) -> None:
    stack = silent_stack
    worker = await stack.start_worker(
        "w1",
        WFJOBS_E2E_SLOW_METHOD=EMBED,
        WFJOBS_E2E_SLOW_S="3",
        WFJOBS_SHUTDOWN_GRACE_S=str(GRACE_S),
    )
    workflow = envelope(name="e2e-silent-store", review="invoke")
    await stack.put_workflow(worker, workflow)
    job_id = stack.produce_request(workflow["name"], {"text": "a database that went quiet"})
    stack.flush()

    async def embedding() -> bool | None:
        return True if stack.calls_for(job_id, EMBED) else None

    await wait_until(embedding, timeout_s=30)
    with silenced(_server_processes(stack.dsn)):
        began = time.monotonic()
        code = worker.stop(timeout_s=GRACE_S + STOP_MARGIN_S + 30)
        took = time.monotonic() - began
        log = worker.log_tail(400)
    # Every part of the stop gives up on the store in turn; whatever is left
    # when the margin is up, the process exits saying so.
    assert took < GRACE_S + STOP_MARGIN_S + 5, (took, code, log)
    assert code in (0, EXIT_STOP_HUNG), (code, log)
    if code == EXIT_STOP_HUNG:
        assert "did not stop within" in log
    # Losing its own sessions to the silence, it did not take itself for a
    # second process under its id.
    assert "refusing to run" not in log, log
    # The job stays with the lease it had, for the sweeper once that passes.
    job = await stack.job(job_id)
    assert job.status == "RUNNING" and job.lease_owner == "w1", job
