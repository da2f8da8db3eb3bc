"""``wfjobs`` argument handling and error reporting (no services needed).

The verbs against a real worker are exercised by the dev-stack smoke test.
"""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path

import pytest

from streams import cli
from streams.services import free_port


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_unreachable_api_prints_code_and_message(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = run(capsys, "--url", url, "get", str(uuid.uuid4()))
    assert code == 1
    assert out == ""
    assert "UNAVAILABLE" in err
    assert url in err


def test_options_are_accepted_after_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    args = cli.build_parser().parse_args(["list", "--json", "--url", url, "--status", "WAITING"])
    assert args.json is True
    assert args.url == url
    assert args.status == "WAITING"
    before = cli.build_parser().parse_args(["--json", "--url", url, "list"])
    assert before.json is True
    assert before.url == url


def test_url_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WFJOBS_URL", "http://example.invalid:1234")
    assert cli.build_parser().parse_args(["workflows", "list"]).url == (
        "http://example.invalid:1234"
    )
    monkeypatch.delenv("WFJOBS_URL")
    assert cli.build_parser().parse_args(["workflows", "list"]).url == cli.DEFAULT_URL


def test_submit_needs_exactly_one_definition_source(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as neither:
        cli.main(["submit", "--input", "{}"])
    assert neither.value.code == 2
    with pytest.raises(SystemExit) as both:
        cli.main(["submit", "--workflow-name", "a", "--workflow-file", "b.json", "--input", "{}"])
    assert both.value.code == 2


def test_input_must_be_a_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "submit", "--workflow-name", "w", "--input", "[1, 2]")
    assert code == 1
    assert "INVALID_ARGUMENT" in err
    code, _, err = run(capsys, "submit", "--workflow-name", "w", "--input", "{nope")
    assert code == 1
    assert "not valid JSON" in err


def test_bad_job_id_is_refused_before_any_call(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        capsys, "submit", "--workflow-name", "w", "--input", "{}", "--job-id", "not-a-uuid"
    )
    assert code == 1
    assert "job id must be a UUID" in err


def test_json_object_reads_files_and_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "input.json"
    path.write_text(json.dumps({"text": "from a file"}))
    assert cli.json_object(f"@{path}", "--input") == {"text": "from a file"}
    monkeypatch.setattr("sys.stdin", io.StringIO('{"text": "from stdin"}'))
    assert cli.json_object("-", "--input") == {"text": "from stdin"}
    with pytest.raises(cli.CliError):
        cli.json_object(f"@{tmp_path / 'missing.json'}", "--input")


def test_event_summary_names_what_matters() -> None:
    line = cli.event_summary(
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
    failed = cli.event_summary({"type": "TYPE_DEAD", "error": "UNAVAILABLE: down"})
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
    parser = cli.build_parser()
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
