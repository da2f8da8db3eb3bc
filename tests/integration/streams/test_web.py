"""The verbs over HTTP, in-process, against a real Postgres: statuses, bodies, messages."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest

from streams.admission import Admission
from tests.integration.streams.conftest import WEB_WORKFLOW as WORKFLOW
from tests.integration.streams.conftest import parked_job, put_workflow, serve
from tests.loop_gaps import with_longest_gap
from tests.workflows_fixtures import envelope

pytestmark = pytest.mark.asyncio


async def _json(response: Any) -> dict[str, Any]:
    body: dict[str, Any] = await response.json()
    return body


async def _error(response: Any, status: int, code: str) -> str:
    body = await _json(response)
    assert response.status == status, body
    assert body["code"] == code, body
    assert set(body) == {"code", "message"}
    message: str = body["message"]
    return message


# ---------------------------------------------------------------------- no store


async def test_every_verb_answers_503_without_a_store() -> None:
    job = str(uuid.uuid4())
    async with serve({}) as (client, _):
        calls = [
            client.post("/v1/workflow-runs", json={"workflow_name": "x"}),
            client.get(f"/v1/workflow-runs/{job}"),
            client.get("/v1/workflow-runs"),
            client.post(
                f"/v1/workflow-runs/{job}/steps/review:complete", json={"response": {"a": 1}}
            ),
            client.put("/v1/workflows/x", json={"workflow": {"name": "x"}}),
            client.get("/v1/workflows/x"),
            client.get("/v1/workflows"),
        ]
        for call in calls:
            response = await call
            message = await _error(response, 503, "UNAVAILABLE")
            assert "DATABASE_URL" in message
        health = await client.get("/healthz")
        assert health.status == 200
        assert (await _json(health))["parts"]["store"]["summary"] == "not configured"


async def test_an_unreachable_store_answers_503(dsn: str) -> None:
    missing = dsn.rsplit("/", 1)[0] + "/no_such_database"
    env = {"DATABASE_URL": missing, "WFJOBS_POOL_TIMEOUT_S": "0.5"}
    async with serve(env, token=False) as (client, _):
        # A well-formed token: checking it is what needs the store.
        token = "wfj_0123456789ab_" + "a" * 43
        message = await _error(
            await client.get(
                f"/v1/workflow-runs/{uuid.uuid4()}", headers={"Authorization": f"Bearer {token}"}
            ),
            503,
            "UNAVAILABLE",
        )
        assert message.startswith("the store is unreachable")
        health = await client.get("/healthz")
        assert health.status == 503
        body = await _json(health)
        assert body["status"] == "stuck"
        assert body["parts"]["store"]["summary"].startswith("unreachable")
        assert (await client.get("/readyz")).status == 503


# ---------------------------------------------------------------------- bad input


async def test_bad_input_is_refused_with_a_message_that_says_what(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, _):
        message = await _error(await client.get("/v1/workflows/bad name!"), 400, "INVALID_ARGUMENT")
        assert "'bad name!' is malformed" in message

        message = await _error(
            await client.get("/v1/workflow-runs", params={"workflow_name": "no spaces"}),
            400,
            "INVALID_ARGUMENT",
        )
        assert "malformed" in message

        message = await _error(
            await client.get("/v1/workflow-runs", params={"limit": "-5"}), 400, "INVALID_ARGUMENT"
        )
        assert message == "limit must not be negative, got -5"

        message = await _error(
            await client.get("/v1/workflow-runs", params={"limit": "ten"}), 400, "INVALID_ARGUMENT"
        )
        assert message == "limit must be an integer, got 'ten'"

        # Python's int() also reads these; a query parameter is plain digits.
        for lenient in ("1_0", "+5", "\u0665", "\uff15"):
            message = await _error(
                await client.get("/v1/workflow-runs", params={"limit": lenient}),
                400,
                "INVALID_ARGUMENT",
            )
            assert message == f"limit must be an integer, got {lenient!r}"

        message = await _error(
            await client.get("/v1/workflow-runs", params={"status": "SLEEPING"}),
            400,
            "INVALID_ARGUMENT",
        )
        assert "unknown status 'SLEEPING'" in message and "QUEUED" in message

        message = await _error(
            await client.get("/v1/workflow-runs", params={"colour": "red"}), 400, "INVALID_ARGUMENT"
        )
        assert "colour" in message

        message = await _error(
            await client.get("/v1/workflow-runs", params={"page_token": "nonsense"}),
            400,
            "INVALID_ARGUMENT",
        )
        assert "page_token" in message

        message = await _error(await client.get("/v1/workflow-runs/12345"), 400, "INVALID_ARGUMENT")
        assert message == "job_id must be a UUID, got '12345'"

        message = await _error(
            await client.post(
                "/v1/workflow-runs/12345/steps/review:complete", json={"response": {}}
            ),
            400,
            "INVALID_ARGUMENT",
        )
        assert "UUID" in message

        message = await _error(
            await client.post(
                "/v1/workflow-runs", data=b"{not json", headers={"Content-Type": "application/json"}
            ),
            400,
            "INVALID_ARGUMENT",
        )
        assert "not valid JSON" in message

        message = await _error(
            await client.post("/v1/workflow-runs", json=["a", "list"]), 400, "INVALID_ARGUMENT"
        )
        assert "JSON object" in message

        # Neither and both definition sources break the message's CEL rule.
        for body in ({}, {"workflow": WORKFLOW, "workflow_name": "web-review"}):
            message = await _error(
                await client.post("/v1/workflow-runs", json=body), 400, "INVALID_ARGUMENT"
            )
            assert "exactly one definition source" in message

        message = await _error(
            await client.post("/v1/workflow-runs", json={"workflow_name": "x", "colour": 1}),
            400,
            "INVALID_ARGUMENT",
        )
        assert "colour" in message

        message = await _error(
            await client.post(
                "/v1/workflow-runs", json={"workflow_name": "x", "job_id": "not-a-uuid"}
            ),
            400,
            "INVALID_ARGUMENT",
        )
        assert "job_id" in message

        message = await _error(
            await client.post(
                "/v1/workflow-runs", json={"workflow": WORKFLOW, "input": {"txt": "typo"}}
            ),
            400,
            "INVALID_ARGUMENT",
        )
        assert "txt" in message

        broken = {**WORKFLOW, "steps": [{**WORKFLOW["steps"][0], "method": "jobs.test.Nope/Nope"}]}
        message = await _error(
            await client.put("/v1/workflows/web-review", json={"workflow": broken}),
            400,
            "INVALID_ARGUMENT",
        )
        assert "Nope" in message

        message = await _error(
            await client.put("/v1/workflows/other-name", json={"workflow": WORKFLOW}),
            400,
            "INVALID_ARGUMENT",
        )
        assert "'web-review'" in message and "'other-name'" in message

        message = await _error(
            await client.put("/v1/workflows/web-review", json=WORKFLOW), 400, "INVALID_ARGUMENT"
        )
        assert "PutWorkflowRequest" in message


async def test_a_stored_definition_without_a_name_is_refused_naming_the_field(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, _):
        for workflow in ({}, {k: v for k, v in WORKFLOW.items() if k != "name"}):
            message = await _error(
                await client.put("/v1/workflows/web-review", json={"workflow": workflow}),
                400,
                "INVALID_ARGUMENT",
            )
            assert message == (
                "workflow.name is missing; the definition must be named 'web-review', "
                "as the path is"
            )
        numbered = {"workflow": {**WORKFLOW, "name": 5}}
        message = await _error(
            await client.put("/v1/workflows/web-review", json=numbered),
            400,
            "INVALID_ARGUMENT",
        )
        assert message == "workflow.name must be a string, got 5"
        assert (await client.get("/v1/workflows/web-review")).status == 404


async def test_both_paged_listings_refuse_a_page_token_they_never_gave(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, _):
        for path in ("/v1/workflow-runs", "/v1/outbox"):
            for token in (" 1", "1 ", "9" * 20):
                message = await _error(
                    await client.get(path, params={"page_token": token}), 400, "INVALID_ARGUMENT"
                )
                assert message == (
                    f"page_token {token!r} is malformed; "
                    "pass the next_page_token of a previous answer"
                ), path


async def test_a_query_parameter_a_verb_does_not_take_is_refused_and_changes_nothing(
    dsn: str,
) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client)
        job_id = await parked_job(client, runtime, "hold on")
        run = f"/v1/workflow-runs/{job_id}"
        # A reason sent where cancel does not read it must not cancel without one.
        message = await _error(
            await client.post(f"{run}:cancel", params={"reason": "typo"}),
            400,
            "INVALID_ARGUMENT",
        )
        assert message == "unknown query parameter(s) reason; cancel takes none"
        message = await _error(
            await client.post(
                f"{run}/steps/review:complete",
                params={"approved": "true"},
                json={"response": {"approved": True}},
            ),
            400,
            "INVALID_ARGUMENT",
        )
        assert message == "unknown query parameter(s) approved; complete-step takes none"
        for method, path, body in (
            ("GET", run, None),
            ("GET", f"{run}:explain", None),
            ("POST", f"{run}:resume", {}),
            ("POST", "/v1/workflow-runs", {"workflow_name": "web-review", "input": {"text": "a"}}),
            ("POST", "/v1/workflow-runs:cancel", {"workflow_name": "web-review"}),
            ("POST", "/v1/workflow-runs:resume", {}),
            ("GET", "/v1/workflows/web-review", None),
            ("PUT", "/v1/workflows/web-review", {"workflow": WORKFLOW}),
            ("POST", "/v1/outbox:redrive", {"all": True}),
        ):
            response = await client.request(method, path, params={"colour": "red"}, json=body)
            message = await _error(response, 400, "INVALID_ARGUMENT")
            assert message.startswith("unknown query parameter(s) colour; "), (path, message)
        job = (await _json(await client.get(run)))["job"]
        assert job["status"] == "WAITING" and job["attempt"] == 1
        assert [
            j["job_id"] for j in (await _json(await client.get("/v1/workflow-runs")))["jobs"]
        ] == [job_id]
        stored = await client.get("/v1/workflows/web-review")
        assert stored.headers["ETag"] == '"1"'


async def test_a_body_naming_another_job_or_step_than_its_path_is_refused(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client)
        job_id = await parked_job(client, runtime, "hold on")
        other = "00000000-0000-4000-8000-000000000001"
        run = f"/v1/workflow-runs/{job_id}"
        for path, body, key, given in (
            (f"{run}:cancel", {"job_id": other}, "job_id", other),
            (f"{run}:resume", {"job_id": other}, "job_id", other),
            (
                f"{run}/steps/review:complete",
                {"job_id": other, "response": {"approved": True}},
                "job_id",
                other,
            ),
            (
                f"{run}/steps/review:complete",
                {"step_name": "tokenize", "response": {"approved": True}},
                "step_name",
                "tokenize",
            ),
        ):
            message = await _error(await client.post(path, json=body), 400, "INVALID_ARGUMENT")
            assert message.startswith(
                f"{key} in the body ({given!r}) differs from the one in the path"
            )
        # The same ids in the body as in the path are taken, a job id in
        # capitals being the same UUID.
        answer = await client.post(
            f"/v1/workflow-runs/{job_id.upper()}/steps/review:complete",
            json={"job_id": job_id, "step_name": "review", "response": {"approved": True}},
        )
        assert answer.status == 200, await answer.text()
        assert (await _json(answer))["outcome"] == "COMPLETED"
        cancelled = await client.post(f"{run}:cancel", json={"job_id": job_id.upper()})
        assert cancelled.status == 200, await cancelled.text()
        assert (await _json(cancelled))["job"]["status"] == "CANCELLED"


async def test_a_number_json_cannot_hold_is_refused_naming_where_and_stores_nothing(
    dsn: str,
) -> None:
    """Python's parser takes NaN, Infinity and 1e400 (as infinity), and integers of any
    length; none past a double's range is JSON a job can keep."""
    json_body = {"Content-Type": "application/json"}
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client)
        scores = (
            '{"workflow_name": "web-review", "input": {"text": "a", "meta": {"scores": [1, X]}}}'
        )
        for body, where in (
            ('{"workflow_name": "web-review", "input": {"text": NaN}}', "input.text"),
            (scores.replace("X", "-Infinity"), "input.meta.scores[1]"),
            (scores.replace("X", "1e400"), "input.meta.scores[1]"),
            (scores.replace("X", "1" + "0" * 400), "input.meta.scores[1]"),
            # Past 4300 digits Python's int() refuses the literal itself.
            (scores.replace("X", "-" + "9" * 5000), "input.meta.scores[1]"),
        ):
            message = await _error(
                await client.post("/v1/workflow-runs", data=body, headers=json_body),
                400,
                "INVALID_ARGUMENT",
            )
            assert message.startswith(f"{where} is not a finite number"), message

        job = str(uuid.uuid4())
        message = await _error(
            await client.post(
                f"/v1/workflow-runs/{job}/steps/review:complete",
                data='{"response": {"approved": true, "score": NaN}}',
                headers=json_body,
            ),
            400,
            "INVALID_ARGUMENT",
        )
        assert message.startswith("response.score is not a finite number"), message

        definition = json.dumps({"workflow": {**WORKFLOW, "name": "other"}})
        message = await _error(
            await client.put(
                "/v1/workflows/other",
                data=definition.replace('"steps": [', '"limit": Infinity, "steps": [', 1),
                headers=json_body,
            ),
            400,
            "INVALID_ARGUMENT",
        )
        assert message.startswith("workflow.limit is not a finite number"), message

        assert (await runtime.require_runs().list()).jobs == ()
        await _error(await client.get("/v1/workflows/other"), 404, "NOT_FOUND")


