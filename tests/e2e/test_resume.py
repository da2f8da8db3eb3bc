"""Resume with a real worker process and the real Kafka: a DEAD job run on from its checkpoint."""

from __future__ import annotations

import copy

import httpx
import pytest

from tests.e2e.conftest import PARTITIONS
from tests.e2e.harness import Stack, dedupe, type_name
from tests.workflows_fixtures import EMBED, REVIEW, TOKENIZE, envelope

pytestmark = pytest.mark.e2e


async def test_a_dead_job_resumed_runs_on_from_its_last_good_checkpoint(stack: Stack) -> None:
    worker = await stack.start_worker("w1")
    reader = stack.event_reader(PARTITIONS)
    broken = envelope(name="e2e-resume", review="invoke")
    await stack.put_workflow(worker, broken)

    async with httpx.AsyncClient(base_url=worker.url, timeout=10, headers=stack.headers) as http:
        submitted = await http.post(
            "/v1/workflow-runs",
            json={
                "workflow_name": "e2e-resume",
                "input": {"text": "resume me", "embed_fail": "UNAVAILABLE"},
                "max_attempts": 1,
            },
        )
        assert submitted.status_code == 201, submitted.text
        original_id = submitted.json()["job"]["job_id"]
        dead = await stack.wait_for_job(original_id, {"COMPLETED", "FAILED", "DEAD"})
        assert dead.status == "DEAD", dead
        assert [entry["name"] for entry in dead.checkpoints] == ["tokenize"]

        # The fix: the embed step no longer passes the fault through. The
        # resume runs that definition from the job's last good checkpoint.
        fixed = copy.deepcopy(broken)
        fixed["steps"][1]["rules"] = ["ids = tokenize.ids"]
        await stack.put_workflow(worker, fixed)
        resumed = await http.post(
            f"/v1/workflow-runs/{original_id}:resume", json={"use_current_definition": True}
        )
        assert resumed.status_code == 201, resumed.text
        run_id = resumed.json()["job"]["job_id"]

        run = await stack.wait_for_job(run_id, {"COMPLETED", "FAILED", "DEAD"})
        assert run.status == "COMPLETED", run
        assert run.verdict == "completed 3 steps: tokenize, embed, review"
        assert [entry["name"] for entry in run.checkpoints] == ["tokenize", "embed", "review"]
        # The checkpointed step ran once, for the original; the run went on from there.
        assert [(c.method, c.attempt) for c in stack.calls_for(original_id)] == [
            (TOKENIZE, 1),
            (EMBED, 1),
        ]
        assert [(c.method, c.attempt) for c in stack.calls_for(run_id)] == [
            (EMBED, 1),
            (REVIEW, 1),
        ]

        original_view = (await http.get(f"/v1/workflow-runs/{original_id}")).json()["job"]
        run_view = (await http.get(f"/v1/workflow-runs/{run_id}")).json()["job"]
    assert original_view["status"] == "DEAD" and original_view["resumed_by"] == run_id
    assert run_view["status"] == "COMPLETED" and run_view["resumed_from"] == original_id

    def settled(_: object) -> bool:
        return any(type_name(e) == "COMPLETED" for e in reader.for_job(run_id)) and any(
            type_name(e) == "RESUMED" for e in reader.for_job(original_id)
        )

    await reader.wait(settled)
    original_events = dedupe(reader.for_job(original_id))
    assert [type_name(e) for e in original_events] == [
        "ACCEPTED",
        "STEP_CHECKPOINT",
        "DEAD",
        "RESUMED",
    ]
    assert original_events[-1].resumed_by == run_id
    run_events = dedupe(reader.for_job(run_id))
    assert [(type_name(e), e.step_name) for e in run_events] == [
        ("ACCEPTED", ""),
        ("STEP_CHECKPOINT", "embed"),
        ("STEP_CHECKPOINT", "review"),
        ("COMPLETED", ""),
    ]
    assert run_events[0].resumed_from == original_id
    reader.close()
