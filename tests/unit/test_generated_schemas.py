"""The checked-in modules in schemas/gen are exactly what the .proto sources produce."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from schemas import generate

REPO = Path(__file__).resolve().parents[2]


def test_checked_in_modules_match_the_proto_sources() -> None:
    # The very command `make check-generated` and CI run.
    proc = subprocess.run(
        [sys.executable, "-m", "schemas.generate", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_check_fails_when_a_proto_source_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sources = tmp_path / "proto"
    shutil.copytree(generate.PROTO_ROOT, sources)
    events = sources / "workflowjobs" / "v1" / "events.proto"
    text = events.read_text()
    last_brace = text.rindex("}")
    events.write_text(text[:last_brace] + "  string drift_probe = 99;\n" + text[last_brace:])
    # Only the sources move; the comparison is still against the real schemas/gen.
    monkeypatch.setattr(generate, "PROTO_ROOT", sources)

    assert generate.main(["--check"]) == 1

    report = capsys.readouterr().err
    assert "schemas/gen is stale" in report
    assert "generated/workflowjobs/v1/events_pb2.pyi" in report
    assert "drift_probe" in report


def test_check_fails_when_a_consumer_file_is_edited_by_hand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shipped = tmp_path / "proto-consumer"
    shutil.copytree(generate.CONSUMER_ROOT, shipped)
    events = shipped / "workflowjobs" / "v1" / "events.proto"
    events.write_text(events.read_text().replace("int64 event_id = 1;", "int64 event_id = 21;"))
    monkeypatch.setattr(generate, "CONSUMER_ROOT", shipped)

    assert generate.main(["--check"]) == 1

    report = capsys.readouterr().err
    assert "schemas/proto-consumer is stale" in report
    assert "workflowjobs/v1/events.proto is not the contract registered for it" in report
    assert "number: 21" in report


def test_consumer_source_drops_only_validation_options() -> None:
    source = """syntax = "proto3";

package demo.v1;

import "buf/validate/validate.proto";
import "google/protobuf/struct.proto";

message Thing {
  option (buf.validate.message).cel = {
    id: "braces"
    message: "a string with } ; ] and // inside"
    expression: "this.a != '' || size(this.b) > 0"
  };

  string a = 1 [(buf.validate.field).string = {min_len: 1, in: ["x", "y]"]}];
  string b = 2 [deprecated = true, (buf.validate.field).string.max_len = 5];
  int32 c = 3 [(buf.validate.field).int32 = {gte: 0, lte: 100}, json_name = "sea"];
  // a = 4 [ mentioned in a comment
  google.protobuf.Struct d = 4;
}
"""
    result = generate.consumer_source(source, "demo/v1/thing.proto")

    assert "buf/validate" not in result and "buf.validate" not in result
    assert "  string a = 1;\n  string b = 2 [deprecated = true];\n" in result
    assert '  int32 c = 3 [json_name = "sea"];\n' in result
    assert "message Thing {\n  string a = 1;" in result
    assert "  // a = 4 [ mentioned in a comment\n  google.protobuf.Struct d = 4;\n" in result
