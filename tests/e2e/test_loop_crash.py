"""A long-lived loop that dies unexpectedly takes its worker process down, loudly.

Each loop of a real ``faust -A streams.app worker`` runs as a mode service, and
the request and completions agents are held to the same rule rather than
restarted by Faust past the messages they held; an error a loop does not
expect (here one injected by ``tests.e2e.broken_loops`` once the process is
healthy) must end the process with a non-zero exit and
the error's traceback in its log, instead of leaving it up and looking healthy
with the loop gone.
"""

from __future__ import annotations

import pytest

from devstack.stack import WorkerProcess
from schemas.contract import StepCompletion
from streams.agents import STOP_MARGIN_S
from streams.settings import Settings
from tests.e2e.broken_loops import LOOP_ENV, MESSAGE, TRIGGER_ENV
from tests.e2e.harness import HANDLERS_MODULE, Stack, wait_until
from tests.workflows_fixtures import envelope

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("loop", ["sweeper", "claims", "relay", "loop_lag", "ownership"])
async def test_a_loop_that_raises_stops_its_process_with_the_error_logged(
    stack: Stack, loop: str
) -> None:
    trigger = stack.tmp / f"break-{loop}"
    worker = await stack.start_worker(
        f"w-{loop}",
        WFJOBS_HANDLERS=f"{HANDLERS_MODULE},tests.e2e.broken_loops",
        # The ownership watchdog reads the group every this many seconds.
        WFJOBS_OWNERSHIP_CHECK_S="1",
        **{LOOP_ENV: loop, TRIGGER_ENV: str(trigger)},
    )
    assert worker.exit_code() is None, worker.log_tail()
    trigger.touch()

    async def exited() -> int | None:
        return worker.exit_code()

    try:
        code = await wait_until(exited, timeout_s=30, interval_s=0.2)
    except TimeoutError:
        raise AssertionError(
            f"the worker is still running with its {loop} loop dead\n{worker.log_tail(80)}"
        ) from None
    log = worker.log_path.read_text(errors="replace")
    assert code != 0, log
    message = MESSAGE.format(loop=loop)
    assert f"InjectedDefect: {message}" in log, log
    assert "Traceback (most recent call last)" in log, log


async def _exit_code(worker: WorkerProcess, what: str) -> int:
    async def exited() -> int | None:
        return worker.exit_code()

    # Past the stop's own bound (the grace and its margin): a stop that hangs
    # ends in the process's exit all the same.
    bound = Settings.from_env({}).shutdown_grace_s + STOP_MARGIN_S + 10
    try:
        return await wait_until(exited, timeout_s=bound, interval_s=0.2)
    except TimeoutError:
        raise AssertionError(
            f"the worker is still running with its {what} agent dead\n{worker.log_tail(80)}"
        ) from None


def _assert_died_loudly(worker: WorkerProcess, code: int, loop: str, what: str) -> None:
    log = worker.log_path.read_text(errors="replace")
    assert code != 0, log
    message = MESSAGE.format(loop=loop)
    assert f"the {what} agent died (InjectedDefect: {message})" in log, log
    assert "Traceback (most recent call last)" in log, log
    # Faust's supervisor would have restarted it, reading on past what it held.
    assert "Restarting dead" not in log, log


async def test_a_request_agent_that_raises_stops_its_process_and_loses_no_request(
    stack: Stack,
) -> None:
    trigger = stack.tmp / "break-request-agent"
    broken = {
        "WFJOBS_HANDLERS": f"{HANDLERS_MODULE},tests.e2e.broken_loops",
        LOOP_ENV: "request_agent",
        TRIGGER_ENV: str(trigger),
    }
    worker = await stack.start_worker("w-requests", **broken)
    workflow = envelope(name="e2e-auto", review="invoke")
    await stack.put_workflow(worker, workflow)
    first = stack.produce_request(workflow["name"], {"text": "before"})
    stack.flush()
    await stack.wait_for_job(first, {"COMPLETED"})

    trigger.touch()
    held = [stack.produce_request(workflow["name"], {"text": f"held {i}"}) for i in range(5)]
    stack.flush()
    code = await _exit_code(worker, "request")
    _assert_died_loudly(worker, code, "request_agent", "request")

    # The requests the dead agent held were not acknowledged: the next member
    # of the group submits every one of them.
    trigger.unlink()
    await stack.start_worker("w-requests-next", **broken)
    for job_id in held:
        done = await stack.wait_for_job(job_id, {"COMPLETED", "FAILED", "DEAD"})
        assert done.status == "COMPLETED", done


async def test_a_completions_agent_that_raises_stops_its_process_and_loses_no_completion(
    stack: Stack,
) -> None:
    trigger = stack.tmp / "break-completions-agent"
    broken = {
        "WFJOBS_HANDLERS": f"{HANDLERS_MODULE},tests.e2e.broken_loops",
        LOOP_ENV: "completions_agent",
        TRIGGER_ENV: str(trigger),
    }
    worker = await stack.start_worker("w-completions", **broken)
    workflow = envelope(name="e2e-review")
    await stack.put_workflow(worker, workflow)
    job_id = stack.produce_request(workflow["name"], {"text": "please look"})
    stack.flush()
    await stack.wait_for_job(job_id, {"WAITING"})

    trigger.touch()
    completion = StepCompletion(job_id=str(job_id), step_name="review", request_id="held")
    completion.response.update({"approved": True, "reviewer": "ann"})
    stack.produce_keyed(
        stack.completions_topic, key=str(job_id).encode(), value=completion.SerializeToString()
    )
    stack.flush()
    code = await _exit_code(worker, "completions")
    _assert_died_loudly(worker, code, "completions_agent", "completions")
    assert (await stack.job(job_id)).status == "WAITING"

    trigger.unlink()
    await stack.start_worker("w-completions-next", **broken)
    done = await stack.wait_for_job(job_id, {"COMPLETED", "FAILED"})
    assert done.status == "COMPLETED", done
    assert done.result is not None and done.result["reviewer"] == "ann"
