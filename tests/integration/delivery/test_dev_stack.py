"""The ``make dev`` path: embedded Postgres + Tansu + a real worker process.

The stack is the one ``wfjobs dev`` starts (:class:`streams.devstack.DevStack`),
and the job is driven the way the README walks through it, with the ``wfjobs``
commands: submit, get (WAITING on review), complete, get (COMPLETED), events.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streams import cli
from streams.devstack import DevStack
from streams.services import free_port
from workflows.samples import SAMPLE_INPUT, SAMPLE_REVIEW, SAMPLE_WORKFLOW_NAME, WORKFLOW_FILE

pytestmark = [pytest.mark.tansu, pytest.mark.e2e]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[DevStack]:
    with DevStack(web_port=free_port(), workdir=tmp_path / "dev") as running:
        yield running


def wfjobs(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    """Run one ``wfjobs --json`` command in-process and parse what it printed."""
    capsys.readouterr()
    code = cli.main(["--json", *argv])
    captured = capsys.readouterr()
    assert code == 0, f"wfjobs {' '.join(argv)} exited {code}: {captured.err}"
    return json.loads(captured.out)


def wait_for_status(
    capsys: pytest.CaptureFixture[str], url: str, job_id: str, status: str, timeout_s: float = 60
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        job: dict[str, Any] = wfjobs(capsys, "--url", url, "get", job_id)["job"]
        if job.get("status") == status:
            return job
        assert job.get("status") not in {"FAILED", "DEAD"}, job
        assert time.monotonic() < deadline, f"job stayed {job.get('status')}: {job}"
        time.sleep(0.2)


def test_sample_workflow_runs_to_completed_on_tansu(
    stack: DevStack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = stack.url
    stored = wfjobs(capsys, "--url", url, "workflows", "list")["workflows"]
    assert [workflow["name"] for workflow in stored] == [SAMPLE_WORKFLOW_NAME]
    # The README's file, stored again by hand: the same definition, accepted as is.
    again = wfjobs(capsys, "--url", url, "workflows", "put", str(WORKFLOW_FILE))
    assert again["workflow"]["name"] == SAMPLE_WORKFLOW_NAME

    job_id = str(uuid.uuid4())
    submitted = wfjobs(
        capsys,
        "--url",
        url,
        "submit",
        "--workflow-name",
        SAMPLE_WORKFLOW_NAME,
        "--input",
        json.dumps(SAMPLE_INPUT),
        "--job-id",
        job_id,
    )
    assert submitted["job"]["job_id"] == job_id

    waiting = wait_for_status(capsys, url, job_id, "WAITING")
    assert waiting["outstanding_step"] == "review"
    assert [entry["name"] for entry in waiting["checkpoints"]] == ["tokenize", "embed"]

    answer = wfjobs(
        capsys, "--url", url, "complete", job_id, "review", "--response", json.dumps(SAMPLE_REVIEW)
    )
    assert answer["outcome"] == "COMPLETED"

    done = wait_for_status(capsys, url, job_id, "COMPLETED")
    assert [entry["name"] for entry in done["checkpoints"]] == ["tokenize", "embed", "review"]
    assert done["verdict"]
    assert done["result"]["approved"] is True
    assert done["result"]["dimensions"] == 8
    listed = wfjobs(capsys, "--url", url, "list", "--status", "COMPLETED")["jobs"]
    assert [job["job_id"] for job in listed] == [job_id]

    # The events, as `wfjobs events` reads them from Tansu: plain Protobuf, no registry.
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", stack.bootstrap_servers)
    monkeypatch.delenv("WFJOBS_SCHEMA_REGISTRY_URL", raising=False)
    deadline = time.monotonic() + 60
    events: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        capsys.readouterr()
        code = cli.main(["--json", "events", "--from-beginning", "--max", "6", "--timeout", "20"])
        assert code == 0
        lines = capsys.readouterr().out.splitlines()
        events = [json.loads(line) for line in lines if line.strip()]
        if len(events) == 6:
            break
    ours = [event for event in events if event["job_id"] == job_id]
    assert [event["type"] for event in ours] == [
        "TYPE_ACCEPTED",
        "TYPE_STEP_CHECKPOINT",
        "TYPE_STEP_CHECKPOINT",
        "TYPE_WAITING",
        "TYPE_STEP_CHECKPOINT",
        "TYPE_COMPLETED",
    ]
    assert ours[-1]["verdict"] == done["verdict"]
    assert [int(event["event_id"]) for event in ours] == sorted(
        int(event["event_id"]) for event in ours
    )