async def test_unknown_routes_and_methods_answer_error_bodies(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, _):
        await _error(await client.get("/v1/nothing-here"), 404, "NOT_FOUND")
        await _error(await client.delete("/v1/workflows"), 405, "METHOD_NOT_ALLOWED")


async def test_bodies_above_the_limit_are_refused_with_413(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn, "WFJOBS_MAX_BODY_BYTES": "2048"}) as (client, _):
        big = {"workflow_name": "web-review", "input": {"text": "x" * 5000}}
        message = await _error(
            await client.post("/v1/workflow-runs", json=big), 413, "PAYLOAD_TOO_LARGE"
        )
        assert "2048" in message

        async def chunks() -> Any:
            for _ in range(10):
                yield b" " * 1000

        # No Content-Length: counted while it streams.
        message = await _error(
            await client.put(
                "/v1/workflows/web-review",
                data=chunks(),
                headers={"Content-Type": "application/json"},
            ),
            413,
            "PAYLOAD_TOO_LARGE",
        )
        assert "2048" in message

        small = await client.post("/v1/workflow-runs", json={"workflow_name": "web-review"})
        await _error(small, 404, "NOT_FOUND")


# ---------------------------------------------------------------------- happy paths


async def test_stored_workflows_put_get_list(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, _):
        await _error(await client.get("/v1/workflows/web-review"), 404, "NOT_FOUND")
        await put_workflow(client)
        stored = (await _json(await client.get("/v1/workflows/web-review")))["workflow"]
        assert stored["name"] == "web-review"
        assert stored["definition"] == WORKFLOW
        listed = await _json(await client.get("/v1/workflows"))
        assert [item["name"] for item in listed["workflows"]] == ["web-review"]


