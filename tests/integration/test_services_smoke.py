"""The real services the suite starts actually serve clients."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient

from devstack import kafka
from devstack.apache_kafka import ApacheKafkaService
from devstack.postgres import PostgresService
from devstack.processes import ServiceError, free_port

REPO = Path(__file__).resolve().parents[2]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


# --------------------------------------------------------------------------- Postgres


async def test_postgres_serves_queries(make_database: Callable[[], str]) -> None:
    dsn = make_database()
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        row = await (await conn.execute("select version()")).fetchone()
    assert row is not None
    assert str(row[0]).startswith("PostgreSQL")


async def test_make_database_gives_isolated_databases(make_database: Callable[[], str]) -> None:
    first, second = make_database(), make_database()
    assert first != second
    async with await psycopg.AsyncConnection.connect(first, autocommit=True) as conn:
        await conn.execute("create table marker (id int)")
    async with await psycopg.AsyncConnection.connect(second) as conn:
        cur = await conn.execute("select to_regclass('marker') is null")
        row = await cur.fetchone()
    assert row == (True,)


def test_embedded_postgres_is_tuned_and_stopped_by_pid() -> None:
    with PostgresService("") as server:
        pid = server.pid
        assert pid is not None
        with psycopg.connect(server.dsn) as conn:
            settings: dict[str, str] = dict(
                conn.execute(
                    "select name, setting from pg_settings where name = any(%s)",
                    (["fsync", "synchronous_commit", "full_page_writes", "listen_addresses"],),
                ).fetchall()
            )
    assert settings == {
        "fsync": "off",
        "synchronous_commit": "off",
        "full_page_writes": "off",
        "listen_addresses": "127.0.0.1",
    }
    assert not _pid_alive(pid)


# --------------------------------------------------------------------------- Kafka


def _round_trip(bootstrap: str, topic: str, count: int, **consumer_config: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    sent = [(f"key-{i % 5}".encode(), f"value-{i}".encode()) for i in range(count)]
    for key, value in sent:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0, "messages still unacknowledged after 30 s"

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"smoke-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **consumer_config,
        }
    )
    received: list[tuple[bytes, bytes]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(received) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                continue
            got_key, got_value = message.key(), message.value()
            assert got_key is not None and got_value is not None
            received.append((got_key, got_value))
    finally:
        consumer.close()

    assert sorted(received) == sorted(sent)
    # Keyed messages land on one partition each, so per-key order survives.
    for key in {k for k, _ in sent}:
        assert [v for k, v in received if k == key] == [v for k, v in sent if k == key]


def test_apache_kafka_round_trip(kafka_bootstrap: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(kafka_bootstrap, 3)
    _round_trip(kafka_bootstrap, topic, 50)


def test_apache_kafka_auto_creates_topics(kafka_bootstrap: str) -> None:
    topic = f"auto-{time.monotonic_ns()}"
    _round_trip(kafka_bootstrap, topic, 5)


def test_tansu_round_trip(tansu_bootstrap: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(tansu_bootstrap, 3)
    # Tansu holds a group join for about half the session timeout; the default
    # 45 s would make this test wait over 20 s for its assignment.
    _round_trip(tansu_bootstrap, topic, 50, **{"session.timeout.ms": "6000"})


@pytest.mark.kafka
def test_kafka_with_a_bad_config_says_why() -> None:
    broken = ApacheKafkaService("", properties={"num.partitions": "many"}, startup_timeout_s=60)
    with pytest.raises(ServiceError) as caught:
        broken.start()
    assert "Invalid value many for configuration num.partitions" in str(caught.value)
    assert broken.pid is None


@pytest.mark.kafka
def test_kafka_broker_that_dies_at_startup_says_why() -> None:
    # The controller listener binds first, so the broker fails early on it.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        controller, port = taken.getsockname()[1], free_port()
        broken = ApacheKafkaService(
            "",
            properties={
                "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
                "controller.quorum.voters": f"1@127.0.0.1:{controller}",
            },
            startup_timeout_s=60,
        )
        with pytest.raises(ServiceError) as caught:
            broken.start()
    message = str(caught.value)
    assert "exited with code" in message
    assert "Address already in use" in message
    assert broken.pid is None


# --------------------------------------------------------------------------- CLI


def test_cli_runs_a_service_until_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "devstack.services", "tansu"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        assert address.startswith("127.0.0.1:")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "pid" in (proc.stderr.read() if proc.stderr else "")


def test_services_module_does_not_import_faust() -> None:
    code = "import sys, devstack.services; sys.exit('faust' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, check=False).returncode == 0


# --------------------------------------------------------------------------- Kafka storage


@pytest.mark.kafka
def test_brokers_lay_out_storage_from_kept_bootstrap_metadata_with_identities_of_their_own(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    # The first format of the release keeps its bootstrap metadata; every later
    # broker lays out its storage from it, with its own cluster and dir ids.
    key = kafka.formatted_storage_key(kafka.KAFKA_VERSION, {})
    cached = kafka.cached_bootstrap_checkpoint(kafka.kafka_libs(), key)
    with ApacheKafkaService("") as private:
        assert cached.is_file()
        admins = [
            AdminClient({"bootstrap.servers": bootstrap})
            for bootstrap in (kafka_bootstrap, private.bootstrap_servers)
        ]
        ids = {admin.describe_cluster().result(timeout=10).cluster_id for admin in admins}
        del admins  # before the broker stops: they would retry it meanwhile
    assert len(ids) == 2
    kafka.reuse_formatted_storage(tmp_path, cached, cluster_id="x" * 22, node_id="1")
    layout = dict(
        line.split("=", 1) for line in (tmp_path / kafka.META_PROPERTIES).read_text().split()
    )
    assert layout["cluster.id"] == "x" * 22 and layout["version"] == "1"
    assert len(layout["directory.id"]) == 22
    assert (tmp_path / kafka.BOOTSTRAP_CHECKPOINT).read_bytes() == cached.read_bytes()
