"""Session-wide real services: Postgres, Apache Kafka, Tansu and a Schema Registry.

Each server starts once per session and only when a test asks for it, so the
unit tests never pay for one. A server that cannot start errors every test that
needs it, with the reason and the server's log tail; nothing is skipped, in CI
or anywhere else.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka.admin import AdminClient

# The same class confluent_kafka.admin re-exports, from the module its stubs type.
from confluent_kafka.cimpl import NewTopic

from streams.services import (
    ApacheKafkaService,
    PostgresService,
    SchemaRegistryService,
    TansuService,
)

# --------------------------------------------------------------------------- Postgres


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresService]:
    """The session's Postgres: ``DATABASE_URL`` when set, else an embedded server.

    ``postgres_server.dsn`` is the admin DSN.
    """
    with PostgresService() as server:
        yield server


@pytest.fixture
def make_database(postgres_server: PostgresService) -> Iterator[Callable[[], str]]:
    """Factory: each call creates a new empty database and returns its DSN.

    Every database made here is dropped at teardown, its clients disconnected.
    """
    made: list[str] = []

    def make() -> str:
        dsn = postgres_server.create_database("test")
        made.append(dsn)
        return dsn

    yield make
    for dsn in made:
        postgres_server.drop_database(dsn)


# --------------------------------------------------------------------------- brokers


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[ApacheKafkaService]:
    """Apache Kafka 4.x started by the suite, or ``KAFKA_BOOTSTRAP_SERVERS`` when set."""
    with ApacheKafkaService() as broker:
        yield broker


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: ApacheKafkaService) -> str:
    """``"127.0.0.1:PORT"`` of the session's Apache Kafka."""
    return kafka_broker.bootstrap_servers


@pytest.fixture(scope="session")
def tansu_broker() -> Iterator[TansuService]:
    with TansuService() as broker:
        yield broker


@pytest.fixture(scope="session")
def tansu_bootstrap(tansu_broker: TansuService) -> str:
    """Bootstrap address of the session's in-memory Tansu broker."""
    return tansu_broker.bootstrap_servers


NewTopicFactory = Callable[..., str]


@pytest.fixture
def new_topic() -> Iterator[NewTopicFactory]:
    """Factory: ``new_topic(bootstrap, partitions=3, prefix="test") -> name``.

    The topic has a unique name and is ready (every partition has a leader) when
    the call returns. Topics are deleted at teardown, best effort, so a shared
    ``KAFKA_BOOTSTRAP_SERVERS`` does not fill up.
    """
    made: list[tuple[str, str]] = []

    def create(bootstrap: str, partitions: int = 3, *, prefix: str = "test") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        futures = admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=30)
        futures[name].result(timeout=30)
        made.append((bootstrap, name))
        _wait_for_leaders(admin, name, partitions, timeout_s=30.0)
        return name

    yield create
    by_bootstrap: dict[str, list[str]] = {}
    for bootstrap, name in made:
        by_bootstrap.setdefault(bootstrap, []).append(name)
    for bootstrap, names in by_bootstrap.items():
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.delete_topics(names, operation_timeout=10).values():
            # Cleanup only: a broker the suite started is thrown away anyway.
            with contextlib.suppress(Exception):
                future.result(timeout=10)


def _wait_for_leaders(admin: AdminClient, topic: str, partitions: int, timeout_s: float) -> None:
    # create_topics returns once the controller accepted the topic; a producer
    # racing the leader election would see UNKNOWN_TOPIC_OR_PARTITION.
    deadline = time.monotonic() + timeout_s
    while True:
        meta = admin.list_topics(topic=topic, timeout=5).topics.get(topic)
        if (
            meta is not None
            and meta.error is None
            and len(meta.partitions) == partitions
            and all(p.leader >= 0 for p in meta.partitions.values())
        ):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {topic} has no leader for every partition yet")
        time.sleep(0.05)


# --------------------------------------------------------------------------- Schema Registry


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[SchemaRegistryService]:
    """A real Confluent-compatible Schema Registry; ``schema_registry.url`` is its API base.

    ``WFJOBS_TEST_SCHEMA_REGISTRY_URL`` when set, else an in-memory Apicurio
    Registry the suite starts. Shared by the session: use unique subjects (topics).
    """
    with SchemaRegistryService() as registry:
        yield registry


# --------------------------------------------------------------------------- markers

_MARKED_BY_FIXTURE = {
    "kafka_broker": "kafka",
    "kafka_bootstrap": "kafka",
    "tansu_broker": "tansu",
    "tansu_bootstrap": "tansu",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Lets `-m "not kafka"` deselect what needs a broker without every test
    # repeating a marker its fixtures already imply.
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for fixture, marker in _MARKED_BY_FIXTURE.items():
            if fixture in names:
                item.add_marker(marker)