async def test_stored_workflows_are_listed_a_page_at_a_time_by_name(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, _):
        for name in ("wf-c", "wf-a", "wf-b"):
            await put_workflow(client, {**WORKFLOW, "name": name})
        first = await _json(await client.get("/v1/workflows", params={"limit": "2"}))
        assert [item["name"] for item in first["workflows"]] == ["wf-a", "wf-b"]
        rest = await _json(
            await client.get(
                "/v1/workflows", params={"limit": "2", "page_token": first["next_page_token"]}
            )
        )
        assert [item["name"] for item in rest["workflows"]] == ["wf-c"]
        assert rest["next_page_token"] == ""
        every = await _json(await client.get("/v1/workflows", params={"limit": "0"}))
        assert [item["name"] for item in every["workflows"]] == ["wf-a", "wf-b", "wf-c"]

        for params, refusal in (
            ({"page_token": "nonsense!"}, "page_token 'nonsense!' is malformed"),
            ({"page_token": first["next_page_token"] + " "}, "is malformed"),
            ({"limit": "-1"}, "limit must not be negative, got -1"),
            ({"name": "wf-a"}, "unknown query parameter(s) name"),
        ):
            message = await _error(
                await client.get("/v1/workflows", params=params), 400, "INVALID_ARGUMENT"
            )
            assert refusal in message, params


