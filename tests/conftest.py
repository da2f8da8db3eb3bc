"""Session-wide real services: Postgres, Apache Kafka, Tansu and a Schema Registry.

Each server starts once per session and only when a test asks for it, so the
unit tests never pay for one. A server that cannot start errors every test that
needs it, with the reason and the server's log tail; nothing is skipped, in CI
or anywhere else.

Under pytest-xdist (``-n N``) the controller starts one Postgres, one Apache
Kafka and one Schema Registry before the workers exist and hands them their
addresses in ``DATABASE_URL``, ``KAFKA_BOOTSTRAP_SERVERS`` and
``WFJOBS_TEST_SCHEMA_REGISTRY_URL``, so every worker adopts the same servers as
it would servers the user named. Addresses the user already set are kept.

Migrations run once per session, into a template database; a test's migrated
database is a copy of it (``CREATE DATABASE ... TEMPLATE``), which is far
cheaper than migrating again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

# The same class confluent_kafka.admin re-exports, from the module its stubs type.
from confluent_kafka.cimpl import NewTopic
from psycopg import sql

from devstack.services import (
    ApacheKafkaService,
    PostgresService,
    SchemaRegistryService,
    TansuService,
    dsn_with_database,
)
from store.migrate import migrate

# --------------------------------------------------------------------------- Postgres


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresService]:
    """The session's Postgres: ``DATABASE_URL`` when set, else an embedded server.

    ``postgres_server.dsn`` is the admin DSN.
    """
    with PostgresService() as server:
        yield server


# Names the template the xdist controller built, for its workers.
TEMPLATE_ENV = "WFJOBS_TEST_TEMPLATE_DATABASE"


def build_template(admin_dsn: str) -> str:
    """A new database holding every migration, closed to connections; its name.

    Named per session, so runs sharing one ``DATABASE_URL`` never meet. Closed
    because ``CREATE DATABASE ... TEMPLATE`` refuses a source anyone is connected to.
    """
    name = f"wfjobs_template_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    # Its own thread and loop: a test may ask for the first template from inside
    # the session's running loop, where asyncio.run is refused.
    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, migrate(dsn_with_database(admin_dsn, name))).result()
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(sql.Identifier(name))
        )
    return name


@pytest.fixture(scope="session")
def migrated_template(postgres_server: PostgresService) -> Iterator[str]:
    """The session's template database: every migration applied, once."""
    handed_down = os.environ.get(TEMPLATE_ENV)
    if handed_down:
        yield handed_down
        return
    name = build_template(postgres_server.dsn)
    yield name
    postgres_server.drop_database(name)


MakeDatabase = Callable[..., str]


@pytest.fixture
def make_database(
    postgres_server: PostgresService, request: pytest.FixtureRequest
) -> Iterator[MakeDatabase]:
    """Factory: ``make_database(migrated=False) -> dsn``, a new database per call.

    Empty by default (for the tests of migrations themselves); ``migrated=True``
    copies the session's template, every migration applied. Every database made
    here is dropped at teardown, its clients disconnected.
    """
    made: list[str] = []

    def make(*, migrated: bool = False) -> str:
        if migrated:
            template = request.getfixturevalue("migrated_template")
            name = f"test_{uuid.uuid4().hex[:16]}"
            with psycopg.connect(postgres_server.dsn, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                        sql.Identifier(name), sql.Identifier(template)
                    )
                )
            dsn = dsn_with_database(postgres_server.dsn, name)
        else:
            dsn = postgres_server.create_database("test")
        made.append(dsn)
        return dsn

    yield make
    for dsn in made:
        postgres_server.drop_database(dsn)


@pytest.fixture
def migrated_database(make_database: MakeDatabase) -> str:
    """The DSN of a new database with every migration applied."""
    return make_database(migrated=True)


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Lets `-m "not kafka"` deselect what needs a broker without every test
    # repeating a marker its fixtures already imply.
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for fixture, marker in _MARKED_BY_FIXTURE.items():
            if fixture in names:
                item.add_marker(marker)
    if hasattr(config, "workerinput"):
        # xdist (--dist loadfile --no-loadscope-reorder) hands out modules in this
        # order: the long ones first, so the run does not end waiting on one
        # worker that drew a long module last.
        items.sort(key=_start_rank)


# Modules whose tests take longest, longest first (measured with --durations).
_LONG_MODULES = (
    "tests/e2e/test_soak.py",
    "tests/e2e/test_roles.py",
    "tests/e2e/test_ownership.py",
    "tests/integration/test_install.py",
    "tests/integration/delivery/test_relay_outage.py",
    "tests/integration/delivery/test_dev_stack.py",
    "tests/integration/streams/test_ownership.py",
    "tests/integration/delivery/test_relay.py",
)
# xdist queues the next module behind a worker's last two tests: the unit tests
# come right after the longest modules, so what waits behind those is short.
_FIRST_WAVE = 4


def _start_rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0]
    if path in _LONG_MODULES[:_FIRST_WAVE]:
        return _LONG_MODULES.index(path)
    if path.startswith("tests/unit/"):
        return _FIRST_WAVE
    if path in _LONG_MODULES:
        return _LONG_MODULES.index(path) + 1
    if path.startswith("tests/e2e/"):
        return len(_LONG_MODULES) + 1
    return len(_LONG_MODULES) + 2


# --------------------------------------------------------------------------- xdist controller

# Services the controller started for its workers; stopped by pid when it ends.
_SHARED: list[PostgresService | ApacheKafkaService | SchemaRegistryService] = []
_SHARED_TEMPLATE: list[tuple[PostgresService, str]] = []


def _distributes(config: pytest.Config) -> bool:
    """True in the xdist controller of a run that hands tests to workers."""
    if hasattr(config, "workerinput") or config.getoption("collectonly"):
        return False
    return getattr(config.option, "dist", "no") != "no"


def _only_unit_tests(config: pytest.Config) -> bool:
    unit = Path(str(config.rootpath), "tests", "unit").resolve()
    paths = [Path(arg.split("::", 1)[0]).resolve() for arg in config.args]
    return bool(paths) and all(path == unit or unit in path.parents for path in paths)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not _distributes(config) or _only_unit_tests(config):
        return
    # Before xdist starts its workers (at session start), so they inherit the
    # addresses. Each service adopts the one the environment names, if any.
    postgres = PostgresService()
    _SHARED.append(postgres)
    postgres.start()
    os.environ["DATABASE_URL"] = postgres.dsn
    template = build_template(postgres.dsn)
    _SHARED_TEMPLATE.append((postgres, template))
    os.environ[TEMPLATE_ENV] = template
    kafka = ApacheKafkaService()
    _SHARED.append(kafka)
    kafka.start()
    os.environ["KAFKA_BOOTSTRAP_SERVERS"] = kafka.bootstrap_servers
    registry = SchemaRegistryService()
    _SHARED.append(registry)
    registry.start()
    os.environ["WFJOBS_TEST_SCHEMA_REGISTRY_URL"] = registry.url


def pytest_unconfigure(config: pytest.Config) -> None:
    for postgres, template in _SHARED_TEMPLATE:
        with contextlib.suppress(psycopg.Error):
            postgres.drop_database(template)
    _SHARED_TEMPLATE.clear()
    while _SHARED:
        _SHARED.pop().stop()
