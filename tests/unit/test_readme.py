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