async def test_submit_get_and_list_jobs(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, _):
        await put_workflow(client)
        job_id = str(uuid.uuid4())
        body = {"job_id": job_id, "workflow_name": "web-review", "input": {"text": "a b"}}
        first = await client.post("/v1/workflow-runs", json=body)
        assert first.status == 201, await first.text()
        created = await _json(first)
        assert created["created"] is True
        assert created["job"]["status"] == "QUEUED"
        assert created["job"]["input"]["text"] == "a b"
        assert created["job"]["max_attempts"] == 3

        again = await client.post("/v1/workflow-runs", json=body)
        assert again.status == 200
        assert "created" not in await _json(again)  # false is the proto3 default

        inline = await client.post(
            "/v1/workflow-runs",
            json={
                "workflow": envelope(name="inline-one"),
                "input": {"text": "c"},
                "max_attempts": 5,
            },
        )
        assert inline.status == 201, await inline.text()
        inline_job = (await _json(inline))["job"]
        assert inline_job["workflow_name"] == "inline-one"
        assert inline_job["max_attempts"] == 5
        uuid.UUID(inline_job["job_id"])  # the server made one

        got = await _json(await client.get(f"/v1/workflow-runs/{job_id}"))
        assert got["job"]["job_id"] == job_id
        await _error(await client.get(f"/v1/workflow-runs/{uuid.uuid4()}"), 404, "NOT_FOUND")

        newest = await _json(await client.get("/v1/workflow-runs", params={"limit": "1"}))
        assert [job["job_id"] for job in newest["jobs"]] == [inline_job["job_id"]]
        rest = await _json(
            await client.get(
                "/v1/workflow-runs", params={"limit": "1", "page_token": newest["next_page_token"]}
            )
        )
        assert [job["job_id"] for job in rest["jobs"]] == [job_id]
        assert rest["next_page_token"] == ""

        by_name = await _json(
            await client.get("/v1/workflow-runs", params={"workflow_name": "inline-one"})
        )
        assert [job["workflow_name"] for job in by_name["jobs"]] == ["inline-one"]
        by_status = await _json(await client.get("/v1/workflow-runs", params={"status": "WAITING"}))
        assert by_status == {"jobs": [], "next_page_token": ""}


