"""Every shared default is written once, in ``schemas.defaults``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from schemas import defaults
from store import pool
from streams.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "store", "streams", "workflows", "cli", "devstack")
# Values that mean one thing everywhere: a second literal copy would drift.
SHARED = {
    defaults.REQUESTS_TOPIC,
    defaults.EVENTS_TOPIC,
    defaults.KAFKA_BOOTSTRAP_SERVERS,
    defaults.API_URL,
    defaults.WEB_PORT,
    defaults.KAFKA_PORT,
}


def _modules() -> list[Path]:
    return [
        path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "gen" not in path.relative_to(ROOT).parts
    ]


@pytest.mark.parametrize("path", _modules(), ids=lambda path: str(path.relative_to(ROOT)))
def test_no_module_but_the_defaults_spells_a_shared_default(path: Path) -> None:
    if path == ROOT / "schemas" / "defaults.py":
        return
    literals = [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant)
        and not isinstance(node.value, bool)
        and isinstance(node.value, str | int)
        and node.value in SHARED
    ]
    assert literals == [], f"{path.relative_to(ROOT)} repeats shared defaults: {literals}"


def test_the_settings_start_from_the_shared_defaults() -> None:
    settings = Settings()
    assert settings.requests_topic == defaults.REQUESTS_TOPIC
    assert settings.events_topic == defaults.EVENTS_TOPIC
    assert settings.dlq_topic == defaults.dlq_topic_for(defaults.REQUESTS_TOPIC)
    assert settings.kafka_bootstrap_servers == defaults.KAFKA_BOOTSTRAP_SERVERS
    assert (settings.web_host, settings.web_port) == (defaults.WEB_HOST, defaults.WEB_PORT)
    assert (settings.pool_min_size, settings.pool_max_size, settings.pool_timeout_s) == (
        pool.DEFAULT_MIN_SIZE,
        pool.DEFAULT_MAX_SIZE,
        pool.DEFAULT_TIMEOUT_S,
    )
