"""The settings object: defaults, parsing, and errors that name the variable."""

from __future__ import annotations

import re

import pytest

from streams.settings import Settings, SettingsError


def test_defaults() -> None:
    settings = Settings.from_env({})
    assert settings.roles == {"api", "worker", "relay"}
    assert settings.auto_migrate is False
    assert settings.max_concurrent_per_target == 8
    assert settings.dlq_topic == "workflow-run-requests.dlq"
    assert settings.broker_url == "kafka://127.0.0.1:9092"
    assert settings.store_configured is False
    assert settings.max_queued_jobs == 0  # no admission cap unless asked for
    assert (settings.retry_base_s, settings.retry_max_s) == (5.0, 3600.0)
    assert settings.effective_heartbeat_s == pytest.approx(100.0)


def test_values_are_parsed() -> None:
    settings = Settings.from_env(
        {
            "WFJOBS_ROLES": "api, worker",
            "WFJOBS_AUTO_MIGRATE": "true",
            "WFJOBS_CLAIM_LOOPS": "16",
            "WFJOBS_LEASE_S": "3",
            "WFJOBS_HANDLERS": "a.b, c.d",
            "WFJOBS_REQUESTS_TOPIC": "in",
            "KAFKA_BOOTSTRAP_SERVERS": "k1:9092,k2:9092",
        }
    )
    assert settings.roles == {"api", "worker"}
    assert settings.auto_migrate is True
    assert settings.claim_loops == 16
    assert settings.effective_heartbeat_s == pytest.approx(1.0)
    assert settings.handler_modules == ("a.b", "c.d")
    assert settings.dlq_topic == "in.dlq"
    assert settings.broker_url == "kafka://k1:9092;kafka://k2:9092"


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"WFJOBS_CLAIM_LOOPS": "many"}, "WFJOBS_CLAIM_LOOPS must be an integer, got 'many'"),
        ({"WFJOBS_AUTO_MIGRATE": "sure"}, "WFJOBS_AUTO_MIGRATE must be boolean"),
        ({"WFJOBS_LEASE_S": "0"}, "WFJOBS_LEASE_S must be positive"),
        ({"WFJOBS_CLAIM_LOOPS": "-1"}, "WFJOBS_CLAIM_LOOPS must not be negative"),
        ({"WFJOBS_ROLES": "api,cook"}, "WFJOBS_ROLES must be a comma-separated subset"),
        ({"WFJOBS_WEB_PORT": "70000"}, "WFJOBS_WEB_PORT must be a TCP port"),
        ({"WFJOBS_SHUTDOWN_GRACE_S": "-1"}, "WFJOBS_SHUTDOWN_GRACE_S must be positive"),
        ({"WFJOBS_HEARTBEAT_S": "400"}, "WFJOBS_HEARTBEAT_S must be >= 0 and below"),
        ({"WFJOBS_MAX_QUEUED_JOBS": "-1"}, "WFJOBS_MAX_QUEUED_JOBS must be 0"),
        ({"WFJOBS_MAX_EVENT_BYTES": "1000"}, "WFJOBS_MAX_EVENT_BYTES must be at least 16384"),
        ({"WFJOBS_EVENT_FORMAT": "avro"}, "WFJOBS_EVENT_FORMAT=avro needs WFJOBS_SCHEMA_REGISTRY"),
        ({"WFJOBS_AUTH": "maybe"}, "WFJOBS_AUTH must be 'on' or 'off', got 'maybe'"),
        ({"WFJOBS_RELAY_LINGER_MS": "-1"}, "WFJOBS_RELAY_LINGER_MS must not be negative"),
        ({"WFJOBS_RETRY_MAX_S": "0"}, "WFJOBS_RETRY_MAX_S must be positive"),
        ({"WFJOBS_MAX_ATTEMPTS": "101"}, "WFJOBS_MAX_ATTEMPTS must be at most 100, got 101"),
        ({"WFJOBS_RETRY_MAX_S": "1e12"}, "WFJOBS_RETRY_MAX_S must be at most 31536000 "),
        ({"WFJOBS_RULE_MAX_COST": "0"}, "WFJOBS_RULE_MAX_COST must be at least 1"),
    ],
)
def test_a_bad_value_names_its_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(SettingsError, match=names):
        Settings.from_env(env)


@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "-inf", "1e400"])
@pytest.mark.parametrize(
    "name", ["WFJOBS_LEASE_S", "WFJOBS_COMPILE_TIMEOUT_S", "WFJOBS_RETENTION_INTERVAL_S"]
)
def test_a_number_that_is_not_finite_is_refused(name: str, raw: str) -> None:
    with pytest.raises(SettingsError, match=f"{name} must be a finite number, got '{raw}'"):
        Settings.from_env({name: raw})


@pytest.mark.parametrize(
    "url",
    ["not a url", "registry:8081", "ftp://registry", "HTTP://registry", "http://", "http://r:x"],
)
def test_a_registry_url_the_client_cannot_take_is_refused(url: str) -> None:
    with pytest.raises(SettingsError, match=f"WFJOBS_SCHEMA_REGISTRY_URL must be .*got '{url}'"):
        Settings.from_env({"WFJOBS_SCHEMA_REGISTRY_URL": url})
    with pytest.raises(SettingsError, match="WFJOBS_SCHEMA_REGISTRY_URL"):
        Settings.from_env({"WFJOBS_SCHEMA_REGISTRY_URL": f"http://registry:8081,{url}"})


