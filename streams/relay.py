"""The outbox relay: PENDING outbox rows to ``workflow-run-events``, at least once.

Each pass hands the store a ``publish`` callback. The store selects the oldest
PENDING rows (``FOR UPDATE SKIP LOCKED``, never two relays on one job's rows at
once), ``publish`` produces every row keyed by ``job_id`` and waits for the
broker's answer to each, and the store marks the acked rows PUBLISHED and
records the error of every other one (FAILED after ``max_attempts``), all before
its locks are released. Nothing is marked PUBLISHED that the broker did not ack.

Per-job order: one job's rows come in id order within a batch, they share a key
and so a partition, and the producer is idempotent with at most five requests in
flight, which is what keeps librdkafka's retries from reordering a partition.

The loop sleeps ``interval_s`` when idle and wakes early when ``wake`` is set:
the process's shared LISTEN connection (``streams.listener``) sets it on every
outbox NOTIFY. Delivery reports are awaited in a worker thread, so the event
loop keeps serving the rest of the process while the broker answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from schemas.contract import with_event_id
from schemas.serde import EventSerializer, event_serializer
from streams.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_MESSAGE_TIMEOUT_MS = 30_000
_NOT_REPORTED = "no delivery report from the producer"


class RelayRow(Protocol):
    """What the relay reads of an outbox row (``store.outbox.OutboxRow``)."""

    @property
    def id(self) -> int: ...
    @property
    def job_id(self) -> UUID | str: ...
    @property
    def payload(self) -> bytes: ...


Publish = Callable[[list[Any]], Awaitable[list[str | None]]]


class RelayOutbox(Protocol):
    """The store's side of a pass (``store.outbox.Outbox``)."""

    def relay_batch(self, publish: Publish, limit: int = ...) -> Awaitable[object]: ...


def producer_config(
    bootstrap_servers: str, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The relay producer's settings; ``overrides`` win (timeouts in tests, TLS in prod)."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "client.id": "workflow-jobs-relay",
        # Ack means "in every in-sync replica", and retries neither duplicate nor
        # reorder within a partition: the base of per-job order.
        "enable.idempotence": True,
        "acks": "all",
        "max.in.flight.requests.per.connection": 5,
        # A batch is produced at once and then flushed; a short linger lets it
        # leave as a few requests instead of one per row.
        "linger.ms": 5,
        # Every message gets a delivery report within this time, ack or error, so
        # a flush never waits forever on an unreachable broker.
        "message.timeout.ms": DEFAULT_MESSAGE_TIMEOUT_MS,
    }
    config.update(overrides or {})
    return config


@dataclass
class RelayStats:
    passes: int = 0
    published: int = 0
    failed: int = 0
    errors: int = 0


