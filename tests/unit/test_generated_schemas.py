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
