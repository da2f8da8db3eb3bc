"""The deployment files name only settings that exist, with values the settings accept.

No Docker is needed: the files are read as text. A misspelt variable in the
compose file would otherwise be ignored silently by every worker replica.
"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from streams.settings import Settings

DOCKER = Path(__file__).resolve().parents[3] / "docker"
COMPOSE = DOCKER / "compose.yaml"

# Read by docker/entrypoint.sh itself, never by the worker.
ENTRYPOINT_ONLY = {"WFJOBS_WORKER_ID_PREFIX"}
OURS = re.compile(r"\b(WFJOBS_[A-Z0-9_]+|DATABASE_URL|KAFKA_BOOTSTRAP_SERVERS)\b")
# `NAME: value` lines of the compose file; `${NAME:-default}` stands for its default.
ASSIGNMENT = re.compile(r"^\s+(?P<name>[A-Z][A-Z0-9_]*): (?P<value>.+?)\s*$", re.MULTILINE)
SUBSTITUTION = re.compile(r"\$\{[A-Z0-9_]+:-(?P<default>[^}]*)\}")

KNOWN = {str(f.metadata["env"]) for f in fields(Settings)}


def test_every_variable_named_is_a_setting() -> None:
    for path in (COMPOSE, DOCKER / "Dockerfile", DOCKER / "entrypoint.sh"):
        named = set(OURS.findall(path.read_text()))
        unknown = named - KNOWN - ENTRYPOINT_ONLY
        assert not unknown, f"{path.name} names {sorted(unknown)}, which the worker never reads"


def test_the_worker_environment_parses() -> None:
    environment: dict[str, str] = {}
    for match in ASSIGNMENT.finditer(COMPOSE.read_text()):
        name = match["name"]
        if name in KNOWN:
            value = SUBSTITUTION.sub(lambda m: m["default"], match["value"])
            environment[name] = value.strip("'\"")
    # The worker service's own settings and the shared anchor both appear.
    assert {"DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS", "WFJOBS_ROLES"} <= set(environment)
    settings = Settings.from_env(environment)
    assert settings.roles == {"api", "worker", "relay"}
    assert settings.schema_registry_url == "http://schema-registry:8081"
    assert settings.web_host == "0.0.0.0"


def test_the_topics_the_compose_file_creates_are_the_default_ones() -> None:
    defaults = Settings()
    text = COMPOSE.read_text()
    for topic in (defaults.requests_topic, defaults.events_topic, defaults.dlq_topic):
        assert f" {topic}" in text, topic