async def test_complete_step_outcomes(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client)
        job_id = await parked_job(client, runtime, "looks fine")
        path = f"/v1/workflow-runs/{job_id}/steps/review:complete"

        message = await _error(
            await client.post(path, json={"response": {"approved": "yes please"}}),
            400,
            "INVALID_ARGUMENT",
        )
        assert "approved" in message
        await _error(await client.post(path, json={}), 400, "INVALID_ARGUMENT")
        message = await _error(
            await client.post(path, json={"step_name": "embed", "response": {}}),
            400,
            "INVALID_ARGUMENT",
        )
        assert "differs" in message

        # A step the workflow does not have is no resource; one a worker
        # answers exists but can never be completed, even once it is done.
        wrong = f"/v1/workflow-runs/{job_id}/steps/publish:complete"
        message = await _error(
            await client.post(wrong, json={"response": {"approved": True}}), 404, "NOT_FOUND"
        )
        assert message == f"job {job_id}: workflow 'web-review' has no step 'publish'"
        for worker_step in ("tokenize", "embed"):
            message = await _error(
                await client.post(
                    f"/v1/workflow-runs/{job_id}/steps/{worker_step}:complete",
                    json={"response": {}},
                ),
                409,
                "WRONG_STATE",
            )
            assert message == (
                f"step {worker_step!r} of job {job_id} is not an external step: "
                "a worker answers it, not a person"
            )
        form = await client.get(f"/v1/workflow-runs/{job_id}/steps/publish:form")
        message = await _error(form, 404, "NOT_FOUND")
        assert message == f"job {job_id}: workflow 'web-review' has no step 'publish'"

        done = await client.post(path, json={"response": {"approved": True, "reviewer": "ada"}})
        assert done.status == 200, await done.text()
        body = await _json(done)
        assert body["outcome"] == "COMPLETED"
        assert body["job"]["status"] == "QUEUED"
        assert [c["name"] for c in body["job"]["checkpoints"]] == ["tokenize", "embed", "review"]
        # Checkpointed as the engine normalized it (proto3 JSON with defaults).
        assert body["job"]["checkpoints"][2]["response"] == {
            "approved": True,
            "reviewer": "ada",
            "note": "",
        }

        twice = await _json(await client.post(path, json={"response": {"approved": True}}))
        assert twice["outcome"] == "ALREADY_DONE"

        # A queued job is in the wrong state for any step it has not done.
        other = await client.post(
            "/v1/workflow-runs", json={"workflow_name": "web-review", "input": {"text": "q"}}
        )
        other_id = (await _json(other))["job"]["job_id"]
        message = await _error(
            await client.post(
                f"/v1/workflow-runs/{other_id}/steps/review:complete",
                json={"response": {"approved": True}},
            ),
            409,
            "WRONG_STATE",
        )
        assert "QUEUED" in message

        await _error(
            await client.post(
                f"/v1/workflow-runs/{uuid.uuid4()}/steps/review:complete",
                json={"response": {"approved": True}},
            ),
            404,
            "NOT_FOUND",
        )


