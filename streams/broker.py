"""Faust's Kafka parts: none at boot, and the worker's once the broker answers.

Faust boots its producer, consumer, agents, topic conductor and table manager
with the app, so a process whose broker is away dies at start with
``Unable to bootstrap``, and a process without the ``worker`` role (which has
no topic to consume) dies a few seconds later when its consumer subscribes to
nothing. Yet the verbs, the claim loops, the sweeper and the relay (which has
its own producer and retries on its own) need no Faust Kafka client at all.

So every process boots without them (``BootWithoutKafka``). A process with the
``worker`` role, the only one that consumes, adds a ``BrokerConnection``: it
asks the broker for metadata with a capped, jittered backoff, and once the
broker answers it starts those parts in the order Faust itself would, so the
request agent begins consuming. Until then the ``broker`` part of ``/readyz``
is not ready and says what it waits for; ``/healthz`` stays 200, because a
process waiting for its broker is not stuck. Once connected it asks again
every ``CHECK_S``: a broker lost since is not ready again, with the time it
stopped answering, until it answers.

A broker that answers but refuses this process's credentials (or whose
certificate does not verify) is not waited for: no retry can fix the
settings, so the process logs one line naming them and exits non-zero.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import mode
from aiokafka.conn import create_conn  # type: ignore[import-untyped]
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]
from aiokafka.protocol.metadata import MetadataRequest  # type: ignore[import-untyped]
from faust.app.base import BootStrategy

from schemas import defaults
from streams.backoff import Backoff
from streams.health import PartHealth
from streams.kafka_security import KafkaSecurity, bootstrap_servers, kafka_security
from streams.settings import SettingsError

if TYPE_CHECKING:
    import faust
    from mode import ServiceT

    from streams.runtime import Runtime

log = logging.getLogger(__name__)

# The first pause after a failed attempt; each further failure doubles it, up
# to the configured cap.
RETRY_BASE_S = 0.5
# Longest one metadata request may take before the attempt counts as failed.
PROBE_TIMEOUT_S = 5.0
# How often a connected worker asks whether its broker still answers.
CHECK_S = 10.0


class BootWithoutKafka(BootStrategy):
    """Faust's boot order without the parts that talk to Kafka.

    The agents are left out too: they consume Kafka, and the request agent's
    dead letters go through the producer.
    """

    enable_kafka = False

    def agents(self) -> list[Any]:
        return []


def _close_consumer_thread_even_when_cancelled(thread: Any) -> None:
    """Let the consumer's thread say it has closed even when its close is cancelled.

    With the broker away, aiokafka's fetcher re-raises the cancellation of its
    retry pause from ``close()``; the thread's shutdown then never tells mode it
    is done, and mode waits out its whole minute for it, past any
    orchestrator's grace. The close is over all the same: the error is dropped,
    and the thread's shutdown goes on to say so. A close that waits on a live
    broker (a group join in progress) still gets its time.
    """
    close = thread.on_thread_stop

    async def on_thread_stop() -> None:
        try:
            await close()
        except asyncio.CancelledError:
            log.info("the request consumer closed without its broker")

    thread.on_thread_stop = on_thread_stop


def kafka_services(app: faust.App) -> list[ServiceT]:
    """What ``BootWithoutKafka`` leaves out, in the order Faust starts it."""
    thread = getattr(app.consumer, "_thread", None)
    if isinstance(thread, mode.Service):
        _close_consumer_thread_even_when_cancelled(thread)
    full = BootStrategy(app, enable_kafka=True)
    return [
        *full.kafka_producer(),
        *full.kafka_consumer(),
        *full.agents(),
        *full.kafka_conductor(),
        *full.tables(),
    ]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class KafkaRefused(SettingsError):
    """The broker answers but refuses this process's security settings, or the
    cluster cannot hold the topics the settings ask it to create."""


class BrokerConnection(mode.Service):
    """Starts the app's Kafka parts once the broker answers; reports as ``broker``."""

    def __init__(
        self,
        app: faust.App,
        bootstrap_servers: str,
        *,
        retry_max_s: float,
        retry_base_s: float = RETRY_BASE_S,
        security: KafkaSecurity | None = None,
        topic_replicas: int | None = None,
        **kwargs: Any,
    ) -> None:
        """``topic_replicas``: the replicas of the topics this process creates
        (``WFJOBS_CREATE_TOPICS``), checked against the cluster's brokers."""
        super().__init__(**kwargs)
        self._topic_replicas = topic_replicas
        self._app = app
        self.bootstrap_servers = bootstrap_servers
        self._servers = [s.strip() for s in bootstrap_servers.split(",") if s.strip()]
        self._security = security if security is not None else KafkaSecurity()
        self._backoff = Backoff(retry_base_s, max(retry_base_s, retry_max_s))
        self._state = "waiting"
        self._since = _now()
        self._since_monotonic = time.monotonic()
        self._attempts = 0
        self._last_error = ""

    async def on_start(self) -> None:
        self._since = _now()
        self._since_monotonic = time.monotonic()

    def health(self) -> PartHealth:
        if self._state == "connected":
            return PartHealth(
                "broker",
                summary=f"connected to Kafka at {self.bootstrap_servers} since {self._since}",
                detail={"bootstrap_servers": self.bootstrap_servers},
            )
        waited_s = round(time.monotonic() - self._since_monotonic, 1)
        if self._state == "refused":
            return PartHealth(
                "broker",
                healthy=False,
                ready=False,
                summary=self._last_error,
                detail={"bootstrap_servers": self.bootstrap_servers},
            )
        if self._state == "lost":
            return PartHealth(
                "broker",
                # The consumer reconnects by itself; a restart would not bring the broker.
                healthy=True,
                ready=False,
                summary=(
                    f"Kafka at {self.bootstrap_servers} has not answered since {self._since}"
                    f" ({self._last_error})"
                ),
                detail={
                    "bootstrap_servers": self.bootstrap_servers,
                    "lost_s": waited_s,
                    "last_error": self._last_error,
                },
            )
        if self._state == "starting":
            summary = (
                f"Kafka at {self.bootstrap_servers} answered at {self._since}; "
                "starting the request consumer"
            )
        else:
            summary = f"waiting for Kafka at {self.bootstrap_servers} since {self._since}"
            if self._last_error:
                summary += f" ({self._last_error})"
        return PartHealth(
            "broker",
            # Waiting for a broker is not being stuck: a restart would not bring it.
            healthy=True,
            ready=False,
            summary=summary,
            detail={
                "bootstrap_servers": self.bootstrap_servers,
                "waiting_s": waited_s,
                "attempts": self._attempts,
                "last_error": self._last_error,
            },
        )

    @mode.Service.task
    async def _connect(self) -> None:
        try:
            while not await self.broker_answers():
                await self._pause()
                if self._stopping():
                    return
        except KafkaRefused as refused:
            self._state = "refused"
            self._last_error = str(refused)
            # One line an operator can act on; the crash that follows stops the
            # process with a non-zero exit code.
            log.critical("workflow-jobs: cannot use Kafka: %s", refused)
            await self._app.crash(refused)
            return
        if self._stopping():
            return
        self._state = "starting"
        self._since = _now()
        log.info("Kafka at %s answers; starting the request consumer", self.bootstrap_servers)
        # The broker answered a moment ago, so these start as they would at
        # boot; one that fails now stops the process loudly, like any part
        # that dies, and the next process starts by waiting again.
        for service in kafka_services(self._app):
            if self._stopping():
                return
            await self._app.add_runtime_dependency(service)
        self._state = "connected"
        self._since = _now()
        log.info("connected to Kafka at %s", self.bootstrap_servers)
        await self._watch()

    async def _watch(self) -> None:
        """Once connected, ask again every ``CHECK_S``: a broker lost since is
        not ready until it answers again (the consumer reconnects by itself)."""
        while not self._stopping():
            await self.sleep(CHECK_S)
            if self._stopping():
                return
            try:
                answers = await self.broker_answers()
            except KafkaRefused as refused:
                answers, self._last_error = False, str(refused)
            if answers and self._state == "lost":
                log.info("Kafka at %s answers again", self.bootstrap_servers)
                self._state, self._since = "connected", _now()
            elif not answers and self._state == "connected":
                log.warning(
                    "Kafka at %s does not answer (%s); the request consumer is not ready "
                    "until it does",
                    self.bootstrap_servers,
                    self._last_error,
                )
                self._state, self._since = "lost", _now()
                self._since_monotonic = time.monotonic()

    async def _pause(self) -> None:
        pause = self._backoff.next()
        log.warning(
            "Kafka at %s does not answer (%s); trying again in %.1fs (attempt %d)",
            self.bootstrap_servers,
            self._last_error,
            pause,
            self._attempts,
        )
        await self.sleep(pause)

    def _stopping(self) -> bool:
        return bool(self.should_stop or self._app.should_stop)

    async def broker_answers(self) -> bool:
        """One attempt: a metadata request to a bootstrap server, as Faust's client makes it.

        Connects with the process's TLS and SASL settings; raises ``KafkaRefused``
        when the broker turns those down.
        """
        self._attempts += 1
        if not await self._any_port_open():
            return False
        options = self._security.aiokafka()
        for server in self._servers:
            host, _, port = server.rpartition(":")
            connection = None
            try:
                async with asyncio.timeout(PROBE_TIMEOUT_S):
                    connection = await create_conn(
                        host.strip("[]"),
                        int(port),
                        client_id="workflow-jobs-broker-check",
                        request_timeout_ms=int(PROBE_TIMEOUT_S * 1000),
                        **options,
                    )
                    metadata = await connection.send(MetadataRequest([]))
            except (KafkaError, OSError, TimeoutError, ValueError) as exc:
                explained = self._security.explain(exc, self.bootstrap_servers)
                if explained is not None:
                    raise KafkaRefused(explained) from None
                self._last_error = (
                    f"{server}: {type(exc).__name__}: {exc}"
                    if str(exc)
                    else f"{server}: {type(exc).__name__}"
                )
                continue
            finally:
                if connection is not None:
                    connection.close()
            brokers = len(metadata.brokers)
            if self._topic_replicas is not None and self._topic_replicas > brokers:
                # Faust would fail creating its first topic, with a traceback
                # that names no setting.
                raise KafkaRefused(
                    f"WFJOBS_TOPIC_REPLICAS is {self._topic_replicas}, more than the "
                    f"{brokers} broker(s) of the cluster at {self.bootstrap_servers}: "
                    "WFJOBS_CREATE_TOPICS cannot create topics with that many replicas"
                )
            return True
        return False

    async def _any_port_open(self) -> bool:
        # A plain connect first: the Kafka client logs every refused
        # connection as an error, which is noise while a broker is away.
        for server in self._servers:
            host, colon, port = server.rpartition(":")
            if not colon:
                host, port = server, str(defaults.KAFKA_PORT)
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(host.strip("[]"), int(port)),
                    PROBE_TIMEOUT_S,
                )
            except (OSError, TimeoutError, ValueError) as exc:
                self._last_error = f"{server}: {exc or type(exc).__name__}"
                continue
            writer.close()
            return True
        return False


def connect_kafka(app: faust.App, runtime: Runtime) -> BrokerConnection:
    """Give a worker process its Kafka parts once the broker answers (see the module doc)."""
    settings = runtime.settings
    connection = BrokerConnection(
        app,
        ",".join(bootstrap_servers(settings)),
        retry_max_s=settings.broker_retry_max_s,
        security=kafka_security(settings),
        topic_replicas=settings.topic_replicas if settings.create_topics else None,
    )
    app.add_dependency(connection)
    runtime.register_health(connection.health)
    return connection


__all__ = [
    "BootWithoutKafka",
    "BrokerConnection",
    "KafkaRefused",
    "connect_kafka",
    "kafka_services",
]