class OutboxRelay:
    """One relay: a producer and a loop over ``Outbox.relay_batch``, woken by ``wake``.

    ``start()`` runs it as a task on the current loop and ``stop()`` ends it,
    flushing the producer; ``run_until_stopped()`` is the same loop for callers
    that manage the task themselves. ``relay_once()`` is one pass, for tests.
    """

    def __init__(
        self,
        outbox: RelayOutbox,
        *,
        producer_config: Mapping[str, Any],
        topic: str,
        serializer: EventSerializer,
        interval_s: float = 0.5,
        batch: int = 100,
        wake: asyncio.Event | None = None,
        name: str = "relay",
    ) -> None:
        if batch <= 0 or interval_s <= 0:
            raise ValueError("batch and interval_s must be positive")
        self._outbox = outbox
        self._producer_config = dict(producer_config)
        self._topic = topic
        self._serializer = serializer
        self._interval_s = interval_s
        self._batch = batch
        self._name = name
        timeout_ms = int(
            self._producer_config.get("message.timeout.ms", DEFAULT_MESSAGE_TIMEOUT_MS)
        )
        # Past the producer's own deadline every message has its report; the
        # margin only covers the time librdkafka needs to raise it.
        self._flush_timeout_s = timeout_ms / 1000 + 5.0
        self._producer: Producer | None = None
        self._fatal: KafkaError | None = None
        self._prepared = False
        self._wake = wake if wake is not None else asyncio.Event()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.stats = RelayStats()

    # -- lifecycle

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def serializer(self) -> EventSerializer:
        return self._serializer

    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._stopping.clear()
            self._task = asyncio.get_running_loop().create_task(
                self.run_until_stopped(), name=f"outbox-{self._name}"
            )
        return self._task

    async def stop(self) -> None:
        """Finish the pass in progress, then flush and close the producer."""
        self._stopping.set()
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        else:
            await self._close()

    def wake(self) -> None:
        """Start the next pass now instead of after the idle interval."""
        self._wake.set()

    async def run_until_stopped(self) -> None:
        log.info("%s: publishing to %s", self._name, self._topic)
        failures = 0
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                try:
                    handled = await self.relay_once()
                    failures = 0
                except Exception:
                    # A store or registry outage must not end the worker: log it
                    # and try again after a growing pause.
                    failures += 1
                    self.stats.errors += 1
                    log.exception("%s: pass failed (%d in a row)", self._name, failures)
                    await self._idle(min(self._interval_s * 2**failures, 30.0))
                    continue
                if handled < self._batch:
                    await self._idle(self._interval_s)
        finally:
            await self._close()

    async def _idle(self, seconds: float) -> None:
        if self._stopping.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)

    async def _close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            # Every pass already waited for its reports; this only covers a pass
            # cut short, so that nothing produced is dropped on the floor.
            remaining = await asyncio.to_thread(producer.flush, self._flush_timeout_s)
            if remaining:
                log.warning("%s: %d message(s) unflushed at shutdown", self._name, remaining)

    # -- one pass

    async def relay_once(self) -> int:
        """One ``relay_batch`` pass; returns how many rows it handed to ``publish``."""
        if not self._prepared:
            # Registers or looks up the schema id: blocking HTTP, done once.
            await asyncio.to_thread(self._serializer.prepare)
            self._prepared = True
            log.info("%s: events as %s", self._name, self._serializer.description)
        handled = 0

        async def publish(rows: list[Any]) -> list[str | None]:
            nonlocal handled
            handled = len(rows)
            return await self.publish(rows)

        await self._outbox.relay_batch(publish, self._batch)
        self.stats.passes += 1
        return handled

    async def publish(self, rows: Sequence[RelayRow]) -> list[str | None]:
        """Produce ``rows`` in order and wait for the broker: ``None`` per ack, else the error."""
        if not rows:
            return []
        producer = self._ensure_producer()
        results: list[str | None] = [_NOT_REPORTED] * len(rows)
        failed_jobs: set[str] = set()
        pending = 0
        for index, row in enumerate(rows):
            key = str(row.job_id)
            if key in failed_jobs:
                # An earlier event of this job was not even handed to the producer;
                # sending this one would put the job's events out of order.
                results[index] = "held back: an earlier event of this job was not sent"
                continue
            try:
                value = self._serializer.serialize(with_event_id(bytes(row.payload), row.id))
            except Exception as exc:
                results[index] = f"cannot serialize event: {exc}"
                failed_jobs.add(key)
                continue
            error = await self._produce(
                producer, key, value, functools.partial(_report, results, index)
            )
            if error is not None:
                results[index] = error
                failed_jobs.add(key)
            else:
                pending += 1
        if pending:
            remaining = await asyncio.to_thread(producer.flush, self._flush_timeout_s)
            if remaining:
                log.warning("%s: %d message(s) unacknowledged after flush", self._name, remaining)
        published = sum(1 for result in results if result is None)
        self.stats.published += published
        self.stats.failed += len(results) - published
        if self._fatal is not None:
            await self._replace_producer()
        return results

    async def _produce(
        self,
        producer: Producer,
        key: str,
        value: bytes,
        on_delivery: Callable[[KafkaError | None, Message], None],
    ) -> str | None:
        while True:
            try:
                producer.produce(
                    self._topic, value=value, key=key.encode(), on_delivery=on_delivery
                )
                return None
            except BufferError:
                # The local queue is full: let the broker drain some of it.
                await asyncio.to_thread(producer.poll, 0.1)
            except KafkaException as exc:
                return _describe(exc.args[0] if exc.args else None) or str(exc)

    # -- producer

    def _ensure_producer(self) -> Producer:
        if self._producer is None:
            config = dict(self._producer_config)
            config.setdefault("error_cb", self._on_error)
            # librdkafka's own log lines go through logging, not straight to stderr.
            config.setdefault("logger", logging.getLogger(f"{__name__}.librdkafka"))
            self._producer = Producer(config)
        return self._producer

    def _on_error(self, error: KafkaError) -> None:
        # Transient broker errors are retried by librdkafka and show up, if they
        # last, as failed delivery reports; only a fatal one needs action.
        if error.fatal():
            log.error("%s: fatal producer error: %s", self._name, _describe(error))
            self._fatal = error
        else:
            log.debug("%s: producer: %s", self._name, _describe(error))

    async def _replace_producer(self) -> None:
        """An idempotent producer that hit a fatal error is unusable: start a new one."""
        producer, self._producer, self._fatal = self._producer, None, None
        if producer is not None:
            await asyncio.to_thread(producer.flush, 0)


def _report(results: list[str | None], index: int, error: KafkaError | None, _: Message) -> None:
    # Runs in the flushing thread; each call writes its own slot only.
    results[index] = None if error is None else (_describe(error) or "delivery failed")


def _describe(error: Any) -> str | None:
    if isinstance(error, KafkaError):
        return f"{error.name()}: {error.str()}"
    return None if error is None else str(error)


def build_relay(
    settings: Settings,
    outbox: RelayOutbox,
    *,
    wake: asyncio.Event | None = None,
    producer_overrides: Mapping[str, Any] | None = None,
    name: str | None = None,
) -> OutboxRelay:
    """The relay the settings describe: registry and format, topic, interval, batch."""
    serializer = event_serializer(
        registry=settings.open_registry(),
        topic=settings.events_topic,
        event_format=settings.event_format,
    )
    return OutboxRelay(
        outbox,
        producer_config=producer_config(settings.kafka_bootstrap_servers, producer_overrides),
        topic=settings.events_topic,
        serializer=serializer,
        interval_s=settings.relay_interval_s,
        batch=settings.relay_batch,
        wake=wake,
        name=name or f"relay-{settings.worker_id or 'anonymous'}",
    )


__all__ = [
    "OutboxRelay",
    "RelayOutbox",
    "RelayRow",
    "RelayStats",
    "build_relay",
    "producer_config",
]
