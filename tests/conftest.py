"""Session-wide real services: Postgres, Apache Kafka, Tansu and a Schema Registry.

Each server starts once per session and only when a test asks for it, so the
unit tests never pay for one. A server that cannot start errors every test that
needs it, with the reason and the server's log tail; nothing is skipped, in CI
or anywhere else.

Under pytest-xdist (``-n N``) the controller starts one Postgres and one Apache
Kafka before the workers exist and hands them their addresses in
``DATABASE_URL`` and ``KAFKA_BOOTSTRAP_SERVERS``, so every worker adopts the
same servers as it would servers the user named. Addresses the user already set
are kept. The Schema Registry serves one module, which runs on one worker: that
worker starts it when the module first asks, while the others run their tests.

Scratch space (server data, each test's ``tmp_path``) is ``/dev/shm`` when it is
a roomy tmpfs and ``TMPDIR`` is not set.

Migrations run once per session, into a template database; a test's migrated
database is a copy of it (``CREATE DATABASE ... TEMPLATE``), which is far
cheaper than migrating again.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

# The same class confluent_kafka.admin re-exports, from the module its stubs type.
from confluent_kafka.cimpl import NewTopic
from psycopg import sql

import devstack.processes
from devstack.apache_kafka import ApacheKafkaService, SaslSslListener
from devstack.postgres import PostgresService
from devstack.schema_registry import SchemaRegistryService
from devstack.tansu import TansuService
from store.databases import dsn_with_database
from store.migrate import load_migrations, migrate
from tests.certificates import make_server_certificates
from tests.forkserver import ForkServer

# --------------------------------------------------------------------------- ports


def _confine_server_ports(config: pytest.Config) -> None:
    """Give this process its own share of the ports ``free_port`` draws from.

    A port is free when drawn but bound only once its server is up, seconds
    later for a worker process; two xdist workers that drew the same port in
    that window left one server unable to start. Each xdist worker, and the
    controller, draws from a slice of its own.
    """
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        workers, index = int(workerinput["workercount"]), int(workerinput["workerid"][2:])
    elif _distributes(config) and isinstance(config.option.numprocesses, int):
        workers = index = config.option.numprocesses
    else:
        return
    ports = devstack.processes._SERVER_PORTS
    width = len(ports) // (workers + 1)
    devstack.processes._SERVER_PORTS = range(
        ports.start + index * width, ports.start + (index + 1) * width
    )


# --------------------------------------------------------------------------- Postgres


# Hundreds of short-lived databases: autovacuum would visit and analyze each
# one while its test runs, for nothing a test reads (the planner tests ANALYZE
# what they need themselves).
SUITE_POSTGRES_SETTINGS = {"autovacuum": "off"}


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresService]:
    """The session's Postgres: ``DATABASE_URL`` when set, else an embedded server.

    ``postgres_server.dsn`` is the admin DSN.
    """
    with PostgresService(settings=SUITE_POSTGRES_SETTINGS) as server:
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
                    sql.SQL("CREATE DATABASE {} TEMPLATE {}{}").format(
                        sql.Identifier(name), sql.Identifier(template), _copy_strategy(conn)
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


def _copy_strategy(conn: psycopg.Connection[tuple[object, ...]]) -> sql.Composable:
    # Postgres 15+ copies a template through the WAL by default, block by block:
    # for a small template, copying its files costs a sixth of the CPU.
    if conn.info.server_version >= 150000:
        return sql.SQL(" STRATEGY FILE_COPY")
    return sql.SQL("")


@pytest.fixture
def migrated_database(make_database: MakeDatabase) -> str:
    """The DSN of a new database with every migration applied."""
    return make_database(migrated=True)


MigrationsBefore = Callable[[str], str]


@pytest.fixture
def migrations_before(tmp_path: Path) -> Iterator[MigrationsBefore]:
    """Factory: ``migrations_before("0011") -> package``, the real files numbered below it.

    An importable package of the migrations unchanged, so ``migrate(dsn,
    package=...)`` brings a database to the schema an earlier release left.
    """
    made: list[str] = []
    root = tmp_path / "migration-packages"

    def make(first_new: str) -> str:
        name = f"migrations_before_{first_new}_{uuid.uuid4().hex[:8]}"
        package = root / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        for migration in load_migrations():
            if migration.name < first_new:
                (package / migration.name).write_text(migration.sql, encoding="utf-8")
        made.append(name)
        # The path finder caches what a directory held when it last looked.
        importlib.invalidate_caches()
        return name

    root.mkdir()
    sys.path.insert(0, str(root))
    try:
        yield make
    finally:
        sys.path.remove(str(root))
        for name in made:
            sys.modules.pop(name, None)


# --------------------------------------------------------------------------- brokers


@dataclass(frozen=True)
class KafkaSasl:
    """A SASL_SSL (SCRAM) listener of a test broker and what a client needs to use it."""

    bootstrap: str
    ca_file: str
    username: str
    password: str
    mechanism: str = "SCRAM-SHA-512"

    def settings_env(self, *, password: str | None = None) -> dict[str, str]:
        """The workflow-jobs settings of a process that reaches Kafka only through it."""
        return {
            "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            "WFJOBS_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "WFJOBS_KAFKA_SASL_MECHANISM": self.mechanism,
            "WFJOBS_KAFKA_SASL_USERNAME": self.username,
            "WFJOBS_KAFKA_SASL_PASSWORD": self.password if password is None else password,
            "WFJOBS_KAFKA_SSL_CA_FILE": self.ca_file,
        }

    def client_config(self) -> dict[str, Any]:
        """librdkafka properties of a test client on this listener."""
        return {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": self.mechanism,
            "sasl.username": self.username,
            "sasl.password": self.password,
            "ssl.ca.location": self.ca_file,
        }


# How the xdist controller hands its broker's SASL_SSL listener to the workers.
SASL_ENV = {
    "bootstrap": "WFJOBS_TEST_KAFKA_SASL_BOOTSTRAP",
    "ca_file": "WFJOBS_TEST_KAFKA_SASL_CA_FILE",
    "username": "WFJOBS_TEST_KAFKA_SASL_USERNAME",
    "password": "WFJOBS_TEST_KAFKA_SASL_PASSWORD",
    "mechanism": "WFJOBS_TEST_KAFKA_SASL_MECHANISM",
}


def new_sasl_listener(directory: Path) -> tuple[SaslSslListener, str]:
    """A SCRAM user with a fresh password and certificates for 127.0.0.1; and the CA file."""
    certs = make_server_certificates(directory)
    listener = SaslSslListener(
        keystore=certs.keystore_file, username="wfjobs-test", password=uuid.uuid4().hex
    )
    return listener, str(certs.ca_file)


def _sasl_of(broker: ApacheKafkaService, listener: SaslSslListener, ca_file: str) -> KafkaSasl:
    bootstrap = broker.sasl_ssl_bootstrap_servers
    assert bootstrap is not None
    return KafkaSasl(bootstrap, ca_file, listener.username, listener.password, listener.mechanism)


# The SASL_SSL listener of the broker this session started itself, if it did.
_SESSION_SASL: list[KafkaSasl] = []


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafkaService]:
    """Apache Kafka 4.x started by the suite, or ``KAFKA_BOOTSTRAP_SERVERS`` when set.

    One the suite starts also serves a SASL_SSL listener (see ``kafka_sasl``).
    """
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        with ApacheKafkaService() as broker:
            yield broker
        return
    listener, ca_file = new_sasl_listener(tmp_path_factory.mktemp("kafka-tls"))
    with ApacheKafkaService(sasl_ssl=listener) as broker:
        _SESSION_SASL.append(_sasl_of(broker, listener, ca_file))
        yield broker
    _SESSION_SASL.clear()


@pytest.fixture(scope="session")
def kafka_sasl(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaSasl]:
    """A SASL_SSL (SCRAM-SHA-512) listener with a user, on an Apache Kafka 4.x.

    The session's broker's when the suite started it (handed down to xdist
    workers in ``WFJOBS_TEST_KAFKA_SASL_*``); a broker named by
    ``KAFKA_BOOTSTRAP_SERVERS`` has none we know of, so then a private broker
    with one starts for the session.
    """
    if os.environ.get(SASL_ENV["bootstrap"]):
        yield KafkaSasl(**{field: os.environ[name] for field, name in SASL_ENV.items()})
        return
    request.getfixturevalue("kafka_broker")
    if _SESSION_SASL:
        yield _SESSION_SASL[0]
        return
    listener, ca_file = new_sasl_listener(tmp_path_factory.mktemp("kafka-sasl-tls"))
    with ApacheKafkaService("", sasl_ssl=listener) as private:
        yield _sasl_of(private, listener, ca_file)


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


# --------------------------------------------------------------------------- workers


@pytest.fixture(scope="session")
def fork_server() -> Iterator[ForkServer]:
    """Starts worker processes as forks of one that has loaded the service (``launch=``)."""
    server = ForkServer()
    yield server
    server.close()


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
    "kafka_sasl": "kafka",
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
        # xdist (--dist loadfile --no-loadscope-reorder) hands out modules in
        # this order. The sort is stable: a module's tests keep their order.
        items.sort(key=_start_rank)


def pytest_collection_finish(session: pytest.Session) -> None:
    # The modules and test items collected live as long as the session: out of
    # the cyclic collector's passes, every full collection in the run is cheaper.
    gc.freeze()


# Roughly how long each slow module takes, in seconds of wall time on a full
# two-core run. Modules start longest first (the longest-processing-time rule):
# the run does not end waiting on one worker that drew a long module last, and
# the short modules at the end fill the gaps. A module not listed counts as short.
_MODULE_SECONDS = {
    "tests/e2e/test_soak.py": 71,
    "tests/e2e/test_ownership.py": 62,
    "tests/e2e/test_roles.py": 42,
    "tests/integration/delivery/test_relay_outage.py": 40,
    "tests/integration/delivery/test_dev_stack.py": 40,
    "tests/integration/delivery/test_relay.py": 30,
    "tests/integration/security/test_kafka_modes.py": 26,
    "tests/e2e/test_deadlines.py": 25,
    "tests/e2e/test_requests_topic.py": 21,
    "tests/integration/delivery/test_cli_settings.py": 20,
    "tests/integration/contract/test_registry_contract.py": 20,
    "tests/integration/streams/test_ownership.py": 19,
    "tests/e2e/test_loop_crash.py": 17,
    "tests/integration/test_install.py": 15,
    "tests/e2e/test_sasl.py": 15,
    "tests/integration/test_services_smoke.py": 13,
    "tests/e2e/test_fleet.py": 13,
    "tests/e2e/test_failures.py": 13,
    "tests/integration/streams/test_claims.py": 13,
    "tests/e2e/test_crash.py": 12,
    "tests/e2e/test_broker_down.py": 12,
    "tests/e2e/test_group_commit_crash.py": 11,
    "tests/integration/streams/test_web.py": 11,
    "tests/integration/store/test_indexes.py": 10,
    "tests/unit/delivery/test_cli.py": 8,
    "tests/e2e/test_history.py": 7,
    "tests/e2e/test_lifecycle.py": 7,
    "tests/e2e/test_cancel.py": 6,
    "tests/e2e/test_resume.py": 6,
    "tests/integration/streams/test_redrive.py": 6,
    "tests/unit/workflows/test_workflow_codec.py": 5,
}
# An end-to-end module not listed yet still starts real processes.
_UNLISTED_E2E_SECONDS = 10


def _start_rank(item: pytest.Item) -> tuple[int, str]:
    path = item.nodeid.split("::", 1)[0]
    default = _UNLISTED_E2E_SECONDS if path.startswith("tests/e2e/") else 0
    return -_MODULE_SECONDS.get(path, default), path


# --------------------------------------------------------------------------- xdist controller

# Services the controller started for its workers; stopped by pid when it ends.
_SHARED: list[PostgresService | ApacheKafkaService] = []
_SHARED_TEMPLATE: list[tuple[PostgresService, str]] = []
# Scratch directories of the controller (the shared broker's certificates).
_SHARED_DIRS: list[Path] = []


def _distributes(config: pytest.Config) -> bool:
    """True in the xdist controller of a run that hands tests to workers."""
    if hasattr(config, "workerinput") or config.getoption("collectonly"):
        return False
    return getattr(config.option, "dist", "no") != "no"


def _only_unit_tests(config: pytest.Config) -> bool:
    unit = Path(str(config.rootpath), "tests", "unit").resolve()
    paths = [Path(arg.split("::", 1)[0]).resolve() for arg in config.args]
    return bool(paths) and all(path == unit or unit in path.parents for path in paths)


# --------------------------------------------------------------------------- scratch space

# A memory-backed file system for the session's scratch: every server's data and
# every test's tmp_path. Hundreds of databases are copied from the template and
# dropped again; on a disk, the kernel's writeback of those pages costs more CPU
# than most tests. Below this much free space it is not used.
_SCRATCH_CANDIDATE = Path("/dev/shm")
_SCRATCH_MIN_FREE_BYTES = 4 * 1024**3


def _memory_backed_scratch() -> Path | None:
    """``/dev/shm`` when it is a tmpfs we can write and run programs from, with room to
    spare; else ``None``."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
        usage = os.statvfs(_SCRATCH_CANDIDATE)
    except OSError:
        return None
    # Tests run programs from their tmp_path (a fresh venv's scripts): a
    # noexec mount will not do.
    tmpfs = any(
        fields[1:3] == [str(_SCRATCH_CANDIDATE), "tmpfs"] and "noexec" not in fields[3].split(",")
        for fields in (line.split() for line in mounts)
        if len(fields) > 3
    )
    roomy = usage.f_bavail * usage.f_frsize >= _SCRATCH_MIN_FREE_BYTES
    writable = os.access(_SCRATCH_CANDIDATE, os.W_OK | os.X_OK)
    return _SCRATCH_CANDIDATE if tmpfs and roomy and writable else None