async def test_a_rejected_response_fails_the_job_and_answers_200(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client)
        job_id = await parked_job(client, runtime, "needs a second look")
        response = await client.post(
            f"/v1/workflow-runs/{job_id}/steps/review:complete",
            json={"response": {"approved": False, "note": "no"}},
        )
        assert response.status == 200, await response.text()
        body = await _json(response)
        assert body["outcome"] == "REJECTED"
        assert body["job"]["status"] == "FAILED"
        assert "response.approved" in body["job"]["verdict"]


async def test_health_reports_the_store(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, _):
        health = await _json(await client.get("/healthz"))
        assert health == {
            "status": "ok",
            "worker_id": "web-test",
            "roles": ["api"],
            "parts": {"store": {"healthy": True, "ready": True, "summary": "ok"}},
        }
        assert (await client.get("/readyz")).status == 200


async def test_list_limit_zero_means_50_and_large_limits_are_clamped_to_500(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn, "WFJOBS_POOL_MAX": "8"}) as (client, runtime):
        await put_workflow(client)
        runs = runtime.require_runs()
        compiled = runtime.compile(WORKFLOW)

        async def submit(n: int) -> None:
            await runs.submit(
                job_id=uuid.uuid4(),
                workflow_name="web-review",
                definition=WORKFLOW,
                definition_hash=compiled.definition_hash,
                input={"text": f"job {n}"},
            )

        for first in range(0, 501, 50):
            await asyncio.gather(*(submit(n) for n in range(first, min(first + 50, 501))))

        for limit, expected in (("0", 50), ("", 50), ("500", 500), ("501", 500), ("100000", 500)):
            params = {"limit": limit} if limit else {}
            page = await _json(await client.get("/v1/workflow-runs", params=params))
            assert len(page["jobs"]) == expected, limit
            assert page["next_page_token"], limit

        # The cursor walks the rest: 501 jobs, each exactly once, newest first.
        seen: list[str] = []
        token = ""
        while True:
            params = {"limit": "200", **({"page_token": token} if token else {})}
            page = await _json(await client.get("/v1/workflow-runs", params=params))
            seen += [job["job_id"] for job in page["jobs"]]
            token = page.get("next_page_token", "")
            if not token:
                break
        assert len(seen) == len(set(seen)) == 501
        created = [(await runs.get(job_id)).created_at for job_id in (seen[0], seen[250], seen[-1])]
        assert created == sorted(created, reverse=True)


