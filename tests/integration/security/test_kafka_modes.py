"""The other security modes against a real broker: client certificates, PLAIN, OAUTHBEARER.

One private Apache Kafka serves them all: an ``MTLS`` listener (SSL that
requires a client certificate signed by the test CA), a ``SASLPLAIN`` listener
(SASL_PLAINTEXT with PLAIN users) and an ``OAUTH`` listener (SASL_PLAINTEXT with
OAUTHBEARER; the broker's default validator takes unsigned tokens, which a
token endpoint the test serves hands out for a client-credentials grant). For
each mode a worker with every role is
given only that listener and the ``WFJOBS_KAFKA_*`` settings, so Faust, the
ownership reader and the relay must all speak it: it becomes ready, runs a job
submitted over HTTP, and the relay's events are read back with the settings'
own librdkafka configuration. A credential the broker refuses stops a worker
at start, naming the setting (PLAIN only; see the test).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, Producer

from devstack.apache_kafka import ApacheKafkaService
from devstack.postgres import PostgresService
from devstack.processes import ServiceError
from devstack.stack import WorkerProcess
from store.outbox import Outbox
from store.pool import Pool, open_pool
from store.tokens import create_token
from streams.auth import SCOPES
from streams.broker import BrokerConnection
from streams.kafka_security import librdkafka_config
from streams.settings import Settings
from tests.certificates import (
    ServerCertificates,
    make_client_certificate,
    make_server_certificates,
)
from tests.e2e.harness import self_provisioning_worker, wait_until
from tests.e2e.test_sasl import _ready, refused_worker
from tests.forkserver import ForkServer
from tests.http_stub import serving
from tests.workflows_fixtures import envelope

pytestmark = pytest.mark.e2e

MODES = ("ssl-mtls", "sasl-plaintext-plain", "sasl-plaintext-oauthbearer")
PLAIN_USER = "wfjobs-plain"


@dataclass(frozen=True)
class ModesBroker:
    broker: ApacheKafkaService
    # Per mode: the settings of a process that reaches Kafka only that way.
    settings: Mapping[str, Mapping[str, str]]
    # Per mode: those settings with a credential the broker refuses, and its name.
    refused: Mapping[str, tuple[Mapping[str, str], str]]
    # The CA the MTLS listener trusts client certificates of.
    certs: ServerCertificates


def _unsigned_jwt(claims: Mapping[str, Any]) -> str:
    def part(value: Mapping[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part(claims)}."


class _TokenEndpoint(BaseHTTPRequestHandler):
    """An OAuth 2 token endpoint: every client-credentials grant gets an hour's token."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        now = int(time.time())
        token = _unsigned_jwt({"sub": "wfjobs-worker", "iat": now, "exp": now + 3600})
        body = json.dumps(
            {"access_token": token, "token_type": "bearer", "expires_in": 3600}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture(scope="module")
def token_url() -> Iterator[str]:
    with serving(_TokenEndpoint) as url:
        yield f"{url}/token"


@pytest.fixture(scope="module")
def modes_broker(tmp_path_factory: pytest.TempPathFactory, token_url: str) -> Iterator[ModesBroker]:
    tmp = tmp_path_factory.mktemp("kafka-modes")
    certs = make_server_certificates(tmp / "ca")
    client = make_client_certificate(certs, tmp / "client", common_name="wfjobs-worker")
    password = uuid.uuid4().hex
    mtls, plain, oauth = "listener.name.mtls.", "listener.name.saslplain.", "listener.name.oauth."
    properties = {
        f"{mtls}ssl.keystore.type": "PEM",
        f"{mtls}ssl.keystore.location": str(certs.keystore_file),
        f"{mtls}ssl.truststore.type": "PEM",
        f"{mtls}ssl.truststore.location": str(certs.ca_file),
        f"{mtls}ssl.client.auth": "required",
        f"{plain}sasl.enabled.mechanisms": "PLAIN",
        f"{plain}plain.sasl.jaas.config": (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'user_{PLAIN_USER}="{password}";'
        ),
        f"{oauth}sasl.enabled.mechanisms": "OAUTHBEARER",
        f"{oauth}oauthbearer.sasl.jaas.config": (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
            'unsecuredLoginStringClaim_sub="broker";'
        ),
    }
    with ApacheKafkaService(
        "",
        num_partitions=1,
        properties=properties,
        listeners={"MTLS": "SSL", "SASLPLAIN": "SASL_PLAINTEXT", "OAUTH": "SASL_PLAINTEXT"},
    ) as broker:
        ssl_settings = {
            "KAFKA_BOOTSTRAP_SERVERS": broker.listener_bootstrap_servers("MTLS"),
            "WFJOBS_KAFKA_SECURITY_PROTOCOL": "SSL",
            "WFJOBS_KAFKA_SSL_CA_FILE": str(certs.ca_file),
            "WFJOBS_KAFKA_SSL_CERT_FILE": str(client.certificate_file),
            "WFJOBS_KAFKA_SSL_KEY_FILE": str(client.key_file),
        }
        plain_settings = {
            "KAFKA_BOOTSTRAP_SERVERS": broker.listener_bootstrap_servers("SASLPLAIN"),
            "WFJOBS_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "WFJOBS_KAFKA_SASL_MECHANISM": "PLAIN",
            "WFJOBS_KAFKA_SASL_USERNAME": PLAIN_USER,
            "WFJOBS_KAFKA_SASL_PASSWORD": password,
        }
        oauth_settings = {
            "KAFKA_BOOTSTRAP_SERVERS": broker.listener_bootstrap_servers("OAUTH"),
            "WFJOBS_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "WFJOBS_KAFKA_SASL_MECHANISM": "OAUTHBEARER",
            "WFJOBS_KAFKA_OAUTH_TOKEN_URL": token_url,
            "WFJOBS_KAFKA_OAUTH_CLIENT_ID": "wfjobs-worker",
            "WFJOBS_KAFKA_OAUTH_CLIENT_SECRET": uuid.uuid4().hex,
        }
        yield ModesBroker(
            broker,
            settings={
                "ssl-mtls": ssl_settings,
                "sasl-plaintext-plain": plain_settings,
                "sasl-plaintext-oauthbearer": oauth_settings,
            },
            refused={
                "sasl-plaintext-plain": (
                    {**plain_settings, "WFJOBS_KAFKA_SASL_PASSWORD": "not-the-password"},
                    "WFJOBS_KAFKA_SASL_PASSWORD",
                ),
            },
            certs=certs,
        )


@dataclass
class ModeStack:
    mode: str
    settings: Mapping[str, str]
    worker: WorkerProcess
    pool: Pool
    token: str
    tmp: Path


@pytest.fixture(scope="module", params=MODES)
async def mode_stack(
    request: pytest.FixtureRequest,
    modes_broker: ModesBroker,
    postgres_server: PostgresService,
    tmp_path_factory: pytest.TempPathFactory,
    fork_server: ForkServer,
) -> AsyncIterator[ModeStack]:
    mode: str = request.param
    tmp = tmp_path_factory.mktemp(mode)
    dsn = postgres_server.create_database(mode.replace("-", "_"))
    suffix = uuid.uuid4().hex[:10]
    settings = {
        **modes_broker.settings[mode],
        "WFJOBS_REQUESTS_TOPIC": f"{mode}-requests-{suffix}",
        "WFJOBS_REQUESTS_DLQ_TOPIC": f"{mode}-requests-dlq-{suffix}",
        "WFJOBS_EVENTS_TOPIC": f"{mode}-events-{suffix}",
        "WFJOBS_SCHEMA_REGISTRY_URL": f"mock://{mode}-{suffix}",
    }
    # Topic creation goes over the mode's listener too.
    worker = self_provisioning_worker(
        mode,
        dsn=dsn,
        bootstrap=settings["KAFKA_BOOTSTRAP_SERVERS"],
        settings=settings,
        tmp=tmp,
        launch=fork_server,
    )
    pool: Pool | None = None
    try:
        await asyncio.to_thread(worker.start, timeout_s=60.0)

        async def ready() -> bool | None:
            return True if await _ready(worker.url) else None

        await wait_until(ready, timeout_s=60.0, interval_s=0.2)
        pool = await open_pool(dsn, min_size=1, max_size=2)
        token = (await create_token(dsn, mode, SCOPES)).token
        yield ModeStack(mode, settings, worker, pool, token, tmp)
    except (ServiceError, TimeoutError) as exc:
        raise AssertionError(
            f"the {mode} worker did not start: {exc}\n{worker.log_tail()}"
        ) from None
    finally:
        worker.stop(timeout_s=15)
        if pool is not None:
            await pool.close()
        postgres_server.drop_database(dsn)


def _read_events(settings: Mapping[str, str], job_id: str, count: int) -> list[str]:
    """The keys of ``count`` messages of ``job_id`` on the events topic, read with the settings."""
    config: dict[str, Any] = {
        **librdkafka_config(Settings.from_env(settings)),
        "group.id": f"modes-reader-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    consumer = Consumer(config)
    keys: list[str] = []
    try:
        consumer.subscribe([settings["WFJOBS_EVENTS_TOPIC"]])
        while len(keys) < count:
            message = consumer.poll(30.0)
            assert message is not None, f"only {len(keys)} of {count} events arrived"
            assert message.error() is None, message.error()
            key = message.key()
            assert isinstance(key, bytes)
            if key.decode() == job_id:
                keys.append(key.decode())
    finally:
        consumer.close()
    return keys


async def test_a_job_submitted_over_http_completes_and_its_events_are_relayed(
    mode_stack: ModeStack,
) -> None:
    ready = await httpx.AsyncClient(timeout=5).get(f"{mode_stack.worker.url}/readyz")
    parts = ready.json()["parts"]
    assert parts["broker"]["ready"] is True, parts

    workflow = envelope(name=f"{mode_stack.mode}-flow", review="invoke")
    job_id = str(uuid.uuid4())
    headers = {"Authorization": f"Bearer {mode_stack.token}"}
    async with httpx.AsyncClient(
        base_url=mode_stack.worker.url, timeout=10, headers=headers
    ) as http:
        put = await http.put(f"/v1/workflows/{workflow['name']}", json={"workflow": workflow})
        assert put.status_code in (200, 201), put.text
        submitted = await http.post(
            "/v1/workflow-runs",
            json={"job_id": job_id, "workflow_name": workflow["name"], "input": {"text": "hi"}},
        )
        assert submitted.is_success, submitted.text

        async def settled() -> str | None:
            got = (await http.get(f"/v1/workflow-runs/{job_id}")).json()
            status = str(got["job"]["status"])
            return status if status in {"COMPLETED", "FAILED", "DEAD"} else None

        try:
            status = await wait_until(settled, timeout_s=60.0, interval_s=0.2)
        except TimeoutError:
            raise AssertionError(f"{job_id} not settled\n{mode_stack.worker.log_tail()}") from None
    assert status == "COMPLETED"

    written = await Outbox(mode_stack.pool).events_for(uuid.UUID(job_id))
    assert written
    keys = await asyncio.to_thread(_read_events, mode_stack.settings, job_id, len(written))
    assert len(keys) == len(written)


async def test_a_client_certificate_with_an_encrypted_key_opens_with_its_password(
    modes_broker: ModesBroker, tmp_path: Path
) -> None:
    # The MTLS listener requires a client certificate, so every client must
    # have opened the key with WFJOBS_KAFKA_SSL_KEY_PASSWORD_FILE to get in.
    client = make_client_certificate(
        modes_broker.certs, tmp_path, common_name="wfjobs-encrypted", key_password="key-secret"
    )
    (tmp_path / "key-password").write_text("key-secret\n")
    settings = Settings.from_env(
        {
            **modes_broker.settings["ssl-mtls"],
            "WFJOBS_KAFKA_SSL_CERT_FILE": str(client.certificate_file),
            "WFJOBS_KAFKA_SSL_KEY_FILE": str(client.key_file),
            "WFJOBS_KAFKA_SSL_KEY_PASSWORD_FILE": str(tmp_path / "key-password"),
        }
    )
    probe = BrokerConnection(
        None,  # type: ignore[arg-type]  # the probe alone starts nothing of the app
        ",".join(settings.kafka_servers),
        retry_max_s=1.0,
        security=settings.kafka_security(),
    )
    assert await probe.broker_answers()

    topic = f"encrypted-key-{uuid.uuid4().hex[:8]}"
    producer = Producer({**settings.kafka_client_config(), "message.timeout.ms": 20000})
    producer.produce(topic, key=b"k", value=b"with an encrypted key")
    assert await asyncio.to_thread(producer.flush, 25) == 0


async def test_the_oauth_client_secret_may_come_from_a_file(
    modes_broker: ModesBroker, tmp_path: Path
) -> None:
    oauth = dict(modes_broker.settings["sasl-plaintext-oauthbearer"])
    secret_file = tmp_path / "client-secret"
    secret_file.write_text(oauth.pop("WFJOBS_KAFKA_OAUTH_CLIENT_SECRET") + "\n")
    settings = Settings.from_env(
        {**oauth, "WFJOBS_KAFKA_OAUTH_CLIENT_SECRET_FILE": str(secret_file)}
    )
    probe = BrokerConnection(
        None,  # type: ignore[arg-type]
        ",".join(settings.kafka_servers),
        retry_max_s=1.0,
        security=settings.kafka_security(),
    )
    assert await probe.broker_answers()
    topic = f"secret-file-{uuid.uuid4().hex[:8]}"
    producer = Producer({**settings.kafka_client_config(), "message.timeout.ms": 20000})
    producer.produce(topic, key=b"k", value=b"with a token for the secret of the file")
    assert await asyncio.to_thread(producer.flush, 25) == 0


# Only PLAIN: a client certificate the broker refuses reaches the worker as a
# closed connection, which it cannot tell from a broker that is down.
@pytest.mark.parametrize("mode", ["sasl-plaintext-plain"])
async def test_a_refused_credential_stops_the_worker_at_start_naming_the_setting(
    mode: str, modes_broker: ModesBroker, tmp_path: Path, fork_server: ForkServer
) -> None:
    settings, name = modes_broker.refused[mode]
    log = await refused_worker(tmp_path, settings["KAFKA_BOOTSTRAP_SERVERS"], settings, fork_server)
    named = [line for line in log.splitlines() if name in line and "cannot use Kafka" in line]
    assert named, log