def _use_memory_backed_scratch() -> None:
    # A TMPDIR the user set is theirs to keep. xdist workers and every process
    # a test starts inherit the choice through the environment.
    if os.environ.get("TMPDIR"):
        return
    scratch = _memory_backed_scratch()
    if scratch is not None:
        os.environ["TMPDIR"] = str(scratch)
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    _use_memory_backed_scratch()
    _confine_server_ports(config)
    if not _distributes(config) or _only_unit_tests(config):
        return
    # Before xdist starts its workers (at session start), so they inherit the
    # addresses. Each service adopts the one the environment names, if any.
    # The two start side by side: each spends most of its start waiting.
    postgres = PostgresService(settings=SUITE_POSTGRES_SETTINGS)
    listener: SaslSslListener | None = None
    ca_file = ""
    if not os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        certificates = Path(tempfile.mkdtemp(prefix="wfjobs-test-tls-"))
        _SHARED_DIRS.append(certificates)
        listener, ca_file = new_sasl_listener(certificates)
    kafka = ApacheKafkaService(sasl_ssl=listener)
    _SHARED.extend((postgres, kafka))

    def start_postgres() -> str:
        postgres.start()
        template = build_template(postgres.dsn)
        _SHARED_TEMPLATE.append((postgres, template))
        return template

    warming = _warm_rewritten_test_modules(config)
    with ThreadPoolExecutor(2) as starting:
        template = starting.submit(start_postgres)
        broker = starting.submit(kafka.start)
        template_name = template.result()
        broker.result()
    warming.wait()
    os.environ["DATABASE_URL"] = postgres.dsn
    os.environ[TEMPLATE_ENV] = template_name
    os.environ["KAFKA_BOOTSTRAP_SERVERS"] = kafka.bootstrap_servers
    if listener is not None:
        sasl = _sasl_of(kafka, listener, ca_file)
        for field, name in SASL_ENV.items():
            os.environ[name] = getattr(sasl, field)


def _warm_rewritten_test_modules(config: pytest.Config) -> subprocess.Popen[bytes]:
    """A collection pass that leaves pytest's rewritten test modules in ``__pycache__``.

    Every xdist worker imports every test module. With the rewritten modules
    cached, each loads them instead of rewriting them again, which is most of
    its collection time; pytest reads the cache even where
    PYTHONDONTWRITEBYTECODE keeps the workers from writing it. The pass runs
    while the services start.
    """
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    collect = ["--collect-only", "-q", "-p", "no:xdist", "-p", "no:cacheprovider"]
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", *collect, *config.args],
        cwd=config.rootpath,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    for postgres, template in _SHARED_TEMPLATE:
        with contextlib.suppress(psycopg.Error):
            postgres.drop_database(template)
    _SHARED_TEMPLATE.clear()
    while _SHARED:
        _SHARED.pop().stop()
    while _SHARED_DIRS:
        shutil.rmtree(_SHARED_DIRS.pop(), ignore_errors=True)
