"""Tokens, scopes and owners on the real service: the app's views on a real Postgres.

Tokens are made as an operator makes them (``store.tokens``, what ``wfjobs
tokens`` runs), and every answer is checked for its status and its JSON error.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from cli.main import main as cli_main
from schemas.contract import WorkflowRunRequest
from store.tokens import revoke_token
from streams import auth
from streams.request_agent import RequestHandler
from streams.runtime import Runtime
from streams.settings import Settings
from tests.integration.streams.conftest import bearer, parked_job, put_workflow, serve
from tests.workflows_fixtures import envelope

Client = TestClient[Any, Any]

MARK_FAILED_SQL = """
UPDATE workflow_run_events_outbox SET status = 'FAILED', attempts = 10, last_error = 'no'
 WHERE job_id = %(job_id)s
"""


@pytest.fixture
def dsn(make_database: Callable[..., str]) -> str:
    return make_database(migrated=True)


async def _error(response: Any, status: int, code: str) -> str:
    body: dict[str, Any] = await response.json()
    assert response.status == status, body
    assert set(body) == {"code", "message"} and body["code"] == code, body
    message: str = body["message"]
    return message


async def _refused_once_verification_lapses(accepted: Callable[[], Awaitable[bool]]) -> None:
    """Calls a revoked token's ``accepted`` until one is refused.

    Judged by when each call was sent, not by how long it took: a call slow
    to answer on a loaded machine says nothing about how long a verified
    token is trusted, and none sent past that window may still get in.
    """
    revoked_at = time.monotonic()
    while True:
        sent = time.monotonic()
        if not await accepted():
            return
        assert sent - revoked_at < auth.VERIFIED_FOR_S + 0.25, "accepted after revocation"


def _routes(job_id: str) -> list[tuple[str, str, Mapping[str, Any] | None]]:
    """Every verb's route, with a body that would be well-formed."""
    return [
        ("POST", "/v1/workflow-runs", {"workflow_name": "web-review", "input": {"text": "a"}}),
        ("GET", "/v1/workflow-runs", None),
        ("GET", f"/v1/workflow-runs/{job_id}", None),
        ("POST", f"/v1/workflow-runs/{job_id}/steps/review:complete", {"response": {}}),
        ("GET", "/v1/workflows", None),
        ("GET", "/v1/workflows/web-review", None),
        ("PUT", "/v1/workflows/web-review", {"workflow": envelope(name="web-review")}),
        ("GET", "/v1/outbox", None),
        ("POST", "/v1/outbox:redrive", {"all": True}),
        ("GET", "/v1/requests-dlq", None),
        ("POST", "/v1/requests-dlq:redrive", {"all": True}),
    ]


async def test_no_token_or_a_bad_one_is_401_on_every_verb(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}, token=False) as (client, _):
        made_up = "wfj_0123456789ab_" + "x" * 43
        for headers in ({}, {"Authorization": "Basic dXNlcjpwdw=="}, {"Authorization": made_up}):
            for method, path, body in _routes(str(uuid.uuid4())):
                response = await client.request(method, path, json=body, headers=headers)
                message = await _error(response, 401, "UNAUTHENTICATED")
                assert response.headers["WWW-Authenticate"].startswith("Bearer")
                assert "token" in message
        unknown = await client.get(
            "/v1/workflow-runs", headers={"Authorization": f"Bearer {made_up}"}
        )
        assert await _error(unknown, 401, "UNAUTHENTICATED") == "the token is unknown or revoked"
        # Health stays open: probes carry no token.
        assert (await client.get("/healthz")).status == 200


async def test_a_token_without_the_verbs_scope_is_403(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}, token=False) as (client, _):
        job_id = str(uuid.uuid4())
        needs = dict.fromkeys(range(len(_routes(job_id))), auth.ADMIN)
        needs.update({0: auth.SUBMIT, 1: auth.READ, 2: auth.READ, 3: auth.COMPLETE})
        needs.update({4: auth.READ, 5: auth.READ})
        for index, (method, path, body) in enumerate(_routes(job_id)):
            others = [scope for scope in auth.SCOPES if scope != needs[index]]
            headers = await bearer(dsn, "someone", others)
            response = await client.request(method, path, json=body, headers=headers)
            message = await _error(response, 403, "PERMISSION_DENIED")
            assert repr(needs[index]) in message, (path, message)
        # The dead-letter topic's messages belong to nobody: admin is not enough.
        admin = await bearer(dsn, "operator", [auth.ADMIN])
        for method, path, body in _routes(job_id)[-2:]:
            response = await client.request(method, path, json=body, headers=admin)
            assert "'fleet'" in await _error(response, 403, "PERMISSION_DENIED")


