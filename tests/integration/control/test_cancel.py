"""Cancel against the real Postgres: the store's rules, and the verb over the app's real views.

Running jobs are driven through the store as a worker would (claim, renew,
checkpoint, settle); the worker process's side is the end-to-end test's.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from schemas.contract import WorkflowRunEvent
from schemas.errors import InvalidArgument, LeaseLost, NotFound
from store.control import MAX_REASON_CHARS, CancelFilter, ControlStore
from store.pool import Pool
from store.runs import RunStore
from streams.auth import CANCEL, COMPLETE, READ, SUBMIT
from streams.runtime import Runtime
from tests.integration.streams.conftest import bearer, parked_job, put_workflow, serve
from tests.integration.streams.test_cli_verbs import Wfjobs
from tests.loop_gaps import with_longest_gap
from tests.workflows_fixtures import envelope, tokenize_ids

OUTBOX_SQL = """
SELECT event_type, payload FROM workflow_run_events_outbox WHERE job_id = %(job_id)s ORDER BY id
"""
ATTEMPTS_SQL = """
SELECT attempt, worker, outcome, steps, error, error_class FROM workflow_run_attempt
 WHERE job_id = %(job_id)s ORDER BY id
"""
LATER = timedelta(hours=1)


@pytest.fixture
async def dsn(make_database: Callable[..., str]) -> str:
    return make_database(migrated=True)


async def events(pool: Pool, job_id: uuid.UUID | str) -> list[tuple[str, WorkflowRunEvent]]:
    async with pool.connection() as conn:
        rows = await (await conn.execute(OUTBOX_SQL, {"job_id": job_id})).fetchall()
    return [(kind, WorkflowRunEvent.FromString(payload)) for kind, payload in rows]


async def kinds(pool: Pool, job_id: uuid.UUID | str) -> list[str]:
    return [kind for kind, _ in await events(pool, job_id)]


async def attempts(pool: Pool, job_id: uuid.UUID | str) -> list[tuple[Any, ...]]:
    async with pool.connection() as conn:
        return list(await (await conn.execute(ATTEMPTS_SQL, {"job_id": job_id})).fetchall())


async def submitted(client: TestClient[Any, Any], text: str = "cancel me", **extra: Any) -> str:
    response = await client.post(
        "/v1/workflow-runs",
        json={"workflow_name": "web-review", "input": {"text": text}, **extra},
    )
    assert response.status == 201, await response.text()
    job_id: str = (await response.json())["job"]["job_id"]
    return job_id


async def cancel(
    client: TestClient[Any, Any], job_id: str, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    response = await client.post(f"/v1/workflow-runs/{job_id}:cancel", json=body)
    answer: dict[str, Any] = await response.json()
    return response.status, answer


def stores(runtime: Runtime) -> tuple[RunStore, ControlStore, Pool]:
    pool = runtime.pool
    assert pool is not None
    return runtime.require_runs(), runtime.require_control(), pool


# --------------------------------------------------------------------------- one job


async def test_a_queued_job_is_cancelled_at_once_with_one_event_after_its_others(
    dsn: str,
) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        _, _, pool = stores(runtime)
        await put_workflow(client)
        job_id = await submitted(client)

        status, body = await cancel(client, job_id, {"reason": "wrong input"})
        assert status == 200, body
        assert body["outcome"] == "CANCELLED"
        assert body["job"]["status"] == "CANCELLED"
        assert body["message"] == f"job {job_id} was QUEUED; now CANCELLED"

        got = (await (await client.get(f"/v1/workflow-runs/{job_id}")).json())["job"]
        assert got["status"] == "CANCELLED"
        assert "cancel_requested_at" in got
        found = await events(pool, job_id)
        assert [kind for kind, _ in found] == ["ACCEPTED", "CANCELLED"]
        cancelled = found[-1][1]
        assert cancelled.reason == "wrong input"
        assert cancelled.workflow_name == "web-review"

        # Again: answered as it stands, nothing written.
        status, again = await cancel(client, job_id)
        assert (status, again["outcome"]) == (200, "ALREADY_CANCELLED")
        assert await kinds(pool, job_id) == ["ACCEPTED", "CANCELLED"]
        # Nothing claims it any more.
        assert await runtime.require_runs().claim("w") is None


async def test_a_waiting_job_is_cancelled_at_once_and_its_step_can_no_longer_be_completed(
    dsn: str,
) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        _, _, pool = stores(runtime)
        await put_workflow(client)
        job_id = await parked_job(client, runtime, "parked then cancelled")

        status, body = await cancel(client, job_id)
        assert (status, body["outcome"]) == (200, "CANCELLED")
        assert body["message"] == f"job {job_id} was WAITING; now CANCELLED"
        # The row keeps what it was waiting on, as evidence.
        assert body["job"]["outstanding_step"] == "review"

        late = await client.post(
            f"/v1/workflow-runs/{job_id}/steps/review:complete",
            json={"response": {"approved": True, "reviewer": "ada"}},
        )
        assert late.status == 409
        assert "CANCELLED" in (await late.json())["message"]
        assert await kinds(pool, job_id) == [
            "ACCEPTED",
            "STEP_CHECKPOINT",
            "STEP_CHECKPOINT",
            "WAITING",
            "CANCELLED",
        ]


async def test_a_finished_job_is_answered_as_it_is_and_nothing_changes(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        runs, _, pool = stores(runtime)
        await put_workflow(client)
        job_id = await submitted(client)
        claimed = await runs.claim("w")
        assert claimed is not None
        await runs.fail(claimed.lease, error="the step said no")
        before = await runs.get(job_id)

        status, body = await cancel(client, job_id, {"reason": "too late"})
        assert (status, body["outcome"]) == (200, "ALREADY_FINISHED")
        assert body["job"]["status"] == "FAILED"
        assert body["message"] == f"job {job_id} already finished FAILED; nothing to cancel"
        after = await runs.get(job_id)
        assert after == before
        assert await kinds(pool, job_id) == ["ACCEPTED", "FAILED"]


async def test_a_running_job_is_asked_of_its_worker_and_nothing_but_the_cancel_lands(
    dsn: str,
) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        runs, control, pool = stores(runtime)
        await put_workflow(client)
        job_id = await submitted(client, "running when cancelled")
        claimed = await runs.claim("worker-a")
        assert claimed is not None
        lease = claimed.lease
        ids = tokenize_ids("running when cancelled")
        tokenized = {"ids": ids, "count": len(ids)}
        await runs.checkpoint(lease, {"name": "tokenize", "skipped": False, "response": tokenized})
        assert await runs.extend_lease(lease) is None

        status, body = await cancel(client, job_id, {"reason": "operator stop"})
        assert (status, body["outcome"]) == (200, "CANCEL_REQUESTED")
        assert body["job"]["status"] == "RUNNING"
        assert "worker-a" in body["message"]
        # Asked again: the first request stands.
        status, again = await cancel(client, job_id, {"reason": "second thoughts"})
        assert (status, again["outcome"]) == (200, "CANCEL_REQUESTED")
        assert again["job"]["cancel_requested_at"] == body["job"]["cancel_requested_at"]
        # The message writes the moment as the job's field does.
        assert f"asked to cancel at {body['job']['cancel_requested_at']};" in again["message"]

        # The worker's renewal tells it; its checkpoint and settle no longer land.
        assert await runs.extend_lease(lease) is not None
        embedded = {"vector": [0.5], "dimensions": 1}
        with pytest.raises(LeaseLost):
            await runs.checkpoint(lease, {"name": "embed", "skipped": False, "response": embedded})
        with pytest.raises(LeaseLost):
            await runs.complete(lease, result={}, verdict="done")
        with pytest.raises(LeaseLost):
            await runs.hand_back(lease)

        assert await control.settle_cancelled(lease)
        assert not await control.settle_cancelled(lease)
        job = await runs.get(job_id)
        assert job.status == "CANCELLED"
        assert job.cancel_reason == "operator stop"
        assert [entry["name"] for entry in job.checkpoints] == ["tokenize"]
        found = await events(pool, job_id)
        assert [kind for kind, _ in found] == ["ACCEPTED", "STEP_CHECKPOINT", "CANCELLED"]
        assert found[-1][1].reason == "operator stop"
        assert found[-1][1].attempt == 1
        assert await attempts(pool, job_id) == [
            (
                1,
                "worker-a",
                "CANCELLED",
                ["tokenize"],
                "cancelled by an operator: operator stop",
                "cancel",
            ),
        ]


async def test_a_worker_that_lost_its_lease_cannot_settle_the_cancel(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        runs, control, _ = stores(runtime)
        await put_workflow(client)
        job_id = await submitted(client)
        claimed = await runs.claim("worker-a")
        assert claimed is not None
        # Not asked to cancel: the settle refuses and writes nothing.
        assert not await control.settle_cancelled(claimed.lease)
        await cancel(client, job_id)
        stale = type(claimed.lease)(
            claimed.lease.job_id, "worker-b", claimed.lease.attempt, "web-review", 999
        )
        assert not await control.settle_cancelled(stale)
        assert (await runs.get(job_id)).status == "RUNNING"


async def test_the_sweeper_settles_a_cancel_its_worker_never_did(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        runs, control, pool = stores(runtime)
        await put_workflow(client)
        job_id = await submitted(client)
        claimed = await runs.claim("gone-worker")
        assert claimed is not None
        await cancel(client, job_id, {"reason": "worker unreachable"})

        # The lease is still running: nothing to settle yet.
        assert await control.sweep_cancelled() == 0
        later = datetime.now(UTC) + LATER
        # Past the lease, the requeue sweep leaves it alone: it is never requeued.
        swept = await runs.sweep_expired(now=later)
        assert (swept.requeued, swept.dead) == (0, 0)
        assert await control.sweep_cancelled(now=later) == 1
        assert await control.sweep_cancelled(now=later) == 0

        job = await runs.get(job_id)
        assert job.status == "CANCELLED"
        found = await events(pool, job_id)
        assert [kind for kind, _ in found] == ["ACCEPTED", "CANCELLED"]
        assert found[-1][1].reason == "worker unreachable"
        assert [(row[1], row[2], row[5]) for row in await attempts(pool, job_id)] == [
            ("gone-worker", "CANCELLED", "cancel")
        ]


# --------------------------------------------------------------------------- input and reach


async def test_refusals_name_what_is_wrong(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, _):
        await put_workflow(client)
        job_id = await submitted(client)

        status, body = await cancel(client, job_id, {"reason": "x" * (MAX_REASON_CHARS + 1)})
        assert (status, body["code"]) == (400, "INVALID_ARGUMENT")
        assert "reason" in body["message"]
        status, body = await cancel(client, job_id, {"job_id": str(uuid.uuid4())})
        assert status == 400 and "job_id" in body["message"]
        status, body = await cancel(client, job_id, {"why": "unknown field"})
        assert status == 400 and "why" in body["message"]
        status, body = await cancel(client, str(uuid.uuid4()))
        assert (status, body["code"]) == (404, "NOT_FOUND")
        status, body = await cancel(client, "not-a-uuid")
        assert status == 400 and "job_id" in body["message"]

        # A bare POST, no body at all, cancels.
        bare = await client.post(f"/v1/workflow-runs/{job_id}:cancel")
        assert bare.status == 200, await bare.text()
        assert (await bare.json())["outcome"] == "CANCELLED"

        bulk = await client.post("/v1/workflow-runs:cancel", json={})
        assert bulk.status == 400
        assert "at least one of status" in (await bulk.json())["message"]
        bulk = await client.post("/v1/workflow-runs:cancel", json={"status": "COMPLETED"})
        assert bulk.status == 400
        assert "status COMPLETED is terminal" in (await bulk.json())["message"]


async def test_cancel_needs_its_scope_and_reaches_only_the_callers_own_jobs(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, _):
        await put_workflow(client)
        ada = await bearer(dsn, "ada", [SUBMIT, READ, CANCEL])
        bob = await bearer(dsn, "bob", [SUBMIT, READ, CANCEL])
        reader = await bearer(dsn, "ada", [SUBMIT, READ, COMPLETE])
        made = await client.post(
            "/v1/workflow-runs",
            json={"workflow_name": "web-review", "input": {"text": "ada's"}},
            headers=ada,
        )
        ada_job = (await made.json())["job"]["job_id"]
        made = await client.post(
            "/v1/workflow-runs",
            json={"workflow_name": "web-review", "input": {"text": "bob's"}},
            headers=bob,
        )
        bob_job = (await made.json())["job"]["job_id"]

        refused = await client.post(f"/v1/workflow-runs/{ada_job}:cancel", headers=reader)
        assert refused.status == 403
        assert "cancel" in (await refused.json())["message"]
        other = await client.post(f"/v1/workflow-runs/{bob_job}:cancel", headers=ada)
        assert other.status == 404

        # Bulk: a caller without fleet reaches only its own jobs, whatever it names.
        bulk = await client.post(
            "/v1/workflow-runs:cancel", json={"workflow_name": "web-review"}, headers=ada
        )
        assert (await bulk.json())["cancelled"] == [ada_job]
        bulk = await client.post("/v1/workflow-runs:cancel", json={"owner": "bob"}, headers=ada)
        assert await bulk.json() == {"cancelled": [], "cancel_requested": []}
        got = await client.get(f"/v1/workflow-runs/{bob_job}", headers=bob)
        assert (await got.json())["job"]["status"] == "QUEUED"


async def test_bulk_cancel_takes_every_live_job_the_filter_names(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        runs, control, pool = stores(runtime)
        await put_workflow(client)
        other = {**(await (await client.get("/v1/workflows/web-review")).json())["workflow"]}
        await put_workflow(client, {**other["definition"], "name": "other-flow"})

        running = await submitted(client, "running")
        claimed = await runs.claim("worker-a")
        assert claimed is not None and str(claimed.job_id) == running
        queued = [await submitted(client, f"queued {n}") for n in range(3)]
        made = await client.post(
            "/v1/workflow-runs",
            json={"workflow_name": "other-flow", "input": {"text": "elsewhere"}},
        )
        elsewhere = (await made.json())["job"]["job_id"]

        # created_before: only what existed then.
        cutoff = (await runs.get(queued[1])).created_at
        bulk = await client.post(
            "/v1/workflow-runs:cancel",
            json={"created_before": cutoff.isoformat(), "status": "QUEUED", "reason": "old"},
        )
        assert bulk.status == 200
        assert (await bulk.json())["cancelled"] == [queued[0]]

        bulk = await client.post(
            "/v1/workflow-runs:cancel", json={"workflow_name": "web-review", "reason": "drain"}
        )
        answer = await bulk.json()
        assert answer["cancelled"] == queued[1:]
        assert answer["cancel_requested"] == [running]
        assert (await runs.get(elsewhere)).status == "QUEUED"
        for job_id in queued[1:]:
            found = await events(pool, job_id)
            assert [kind for kind, _ in found] == ["ACCEPTED", "CANCELLED"]
            assert found[-1][1].reason == "drain"
        # Nothing left to cancel by that filter: a running job asked once is not asked again.
        bulk = await client.post("/v1/workflow-runs:cancel", json={"workflow_name": "web-review"})
        assert await bulk.json() == {"cancelled": [], "cancel_requested": []}
        assert await control.settle_cancelled(claimed.lease)

        # The store refuses a filter with no condition.
        with pytest.raises(InvalidArgument, match="at least one"):
            await control.cancel_many(CancelFilter())
        with pytest.raises(NotFound):
            await control.cancel(uuid.uuid4())


# --------------------------------------------------------------------------- races


@pytest.mark.parametrize("answer", ["accepted", "rejected"])
async def test_twenty_concurrent_cancels_and_completes_on_a_waiting_job(
    dsn: str, answer: str
) -> None:
    """Ten cancels and ten completes at once: the row lock orders them.

    Exactly one takes the job out of WAITING; every other answer says why it
    changed nothing. A rejected response fails the job, so then the one winner
    is the only change at all. An accepted one queues the job again, and the
    first cancel after it cancels that QUEUED job: the job still ends with one
    terminal event, CANCELLED, after the step's checkpoint.
    """
    async with serve({"DATABASE_URL": dsn, "WFJOBS_POOL_MAX": "24"}) as (client, runtime):
        _, _, pool = stores(runtime)
        await put_workflow(client)
        job_id = await parked_job(client, runtime, "raced")
        response = {"approved": answer == "accepted", "reviewer": "ada"}

        async def one(index: int) -> tuple[str, int, dict[str, Any]]:
            if index % 2:
                status, body = await cancel(client, job_id, {"reason": f"racer {index}"})
                return "cancel", status, body
            done = await client.post(
                f"/v1/workflow-runs/{job_id}/steps/review:complete", json={"response": response}
            )
            return "complete", done.status, await done.json()

        results = await asyncio.gather(*(one(index) for index in range(20)))
        cancels = [(status, body) for verb, status, body in results if verb == "cancel"]
        completes = [(status, body) for verb, status, body in results if verb == "complete"]
        assert all(status in (200, 409) for status, _ in cancels + completes), results
        won_cancel = [b for s, b in cancels if s == 200 and b["outcome"] == "CANCELLED"]
        won_complete = [
            b for s, b in completes if s == 200 and b["outcome"] in ("COMPLETED", "REJECTED")
        ]
        left_waiting = [b for b in won_cancel if "was WAITING" in b["message"]] + won_complete
        assert len(left_waiting) == 1, results
        # Every other answer is one of the clear ones.
        for _, body in cancels:
            if body not in won_cancel:
                assert body["outcome"] in ("ALREADY_CANCELLED", "ALREADY_FINISHED"), body
        for status, body in completes:
            if body not in won_complete:
                assert (status, body.get("code"), body.get("outcome")) in (
                    (409, "WRONG_STATE", None),
                    (200, None, "ALREADY_DONE"),
                ), body

        found = await kinds(pool, job_id)
        terminal = [kind for kind in found if kind in ("CANCELLED", "FAILED", "COMPLETED")]
        assert len(terminal) == 1, found
        assert found[:4] == ["ACCEPTED", "STEP_CHECKPOINT", "STEP_CHECKPOINT", "WAITING"]
        if won_complete and answer == "accepted":
            # The complete won; a later cancel cancelled the QUEUED job it made.
            assert len(won_cancel) == 1 and "was QUEUED" in won_cancel[0]["message"]
            assert found[4:] == ["STEP_CHECKPOINT", "CANCELLED"]
        elif won_complete:
            assert won_cancel == []
            assert found[4:] == ["FAILED"]
        else:
            assert found[4:] == ["CANCELLED"]


# --------------------------------------------------------------------------- command line


async def test_wfjobs_cancel_one_job_and_by_filter(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        wfjobs = Wfjobs(str(client.make_url("")), capsys)
        await put_workflow(client)
        first = await submitted(client, "first")
        second = await submitted(client, "second")
        third = await submitted(client, "third")

        code, out, _ = await wfjobs("cancel", first, "--reason", "not needed")
        assert code == 0
        assert f"CANCELLED: job {first} was QUEUED; now CANCELLED (job is CANCELLED)" in out
        assert (await runtime.require_runs().get(first)).cancel_reason == "not needed"
        # Already cancelled is what was asked for: exit 0 (ALREADY_FINISHED exits 1).
        code, out, _ = await wfjobs("cancel", first)
        assert code == 0 and "ALREADY_CANCELLED" in out

        code, out, _ = await wfjobs("--json", "cancel", "--workflow", "web-review")
        assert code == 0
        assert json.loads(out) == {"cancelled": [second, third], "cancel_requested": []}

        code, _, err = await wfjobs("cancel")
        assert code == 1 and "name a job id, or --status" in err
        code, _, err = await wfjobs("cancel", second, "--status", "QUEUED")
        assert code == 1 and "not both" in err


async def test_a_bulk_cancel_does_not_read_back_each_jobs_definition(dsn: str) -> None:
    # A large definition (a 500 kB fallback) shared by 300 jobs: read back with
    # every changed row, a batch shipped 300 copies and held the loop to parse them.
    big = envelope(name="big-definition")
    big["steps"][2].update(timeoutMs=60_000, fallback={"approved": True, "note": "x" * 500_000})
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        _, control, pool = stores(runtime)
        await put_workflow(client, big)
        response = await client.post(
            "/v1/workflow-runs", json={"workflow_name": "big-definition", "input": {"text": "a"}}
        )
        assert response.status == 201, await response.text()
        job_id = (await response.json())["job"]["job_id"]
        async with pool.connection() as conn:
            await conn.execute(
                "INSERT INTO workflow_run (job_id, workflow_name, definition_hash, input,"
                " status, attempt, max_attempts, run_after)"
                " SELECT gen_random_uuid(), workflow_name, definition_hash, input, status,"
                " attempt, max_attempts, run_after"
                " FROM workflow_run, generate_series(1, 299) WHERE job_id = %(job_id)s",
                {"job_id": job_id},
            )
        done, longest = await with_longest_gap(
            control.cancel_many(CancelFilter(workflow_name="big-definition"))
        )
        assert len(done.cancelled) == 300
        assert longest < 0.2, f"the loop was held for {longest:.2f}s"
        # One job's cancel still answers the job as the API shows it.
        status, body = await cancel(client, job_id)
        assert (status, body["outcome"]) == (200, "ALREADY_CANCELLED")
        assert body["job"]["input"] == {"text": "a", "fail": "", "embed_fail": "", "delay_ms": 0}
