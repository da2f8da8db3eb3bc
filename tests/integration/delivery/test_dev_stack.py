"""The ``make dev`` path: embedded Postgres + Tansu + a real worker process.

The stack is the one ``wfjobs dev`` starts (:class:`devstack.stack.DevStack`),
and the job is driven by the README's own walk-through: every ``$ wfjobs ...``
line of "Five minutes with the sample workflow" is read from the README and run
as written, in order, with the job id the submit printed in place of
``<job-id>``. The stack runs on free ports, so the environment holds the
exports ``wfjobs dev`` prints when its default ports are taken.

A stack given a folder keeps its work there: stopped and started again on the
same folder, it has the jobs and workflows of the first run (the walk-through's
among them), on the same port.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import signal
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from rich.console import Console

from cli.main import main as cli_main
from devstack.postgres import PostgresService
from devstack.processes import ServiceError, StopSignals, free_port
from devstack.stack import DevStack, _run_dev_stack, next_steps
from devstack.tansu import TansuService
from store import databases
from workflows.samples import SAMPLE_WORKFLOW_NAME, WORKFLOW_FILE

pytestmark = [pytest.mark.tansu, pytest.mark.e2e]

README = Path(__file__).resolve().parents[3] / "README.md"
JOB_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def walkthrough_commands() -> list[list[str]]:
    """The ``$ wfjobs`` lines of the README's walk-through, split as a shell would,
    without the program name."""
    text = README.read_text()
    start = text.index("## Five minutes with the sample workflow")
    section = text[start : text.index("\n## ", start + 1)]
    commands = []
    for line in section.splitlines():
        if line.startswith("$ wfjobs "):
            commands.append(shlex.split(line.removeprefix("$ wfjobs "), comments=True))
    return commands


def use(stack: DevStack, monkeypatch: pytest.MonkeyPatch) -> None:
    """The exports ``wfjobs dev`` prints, for the commands run in-process."""
    monkeypatch.setenv("WFJOBS_URL", stack.url)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", stack.bootstrap_servers)
    monkeypatch.setenv("WFJOBS_TOKEN_FILE", str(stack.token_path))
    monkeypatch.delenv("WFJOBS_TOKEN", raising=False)
    monkeypatch.delenv("WFJOBS_SCHEMA_REGISTRY_URL", raising=False)


@pytest.fixture
def dev_folder() -> Iterator[Path]:
    """A folder for a stack's kept data, like ``.wfjobs-dev`` in a checkout.

    Readable by others as a checkout is: run as root, Postgres runs as its own
    user and must reach its data directory inside.
    """
    folder = Path(tempfile.mkdtemp(prefix="devstack-kept-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def wfjobs(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run one command in-process, as typed; what it printed to stdout."""
    capsys.readouterr()
    code = cli_main(argv)
    captured = capsys.readouterr()
    assert code == 0, f"wfjobs {shlex.join(argv)} exited {code}: {captured.err}"
    return captured.out


def job(capsys: pytest.CaptureFixture[str], job_id: str) -> dict[str, Any]:
    """The job as get-job answers it; empty while it does not exist yet."""
    capsys.readouterr()
    code = cli_main(["--json", "get", job_id])
    captured = capsys.readouterr()
    if code != 0:
        assert "NOT_FOUND" in captured.err, captured.err
        return {}
    answer: dict[str, Any] = json.loads(captured.out)["job"]
    return answer