async def test_an_inline_definition_needs_its_own_scope(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}, token=False) as (client, _):
        inline = {"workflow": envelope(name="inline-review"), "input": {"text": "a"}}
        submitter = await bearer(dsn, "submitter", [auth.SUBMIT, auth.READ])
        refused = await client.post("/v1/workflow-runs", json=inline, headers=submitter)
        assert repr(auth.DEFINE_INLINE) in await _error(refused, 403, "PERMISSION_DENIED")
        listed = await client.get("/v1/workflow-runs", headers=submitter)
        # A refused submit left no job behind.
        assert await listed.json() == {"jobs": [], "next_page_token": ""}
        definer = await bearer(dsn, "definer", [auth.SUBMIT, auth.DEFINE_INLINE])
        accepted = await client.post("/v1/workflow-runs", json=inline, headers=definer)
        assert accepted.status == 201, await accepted.text()


async def test_another_owners_job_is_not_found_by_any_verb(dsn: str) -> None:
    verbs = [auth.SUBMIT, auth.READ, auth.COMPLETE, auth.ADMIN]
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        await put_workflow(client)
        alice = await bearer(dsn, "alice", verbs)
        bob = await bearer(dsn, "bob", verbs)
        fleet = await bearer(dsn, "carol", [auth.READ, auth.ADMIN, auth.FLEET])
        # The fixture's client is fleet-wide; alice submits and owns this one.
        client.session.headers.update(alice)
        job_id = await parked_job(client, runtime, "only mine")
        assert runtime.pool is not None
        async with runtime.pool.connection() as conn:
            await conn.execute(MARK_FAILED_SQL, {"job_id": uuid.UUID(job_id)})
        mine = await (await client.get(f"/v1/workflow-runs/{job_id}")).json()
        assert mine["job"]["owner"] == "alice"

        async def as_bob(method: str, path: str, **kwargs: Any) -> Any:
            return await client.request(method, path, headers=bob, **kwargs)

        message = await _error(await as_bob("GET", f"/v1/workflow-runs/{job_id}"), 404, "NOT_FOUND")
        assert message == f"job {job_id} not found"
        listed = await (await as_bob("GET", "/v1/workflow-runs")).json()
        assert listed == {"jobs": [], "next_page_token": ""}
        complete = f"/v1/workflow-runs/{job_id}/steps/review:complete"
        await _error(
            await as_bob("POST", complete, json={"response": {"approved": True}}), 404, "NOT_FOUND"
        )
        await _error(await as_bob("GET", "/v1/outbox", params={"job_id": job_id}), 404, "NOT_FOUND")
        assert (await (await as_bob("GET", "/v1/outbox")).json())["events"] == []
        await _error(
            await as_bob("POST", "/v1/outbox:redrive", json={"job_id": job_id}), 404, "NOT_FOUND"
        )
        redrive_all = await (await as_bob("POST", "/v1/outbox:redrive", json={"all": True})).json()
        assert redrive_all["redriven"] == []
        failed = await (await client.get("/v1/outbox")).json()
        ids = [event["id"] for event in failed["events"]]
        assert ids, failed
        by_id = await (await as_bob("POST", "/v1/outbox:redrive", json={"ids": ids})).json()
        assert by_id == {"redriven": [], "not_failed": ids}
        # Reusing alice's job id does not show bob her job either.
        again = await as_bob(
            "POST",
            "/v1/workflow-runs",
            json={"job_id": job_id, "workflow_name": "web-review", "input": {"text": "x"}},
        )
        assert job_id in await _error(again, 409, "ALREADY_EXISTS")

        # A fleet-wide token reaches every owner's job; alice reaches her own.
        got = await client.get(f"/v1/workflow-runs/{job_id}", headers=fleet)
        assert got.status == 200
        everyone = await (await client.get("/v1/workflow-runs", headers=fleet)).json()
        assert [job["owner"] for job in everyone["jobs"]] == ["alice"]
        done = await client.post(complete, json={"response": {"approved": True}})
        assert (await done.json())["outcome"] == "COMPLETED"
        redriven = await (await client.post("/v1/outbox:redrive", json={"job_id": job_id})).json()
        assert [row["id"] for row in redriven["redriven"]] == ids