@pytest.mark.parametrize(
    "url",
    [
        "http://registry:8081",
        "https://registry.example/apis/ccompat/v7/",
        "http://a:8081, http://[::1]:8081",
        "mock://tests",
    ],
)
def test_registry_urls_the_client_takes_are_kept(url: str) -> None:
    settings = Settings.from_env({"WFJOBS_SCHEMA_REGISTRY_URL": url})
    assert settings.schema_registry_url == url
    assert settings.open_registry() is not None


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"WFJOBS_REQUESTS_TOPIC": "job requests"}, "WFJOBS_REQUESTS_TOPIC must be a Kafka topic"),
        ({"WFJOBS_EVENTS_TOPIC": "events/v1"}, "WFJOBS_EVENTS_TOPIC must be a Kafka topic"),
        ({"WFJOBS_COMPLETIONS_TOPIC": ".."}, "WFJOBS_COMPLETIONS_TOPIC must be a Kafka topic"),
        ({"WFJOBS_COMPLETION_RESULTS_TOPIC": "r" * 250}, "WFJOBS_COMPLETION_RESULTS_TOPIC"),
        ({"WFJOBS_REQUESTS_DLQ_TOPIC": "dead:letters"}, "WFJOBS_REQUESTS_DLQ_TOPIC must be"),
        # The default dead-letter topic is the requests topic's name and ".dlq".
        ({"WFJOBS_REQUESTS_TOPIC": "r" * 247}, r"WFJOBS_REQUESTS_TOPIC \(with .dlq"),
    ],
)
def test_a_topic_name_no_broker_accepts_is_refused(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=named):
        Settings.from_env(env)


def test_topic_names_of_every_legal_character_are_kept() -> None:
    settings = Settings.from_env({"WFJOBS_EVENTS_TOPIC": "Team_A.workflow-run-events.v2"})
    assert settings.events_topic == "Team_A.workflow-run-events.v2"


@pytest.mark.parametrize("principal", ["  ", "ingest team", "-ingest", "ingest\nx", "a" * 201])
def test_the_request_principal_must_be_one_a_token_could_name(principal: str) -> None:
    with pytest.raises(SettingsError, match=r"WFJOBS_REQUEST_PRINCIPAL: principal .* is malformed"):
        Settings.from_env({"WFJOBS_REQUEST_PRINCIPAL": principal})
    assert Settings.from_env({"WFJOBS_REQUEST_PRINCIPAL": "ingest@team-a"}).request_principal == (
        "ingest@team-a"
    )


def test_the_worker_id_is_required_and_not_blank() -> None:
    with pytest.raises(SettingsError, match="WFJOBS_WORKER_ID is required"):
        Settings.from_env({"WFJOBS_WORKER_ID": "   "}).require_worker_id()
    assert Settings.from_env({"WFJOBS_WORKER_ID": " w7 "}).require_worker_id() == "w7"


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        # A password with a bare '%' is not percent-encoding libpq can read.
        ("postgresql://wfjobs:50%off@db/wfjobs", "50%off"),
        ("host=db user=wfjobs password=two words dbname=wfjobs", "words"),
        ("postgresql://wfjobs:s3cret@[::1/wfjobs", "s3cret"),
    ],
)
def test_a_database_url_that_does_not_parse_stops_the_process_without_its_secret(
    url: str, secret: str
) -> None:
    # Left to the pool, it would log libpq's refusal, quoting the password, at every retry.
    with pytest.raises(SettingsError, match="DATABASE_URL") as refused:
        Settings.from_env({"DATABASE_URL": url})
    assert secret not in str(refused.value)


def test_a_database_url_refusal_quotes_only_libpqs_own_words() -> None:
    unknown_option = re.escape('invalid connection option "..."')
    with pytest.raises(SettingsError, match=unknown_option) as refused:
        Settings.from_env({"DATABASE_URL": "host=db passwrd=s3cret"})
    assert "s3cret" not in str(refused.value) and "passwrd" not in str(refused.value)
    with pytest.raises(SettingsError, match=re.escape('missing "=" after "..."')):
        Settings.from_env({"DATABASE_URL": "nonsense://"})


def test_a_registry_url_is_refused_without_showing_its_password() -> None:
    with pytest.raises(SettingsError, match="WFJOBS_SCHEMA_REGISTRY_URL must be") as refused:
        Settings.from_env({"WFJOBS_SCHEMA_REGISTRY_URL": "https://sr:sekrit@registry:80x1"})
    assert "sekrit" not in str(refused.value) and "registry:80x1" in str(refused.value)


@pytest.mark.parametrize(
    "basic_auth", ["WFJOBS_SCHEMA_REGISTRY_BASIC_AUTH", "WFJOBS_SCHEMA_REGISTRY_BASIC_AUTH_FILE"]
)
def test_registry_credentials_are_given_in_one_place(basic_auth: str) -> None:
    # The registry client would refuse the pair only when a process first opens it.
    env = {"WFJOBS_SCHEMA_REGISTRY_URL": "https://sr:sekrit@registry.example", basic_auth: "x"}
    with pytest.raises(SettingsError, match="WFJOBS_SCHEMA_REGISTRY_URL") as refused:
        Settings.from_env(env)
    assert basic_auth in str(refused.value) and "sekrit" not in str(refused.value)
