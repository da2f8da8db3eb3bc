"""Topics created at start (``WFJOBS_CREATE_TOPICS``), against the session's Apache Kafka.

The Faust app is the one the settings build; only its producer starts, which
is what declaring a topic takes.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import InvalidReplicationFactorError  # type: ignore[import-untyped]
from confluent_kafka.admin import AdminClient

from streams.app import create_app
from streams.broker import BrokerConnection, KafkaRefused
from streams.runtime import Runtime
from streams.settings import Settings
from streams.topics import declare
from tests.e2e.test_sasl import refused_worker
from tests.forkserver import ForkServer

pytestmark = pytest.mark.kafka


async def _declare(kafka_bootstrap: str, name: str, **env: str) -> None:
    settings = Settings.from_env(
        {
            "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "WFJOBS_GROUP": f"topics-{uuid.uuid4().hex[:8]}",
            "WFJOBS_CREATE_TOPICS": "true",
            **env,
        }
    )
    app: Any = create_app(settings, runtime=Runtime(settings))
    await app.producer.start()
    try:
        await declare(app, settings, name)
    finally:
        await app.producer.stop()


async def test_topics_are_created_with_the_settings_partitions_and_replicas(
    kafka_bootstrap: str,
) -> None:
    name = f"declared-{uuid.uuid4().hex[:8]}"
    await _declare(kafka_bootstrap, name, WFJOBS_TOPIC_PARTITIONS="3")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    partitions = admin.list_topics(name, timeout=10).topics[name].partitions
    assert {index: len(partition.replicas) for index, partition in partitions.items()} == {
        0: 1,
        1: 1,
        2: 1,
    }

    # The session's broker is alone, so two replicas are more than it can
    # place: asking for them shows the factor reaches the broker.
    refused = f"declared-{uuid.uuid4().hex[:8]}"
    with pytest.raises(InvalidReplicationFactorError, match="replication factor of 2"):
        await _declare(kafka_bootstrap, refused, WFJOBS_TOPIC_REPLICAS="2")


async def test_more_replicas_than_brokers_is_refused_naming_the_setting(
    kafka_bootstrap: str,
) -> None:
    # Faust would only fail later, creating the first topic, with a traceback
    # that names no setting.
    settings = Settings.from_env(
        {
            "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "WFJOBS_CREATE_TOPICS": "true",
            "WFJOBS_TOPIC_REPLICAS": "2",
        }
    )
    app: Any = create_app(settings, runtime=Runtime(settings))
    connection = BrokerConnection(
        app, kafka_bootstrap, retry_max_s=1.0, topic_replicas=settings.topic_replicas
    )
    with pytest.raises(KafkaRefused, match=r"WFJOBS_TOPIC_REPLICAS is 2, more than the 1 broker"):
        await connection.broker_answers()
    # Without WFJOBS_CREATE_TOPICS the topics are provisioned: nothing to check.
    assert await BrokerConnection(app, kafka_bootstrap, retry_max_s=1.0).broker_answers()


async def test_a_worker_asked_for_more_replicas_than_brokers_exits_with_one_line(
    kafka_bootstrap: str, fork_server: ForkServer, tmp_path: Path
) -> None:
    log = await refused_worker(
        tmp_path,
        kafka_bootstrap,
        {"WFJOBS_CREATE_TOPICS": "true", "WFJOBS_TOPIC_REPLICAS": "3"},
        fork_server,
    )
    named = [line for line in log.splitlines() if "WFJOBS_TOPIC_REPLICAS" in line]
    assert named, log
    assert "is 3, more than the 1 broker" in named[0], named[0]
    assert "InvalidReplicationFactor" not in log, log