async def test_a_revoked_token_is_refused_within_a_second(dsn: str) -> None:
    async with serve({"DATABASE_URL": dsn}, token=False) as (client, _):
        headers = await bearer(dsn, "leaver", [auth.READ])
        assert (await client.get("/v1/workflow-runs", headers=headers)).status == 200
        token_id = headers["Authorization"].split("_")[1]
        revoked = await revoke_token(dsn, token_id)
        assert revoked.revoked_at is not None

        async def accepted() -> bool:
            return (await client.get("/v1/workflow-runs", headers=headers)).status == 200

        await _refused_once_verification_lapses(accepted)
        response = await client.get("/v1/workflow-runs", headers=headers)
        await _error(response, 401, "UNAUTHENTICATED")


async def test_stored_definitions_are_written_with_if_match(dsn: str) -> None:
    workflow = {"workflow": envelope(name="web-review")}
    async with serve({"DATABASE_URL": dsn}) as (client, _):
        path = "/v1/workflows/web-review"
        first = await client.put(path, json=workflow, headers={"If-None-Match": "*"})
        assert first.status == 201 and first.headers["ETag"] == '"1"'
        assert (await first.json())["workflow"]["version"] == "1"  # int64 is a JSON string
        again = await client.put(path, json=workflow, headers={"If-None-Match": "*"})
        assert "version 1 is stored" in await _error(again, 412, "VERSION_MISMATCH")

        second = await client.put(path, json=workflow, headers={"If-Match": '"1"'})
        assert second.status == 200 and second.headers["ETag"] == '"2"'
        stale = await client.put(path, json=workflow, headers={"If-Match": '"1"'})
        message = await _error(stale, 412, "VERSION_MISMATCH")
        assert "replace version 1" in message and "version 2 is stored" in message
        got = await client.get(path)
        assert got.headers["ETag"] == '"2"'
        # No condition: the last writer wins, and the version still moves.
        plain = await client.put(path, json=workflow)
        assert plain.headers["ETag"] == '"3"'
        # "\u00b2" (superscript two) is a digit to str.isdigit, but no number to int(),
        # nor is a run of digits longer than int() reads (4300) or a version can be.
        for etag in ("yesterday", '"\u00b2"', '"' + "9" * 5000 + '"'):
            bad = await client.put(path, json=workflow, headers={"If-Match": etag})
            assert "If-Match" in await _error(bad, 400, "INVALID_ARGUMENT")


