"""Every kind of Kafka client, built from the settings, on a SASL_SSL (SCRAM-SHA-512) listener.

In process and without worker processes: the librdkafka clients (the relay's
producer, the dead-letter verbs, an admin client), the aiokafka ones (the
broker probe, the ownership reader). The settings name only the SASL_SSL
listener, so a client that ignored them could not connect at all.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from aiokafka.errors import KafkaConnectionError  # type: ignore[import-untyped]
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from schemas.errors import Unavailable
from store.outbox import Backlog, RelayResult
from streams.broker import BrokerConnection, KafkaRefused
from streams.ownership import OwnershipReader, ownership_reader
from streams.relay import build_relay
from streams.requests_dlq import RequestsDeadLetters
from streams.settings import Settings
from tests.conftest import KafkaSasl


class NoOutbox:
    async def relay_batch(
        self, publish: object, limit: int = 100, *, owner: str = "relay"
    ) -> RelayResult:
        raise AssertionError("not used here")

    async def backlog(self) -> Backlog:
        raise AssertionError("not used here")


def sasl_settings(kafka_sasl: KafkaSasl, **env: str) -> Settings:
    return Settings.from_env({**kafka_sasl.settings_env(), **env})


@pytest.fixture(scope="module")
def topic(kafka_sasl: KafkaSasl) -> str:
    """A topic made by an admin client built from the settings, over SASL_SSL."""
    name = f"sasl-{uuid.uuid4().hex[:12]}"
    admin = AdminClient(sasl_settings(kafka_sasl).kafka_client_config())
    admin.create_topics([NewTopic(name, 1, 1)], operation_timeout=30)[name].result(timeout=30)
    return name


def test_the_relay_producer_publishes_over_sasl_ssl(kafka_sasl: KafkaSasl, topic: str) -> None:
    settings = sasl_settings(kafka_sasl, WFJOBS_RELAY_MESSAGE_TIMEOUT_MS="10000")
    producer = Producer(dict(build_relay(settings, NoOutbox()).producer_config))
    producer.produce(topic, key=b"k", value=b"over sasl_ssl")
    assert producer.flush(15) == 0

    consumer = Consumer(
        {**settings.kafka_client_config(), "group.id": "sasl-read", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        message = consumer.poll(15)
        assert message is not None and message.error() is None
        assert message.value() == b"over sasl_ssl"
    finally:
        consumer.close()


async def test_the_dead_letter_verbs_read_over_sasl_ssl(kafka_sasl: KafkaSasl) -> None:
    settings = sasl_settings(kafka_sasl, WFJOBS_REQUESTS_TOPIC=f"r-{uuid.uuid4().hex[:8]}")
    listing = await RequestsDeadLetters.from_settings(settings).list_messages()
    assert listing.total == 0


async def test_the_dead_letter_verbs_pick_up_a_rotated_password(
    kafka_sasl: KafkaSasl, tmp_path: Path
) -> None:
    # Each call builds new clients, and a new client reads the secret's file again.
    password_file = tmp_path / "kafka-password"
    password_file.write_text("the-old-password\n")
    env = {**kafka_sasl.settings_env(), "WFJOBS_REQUESTS_TOPIC": f"r-{uuid.uuid4().hex[:8]}"}
    del env["WFJOBS_KAFKA_SASL_PASSWORD"]
    settings = Settings.from_env({**env, "WFJOBS_KAFKA_SASL_PASSWORD_FILE": str(password_file)})
    dead_letters = RequestsDeadLetters.from_settings(settings)
    with pytest.raises(Unavailable):
        await dead_letters.list_messages()
    password_file.write_text(kafka_sasl.password + "\n")
    listing = await dead_letters.list_messages()
    assert listing.total == 0


async def test_the_broker_probe_connects_over_sasl_ssl(kafka_sasl: KafkaSasl) -> None:
    settings = sasl_settings(kafka_sasl)
    probe = BrokerConnection(
        None,  # type: ignore[arg-type]  # the probe alone starts nothing of the app
        ",".join(settings.kafka_servers),
        retry_max_s=1.0,
        security=settings.kafka_security(),
    )
    assert await probe.broker_answers()


async def test_the_user_may_come_from_a_file_and_is_named_by_it_when_refused(
    kafka_sasl: KafkaSasl, tmp_path: Path, topic: str
) -> None:
    user_file = tmp_path / "kafka-user"
    user_file.write_text(kafka_sasl.username + "\n")
    env = kafka_sasl.settings_env()
    del env["WFJOBS_KAFKA_SASL_USERNAME"]
    settings = Settings.from_env({**env, "WFJOBS_KAFKA_SASL_USERNAME_FILE": str(user_file)})
    probe = BrokerConnection(
        None,  # type: ignore[arg-type]
        ",".join(settings.kafka_servers),
        retry_max_s=1.0,
        security=settings.kafka_security(),
    )
    assert await probe.broker_answers()
    producer = Producer(dict(build_relay(settings, NoOutbox()).producer_config))
    producer.produce(topic, key=b"k", value=b"as the user of the file")
    assert producer.flush(15) == 0

    user_file.write_text("nobody\n")
    probe = BrokerConnection(
        None,  # type: ignore[arg-type]
        ",".join(settings.kafka_servers),
        retry_max_s=1.0,
        security=settings.kafka_security(),
    )
    with pytest.raises(KafkaRefused, match="WFJOBS_KAFKA_SASL_USERNAME_FILE") as refused:
        await probe.broker_answers()
    assert "user 'nobody'" in str(refused.value)


async def test_refused_credentials_stop_the_probe_naming_the_setting(
    kafka_sasl: KafkaSasl,
) -> None:
    settings = Settings.from_env(kafka_sasl.settings_env(password="not-the-password"))
    probe = BrokerConnection(
        None,  # type: ignore[arg-type]
        ",".join(settings.kafka_servers),
        retry_max_s=1.0,
        security=settings.kafka_security(),
    )
    with pytest.raises(KafkaRefused, match="WFJOBS_KAFKA_SASL_PASSWORD"):
        await probe.broker_answers()


async def test_a_certificate_from_another_authority_names_the_ca_setting(
    kafka_sasl: KafkaSasl, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from tests.certificates import make_server_certificates

    stranger = make_server_certificates(tmp_path_factory.mktemp("other-ca"))
    settings = sasl_settings(kafka_sasl, WFJOBS_KAFKA_SSL_CA_FILE=str(stranger.ca_file))
    probe = BrokerConnection(
        None,  # type: ignore[arg-type]
        ",".join(settings.kafka_servers),
        retry_max_s=1.0,
        security=settings.kafka_security(),
    )
    with pytest.raises(KafkaRefused, match="WFJOBS_KAFKA_SSL_CA_FILE"):
        await probe.broker_answers()


async def test_the_ownership_reader_describes_the_group_over_sasl_ssl(
    kafka_sasl: KafkaSasl, topic: str
) -> None:
    settings = sasl_settings(kafka_sasl)
    reader = OwnershipReader(
        ",".join(settings.kafka_servers),
        f"sasl-group-{uuid.uuid4().hex[:8]}",
        topic,
        security=lambda: settings.kafka_security().aiokafka(),
    )
    try:
        ownership = await reader.read()
    finally:
        await reader.stop()
    assert ownership.partitions == (0,)


async def test_the_ownership_reader_picks_up_a_rotated_password(
    kafka_sasl: KafkaSasl, topic: str, tmp_path: Path
) -> None:
    # A read that fails drops its client; the next one is new and reads the file again.
    password_file = tmp_path / "kafka-password"
    password_file.write_text("the-old-password\n")
    env = kafka_sasl.settings_env()
    del env["WFJOBS_KAFKA_SASL_PASSWORD"]
    settings = Settings.from_env({**env, "WFJOBS_KAFKA_SASL_PASSWORD_FILE": str(password_file)})
    reader = ownership_reader(settings, topic)
    try:
        # aiokafka reports a refused login as a failed bootstrap.
        with pytest.raises(KafkaConnectionError):
            await reader.read()
        password_file.write_text(kafka_sasl.password + "\n")
        ownership = await reader.read()
    finally:
        await reader.stop()
    assert ownership.partitions == (0,)
