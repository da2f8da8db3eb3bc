"""The app's wiring by role, and the refusals that happen before anything connects."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streams.app import create_app
from streams.broker import BootWithoutKafka, BrokerConnection, kafka_services
from streams.runtime import Runtime
from streams.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[3]
FAUST = Path(sys.executable).with_name("faust")


def _routes(app: Any) -> set[str]:
    return {resource.canonical for resource in app.web.web_app.router.resources()}


def _agents(app: Any) -> list[str]:
    return [agent.name for agent in app.agents.values()]


def test_roles_decide_what_is_mounted() -> None:
    api_only = create_app(Settings.from_env({"WFJOBS_ROLES": "api", "WFJOBS_GROUP": "g1"}))
    routes = _routes(api_only)
    assert {
        "/healthz",
        "/v1/workflow-runs",
        "/v1/workflow-runs/{job_id}",
        "/v1/workflow-runs/{job_id}/steps/{step_name}:complete",
        "/v1/workflows",
        "/v1/workflows/{name}",
    } <= routes
    assert _agents(api_only) == []

    worker_only = create_app(Settings.from_env({"WFJOBS_ROLES": "worker", "WFJOBS_GROUP": "g2"}))
    assert "/healthz" in _routes(worker_only)
    assert not any(route.startswith("/v1/") for route in _routes(worker_only))
    assert _agents(worker_only) == ["workflow-run-requests", "workflow-step-completions"]


def test_the_app_is_configured_from_settings() -> None:
    settings = Settings.from_env(
        {
            "WFJOBS_GROUP": "my-group",
            "KAFKA_BOOTSTRAP_SERVERS": "k1:1,k2:2",
            "WFJOBS_WEB_PORT": "7001",
            "WFJOBS_WEB_HOST": "0.0.0.0",
            "WFJOBS_BROKER_SESSION_TIMEOUT_S": "6",
        }
    )
    runtime = Runtime(settings)
    app: Any = create_app(settings, runtime=runtime)
    assert app.conf.id == "my-group"
    assert [str(url) for url in app.conf.broker] == ["kafka://k1:1", "kafka://k2:2"]
    assert app.conf.web_port == 7001
    assert app.conf.web_bind == "0.0.0.0"
    assert app.conf.topic_disable_leader is True
    assert str(app.conf.store) == "memory:"
    assert app.conf.broker_session_timeout == 6.0
    assert app.conf.broker_rebalance_timeout == 6.0
    assert app.conf.broker_heartbeat_interval == 2.0
    assert app.wfjobs_runtime is runtime


def test_the_session_timeout_defaults_to_a_minute() -> None:
    app: Any = create_app(Settings.from_env({"WFJOBS_GROUP": "g3"}))
    assert app.conf.broker_session_timeout == 60.0
    assert app.conf.broker_heartbeat_interval == 3.0


def _clean_env(**extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("WFJOBS_", "F_")) and key not in {"DATABASE_URL"}
    }
    # Nothing listens here: the worker must refuse before it tries to connect.
    env["KAFKA_BOOTSTRAP_SERVERS"] = "127.0.0.1:1"
    env.update(extra)
    return env


def _worker(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FAUST), "-A", "streams.app", "worker"],
        env={**env, "WFJOBS_DATA_DIR": str(tmp_path / "data")},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "WFJOBS_WORKER_ID is required"),
        ({"WFJOBS_WORKER_ID": "  "}, "WFJOBS_WORKER_ID is required"),
        (
            {"WFJOBS_WORKER_ID": "w1", "WFJOBS_HANDLERS": "no_such_module_here"},
            "handler module 'no_such_module_here' cannot be imported",
        ),
        ({"WFJOBS_CLAIM_LOOPS": "lots"}, "WFJOBS_CLAIM_LOOPS must be an integer"),
        (
            {"WFJOBS_WORKER_ID": "w1", "WFJOBS_WEB_HOST": "no-such-host.invalid"},
            "WFJOBS_WEB_HOST 'no-such-host.invalid' does not resolve to an address",
        ),
    ],
)
def test_the_worker_refuses_to_start(env: dict[str, str], expected: str, tmp_path: Path) -> None:
    result = _worker(_clean_env(**env), tmp_path)
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr


@pytest.mark.parametrize("roles", ["api", "relay", "worker", "api,relay,worker"])
def test_faust_boots_no_kafka_client_whatever_the_roles(roles: str) -> None:
    app: Any = create_app(Settings.from_env({"WFJOBS_ROLES": roles, "WFJOBS_GROUP": "g4"}))
    assert isinstance(app.boot_strategy, BootWithoutKafka)
    booted = list(app.boot_strategy.server())
    assert app.web in booted
    for part in (app.producer, app.consumer, app.agents, app.topics, app.tables):
        assert part not in booted


def test_the_kafka_parts_start_later_in_fausts_own_order() -> None:
    app: Any = create_app(Settings.from_env({"WFJOBS_ROLES": "worker", "WFJOBS_GROUP": "g5"}))
    services = kafka_services(app)
    assert services[0] is app.producer
    assert services[1] is app.consumer
    order = [services.index(part) for part in (app.consumer, app.agents, app.topics, app.tables)]
    assert order == sorted(order)


async def test_only_the_worker_role_reports_a_broker_part() -> None:
    for roles, expected in (("api,relay", False), ("worker", True)):
        runtime = Runtime(Settings.from_env({"WFJOBS_ROLES": roles, "WFJOBS_GROUP": "g6"}))
        create_app(runtime.settings, runtime=runtime)
        parts = {part.name: part for part in (await runtime.health_report()).parts}
        assert ("broker" in parts) is expected, roles
        if expected:
            assert parts["broker"].healthy and not parts["broker"].ready


async def test_the_broker_connection_says_what_it_waits_for() -> None:
    # Nothing listens on port 1: healthy (waiting is not stuck) but not ready.
    app: Any = create_app(Settings.from_env({"WFJOBS_ROLES": "api", "WFJOBS_GROUP": "g7"}))
    connection = BrokerConnection(app, "127.0.0.1:1", retry_max_s=1.0)
    assert not await connection.broker_answers()
    assert not await connection.broker_answers()
    health = connection.health()
    assert health.healthy and not health.ready
    assert health.summary.startswith("waiting for Kafka at 127.0.0.1:1 since ")
    assert health.detail["attempts"] == 2
    assert "127.0.0.1:1" in health.detail["last_error"]