async def test_auth_off_lets_everyone_do_everything_and_says_so(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="streams.runtime"):
        async with serve({"DATABASE_URL": dsn, "WFJOBS_AUTH": "off"}, token=False) as (client, _):
            await put_workflow(client)
            submitted = await client.post(
                "/v1/workflow-runs", json={"workflow_name": "web-review", "input": {"text": "a"}}
            )
            assert submitted.status == 201
            assert (await submitted.json())["job"]["owner"] == auth.ANONYMOUS
    assert any("WFJOBS_AUTH=off" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("host", ["attacker.example:6066", "rebound.example", "10.0.0.7:6066"])
async def test_auth_off_answers_only_requests_addressed_to_this_machine(
    dsn: str, host: str
) -> None:
    # A page on a name its owner resolves to 127.0.0.1 (DNS rebinding) is the
    # browser's own origin: only the Host header tells it from a local caller.
    async with serve({"DATABASE_URL": dsn, "WFJOBS_AUTH": "off"}, token=False) as (client, _):
        submit = {"workflow_name": "web-review", "input": {"text": "a"}}
        for method, path, body in (
            ("GET", "/v1/workflow-runs", None),
            ("POST", "/v1/workflow-runs", submit),
            ("GET", "/dashboard/", None),
        ):
            response = await client.request(method, path, json=body, headers={"Host": host})
            message = await _error(response, 403, "PERMISSION_DENIED")
            assert "WFJOBS_AUTH=off" in message and "localhost" in message
        for local in ("127.0.0.1:6066", "localhost:6066", "[::1]:6066", "LOCALHOST"):
            listed = await client.get("/v1/workflow-runs", headers={"Host": local})
            assert listed.status == 200, (local, await listed.text())
        # The probes and the scrape, tokenless with auth on too, answer whatever
        # name a kubelet or a Prometheus addresses the process by.
        for probe in ("/healthz", "/readyz", "/metrics"):
            answered = await client.get(probe, headers={"Host": "10.1.2.3:6066"})
            assert answered.status in (200, 503), (probe, await answered.text())
            assert "PERMISSION_DENIED" not in await answered.text()
    # With auth on a token is what counts, whatever name the request was sent to.
    async with serve({"DATABASE_URL": dsn}) as (client, _):
        listed = await client.get("/v1/workflow-runs", headers={"Host": host})
        assert listed.status == 200


async def test_auth_off_refuses_what_another_sites_page_sends(dsn: str) -> None:
    # A POST without a body is a "simple" request a page anywhere may send to
    # 127.0.0.1 without asking first; only its Origin says where it comes from.
    async with serve({"DATABASE_URL": dsn, "WFJOBS_AUTH": "off"}, token=False) as (
        client,
        runtime,
    ):
        await put_workflow(client)
        job_id = await parked_job(client, runtime, "keep me")
        cancel = f"/v1/workflow-runs/{job_id}:cancel"
        for origin in (
            "https://attacker.example",
            "null",
            "http://127.0.0.1.attacker.example",
            "http://[::1",
        ):
            refused = await client.post(cancel, headers={"Origin": origin})
            message = await _error(refused, 403, "PERMISSION_DENIED")
            assert "WFJOBS_AUTH=off" in message
        job = await (await client.get(f"/v1/workflow-runs/{job_id}")).json()
        assert job["job"]["status"] == "WAITING"
        # The dashboard's own requests come from this machine's origin.
        allowed = await client.post(cancel, headers={"Origin": "http://localhost:6066"})
        assert allowed.status == 200, await allowed.text()


def test_the_request_topic_owner_is_configured_or_trusted() -> None:
    def owner(env: Mapping[str, str], principal: str) -> str:
        runtime = Runtime(Settings.from_env(env))
        handler = RequestHandler(runtime, decoder=None, dead_letter=None, topic="t")  # type: ignore[arg-type]
        request = WorkflowRunRequest(job_id=str(uuid.uuid4()), workflow_name="w")
        request.principal = principal
        return handler.owner_of(request)

    assert owner({}, "mallory") == "kafka"
    assert owner({"WFJOBS_REQUEST_PRINCIPAL": "ingest"}, "") == "ingest"
    trusting = {"WFJOBS_TRUST_REQUEST_PRINCIPAL": "true", "WFJOBS_REQUEST_PRINCIPAL": "ingest"}
    assert owner(trusting, "team-a") == "team-a"
    assert owner(trusting, "") == "ingest"


async def test_tokens_from_the_command_line_and_the_token_it_picks_up(
    dsn: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio
    import json

    async def wfjobs(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = await asyncio.to_thread(cli_main, list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    monkeypatch.delenv("WFJOBS_TOKEN", raising=False)
    monkeypatch.delenv("WFJOBS_TOKEN_FILE", raising=False)
    monkeypatch.setenv("DATABASE_URL", dsn)
    code, out, err = await wfjobs(
        "--json", "tokens", "create", "--principal", "ci", "--scope", "read", "--scope", "submit"
    )
    assert code == 0, err
    made = json.loads(out)
    assert made["principal"] == "ci" and made["scopes"] == ["submit", "read"]
    token = made["token"]
    assert token.startswith(f"wfj_{made['id']}_")
    code, out, _ = await wfjobs("tokens", "create", "--principal", "ci", "--scope", "nope")
    assert code == 1

    code, out, _ = await wfjobs("tokens", "list")
    assert code == 0 and made["id"] in out and "submit,read" in out
    # The secret may itself hold "_" (URL-safe base64): cut off the known prefix.
    assert token.removeprefix(f"wfj_{made['id']}_") not in out

    async with serve({"DATABASE_URL": dsn}, token=False) as (client, _):
        url = str(client.make_url(""))
        # No token anywhere: the server's 401, and where a token would be looked for.
        monkeypatch.chdir(tmp_path)
        code, _, err = await wfjobs("--url", url, "list")
        assert code == 1 and "UNAUTHENTICATED" in err and "WFJOBS_TOKEN" in err
        # The development token's file, found from the directory `wfjobs dev` ran in.
        (tmp_path / ".wfjobs-dev").mkdir()
        (tmp_path / ".wfjobs-dev" / "token").write_text(token + "\n")
        code, out, err = await wfjobs("--url", url, "list")
        assert code == 0, err
        code, _, err = await wfjobs("--url", url, "outbox", "list")
        assert code == 1 and "PERMISSION_DENIED" in err and "'admin'" in err

        code, out, _ = await wfjobs("tokens", "revoke", made["id"])
        assert code == 0 and f"revoked token {made['id']}" in out
        code, out, _ = await wfjobs("--json", "tokens", "list")
        assert json.loads(out)["tokens"][0]["revoked_at"]

        async def listed() -> bool:
            return (await wfjobs("--url", url, "list"))[0] == 0

        await _refused_once_verification_lapses(listed)
        code, _, err = await wfjobs("tokens", "revoke", "0123456789ab")
        assert code == 1 and "NOT_FOUND" in err