async def test_a_full_backlog_answers_429_and_admits_again_once_it_drains(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn, "WFJOBS_MAX_QUEUED_JOBS": "2"}) as (client, runtime):
        # The backlog is re-read once a refresh period has passed on this clock.
        elapsed = [0.0]
        runtime.admission = Admission(runtime.admission.cap, clock=lambda: elapsed[0])
        await put_workflow(client)

        def body(job_id: str) -> dict[str, Any]:
            return {"job_id": job_id, "workflow_name": "web-review", "input": {"text": "a"}}

        first, second, third = (str(uuid.uuid4()) for _ in range(3))
        for job_id in (first, second):
            response = await client.post("/v1/workflow-runs", json=body(job_id))
            assert response.status == 201, await response.text()

        message = await _error(
            await client.post("/v1/workflow-runs", json=body(third)), 429, "RESOURCE_EXHAUSTED"
        )
        assert "WFJOBS_MAX_QUEUED_JOBS" in message and "retry later" in message
        # Nothing was written for the refused job.
        await _error(await client.get(f"/v1/workflow-runs/{third}"), 404, "NOT_FOUND")
        # A submit of an existing job creates nothing, so it is answered as usual.
        again = await client.post("/v1/workflow-runs", json=body(first))
        assert again.status == 200, await again.text()
        assert (await _json(again))["job"]["job_id"] == first
        # Malformed requests are still told what is wrong with them.
        await _error(
            await client.post("/v1/workflow-runs", json={"workflow_name": "web-review", "x": 1}),
            400,
            "INVALID_ARGUMENT",
        )

        # A worker takes one job; within a second the backlog is read again.
        assert await runtime.require_runs().claim("web-test") is not None
        await _error(
            await client.post("/v1/workflow-runs", json=body(third)), 429, "RESOURCE_EXHAUSTED"
        )
        elapsed[0] += 1.0
        admitted = await client.post("/v1/workflow-runs", json=body(third))
        assert admitted.status == 201, await admitted.text()


def _large_stored_workflow() -> dict[str, Any]:
    """A definition near the default body limit made of many small values (its
    external step's fallback): turning it into an answer takes a good part of a second."""
    workflow = envelope(name="large-fallback", review=None)
    workflow["steps"].append(
        {
            "name": "review",
            "method": "jobs.test.Embedder/Embed",
            "rules": ["ids = tokenize.ids"],
            "completion": "external",
            "timeoutMs": 60_000,
            "fallback": {"vector": [0.5] * 150_000, "dimensions": 1},
        }
    )
    workflow["output"] = ["ids = tokenize.ids"]
    return workflow


async def test_stored_workflow_answers_are_made_off_the_event_loop(make_database: Any) -> None:
    workflow = _large_stored_workflow()
    async with serve({"DATABASE_URL": make_database(migrated=True)}) as (client, _):

        async def put() -> Any:
            response = await client.put("/v1/workflows/large-fallback", json={"workflow": workflow})
            assert response.status in (200, 201), await response.text()
            return await response.read()

        async def get(path: str) -> Any:
            response = await client.get(path)
            assert response.status == 200, await response.text()
            return await response.read()

        await put()  # compiled now, so the next put is all answer
        _, put_gap = await with_longest_gap(put())
        _, get_gap = await with_longest_gap(get("/v1/workflows/large-fallback"))
        _, list_gap = await with_longest_gap(get("/v1/workflows"))
    longest = max(put_gap, get_gap, list_gap)
    assert longest < 0.2, f"the loop was held for {put_gap:.2f}s, {get_gap:.2f}s, {list_gap:.2f}s"
