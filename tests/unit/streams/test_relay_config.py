"""The relay the settings build: producer guarantees and event encoding (no broker needed)."""

from __future__ import annotations

import uuid

import pytest

from schemas.serde import AvroEventSerializer, PlainProtobufSerializer, ProtobufFramer
from store.outbox import Backlog, RelayResult
from streams.relay import build_relay, producer_config
from streams.settings import Settings


class NoOutbox:
    async def relay_batch(
        self, publish: object, limit: int = 100, *, owner: str = "relay"
    ) -> RelayResult:
        raise AssertionError("not used here")

    async def backlog(self) -> Backlog:
        raise AssertionError("not used here")


def test_the_producer_is_idempotent_and_waits_for_every_in_sync_replica() -> None:
    config = producer_config("k1:9092,k2:9092")
    assert config["bootstrap.servers"] == "k1:9092,k2:9092"
    assert config["enable.idempotence"] is True
    assert config["acks"] == "all"
    # More in flight would let a retry reorder a partition, and with it a job's events.
    assert config["max.in.flight.requests.per.connection"] <= 5
    assert producer_config("k:1", {"acks": "1"})["acks"] == "1"


@pytest.mark.parametrize(
    ("env", "kind"),
    [
        ({}, PlainProtobufSerializer),
        ({"WFJOBS_SCHEMA_REGISTRY_URL": "mock://relay-config"}, ProtobufFramer),
        (
            {"WFJOBS_SCHEMA_REGISTRY_URL": "mock://relay-config", "WFJOBS_EVENT_FORMAT": "avro"},
            AvroEventSerializer,
        ),
    ],
)
def test_events_are_encoded_as_the_settings_say(env: dict[str, str], kind: type) -> None:
    settings = Settings.from_env({**env, "WFJOBS_EVENTS_TOPIC": f"ev-{uuid.uuid4().hex[:6]}"})
    relay = build_relay(settings, NoOutbox())
    assert isinstance(relay.serializer, kind)
    assert relay.topic == settings.events_topic


def test_the_message_timeout_comes_from_the_settings() -> None:
    settings = Settings.from_env({"WFJOBS_RELAY_MESSAGE_TIMEOUT_MS": "2000"})
    relay = build_relay(settings, NoOutbox())
    assert relay.producer_config["message.timeout.ms"] == 2000
    assert producer_config("k:1")["message.timeout.ms"] == 30_000
