"""Jobs a release before operator control (migration 0011) left behind, after the upgrade.

A database is brought to migration 0010 with the real files and given jobs
in every live state the way that release wrote them: one QUEUED, one RUNNING
whose worker died after its first checkpoint, one WAITING at its review
step, each with its events still PENDING in the outbox. Their checkpoints,
definition snapshot and event payloads are taken from a job this release ran
to WAITING, so their formats are the product's own. The database is then
migrated the rest of the way and a worker of this release starts on it:
every job ends COMPLETED without a step called twice, and every event,
the old rows' first, reaches the topic in order.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb

from schemas.contract import WorkflowRunEvent
from store.migrate import migrate
from tests.conftest import MakeDatabase, MigrationsBefore
from tests.e2e.conftest import PARTITIONS, MakeStack
from tests.e2e.harness import Stack, dedupe, type_name
from tests.workflows_fixtures import EMBED, TOKENIZE, envelope

pytestmark = pytest.mark.e2e

FIRST_NEW = "0011"
FLOW = "e2e-upgrade"
TEXT = "jobs outlive the release that queued them"

OLD_JOB = """
INSERT INTO workflow_run (job_id, workflow_name, definition_hash, input, status, attempt,
                          max_attempts, checkpoints, outstanding_step, lease_owner,
                          lease_until, lease_token)
VALUES (%(job_id)s, %(name)s, %(hash)s, %(input)s, %(status)s, %(attempt)s, 3,
        %(checkpoints)s, %(outstanding)s, %(owner)s, %(lease_until)s, %(token)s)
"""
OLD_EVENT = """
INSERT INTO workflow_run_events_outbox (job_id, event_type, payload) VALUES (%s, %s, %s)
"""


async def a_job_run_to_waiting(stack: Stack) -> dict[str, Any]:
    """What this release writes for a job parked at review: its row's parts and its events."""
    worker = await stack.start_worker("donor")
    await stack.put_workflow(worker, envelope(name=FLOW))
    async with httpx.AsyncClient(base_url=worker.url, timeout=10, headers=stack.headers) as http:
        answer = await http.post(
            "/v1/workflow-runs", json={"workflow_name": FLOW, "input": {"text": TEXT}}
        )
        assert answer.status_code == 201, answer.text
        job_id = answer.json()["job"]["job_id"]
    await stack.wait_for_job(job_id, {"WAITING"})
    stack.stop_workers()
    async with await psycopg.AsyncConnection.connect(stack.dsn) as conn:
        cursor = await conn.execute(
            "SELECT r.definition_hash, s.definition, r.input, r.checkpoints"
            "  FROM workflow_run r"
            "  JOIN workflow_definition_snapshot s ON s.hash = r.definition_hash"
            " WHERE r.job_id = %s",
            (job_id,),
        )
        row = await cursor.fetchone()
        assert row is not None
        cursor = await conn.execute(
            "SELECT event_type, payload FROM workflow_run_events_outbox WHERE job_id = %s"
            " ORDER BY id",
            (job_id,),
        )
        events = [(kind, bytes(payload)) for kind, payload in await cursor.fetchall()]
    digest, definition, job_input, checkpoints = row
    assert [kind for kind, _ in events] == [
        "ACCEPTED",
        "STEP_CHECKPOINT",
        "STEP_CHECKPOINT",
        "WAITING",
    ]
    return {
        "hash": digest,
        "definition": definition,
        "input": job_input,
        "checkpoints": checkpoints,
        "events": events,
    }


def payload_for(job_id: uuid.UUID, payload: bytes) -> bytes:
    event = WorkflowRunEvent.FromString(payload)
    event.job_id = str(job_id)
    return event.SerializeToString(deterministic=True)


