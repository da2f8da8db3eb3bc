"""The outbox relay: PENDING outbox rows to ``workflow-run-events``, at least once.

Each pass hands the store a ``publish`` callback. The store leases the oldest
PENDING rows in one short transaction (``FOR UPDATE SKIP LOCKED`` on the heads,
never two relays on one job's rows at once) and commits; ``publish`` then
produces every row keyed by ``job_id`` and waits for the broker's answer to
each, with no transaction open and no connection held; the store records the
outcomes in one statement fenced on the lease. Nothing is marked PUBLISHED
that the broker did not ack.

Faults are told apart in one place, ``classify_fault``:

* transient (broker or registry unreachable, a schema the registry refuses,
  timeouts, no leader, anything not known to be the record's own fault): the
  row spends no attempt and is handed back. When nothing of a pass went out,
  the relay backs off (capped, jittered, exponential in the passes that failed
  in a row) and a NOTIFY does not cut the pause short; when some rows went
  out, only the faulted rows wait out the pause and the relay carries on with
  the rest.
* permanent (the record is too large for the topic, the payload cannot be
  serialized): the row is FAILED at once with the reason, logged at ERROR with
  its id and job id, and holds back the later rows of its job until an
  operator redrives it.

Per-job order: one job's rows come in id order within a batch, they share a key
and so a partition, and the producer is idempotent with at most five requests in
flight, which is what keeps librdkafka's retries from reordering a partition.
Its batches are kept within the topic's ``max.message.bytes``, so the broker
never refuses one for the size of others' records while a later batch of the
partition goes in (``_read_topic_limit``).

The loop sleeps ``interval_s`` when idle and wakes early when ``wake`` is set:
the process's shared LISTEN connection (``streams.listener``) sets it on every
outbox NOTIFY. After a pass that found some rows but less than a batch, the
next one starts no sooner than ``linger_s`` after it began, so that under load
the events of that time go out together (``_linger``). Delivery reports are awaited in a
worker thread, so the event loop keeps serving the rest of the process while
the broker answers.

The relay is a mode service. A pass that fails because the store is away is
retried after the shared backoff (``streams.backoff``); anything else that
escapes a pass is a defect and crashes the service, and with it the process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar
from uuid import UUID

import mode
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from google.protobuf.message import Error as ProtobufError

from schemas.contract import with_event_id
from schemas.errors import ContractViolation, InvalidArgument
from schemas.serde import EventSerializer, event_serializer
from store.errors import is_outage
from store.outbox import Backlog, PublishFailure, RelayResult
from streams import kafka_security
from streams.backoff import backoff_delay
from streams.health import PartHealth
from streams.metrics import RelayTimings
from streams.settings import Settings
from streams.tracing import Tracing
from streams.tracing import stored as stored_trace

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_MESSAGE_TIMEOUT_MS = 30_000
_NOT_REPORTED = "no delivery report from the producer"
# How long a stop waits, once the broker's part of its pass is given up, for
# the store to settle the pass; and then for the cancelled pass to end.
SETTLE_WAIT_S = 2.0
# How often the loop reads the backlog (oldest PENDING age, FAILED rows) for health.
BACKLOG_EVERY_S = 5.0


# How long a new producer's first metadata request may hold its first pass
# (OutboxRelay._connect); also how long it may hold a stop.
CONNECT_WAIT_S = 2.0

# librdkafka's default batch.size: how much of one partition's records one
# produce request carries.
DEFAULT_BATCH_BYTES = 1_000_000
# A record batch's own framing, before its first record: whatever the records
# hold, a batch of one is larger than its key, value and headers by this much.
RECORD_BATCH_OVERHEAD = 61
# The producer's settings about delivery, not about reaching the cluster: left
# out of the client that reads the topic's configuration.
_DELIVERY_SETTINGS = frozenset(
    {
        "enable.idempotence",
        "acks",
        "max.in.flight.requests.per.connection",
        "linger.ms",
        "message.timeout.ms",
        "batch.size",
    }
)
# What a broker answers a client that may not read the topic's configuration
# (or about a topic that does not exist yet, made with the broker's defaults).
_LIMIT_UNREADABLE_CODES = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
    }
)


class _Queue(enum.Enum):
    # A produce call refused for a full local queue: worth trying again shortly.
    FULL = "full"


class Fault(enum.Enum):
    """Whether trying the same row again can ever help."""

    TRANSIENT = "transient"
    PERMANENT = "permanent"


# Broker answers that are a property of the record itself: sending it again,
# to this topic, can only be refused again.
_PERMANENT_KAFKA_CODES = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_TIMESTAMP,
        KafkaError._BAD_MSG,
        KafkaError._KEY_SERIALIZATION,
        KafkaError._VALUE_SERIALIZATION,
    }
)
# A batch too large for the topic is refused as a whole, so a small record
# batched with a large one gets the large one's refusal; such rows are sent
# again one by one before any of them is judged.
_SIZE_CODES = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})


def classify_fault(error: KafkaError | BaseException) -> Fault:
    """Transient or permanent: the one place that decides whether a row is dead.

    Permanent only when the fault is known to be the record's own (its size,
    its bytes). Everything else, from a broker that does not answer to a
    missing ACL, an unknown error code or a registry that refuses the schema
    (the same schema for every event: an incompatible change or a registry
    rule is the deployment's to fix), is transient: the row waits and the
    relay's health says it is stuck, so an operator can fix the cause without
    losing a single event.
    """
    if isinstance(error, KafkaException):
        inner = error.args[0] if error.args else None
        return classify_fault(inner) if isinstance(inner, KafkaError) else Fault.TRANSIENT
    if isinstance(error, KafkaError):
        if error.fatal():
            # An idempotent producer's fatal state: a new producer sends the row again.
            return Fault.TRANSIENT
        return Fault.PERMANENT if error.code() in _PERMANENT_KAFKA_CODES else Fault.TRANSIENT
    if isinstance(error, SchemaRegistryError):
        return Fault.TRANSIENT
    if isinstance(
        error, InvalidArgument | ContractViolation | ProtobufError | ValueError | TypeError
    ):
        # The payload cannot become a Kafka value (undecodable bytes, a value
        # the Avro schema does not admit, an event breaking its rules).
        return Fault.PERMANENT
    return Fault.TRANSIENT


class RelayRow(Protocol):
    """What the relay reads of an outbox row (``store.outbox.OutboxRow``)."""

    @property
    def id(self) -> int: ...
    @property
    def job_id(self) -> UUID | str: ...
    @property
    def payload(self) -> bytes: ...
    @property
    def traceparent(self) -> str | None: ...
    @property
    def tracestate(self) -> str | None: ...


# Kafka headers of one event (its trace context, when the relay traces).
Headers = list[tuple[str, str | bytes | None]]

Publish = Callable[[list[Any]], Awaitable[Sequence[PublishFailure | None]]]


class RelayOutbox(Protocol):
    """The store's side of a pass (``store.outbox.Outbox``)."""

    def relay_batch(
        self, publish: Publish, limit: int = ..., *, owner: str = ...
    ) -> Awaitable[RelayResult]: ...

    def backlog(self) -> Awaitable[Backlog]: ...


def producer_config(
    bootstrap_servers: str,
    overrides: Mapping[str, Any] | None = None,
    *,
    message_timeout_ms: int = DEFAULT_MESSAGE_TIMEOUT_MS,
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
        # a flush never waits forever on an unreachable broker. It is also how
        # long a pass waits before it learns the broker is away.
        "message.timeout.ms": message_timeout_ms,
    }
    config.update(overrides or {})
    return config


@dataclass
class RelayStats:
    passes: int = 0
    published: int = 0
    # Rows FAILED for good.
    failed: int = 0
    # Rows handed back after a transient fault.
    transient: int = 0
    # Passes that raised (store unreachable, a bug).
    errors: int = 0
    # Passes in a row that published nothing for a fault; reset by a pass that publishes.
    failing_passes: int = 0


class OutboxRelay(mode.Service):
    """One relay: a producer and a loop over ``Outbox.relay_batch``, woken by ``wake``.

    Starting the service runs the loop; stopping it finishes the pass in
    progress, then flushes and closes the producer (also when only
    ``relay_once()``, one pass, was used). A pass whose broker has not
    acknowledged it within ``stop_wait_s`` of the stop is given up: its
    messages are purged and its rows handed back, PENDING for the next relay.
    ``health()`` says whether it is publishing (``streams.health``).
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
        linger_s: float = 0.0,
        wake: asyncio.Event | None = None,
        name: str = "relay",
        backoff_max_s: float = 30.0,
        stuck_after_s: float = 120.0,
        explain: Callable[[Any, str], str | None] | None = None,
        tracing: Tracing | None = None,
        timings: RelayTimings | None = None,
        create_topic: TopicShape | None = None,
        registry_url: str = "",
        stop_wait_s: float = 10.0,
        **kwargs: Any,
    ) -> None:
        """``explain(error, servers)`` names the settings behind a producer error that
        is configuration (refused credentials, a certificate that does not verify);
        ``tracing``: a span per event, its context in the event's headers (None: none);
        ``timings``: the publish histogram (``None``, metrics off: nothing is timed);
        ``create_topic``: the topic is made with this shape before the first
        publish when missing (``WFJOBS_CREATE_TOPICS``; None: it is provisioned);
        ``registry_url``: the serializer's registry as its faults may name it
        (no credentials); ``stop_wait_s``: how long a stop waits for the pass in
        flight before giving it up."""
        if batch <= 0 or interval_s <= 0 or backoff_max_s <= 0 or stuck_after_s <= 0:
            raise ValueError("batch, interval_s, backoff_max_s and stuck_after_s must be positive")
        if stop_wait_s < 0:
            raise ValueError("stop_wait_s must not be negative")
        if linger_s < 0:
            raise ValueError("linger_s must not be negative")
        super().__init__(**kwargs)
        self._outbox = outbox
        self._producer_config = dict(producer_config)
        self._topic = topic
        self._create_topic = create_topic
        self._serializer = serializer
        self._registry = f"schema registry at {registry_url}" if registry_url else "schema registry"
        self._interval_s = interval_s
        self._batch = batch
        self._linger_s = linger_s
        self._name = name
        self._backoff_max_s = backoff_max_s
        self._stuck_after_s = stuck_after_s
        timeout_ms = int(
            self._producer_config.get("message.timeout.ms", DEFAULT_MESSAGE_TIMEOUT_MS)
        )
        # Past the producer's own deadline every message has its report; the
        # margin only covers the time librdkafka needs to raise it.
        self._flush_timeout_s = timeout_ms / 1000 + 5.0
        self._stop_wait_s = stop_wait_s
        # Set once a stop gives up the pass in flight: nothing more is produced,
        # and what the pass waits on the broker for answers at once.
        self._given_up = asyncio.Event()
        self._producer: Producer | None = None
        # The events topic's max.message.bytes, read before each producer is made
        # (None: not known, the broker's default assumed).
        self._topic_max_bytes: int | None = None
        self._compressed = any(
            str(self._producer_config.get(name, "none")).lower() != "none"
            for name in ("compression.type", "compression.codec")
        )
        self._fatal: KafkaError | None = None
        self._explain = explain
        self._tracing = tracing
        self._misconfigured = ""
        self._servers = str(self._producer_config.get("bootstrap.servers", ""))
        self._prepared = False
        self._wake = wake if wake is not None else asyncio.Event()
        self._loop_future: asyncio.Future[None] | None = None
        self._random = random.Random()
        self._timings = timings
        self.stats = RelayStats()
        # What health() reports, all kept in memory.
        self._last_publish_at: float | None = None  # wall clock, for operators
        self._last_pass_ok: bool | None = None
        self._last_error = ""
        self._blocked_since: float | None = None  # monotonic
        # Whether the outage now lasting was logged (once, see _log_outage).
        self._outage_logged = False
        # Rows of the last pass that met a transient fault while others went out.
        self._retrying_rows = 0
        self._backlog: Backlog | None = None
        self._backlog_read_at = -BACKLOG_EVERY_S  # monotonic
        # Since when the store has been asked (a lease, a settle, the backlog)
        # without answering: a statement that never answers fails nothing.
        self._store_asked_at: float | None = None  # monotonic

    # -- lifecycle

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def serializer(self) -> EventSerializer:
        return self._serializer

    @property
    def producer_config(self) -> Mapping[str, Any]:
        return self._producer_config

    async def on_start(self) -> None:
        # Kept by handle: stopping waits for the pass in progress to finish.
        self._loop_future = self.add_future(self._run())

    async def on_stop(self) -> None:
        """Finish the pass in progress, then flush and close the producer.

        A broker that is away would hold the pass for the producer's whole
        message timeout (30 s by default), longer than an orchestrator lets a
        stopping process live: after ``stop_wait_s`` its messages are purged,
        their reports fail at once, and the pass hands its rows back unleased
        (a purged message may still have reached the broker: delivery stays at
        least once). A store that does not answer the pass within
        ``SETTLE_WAIT_S`` more has the pass cancelled; its rows stay leased."""
        self._wake.set()
        future, self._loop_future = self._loop_future, None
        if future is not None:
            done, _ = await asyncio.wait({future}, timeout=self._stop_wait_s)
            if not done:
                await self._give_up_in_flight()
                done, _ = await asyncio.wait({future}, timeout=SETTLE_WAIT_S)
            if not done:
                # The store is not answering the pass's own statements: its rows
                # stay leased, and the next relay takes them when the lease passes.
                log.warning(
                    "%s: the store did not answer the stopping pass within %.0fs; "
                    "its rows go to the next relay when their lease passes",
                    self._name,
                    SETTLE_WAIT_S,
                )
                future.cancel()
                await asyncio.wait({future}, timeout=SETTLE_WAIT_S)
        await self._close()

    async def _give_up_in_flight(self) -> None:
        producer = self._producer
        self._given_up.set()
        if producer is None:
            return
        log.warning(
            "%s: stopping with a pass unacknowledged after %.0fs; its events are "
            "handed back for the next relay",
            self._name,
            self._stop_wait_s,
        )
        await asyncio.to_thread(producer.purge)

    def wake(self) -> None:
        """Start the next pass now instead of after the idle interval."""
        self._wake.set()

    async def _run(self) -> None:
        log.info("%s: publishing to %s", self._name, self._topic)
        try:
            while not self.should_stop:
                self._wake.clear()
                began = time.monotonic()
                try:
                    result = await self.relay_once()
                except Exception as exc:
                    if not is_outage(exc):
                        raise
                    # A store outage must not end the worker: log it and try
                    # again after a growing pause. One line, on the first pass
                    # and every tenth: an outage of an hour is a few lines,
                    # not a traceback every few seconds.
                    self.stats.errors += 1
                    self._note_blocked(f"{type(exc).__name__}: {exc}", since=began)
                    failures = self.stats.failing_passes
                    if failures == 1 or failures % 10 == 0:
                        log.warning(
                            "%s: pass failed (%d in a row): %s: %s",
                            self._name,
                            failures,
                            type(exc).__name__,
                            exc,
                        )
                    await self._back_off()
                    continue
                await self._read_backlog()
                if result.transient and not result.published:
                    await self._back_off()
                elif result.fetched < self._batch:
                    await self._idle(self._interval_s)
                    if result.fetched:
                        await self._linger(began)
        finally:
            await self._close()

    def _backoff_s(self) -> float:
        """The pause after ``failing_passes`` fruitless passes (see ``streams.backoff``)."""
        return backoff_delay(
            self.stats.failing_passes,
            base_s=self._interval_s,
            cap_s=self._backoff_max_s,
            rng=self._random,
        )

    async def _back_off(self) -> None:
        # Only stopping ends the pause: outbox NOTIFYs keep coming while the
        # broker is away, and must not turn the pause into back-to-back retries.
        await self.sleep(self._backoff_s())

    async def _idle(self, seconds: float) -> None:
        if self.should_stop:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)

    async def _linger(self, began: float) -> None:
        """After a pass that found some rows but less than a batch, start the next
        one no sooner than ``linger_s`` after that pass began, however early a
        NOTIFY woke the relay.

        While jobs run, nearly every commit wakes the relay, and a pass costs the
        broker one produce request per partition (librdkafka puts one partition
        in each) and the store a lease and a settle, whatever its size. Waiting
        lets the events of that time share one pass. The first event after a
        pass that found nothing, or after ``linger_s`` without a pass, goes at
        once; a full batch never waits.
        """
        remaining = self._linger_s - (time.monotonic() - began)
        if remaining > 0 and not self.should_stop:
            await self.sleep(remaining)

    async def _close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            # Every pass already waited for its reports; this only covers a pass
            # cut short, so that nothing produced is dropped on the floor.
            remaining = await asyncio.to_thread(producer.flush, self._flush_timeout_s)
            if remaining:
                log.warning("%s: %d message(s) unflushed at shutdown", self._name, remaining)

    # -- one pass

    async def relay_once(self) -> RelayResult:
        """One ``relay_batch`` pass: lease, publish, settle."""

        async def publish(rows: list[Any]) -> list[PublishFailure | None]:
            # Between the lease and the settle the broker is waited on, not the store.
            self._store_asked_at = None
            try:
                if self._timings is None:
                    outcomes = await self.publish(rows)
                else:
                    started = time.monotonic()
                    outcomes = await self.publish(rows)
                    self._timings.publish.observe(time.monotonic() - started)
            finally:
                self._store_asked_at = time.monotonic()
            # What health() says the relay retries after.
            transient = [o.reason for o in outcomes if o is not None and not o.permanent]
            if transient:
                self._last_error = transient[-1]
            if any(outcome is None for outcome in outcomes):
                # Some rows went out, so the relay carries on at once: the rows
                # that met a transient fault wait out the pause on their own.
                pause = self._backoff_s()
                outcomes = [
                    PublishFailure(o.reason, permanent=False, retry_after_s=pause)
                    if o is not None and not o.permanent
                    else o
                    for o in outcomes
                ]
            return outcomes

        began = self._store_asked_at = time.monotonic()
        try:
            result = await self._outbox.relay_batch(publish, self._batch, owner=self._name)
        finally:
            self._store_asked_at = None
        self.stats.passes += 1
        self._record(result, began)
        if not result.fetched and self._blocked_since is not None:
            await self._unblock_unless_rows_wait()
        return result

    def _record(self, result: RelayResult, began: float) -> None:
        """What the pass that began at ``began`` (monotonic) did, for stats and health."""
        self.stats.published += result.published
        self.stats.failed += result.failed
        self.stats.transient += result.transient
        for dead in result.dead_letters:
            log.error(
                "%s: outbox row %d of job %s FAILED for good, holding back the job's "
                "later events until it is redriven: %s",
                self._name,
                dead.id,
                dead.job_id,
                dead.reason,
                extra={"job_id": str(dead.job_id)},
            )
        if result.lost:
            log.warning(
                "%s: the lease on %d row(s) ran out before their outcome was recorded; "
                "they will be sent again",
                self._name,
                result.lost,
            )
        if result.published:
            self._last_publish_at = time.time()
            self._unblock("publishing again")
            self._misconfigured = ""
        # Publishing, so not stuck (a restart would not help them), but named.
        self._retrying_rows = result.transient if result.published else 0
        if result.transient:
            self._last_pass_ok = False
            if not result.published:
                self._note_blocked(self._last_error or "transient publish fault", since=began)
                self._log_outage()
        elif result.lost and not result.published and not result.failed:
            # Sent, then found another relay's: relays whose passes all outlast
            # their lease send the same rows again and again, marking none.
            self._note_blocked(
                f"the lease on all {result.lost} row(s) of the pass ran out before it "
                "settled: passes take longer than WFJOBS_RELAY_LEASE_S",
                since=began,
            )
            self._log_outage()
        elif result.fetched:
            self._last_pass_ok = True
            self._unblock("publishing again")

    async def _unblock_unless_rows_wait(self) -> None:
        """After a pass that found nothing while this relay could not publish.

        Finding nothing does not mean the broker answers again: another relay
        may hold the rows, failing the same way, and with every relay of a
        fleet taking turns at them none would ever count as stuck. So the relay
        stays blocked while a row that was waiting when it became blocked still
        waits (rows a dead letter holds back wait for an operator, not for a
        relay); once none does, another relay published them, or none was
        waiting, and this one is not the one stuck.
        """
        assert self._blocked_since is not None
        blocked_for = time.monotonic() - self._blocked_since
        self._backlog = await self._outbox.backlog()
        self._backlog_read_at = time.monotonic()
        waiting = self._backlog.oldest_waiting_age_s
        if waiting is None or waiting < blocked_for:
            self._unblock("none of the events it could not publish waits any more")

    def _log_outage(self) -> None:
        """One WARNING when the relay becomes unable to publish, naming why: an
        operator tailing the log learns of the outage there, not only from
        ``/healthz``, and an outage of hours is one line, not one per pass."""
        if self._outage_logged:
            return
        self._outage_logged = True
        log.warning(
            "%s: cannot publish to %s, the events wait and are retried: %s",
            self._name,
            self._topic,
            self._misconfigured or self._last_error,
        )

    def _unblock(self, how: str) -> None:
        """The relay is no longer unable to publish; its outage's end is logged once."""
        if self._outage_logged and self._blocked_since is not None:
            log.info("%s: %s after %.0fs", self._name, how, time.monotonic() - self._blocked_since)
        self._outage_logged = False
        self.stats.failing_passes = 0
        self._blocked_since = None

    def _note_blocked(self, error: str, *, since: float) -> None:
        """A pass that began at ``since`` published nothing: the relay has been
        unable to publish from then on, not only from when the pass gave up
        (a broker that is away takes a whole message timeout to say so)."""
        self.stats.failing_passes += 1
        self._last_error = error
        self._last_pass_ok = False
        if self._blocked_since is None:
            self._blocked_since = since

    async def _read_backlog(self) -> None:
        now = time.monotonic()
        if now - self._backlog_read_at < BACKLOG_EVERY_S:
            return
        self._backlog_read_at = now
        self._store_asked_at = now
        try:
            self._backlog = await self._outbox.backlog()
        except Exception as exc:
            # Health only; the next pass meets the same store and says why.
            log.debug("%s: backlog not read: %s", self._name, exc)
        finally:
            self._store_asked_at = None

    async def _prepare(self) -> None:
        if not self._prepared:
            # Registers or looks up the schema id: blocking HTTP, done once.
            await asyncio.to_thread(self._serializer.prepare)
            self._prepared = True
            log.info("%s: events as %s", self._name, self._serializer.description)

    async def publish(self, rows: Sequence[RelayRow]) -> list[PublishFailure | None]:
        """Produce ``rows`` in order and wait for the broker: ``None`` per ack, else why not."""
        if not rows:
            return []
        try:
            await self._prepare()
        except Exception as exc:
            failure = self._failure(exc, self._registry)
            return [failure] * len(rows)
        if self._producer is None:
            unread = await self._read_topic_limit()
            if unread is not None:
                return [unread] * len(rows)
            await self._connect(self._ensure_producer())
        producer = self._ensure_producer()
        outcomes: list[PublishFailure | None] = [None] * len(rows)
        reports: list[KafkaError | KafkaException | str | None] = [_NOT_REPORTED] * len(rows)
        values: dict[int, bytes] = {}
        failed_jobs: set[str] = set()
        # With tracing: each event's publish span, and the headers carrying it.
        spans: dict[int, Any] = {}
        headers: dict[int, Headers] = {}
        for index, row in enumerate(rows):
            key = str(row.job_id)
            if self._given_up.is_set():
                outcomes[index] = PublishFailure(
                    "not produced: the relay is stopping", permanent=False
                )
                continue
            if key in failed_jobs:
                # An earlier event of this job did not even reach the producer;
                # sending this one would put the job's events out of order.
                outcomes[index] = PublishFailure(
                    "held back: an earlier event of this job did not go out", permanent=False
                )
                continue
            try:
                value = self._serializer.serialize(with_event_id(bytes(row.payload), row.id))
            except Exception as exc:
                outcomes[index] = self._failure(exc, "cannot serialize event")
                failed_jobs.add(key)
                continue
            on_delivery = functools.partial(_report, reports, index)
            if self._tracing is not None:
                spans[index], headers[index] = self._tracing.start_publish(
                    job_id=key,
                    event_id=row.id,
                    parent=stored_trace(row.traceparent, row.tracestate),
                    topic=self._topic,
                )
            carried = headers.get(index)
            too_large = self._too_large_for_topic(key, value, carried)
            if too_large is not None:
                # Sent, it would be refused alone while the job's later events,
                # in later batches, went in ahead of it.
                outcomes[index] = self._failure(too_large, "not produced")
                failed_jobs.add(key)
                continue
            # The whole batch is handed over with no await in between unless
            # the local queue is full; the pass then awaits the reports once.
            error = self._produce_now(producer, key, value, on_delivery, carried)
            if error is _Queue.FULL:
                error = await self._produce(producer, key, value, on_delivery, carried)
            if error is not None:
                outcomes[index] = self._failure(error, "not produced")
                failed_jobs.add(key)
            else:
                values[index] = value
        await self._flush(producer, len(values))
        if len(values) > 1 and not self._given_up.is_set():
            await self._resend_refused_for_size(producer, rows, values, reports, headers)
        for index in values:
            report = reports[index]
            if isinstance(report, KafkaError | KafkaException):
                outcomes[index] = self._failure(report, "delivery failed")
            elif report is not None:
                outcomes[index] = PublishFailure(report, permanent=False)
        if self._tracing is not None:
            for index, span in spans.items():
                outcome = outcomes[index]
                self._tracing.end_publish(span, outcome.reason if outcome is not None else None)
        if self._fatal is not None:
            await self._replace_producer()
        return outcomes

    async def _resend_refused_for_size(
        self,
        producer: Producer,
        rows: Sequence[RelayRow],
        values: dict[int, bytes],
        reports: list[KafkaError | KafkaException | str | None],
        headers: Mapping[int, Headers],
    ) -> None:
        """Send the rows refused as too large again, alone and in order: each judged on its own."""
        refused_jobs: set[str] = set()
        for index in sorted(values):
            report = reports[index]
            if not isinstance(report, KafkaError) or report.code() not in _SIZE_CODES:
                continue
            key = str(rows[index].job_id)
            if key in refused_jobs:
                continue
            reports[index] = _NOT_REPORTED
            error = await self._produce(
                producer,
                key,
                values[index],
                functools.partial(_report, reports, index),
                headers.get(index),
            )
            if error is not None:
                reports[index] = error
            else:
                await self._flush(producer, 1)
            if reports[index] is not None:
                refused_jobs.add(key)

    async def _flush(self, producer: Producer, produced: int) -> None:
        if not produced:
            return
        remaining = await asyncio.to_thread(producer.flush, self._flush_timeout_s)
        if remaining:
            log.warning("%s: %d message(s) unacknowledged after flush", self._name, remaining)

    def _failure(self, error: KafkaError | BaseException, what: str) -> PublishFailure:
        reason = f"{what}: {_describe(error)}"
        return PublishFailure(reason, permanent=classify_fault(error) is Fault.PERMANENT)

    def _produce_now(
        self,
        producer: Producer,
        key: str,
        value: bytes,
        on_delivery: Callable[[KafkaError | None, Message], None],
        headers: Headers | None = None,
    ) -> KafkaException | Literal[_Queue.FULL] | None:
        """Hand one message to the producer: None, the producer's refusal, or ``_Queue.FULL``."""
        try:
            producer.produce(
                self._topic,
                value=value,
                key=key.encode(),
                headers=headers,
                on_delivery=on_delivery,
            )
        except BufferError:
            return _Queue.FULL
        except KafkaException as exc:
            return exc
        return None

    async def _produce(
        self,
        producer: Producer,
        key: str,
        value: bytes,
        on_delivery: Callable[[KafkaError | None, Message], None],
        headers: Headers | None = None,
    ) -> KafkaException | None:
        while True:
            if self._given_up.is_set():
                return KafkaException(KafkaError(KafkaError._PURGE_QUEUE, "the relay is stopping"))
            error = self._produce_now(producer, key, value, on_delivery, headers)
            if error is not _Queue.FULL:
                return error
            # The local queue is full: let the broker drain some of it.
            await asyncio.to_thread(producer.poll, 0.1)

    # -- health

    def health(self) -> PartHealth:
        """Stuck when it has not published for ``stuck_after_s`` while rows wait for it,
        or has waited that long for the store to answer. Rows that keep meeting a
        passing fault while others go out are named, and show in the oldest
        PENDING row's age, but are not stuck: the relay works, and a restart
        would not send them."""
        now = time.monotonic()
        blocked_for = now - self._blocked_since if self._blocked_since is not None else 0.0
        stuck = self._blocked_since is not None and blocked_for > self._stuck_after_s
        asked_at = self._store_asked_at
        waiting_for = now - asked_at if asked_at is not None else 0.0
        hung = waiting_for > self._stuck_after_s
        detail: dict[str, Any] = {
            "last_publish_at": (
                None
                if self._last_publish_at is None
                else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._last_publish_at))
            ),
            "last_publish_ok": self._last_pass_ok,
            "unable_to_publish_s": round(blocked_for, 1),
            "pass_waiting_s": round(waiting_for, 1),
            "published": self.stats.published,
            "retrying_rows": self._retrying_rows,
        }
        if self._backlog is not None:
            age = self._backlog.oldest_pending_age_s
            detail["oldest_pending_age_s"] = (
                None if age is None else round(age + now - self._backlog_read_at, 1)
            )
            detail["failed_rows"] = self._backlog.failed_rows
        # A delivery timeout hides why: refused credentials say it better.
        reason = self._misconfigured or self._last_error
        if hung:
            summary = f"a relay pass has waited {waiting_for:.0f}s for the store"
        elif stuck:
            summary = f"cannot publish for {blocked_for:.0f}s: {reason}"
        elif self._blocked_since is not None:
            summary = f"retrying after: {reason}"
        elif self._retrying_rows:
            summary = (
                f"publishing; {self._retrying_rows} row(s) of the last pass handed back "
                f"after: {reason}"
            )
        else:
            summary = "ok"
        return PartHealth("relay", healthy=not stuck and not hung, summary=summary, detail=detail)

    # -- producer

    async def _read_topic_limit(self) -> PublishFailure | None:
        """Read the topic's ``max.message.bytes`` for the producer about to be made;
        a transient failure when the broker does not answer.

        librdkafka fills a partition's batch up to ``batch.size``. A topic that
        takes less refuses a batch of records that each fit, while a later,
        smaller batch of the same partition goes in: a job's later event then
        reaches the topic before the earlier one, sent again alone. Batches
        kept within the topic's limit are never refused for others' records. A
        relay that may not read the topic's configuration, or whose broker does
        not tell this limit, sends as before.
        """
        config = {k: v for k, v in self._producer_config.items() if k not in _DELIVERY_SETTINGS}
        # Refused credentials are explained as the producer's are.
        config.setdefault("error_cb", self._on_error)
        config.setdefault("logger", logging.getLogger(f"{__name__}.librdkafka"))
        timeout_s = self._flush_timeout_s - 5.0
        if self._create_topic is not None:
            # Before anything is sent: a broker that makes topics on first use
            # would make it with its own defaults.
            try:
                await self._broker_answer(
                    _create_missing_topic(config, self._topic, self._create_topic, timeout_s),
                    timeout_s,
                )
            except KafkaException as exc:
                inner = exc.args[0] if exc.args else None
                if (
                    not isinstance(inner, KafkaError)
                    or inner.code() != KafkaError.TOPIC_ALREADY_EXISTS
                ):
                    # The deployment's to fix (too many replicas, no right to
                    # create), never the rows': they wait.
                    reason = f"cannot create {self._topic}: {_describe(exc)}"
                    return PublishFailure(reason, permanent=False)
            except (TimeoutError, _GivenUp) as exc:
                why = "the relay is stopping" if isinstance(exc, _GivenUp) else "timed out"
                return PublishFailure(f"cannot create {self._topic}: {why}", permanent=False)
        try:
            entries = await self._broker_answer(
                _describe_topic(config, self._topic, timeout_s), timeout_s
            )
            entry = entries.get("max.message.bytes")
            self._topic_max_bytes = (
                None if entry is None or entry.value is None else int(entry.value)
            )
        except KafkaException as exc:
            inner = exc.args[0] if exc.args else None
            if not isinstance(inner, KafkaError) or inner.code() not in _LIMIT_UNREADABLE_CODES:
                return self._failure(exc, f"cannot read the configuration of {self._topic}")
            log.warning(
                "%s: the limits of %s are unknown (%s); batches of up to %d bytes",
                self._name,
                self._topic,
                _describe(exc),
                int(self._producer_config.get("batch.size", DEFAULT_BATCH_BYTES)),
            )
            self._topic_max_bytes = None
        except (TimeoutError, _GivenUp) as exc:
            why = "the relay is stopping" if isinstance(exc, _GivenUp) else "timed out"
            return PublishFailure(
                f"cannot read the configuration of {self._topic}: {why}", permanent=False
            )
        return None

    async def _broker_answer(self, asked: _Asked[T], timeout_s: float) -> T:
        """What an admin request answers; ``TimeoutError`` past ``timeout_s`` and
        ``_GivenUp`` as soon as a stop gives up the pass. No thread waits on it."""
        _client, future = asked
        answer: asyncio.Future[T] = asyncio.wrap_future(future)
        given_up: asyncio.Future[Any] = asyncio.ensure_future(self._given_up.wait())
        waited: set[asyncio.Future[Any]] = {answer, given_up}
        try:
            # The request's own timeout answers first; the margin only covers raising it.
            done, _ = await asyncio.wait(
                waited, timeout=timeout_s + 5.0, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            given_up.cancel()
        if answer in done:
            return answer.result()
        answer.cancel()
        if given_up in done:
            raise _GivenUp
        raise TimeoutError

    def _too_large_for_topic(
        self, key: str, value: bytes, headers: Headers | None
    ) -> KafkaError | None:
        """The topic's refusal of this record, when it is certain before sending
        (a compressed batch may take a record larger than the limit)."""
        limit = self._topic_max_bytes
        if limit is None or self._compressed:
            return None
        size = len(key.encode()) + len(value) + RECORD_BATCH_OVERHEAD
        for name, header in headers or ():
            carried = header.encode() if isinstance(header, str) else header or b""
            size += len(name.encode()) + len(carried)
        if size <= limit:
            return None
        return KafkaError(
            KafkaError.MSG_SIZE_TOO_LARGE,
            f"the record takes at least {size} bytes, more than the max.message.bytes "
            f"({limit}) of {self._topic}",
        )

    def _ensure_producer(self) -> Producer:
        if self._producer is None:
            config = dict(self._producer_config)
            if self._topic_max_bytes is not None:
                batch_bytes = int(config.get("batch.size", DEFAULT_BATCH_BYTES))
                config["batch.size"] = min(batch_bytes, self._topic_max_bytes)
            config.setdefault("error_cb", self._on_error)
            # librdkafka's own log lines go through logging, not straight to stderr.
            config.setdefault("logger", logging.getLogger(f"{__name__}.librdkafka"))
            self._producer = Producer(config)
        return self._producer

    def _on_error(self, error: KafkaError) -> None:
        # Transient broker errors are retried by librdkafka and show up, if they
        # last, as failed delivery reports; only a fatal one needs action.
        explained = self._explain(error, self._servers) if self._explain else None
        if explained is not None:
            # The rows wait (a transient fault) until the settings are fixed; the
            # reason is logged once per change rather than on every reconnect.
            if explained != self._misconfigured:
                log.error("%s: %s", self._name, explained)
            self._misconfigured = explained
        elif error.fatal():
            log.error("%s: fatal producer error: %s", self._name, _describe(error))
            self._fatal = error
        else:
            log.debug("%s: producer: %s", self._name, _describe(error))

    async def _connect(self, producer: Producer) -> None:
        """Wait, briefly, for a new producer's first answer from the cluster.

        An idempotent producer sends nothing before it has a producer id. Handed
        a batch the moment it is made, it asks for one before any connection is
        up, fails, and librdkafka asks again only 500 ms later: every new
        producer's first pass waited half a second. A metadata request first
        brings a connection up, and the id comes on it. A cluster that does not
        answer in time changes nothing: the pass produces and waits as before.
        """
        try:
            await asyncio.to_thread(producer.list_topics, self._topic, timeout=CONNECT_WAIT_S)
        except KafkaException as exc:
            log.debug("%s: no answer from the cluster yet: %s", self._name, _describe(exc))

    async def _replace_producer(self) -> None:
        """An idempotent producer that hit a fatal error is unusable: start a new one."""
        producer, self._producer, self._fatal = self._producer, None, None
        if producer is not None:
            await asyncio.to_thread(producer.flush, 0)


@dataclass(frozen=True)
class TopicShape:
    """The partitions and replicas a topic the relay makes is given."""

    partitions: int
    replicas: int


# An admin request in flight: the client must live until it answers.
_Asked = tuple[AdminClient, "concurrent.futures.Future[T]"]


class _GivenUp(Exception):
    """A stop gave up the pass that was waiting on the broker."""


def _create_missing_topic(
    config: Mapping[str, Any], topic: str, shape: TopicShape, timeout_s: float
) -> _Asked[None]:
    """Ask the cluster to create ``topic`` (it answers TOPIC_ALREADY_EXISTS if it has it)."""
    admin = AdminClient(dict(config))
    new = NewTopic(topic, num_partitions=shape.partitions, replication_factor=shape.replicas)
    return admin, admin.create_topics([new], request_timeout=timeout_s)[topic]


def _describe_topic(config: Mapping[str, Any], topic: str, timeout_s: float) -> _Asked[Any]:
    """Ask the cluster for ``topic``'s configuration entries (Tansu, the ``make dev``
    broker, leaves ``max.message.bytes`` out)."""
    resource = ConfigResource(ResourceType.TOPIC, topic)
    admin = AdminClient(dict(config))
    return admin, admin.describe_configs([resource], request_timeout=timeout_s)[resource]


def _report(
    reports: list[KafkaError | KafkaException | str | None],
    index: int,
    error: KafkaError | None,
    _: Message,
) -> None:
    # Runs in the flushing thread; each call writes its own slot only.
    reports[index] = error


def _describe(error: Any) -> str:
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        error = error.args[0]
    if isinstance(error, KafkaError):
        return f"{error.name()}: {error.str()}"
    if isinstance(error, BaseException):
        return f"{type(error).__name__}: {error}"
    return str(error)


def build_relay(
    settings: Settings,
    outbox: RelayOutbox,
    *,
    wake: asyncio.Event | None = None,
    producer_overrides: Mapping[str, Any] | None = None,
    name: str | None = None,
    registry: SchemaRegistryClient | None = None,
    tracing: Tracing | None = None,
    timings: RelayTimings | None = None,
) -> OutboxRelay:
    """The relay the settings describe: registry and format, topic, timings, batch.

    ``registry`` is the process's client of the settings' registry, if it has
    one already; otherwise the relay opens its own.
    """
    serializer = event_serializer(
        registry=registry if registry is not None else settings.open_registry(),
        topic=settings.events_topic,
        event_format=settings.event_format,
        auto_register=settings.schema_registry_auto_register,
    )
    security = kafka_security.kafka_security(settings)
    return OutboxRelay(
        outbox,
        producer_config=producer_config(
            ",".join(kafka_security.bootstrap_servers(settings)),
            # TLS, SASL and WFJOBS_KAFKA_PROPERTIES, then what the caller insists on.
            {**security.librdkafka(), **(producer_overrides or {})},
            message_timeout_ms=settings.relay_message_timeout_ms,
        ),
        explain=security.explain,
        topic=settings.events_topic,
        serializer=serializer,
        interval_s=settings.relay_interval_s,
        batch=settings.relay_batch,
        linger_s=settings.relay_linger_ms / 1000,
        wake=wake,
        name=name or f"relay-{settings.worker_id or 'anonymous'}",
        backoff_max_s=settings.relay_backoff_max_s,
        stuck_after_s=settings.relay_stuck_after_s,
        tracing=tracing,
        timings=timings,
        create_topic=(
            TopicShape(settings.topic_partitions, settings.topic_replicas)
            if settings.create_topics
            else None
        ),
        registry_url=settings.shown_registry_url,
        stop_wait_s=settings.shutdown_grace_s,
    )


__all__ = [
    "Fault",
    "OutboxRelay",
    "RelayOutbox",
    "RelayRow",
    "RelayStats",
    "TopicShape",
    "build_relay",
    "classify_fault",
    "producer_config",
]
