"""Topics created at start (``WFJOBS_CREATE_TOPICS``), against the session's Apache Kafka.

The Faust app is the one the settings build; only its producer starts, which
is what declaring a topic takes.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from aiokafka.errors import InvalidReplicationFactorError  # type: ignore[import-untyped]
from confluent_kafka.admin import AdminClient

from streams.app import create_app
from streams.runtime import Runtime
from streams.settings import Settings
from streams.topics import declare

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