def wait_for_status(
    capsys: pytest.CaptureFixture[str], job_id: str, status: str, timeout_s: float = 60
) -> dict[str, Any]:
    """The "within a moment" of the README: until the job has that status."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = job(capsys, job_id)
        if found.get("status") == status:
            return found
        assert found.get("status") not in {"FAILED", "DEAD"}, found
        assert time.monotonic() < deadline, f"job {job_id} is not {status}: {found}"
        time.sleep(0.2)


def run_the_readme_walkthrough(capsys: pytest.CaptureFixture[str]) -> None:
    """Every ``$ wfjobs`` line of the walk-through against a fresh stack, checked."""
    stored = json.loads(wfjobs(capsys, ["--json", "workflows", "list"]))["workflows"]
    assert [workflow["name"] for workflow in stored] == [SAMPLE_WORKFLOW_NAME]
    # The README's file, stored again by hand: the same definition, accepted as is.
    wfjobs(capsys, ["workflows", "put", str(WORKFLOW_FILE)])

    commands = walkthrough_commands()
    assert [argv[0] for argv in commands] == [
        "submit",
        "list",
        "get",
        "complete",
        "get",
        "watch",
        "events",
        "produce",
        "list",
    ]
    submit, listing, get_waiting, complete, get_done, watch, events, produce, waiting = commands

    out = wfjobs(capsys, submit)
    match = JOB_ID.search(out)
    assert match is not None and "submitted" in out, out
    job_id = match.group(0)

    def typed(argv: list[str]) -> list[str]:
        return [job_id if arg == "<job-id>" else arg for arg in argv]

    parked = wait_for_status(capsys, job_id, "WAITING")
    assert parked["outstanding_step"] == "review"
    assert [entry["name"] for entry in parked["checkpoints"]] == ["tokenize", "embed"]
    assert job_id in wfjobs(capsys, typed(listing))
    out = wfjobs(capsys, typed(get_waiting))
    assert "WAITING" in out and "review" in out

    out = wfjobs(capsys, typed(complete))
    assert "COMPLETED" in out
    done = wait_for_status(capsys, job_id, "COMPLETED")
    assert [entry["name"] for entry in done["checkpoints"]] == ["tokenize", "embed", "review"]
    assert done["verdict"] == "completed 3 steps: tokenize, embed, review"
    assert done["result"]["approved"] is True and done["result"]["dimensions"] == 8
    out = wfjobs(capsys, typed(get_done))
    assert "COMPLETED" in out and done["verdict"] in out
    # Its whole timeline at once, from the outbox, and the end it came to.
    out = wfjobs(capsys, typed(watch))
    assert out.count("STEP_CHECKPOINT") == 3 and "job ended COMPLETED" in out
    # "A second complete for the same step answers ALREADY_DONE."
    assert "ALREADY_DONE" in wfjobs(capsys, typed(complete))

    # The events, read from Tansu as plain Protobuf: every commit point once.
    kinds: list[str] = []
    deadline = time.monotonic() + 60
    while len(kinds) < 6 and time.monotonic() < deadline:
        out = wfjobs(capsys, typed(events))
        kinds = [
            line.split()[1] for line in out.splitlines() if job_id in line and len(line.split()) > 1
        ]
    assert kinds == [
        "ACCEPTED",
        "STEP_CHECKPOINT",
        "STEP_CHECKPOINT",
        "WAITING",
        "STEP_CHECKPOINT",
        "COMPLETED",
    ]

    # The same job through Kafka: it parks like the first one.
    out = wfjobs(capsys, typed(produce))
    match = JOB_ID.search(out)
    assert match is not None, out
    produced = match.group(0)
    uuid.UUID(produced)
    wait_for_status(capsys, produced, "WAITING")
    out = wfjobs(capsys, typed(waiting))
    assert produced in out and job_id not in out


def test_a_kept_postgres_comes_back_on_its_port_unless_it_is_taken(dev_folder: Path) -> None:
    # The banner's `export DATABASE_URL=...` must still reach the restarted stack.
    data_dir = dev_folder / "postgres"
    with PostgresService("", data_dir=data_dir) as first:
        kept = first.dsn
    with PostgresService("", data_dir=data_dir) as second:
        assert second.dsn == kept
    port = int(kept.rsplit(":", 1)[1].split("/", 1)[0])
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with PostgresService("", data_dir=data_dir) as moved:
            assert moved.dsn != kept
            assert databases.connects(moved.dsn)


def test_a_kept_postgres_keeps_every_commit_it_acknowledged(dev_folder: Path) -> None:
    # A submit answered 201 must outlive a crash of the server or the machine.
    stack = DevStack(workdir=dev_folder)
    with stack.postgres as server, psycopg.connect(server.dsn) as conn:
        settings = dict(
            conn.execute(
                "select name, setting from pg_settings where name = any(%s)",
                (["fsync", "synchronous_commit", "full_page_writes"],),
            ).fetchall()
        )
    assert settings == {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}


@pytest.mark.parametrize("victim", ["Postgres", "Tansu", "the worker"])
def test_wfjobs_dev_names_a_dead_child_and_stops_the_rest(dev_folder: Path, victim: str) -> None:
    stack = DevStack(web_port=free_port(), kafka_port=None, workdir=dev_folder)
    output = io.StringIO()
    stops = StopSignals()
    codes: list[int] = []
    runner = threading.Thread(
        target=lambda: codes.append(
            _run_dev_stack(stack, 0, Console(file=output, width=200), stops)
        )
    )
    runner.start()
    try:
        deadline = time.monotonic() + 120
        while "dev stack is up" not in output.getvalue():
            assert runner.is_alive() and time.monotonic() < deadline, output.getvalue()
            time.sleep(0.2)
        assert stack.worker is not None
        children = {"Postgres": stack.postgres.pid, "Tansu": stack.tansu.pid}
        children["the worker"] = stack.worker.pid
        pid = children[victim]
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        runner.join(timeout=60)
    finally:
        stops.requested = True
        runner.join(timeout=60)
    assert codes == [1], output.getvalue()
    assert f"{victim} was killed by SIGKILL" in output.getvalue()
    for child in children.values():
        assert child is not None
        with pytest.raises(ProcessLookupError):
            os.kill(child, 0)


def test_a_job_submitted_over_http_is_completed_from_kafka(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The dev stack has one user: what the token submits, a StepCompletion reaches.
    with DevStack(web_port=free_port(), kafka_port=None) as stack:
        use(stack, monkeypatch)
        out = wfjobs(
            capsys, ["submit", "--workflow-name", SAMPLE_WORKFLOW_NAME, "--input", '{"text": "hi"}']
        )
        match = JOB_ID.search(out)
        assert match is not None, out
        job_id = match.group(0)
        wait_for_status(capsys, job_id, "WAITING")
        review = '{"approved": true, "note": "from kafka"}'
        wfjobs(capsys, ["produce-completion", job_id, "review", "--response", review])
        done = wait_for_status(capsys, job_id, "COMPLETED")
        assert done["owner"] == "dev"
        out = wfjobs(
            capsys,
            ["produce", "--workflow-name", SAMPLE_WORKFLOW_NAME, "--input", '{"text": "hi"}'],
        )
        match = JOB_ID.search(out)
        assert match is not None, out
        assert wait_for_status(capsys, match.group(0), "WAITING")["owner"] == "dev"


def test_a_second_stack_on_a_folder_in_use_is_refused_and_touches_nothing(
    dev_folder: Path,
) -> None:
    # Above all `--fresh`, which would delete the running stack's database.
    with DevStack(web_port=free_port(), kafka_port=None, workdir=dev_folder) as running:
        kept = sorted(path.name for path in dev_folder.iterdir())
        second = DevStack(web_port=free_port(), kafka_port=None, workdir=dev_folder, fresh=True)
        with pytest.raises(ServiceError, match="in use by another wfjobs dev"):
            second.start()
        assert sorted(path.name for path in dev_folder.iterdir()) == kept
        assert running.ended() is None
        assert running.worker is not None and running.worker.healthy()
    # Stopped, the folder is free again.
    with DevStack(web_port=free_port(), kafka_port=None, workdir=dev_folder, fresh=True) as again:
        assert again.ended() is None


def test_ctrl_c_while_wfjobs_dev_starts_stops_it_without_the_banner(dev_folder: Path) -> None:
    stack = DevStack(web_port=free_port(), kafka_port=None, workdir=dev_folder)
    output = io.StringIO()
    stops = StopSignals()
    stops.requested = True  # pressed while the services were starting
    assert _run_dev_stack(stack, 0, Console(file=output, width=200), stops) == 0
    assert "dev stack is up" not in output.getvalue()
    assert "stopping" in output.getvalue()
    assert stack.postgres.pid is None and stack.tansu.pid is None


def test_tansu_takes_the_port_it_is_given() -> None:
    # What lets `make dev` sit on KAFKA_BOOTSTRAP_SERVERS's default, 127.0.0.1:9092.
    port = free_port()
    with TansuService(port=port) as broker:
        assert broker.bootstrap_servers == f"127.0.0.1:{port}"


def test_the_readme_walkthrough_then_a_restart_keeps_jobs_workflows_and_the_port(
    dev_folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    with DevStack(web_port=port, kafka_port=None, workdir=dev_folder) as first:
        use(first, monkeypatch)
        assert first.url == f"http://127.0.0.1:{port}"
        run_the_readme_walkthrough(capsys)
        banner = next_steps(first)
        assert str(dev_folder) in banner and "wfjobs dev --fresh" in banner
        assert "in memory: events are lost at stop" in banner
        assert "bin/activate" in banner

        wfjobs(capsys, ["workflows", "put", str(WORKFLOW_FILE), "--name", "kept-review"])
        out = wfjobs(
            capsys,
            ["submit", "--workflow-name", "kept-review", "--input", '{"text": "keep me"}'],
        )
        match = JOB_ID.search(out)
        assert match is not None, out
        job_id = match.group(0)
        parked = wait_for_status(capsys, job_id, "WAITING")
        log = first.worker.log_path if first.worker else None
    assert log is not None and log.is_file()
    first_log = log.read_bytes()

    # Straight away: the first run's connections are still in TIME_WAIT.
    with DevStack(web_port=port, kafka_port=None, workdir=dev_folder) as second:
        use(second, monkeypatch)
        assert (second.url, second.port_was_taken) == (first.url, False)
        assert second.database_url == first.database_url
        assert job(capsys, job_id) == parked
        listed = json.loads(wfjobs(capsys, ["--json", "workflows", "list"]))["workflows"]
        assert sorted(workflow["name"] for workflow in listed) == sorted(
            ["kept-review", SAMPLE_WORKFLOW_NAME]
        )
        # The kept job goes on where it stopped.
        review = '{"approved": true, "note": "after a restart"}'
        wfjobs(capsys, ["complete", job_id, "review", "--response", review])
        wait_for_status(capsys, job_id, "COMPLETED")
        assert log.read_bytes().startswith(first_log)

    with DevStack(web_port=port, kafka_port=None, workdir=dev_folder, fresh=True) as fresh:
        use(fresh, monkeypatch)
        assert job(capsys, job_id) == {}
        listed = json.loads(wfjobs(capsys, ["--json", "workflows", "list"]))["workflows"]
        assert [workflow["name"] for workflow in listed] == [SAMPLE_WORKFLOW_NAME]
        assert not log.read_bytes().startswith(first_log)
