"""One live process per worker id, and a fleet view that tells a live worker from a dead one.

A worker id is the ``lease_owner`` of every job the process holds: two live
processes under one id would renew, settle and sweep each other's jobs. The
second one refuses to start, naming the setting and the process holding the
id; a process restarted under the id of one that was killed starts at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import httpx
import pytest

from devstack.processes import ServiceError
from devstack.stack import WorkerProcess
from tests.e2e.harness import REPO_ROOT, Stack, wait_until
from tests.workflows_fixtures import EMBED, envelope

pytestmark = pytest.mark.e2e


async def _refused(stack: Stack, worker_id: str, name: str) -> tuple[int, str]:
    """The exit code and log of a worker started under ``worker_id``, once it has exited."""
    env = stack.worker_env(worker_id, WFJOBS_DATA_DIR=str(stack.tmp / f"faust-{name}"))
    worker = WorkerProcess(env, workdir=stack.tmp, name=name, cwd=REPO_ROOT, launch=stack.launch)
    stack.workers.append(worker)
    # It may exit before its web server ever answered.
    with contextlib.suppress(ServiceError):
        await asyncio.to_thread(worker.start, timeout_s=60.0)

    async def exited() -> int | None:
        return worker.exit_code()

    try:
        code = await wait_until(exited, timeout_s=60.0, interval_s=0.2)
    except TimeoutError:
        raise AssertionError(
            f"a second process under {worker_id!r} kept running\n{worker.log_tail(80)}"
        ) from None
    return code, worker.log_path.read_text(errors="replace")


async def test_a_second_live_process_under_one_worker_id_refuses_to_start(stack: Stack) -> None:
    first = await stack.start_worker("w1")
    code, log = await _refused(stack, "w1", "w1-again")
    assert code != 0, log
    named = [line for line in log.splitlines() if "WFJOBS_WORKER_ID" in line]
    assert len(named) == 1 and "Traceback" not in log, log
    assert "'w1'" in named[0] and f"pid {first.pid} on {socket.gethostname()}" in named[0], log
    # The first one runs on, untouched.
    assert first.exit_code() is None and first.healthy(), first.log_tail()
    assert first.stop() == 0, first.log_tail()


async def test_a_restart_under_the_id_of_a_killed_process_starts_at_once(stack: Stack) -> None:
    first = await stack.start_worker("w1")
    first.kill()
    again = await stack.start_worker("w1", WFJOBS_DATA_DIR=str(stack.tmp / "faust-w1-again"))
    assert again.healthy(), again.log_tail()
    assert again.stop() == 0, again.log_tail()


async def _fleet_workers(stack: Stack, api: WorkerProcess) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=api.url, timeout=10, headers=stack.headers) as http:
        answer = await http.get("/v1/fleet")
    assert answer.status_code == 200, answer.text
    workers: list[dict[str, Any]] = answer.json()["workers"]
    return workers


async def test_the_fleet_view_tells_a_killed_worker_from_a_live_one(stack: Stack) -> None:
    # The lease outlasts the test: only the worker's death can tell.
    slow = {"WFJOBS_LEASE_S": "120", "WFJOBS_E2E_SLOW_METHOD": EMBED, "WFJOBS_E2E_SLOW_S": "120"}
    worker = await stack.start_worker("w1", **slow)
    api = await stack.start_worker("api", WFJOBS_ROLES="api")
    workflow = envelope(name="e2e-fleet-live", review="invoke")
    await stack.put_workflow(api, workflow)
    job_id = stack.produce_request(workflow["name"], {"text": "held by a worker"})
    stack.flush()

    async def embedding() -> bool | None:
        return True if stack.calls_for(job_id, EMBED) else None

    await wait_until(embedding, timeout_s=30)
    (held,) = await _fleet_workers(stack, api)
    assert (held["worker"], held["running"], held["live"]) == ("w1", 1, True), held

    worker.kill()

    async def dead() -> dict[str, Any] | None:
        (held,) = await _fleet_workers(stack, api)
        return held if held["live"] is False else None

    try:
        held = await wait_until(dead, timeout_s=15, interval_s=0.5)
    except TimeoutError:
        raise AssertionError(
            f"a killed worker is still shown live: {await _fleet_workers(stack, api)}"
        ) from None
    # Its job waits for its lease as before; the view only says nobody renews it.
    assert (held["worker"], held["running"]) == ("w1", 1), held
    assert api.stop() == 0, api.log_tail()
