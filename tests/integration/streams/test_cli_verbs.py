"""``wfjobs`` against the real HTTP verbs on a real Postgres: tables, JSON, exit codes.

The commands run in a thread (they are blocking HTTP clients) while the app's
own Faust views answer on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cli.main import main as cli_main
from tests.integration.streams.conftest import WEB_WORKFLOW, parked_job, put_workflow, serve


class Wfjobs:
    def __init__(self, url: str, capsys: pytest.CaptureFixture[str]) -> None:
        self._url = url
        self._capsys = capsys

    async def __call__(self, *argv: str) -> tuple[int, str, str]:
        self._capsys.readouterr()
        code = await asyncio.to_thread(cli_main, ["--url", self._url, *argv])
        captured = self._capsys.readouterr()
        return code, captured.out, captured.err

    async def json(self, *argv: str) -> dict[str, Any]:
        code, out, err = await self("--json", *argv)
        assert code == 0, err
        answer: dict[str, Any] = json.loads(out)
        return answer


async def test_every_verb_as_text_and_as_json(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workflow_file = tmp_path / "web-review.json"
    workflow_file.write_text(json.dumps(WEB_WORKFLOW))
    async with serve({"DATABASE_URL": dsn}) as (client, runtime):
        wfjobs = Wfjobs(str(client.make_url("")), capsys)

        code, out, _ = await wfjobs("workflows", "put", str(workflow_file))
        assert code == 0 and "stored workflow web-review" in out
        stored = await wfjobs.json("workflows", "get", "web-review")
        assert stored["workflow"]["definition"] == WEB_WORKFLOW
        code, out, _ = await wfjobs("workflows", "get", "web-review")
        assert code == 0 and "web-review" in out and "tokenize" in out
        listed = await wfjobs.json("workflows", "list")
        assert [item["name"] for item in listed["workflows"]] == ["web-review"]

        parked = await parked_job(client, runtime, "answer me")
        code, out, _ = await wfjobs("get", parked)
        assert code == 0
        assert "WAITING" in out and "review" in out and "tokenize" in out and "embed" in out

        job_id = str(uuid.uuid4())
        submit = ("submit", "--workflow-name", "web-review", "--input", '{"text": "a b"}')
        code, out, _ = await wfjobs(*submit, "--job-id", job_id)
        assert code == 0 and f"job {job_id} submitted: QUEUED" in out
        # The same id again creates nothing, and says so.
        code, out, _ = await wfjobs(*submit, "--job-id", job_id)
        assert code == 0 and f"job {job_id} already existed: QUEUED" in out
        answer = await wfjobs.json(*submit, "--job-id", job_id)
        assert answer["job"]["job_id"] == job_id and "created" not in answer

        got = await wfjobs.json("get", job_id)
        assert got["job"]["status"] == "QUEUED" and "deadline" not in got["job"]

        page = await wfjobs.json("list", "--status", "QUEUED", "--name", "web-review")
        assert [job["job_id"] for job in page["jobs"]] == [job_id]
        code, out, _ = await wfjobs("list", "--limit", "1")
        assert code == 0 and job_id in out and "next page: --page-token" in out

        # A step the job is not parked on: the server's code, and a failing exit.
        code, out, err = await wfjobs("complete", job_id, "review", "--response", "{}")
        assert (code, out) == (1, "") and "WRONG_STATE" in err

        review = '{"approved": true, "note": "fine"}'
        done = await wfjobs.json("complete", parked, "review", "--response", review)
        assert done["outcome"] == "COMPLETED" and done["job"]["status"] == "QUEUED"
        code, out, _ = await wfjobs("complete", parked, "review", "--response", review)
        assert code == 0 and "ALREADY_DONE" in out

        code, out, err = await wfjobs("get", str(uuid.uuid4()))
        assert (code, out) == (1, "") and "NOT_FOUND" in err

        timed = str(uuid.uuid4())
        code, out, err = await wfjobs(*submit, "--job-id", timed, "--deadline-ms", "60000")
        assert code == 0, err
        deadline = (await wfjobs.json("get", timed))["job"]["deadline"]
        created = (await wfjobs.json("get", timed))["job"]["created_at"]
        assert _instant(deadline) - _instant(created) == timedelta(minutes=1)
        code, out, err = await wfjobs(*submit, "--deadline-ms", "-1")
        assert (code, out) == (1, "") and "deadline_ms" in err


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_workflows_put_name_stores_under_that_name(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unnamed = {key: value for key, value in WEB_WORKFLOW.items() if key != "name"}
    unnamed_file = tmp_path / "unnamed.json"
    unnamed_file.write_text(json.dumps(unnamed))
    named_file = tmp_path / "web-review.json"
    named_file.write_text(json.dumps(WEB_WORKFLOW))
    async with serve({"DATABASE_URL": dsn}) as (client, _):
        wfjobs = Wfjobs(str(client.make_url("")), capsys)

        code, out, err = await wfjobs("workflows", "put", str(unnamed_file), "--name", "given")
        assert code == 0, err
        assert "stored workflow given" in out
        # A file with a name of its own is stored under the one given instead.
        code, out, err = await wfjobs("workflows", "put", str(named_file), "--name", "copy")
        assert code == 0, err
        stored = await wfjobs.json("workflows", "list")
        assert sorted(item["name"] for item in stored["workflows"]) == ["copy", "given"]
        code, out, err = await wfjobs("workflows", "list", "--limit", "1")
        assert code == 0 and "copy" in out and "given" not in out, err
        token = out.rsplit("next page: --page-token ", 1)[1].strip()
        rest = await wfjobs.json("workflows", "list", "--limit", "1", "--page-token", token)
        assert [item["name"] for item in rest["workflows"]] == ["given"]
        assert rest["next_page_token"] == ""
        copy = await wfjobs.json("workflows", "get", "copy")
        assert copy["workflow"]["definition"] == {**WEB_WORKFLOW, "name": "copy"}

        code, _, err = await wfjobs("workflows", "put", str(unnamed_file))
        assert code == 1 and "pass --name" in err


async def test_workflows_get_as_text_is_a_summary_and_a_step_table(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with serve({"DATABASE_URL": dsn}) as (client, _):
        await put_workflow(client)
        wfjobs = Wfjobs(str(client.make_url("")), capsys)
        code, out, err = await wfjobs("workflows", "get", "web-review")
    assert code == 0, err
    # No JSON document after the table: the descriptor set is for --json.
    assert "{" not in out and '"' not in out
    assert WEB_WORKFLOW["schema"]["descriptorSetBase64"][:20] not in out
    assert str(WEB_WORKFLOW["inputType"]) in out
    for step in WEB_WORKFLOW["steps"]:
        row = next(line for line in out.splitlines() if f" {step['name']} " in line)
        assert str(step["method"]) in row
        assert ("external" in row) == (step.get("completion") == "external")