async def test_jobs_left_by_the_release_before_0011_run_to_completion_after_the_upgrade(
    make_stack: MakeStack,
    make_database: MakeDatabase,
    migrations_before: MigrationsBefore,
) -> None:
    donor = await a_job_run_to_waiting(await make_stack())

    dsn = make_database()
    applied = await migrate(dsn, package=migrations_before(FIRST_NEW))
    assert applied and max(applied) < FIRST_NEW
    queued, running, waiting = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    first, both = donor["checkpoints"][:1], donor["checkpoints"][:2]
    accepted, tokenized, embedded, parked = (payload for _, payload in donor["events"])
    jobs: list[tuple[uuid.UUID, dict[str, Any], list[tuple[str, bytes]]]] = [
        (
            queued,
            {"status": "QUEUED", "attempt": 0, "checkpoints": []},
            [("ACCEPTED", accepted)],
        ),
        (
            # Its worker died holding it; the lease ran out long ago.
            running,
            {
                "status": "RUNNING",
                "attempt": 1,
                "checkpoints": first,
                "owner": "worker-of-the-old-release",
                "lease_until": "2026-01-01T00:00:00Z",
                "token": 1,
            },
            [("ACCEPTED", accepted), ("STEP_CHECKPOINT", tokenized)],
        ),
        (
            waiting,
            {"status": "WAITING", "attempt": 1, "checkpoints": both, "outstanding": "review"},
            [
                ("ACCEPTED", accepted),
                ("STEP_CHECKPOINT", tokenized),
                ("STEP_CHECKPOINT", embedded),
                ("WAITING", parked),
            ],
        ),
    ]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO workflow_definition_snapshot (hash, definition) VALUES (%s, %s)",
            (donor["hash"], Jsonb(donor["definition"])),
        )
        for job_id, row, events in jobs:
            values = {
                "owner": None,
                "lease_until": None,
                "token": 0,
                "outstanding": None,
                **row,
                "job_id": job_id,
                "name": FLOW,
                "hash": donor["hash"],
                "input": Jsonb(donor["input"]),
            }
            values["checkpoints"] = Jsonb(values["checkpoints"])
            await conn.execute(OLD_JOB, values)
            for kind, payload in events:
                await conn.execute(OLD_EVENT, (job_id, kind, payload_for(job_id, payload)))

    assert min(await migrate(dsn)) == FIRST_NEW + "_operator_control.sql"
    stack = await make_stack(dsn=dsn)
    reader = stack.event_reader(PARTITIONS)
    worker = await stack.start_worker("w1")
    for job_id in (queued, running):
        assert (await stack.wait_for_job(job_id, {"WAITING"})).outstanding_step == "review"
    # The dead worker's checkpoint stands: its step is not called again.
    assert [call.method for call in stack.calls_for(running)] == [EMBED]
    assert [call.method for call in stack.calls_for(queued)] == [TOKENIZE, EMBED]

    async with httpx.AsyncClient(base_url=worker.url, timeout=10, headers=stack.headers) as http:
        for job_id, _, _ in jobs:
            answer = await http.post(
                f"/v1/workflow-runs/{job_id}/steps/review:complete",
                json={"response": {"approved": True, "reviewer": "ada"}},
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["outcome"] == "COMPLETED"
        swept = (await http.get(f"/v1/workflow-runs/{running}")).json()["job"]
        explained = await http.get(f"/v1/workflow-runs/{running}:explain")
        assert explained.status_code == 200, explained.text
        listed = await http.get("/v1/workflow-runs", params={"workflow_name": FLOW})
        assert listed.status_code == 200, listed.text
    assert {job["job_id"] for job in listed.json()["jobs"]} == {str(j) for j, _, _ in jobs}
    assert [(a["attempt"], a["worker"], a["outcome"]) for a in swept["history"]][:1] == [
        (1, "worker-of-the-old-release", "SWEPT")
    ]
    assert [c["name"] for c in swept["checkpoints"]] == ["tokenize", "embed", "review"]

    whole = ["ACCEPTED", "STEP_CHECKPOINT", "STEP_CHECKPOINT", "WAITING", "STEP_CHECKPOINT"]
    for job_id, _, _ in jobs:
        await reader.wait(
            lambda _, job_id=job_id: any(
                type_name(e) == "COMPLETED" for e in reader.for_job(job_id)
            )
        )
        events = dedupe(reader.for_job(job_id))
        assert [type_name(e) for e in events if type_name(e) != "RETRY_SCHEDULED"] == [
            *whole,
            "COMPLETED",
        ], job_id
        assert all(e.job_id == str(job_id) for e in events)
        ids = [e.event_id for e in events]
        assert ids == sorted(ids)
