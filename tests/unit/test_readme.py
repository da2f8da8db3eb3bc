"""The README's settings table is the documentation users read: keep it true."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from streams.settings import Settings

README = Path(__file__).resolve().parents[2] / "README.md"
ROW = re.compile(r"^\| `(?P<name>[A-Z_]+)` \| (?P<default>[^|]+) \|", re.MULTILINE)


def _documented() -> dict[str, str]:
    return {m["name"]: m["default"].strip() for m in ROW.finditer(README.read_text())}


def _shown(default: object) -> str:
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, frozenset | tuple):
        default = ",".join(sorted(default))
    if default == "":
        return ""
    return f"`{default}`"


def test_every_setting_is_documented_with_its_default() -> None:
    documented = _documented()
    for f in fields(Settings):
        name = f.metadata["env"]
        assert name in documented, f"{name} is missing from the README settings table"
        shown = _shown(f.default)
        if shown:
            assert documented[name] == shown, f"{name}: README says {documented[name]}"
        else:
            assert documented[name].startswith("*(empty"), f"{name}: README says a default"


def test_the_readme_documents_no_setting_that_does_not_exist() -> None:
    known = {f.metadata["env"] for f in fields(Settings)}
    assert set(_documented()) <= known


def _command_table() -> str:
    text = README.read_text()
    start = text.index("## The command line")
    return text[start : text.index("\n## ", start + 1)]


def test_every_command_and_verb_is_in_the_command_table() -> None:
    import argparse

    from cli.main import build_parser

    def commands(parser: argparse.ArgumentParser, prefix: str) -> list[str]:
        found: list[str] = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    nested = commands(sub, f"{prefix} {name}")
                    found += nested or [f"{prefix} {name}"]
        return found

    table = _command_table()
    rows = [line for line in table.splitlines() if line.startswith("| `wfjobs ")]
    missing = []
    for command in commands(build_parser(), "wfjobs"):
        # A row names a command's verbs after the first as "`get NAME`", "`revoke ID`".
        *group, verb = command.split()
        if not any(
            f"`{command}" in row or (f"`{' '.join(group)}" in row and f"`{verb}" in row)
            for row in rows
        ):
            missing.append(command)
    assert missing == []


def _api_rows() -> dict[str, str]:
    text = README.read_text()
    start = text.index("## The HTTP API")
    table = text[start : text.index("\n## ", start + 1)]
    return {
        line.split(" | ")[0].removeprefix("| "): line
        for line in table.splitlines()
        if line.startswith("| ")
    }


def test_every_field_of_a_request_body_is_named_in_its_api_row() -> None:
    from schemas.contract import api_pb2

    bodies = {
        "submit-workflow": api_pb2.SubmitWorkflowRequest,
        "complete-step": api_pb2.CompleteStepRequest,
        "resume": api_pb2.ResumeJobRequest,
        "cancel": api_pb2.CancelJobRequest,
        "bulk cancel": api_pb2.CancelJobsRequest,
        "bulk resume": api_pb2.ResumeJobsRequest,
    }
    rows = _api_rows()
    unnamed = [
        f"{verb}: {field.name}"
        for verb, message in bodies.items()
        for field in message.DESCRIPTOR.fields
        # The path names these; the body may leave them out.
        if field.name not in ("job_id", "step_name") or verb == "submit-workflow"
        if f"`{field.name}`" not in rows[verb] and f'"{field.name}"' not in rows[verb]
    ]
    assert unnamed == []
