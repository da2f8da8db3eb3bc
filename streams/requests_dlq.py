"""The requests dead-letter topic: see what the request agent set aside, send it back.

The request agent dead-letters a request it cannot decode (or that keeps
hitting an internal error) to ``<requests topic>.dlq``, with the original key
and value and the reason in the ``x-wfjobs-dlq-reason`` header. Here an
operator lists those messages (position, key, reason, and the job id and
workflow name when the value decodes) and redrives them: the original key and
value are produced to the requests topic again, with an
``x-wfjobs-redriven-from`` header naming where they came from.

A request too large to be copied to the dead-letter topic is dead-lettered
without its value, its reason naming where it stays on the requests topic;
redriving that one produces an empty value, which only comes back.

The dead-letter topic is a log: redriving copies a message, it does not remove
it. Redriving one twice is harmless for a request that decodes (submit is
idempotent on ``job_id``); one that still does not decode simply comes back to
the dead-letter topic with its reason.

Every Kafka call blocks, so each listing or redrive runs in a worker thread
with its own short-lived clients, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from schemas.errors import InvalidArgument, NotFound, Unavailable
from schemas.serde import RequestDecoder
from streams.convert import timestamp_json
from streams.kafka_security import SecuritySettingsError
from streams.settings import Settings

log = logging.getLogger(__name__)

# Why the request agent dead-lettered a message, on the dead letter itself.
DLQ_REASON_HEADER = "x-wfjobs-dlq-reason"

REDRIVEN_FROM_HEADER = "x-wfjobs-redriven-from"
DEFAULT_LIST_MAX = 100
MAX_LIST_MAX = 1000
# Dead letters read and produced at a time by a redrive of everything.
_REDRIVE_BATCH = 200
MAX_PARTITION = 2**31 - 1
MAX_OFFSET = 2**63 - 1
# ASCII digits only: str.isdigit() also takes "²", which int() refuses.
_DIGITS = re.compile(r"[0-9]{1,19}")


@dataclass(frozen=True, slots=True, order=True)
class Position:
    """Where a dead letter sits: partition and offset of the dead-letter topic."""

    partition: int
    offset: int

    def __post_init__(self) -> None:
        # Kafka's own ranges: past them the client raises OverflowError, which
        # would answer a caller's typo with a 500.
        if not 0 <= self.partition <= MAX_PARTITION or not 0 <= self.offset <= MAX_OFFSET:
            raise InvalidArgument(
                f"a position's partition is within 0..{MAX_PARTITION} and its offset "
                f"within 0..{MAX_OFFSET}, got {self.partition}:{self.offset}"
            )

    def __str__(self) -> str:
        return f"{self.partition}:{self.offset}"


@dataclass(frozen=True, slots=True)
class DeadLetteredRequest:
    position: Position
    key: str | None
    reason: str
    timestamp: datetime | None
    size: int
    # Empty when the value does not decode as a WorkflowRunRequest.
    job_id: str
    workflow_name: str

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.position.partition,
            "offset": self.position.offset,
            "key": self.key,
            "reason": self.reason,
            "timestamp": timestamp_json(self.timestamp) if self.timestamp else None,
            "size": self.size,
            "job_id": self.job_id,
            "workflow_name": self.workflow_name,
        }


@dataclass(frozen=True, slots=True)
class DeadLetterListing:
    topic: str
    # Messages the topic holds now, whether or not they were listed.
    total: int
    messages: tuple[DeadLetteredRequest, ...]
    # Where the next page starts, "P:O"; empty when no message is left past this page.
    next_page_token: str


def parse_page_token(token: str) -> Position | None:
    """Where a page of the listing starts (None: at the first message)."""
    if not token:
        return None
    partition, sep, offset = token.partition(":")
    if sep and _DIGITS.fullmatch(partition) and _DIGITS.fullmatch(offset):
        with contextlib.suppress(InvalidArgument):
            return Position(int(partition), int(offset))
    raise InvalidArgument(
        f"page_token {token!r} is malformed; pass the next_page_token of a previous answer"
    )


def _read_from(start: Position | None, partition: int, low: int) -> int | None:
    """The offset a listing from ``start`` reads ``partition`` from; None: not at all."""
    if start is None or partition > start.partition:
        return low
    if partition < start.partition:
        return None
    # Retention may have removed what the token pointed at since.
    return max(low, start.offset)


@dataclass(frozen=True, slots=True)
class _Record:
    position: Position
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int | None


class RequestsDeadLetters:
    def __init__(
        self,
        *,
        dlq_topic: str,
        requests_topic: str,
        decoder: RequestDecoder,
        client_config: Callable[[], Mapping[str, Any]],
        timeout_s: float = 15.0,
    ) -> None:
        """``client_config``: ``bootstrap.servers`` and the TLS / SASL properties,
        asked for each client made, so a secret read from a file is read again."""
        self.dlq_topic = dlq_topic
        self.requests_topic = requests_topic
        self._decoder = decoder
        self._client_config = client_config
        self._timeout_s = timeout_s

    @classmethod
    def from_settings(cls, settings: Settings) -> RequestsDeadLetters:
        return cls(
            dlq_topic=settings.dlq_topic,
            requests_topic=settings.requests_topic,
            decoder=RequestDecoder(settings.open_registry(), topic=settings.requests_topic),
            client_config=settings.kafka_client_config,
        )

    # ------------------------------------------------------------------ verbs

    async def list_messages(
        self, *, max_messages: int = DEFAULT_LIST_MAX, page_token: str = ""
    ) -> DeadLetterListing:
        """Up to ``max_messages`` dead letters, by partition then offset, oldest first,
        from where ``page_token`` (a previous page's ``next_page_token``) says."""
        if not 1 <= max_messages <= MAX_LIST_MAX:
            raise InvalidArgument(f"max must be within 1..{MAX_LIST_MAX}, got {max_messages}")
        start = parse_page_token(page_token)
        return await asyncio.to_thread(self._list, max_messages, start)

    async def redrive(self, positions: Sequence[Position] | None) -> list[DeadLetteredRequest]:
        """Produce the named dead letters (None: every one) to the requests topic again.

        Every named position must hold a message, or nothing is produced.
        """
        if positions is not None and not positions:
            raise InvalidArgument("positions must name at least one dead letter")
        return await asyncio.to_thread(self._redrive, positions)

    # ------------------------------------------------------------------ in a thread

    def _list(self, max_messages: int, start: Position | None) -> DeadLetterListing:
        consumer = self._consumer()
        try:
            ranges = self._ranges(consumer)
            total = sum(high - low for low, high in ranges.values())
            found: list[DeadLetteredRequest] = []
            for partition, (low, high) in sorted(ranges.items()):
                if len(found) >= max_messages:
                    break
                first = _read_from(start, partition, low)
                if first is not None and high > first:
                    # Described as they are read: a value is dropped once listed.
                    want = max_messages - len(found)
                    found += map(self._describe, self._read(consumer, partition, first, want))
        finally:
            consumer.close()
        token = ""
        if len(found) == max_messages:
            last = found[-1].position
            after = Position(last.partition, last.offset + 1)
            if any(
                (first := _read_from(after, partition, low)) is not None and high > first
                for partition, (low, high) in ranges.items()
            ):
                token = str(after)
        return DeadLetterListing(self.dlq_topic, total, tuple(found), token)

    def _redrive(self, positions: Sequence[Position] | None) -> list[DeadLetteredRequest]:
        if positions is None:
            return self._redrive_all()
        consumer = self._consumer()
        try:
            ranges = self._ranges(consumer)
            records: list[_Record] = []
            wanted = sorted(set(positions))
            missing = [p for p in wanted if not self._holds(ranges, p)]
            for position in wanted:
                if position in missing:
                    continue
                found = list(self._read(consumer, position.partition, position.offset, 1))
                if found and found[0].position == position:
                    records.append(found[0])
                else:
                    missing.append(position)
            if missing:
                raise NotFound(
                    f"{self.dlq_topic} holds no message at "
                    f"{', '.join(str(p) for p in sorted(missing))}; nothing was redriven"
                )
        finally:
            consumer.close()
        self._produce(records)
        return [self._describe(record) for record in records]

    def _redrive_all(self) -> list[DeadLetteredRequest]:
        """Every dead letter, produced in batches so the topic is never held in memory."""
        consumer = self._consumer()
        redriven: list[DeadLetteredRequest] = []
        try:
            for partition, (low, high) in sorted(self._ranges(consumer).items()):
                batch: list[_Record] = []
                for record in self._read(consumer, partition, low, high - low):
                    batch.append(record)
                    if len(batch) == _REDRIVE_BATCH:
                        redriven += self._send(batch, already=len(redriven))
                        batch = []
                if batch:
                    redriven += self._send(batch, already=len(redriven))
        finally:
            consumer.close()
        return redriven

    def _send(self, batch: Sequence[_Record], *, already: int) -> list[DeadLetteredRequest]:
        try:
            self._produce(batch)
        except Unavailable as exc:
            if already:
                raise Unavailable(
                    f"{exc.message}; {already} dead letter(s) had been redriven before"
                ) from None
            raise
        return [self._describe(record) for record in batch]

    def _holds(self, ranges: Mapping[int, tuple[int, int]], position: Position) -> bool:
        low, high = ranges.get(position.partition, (0, 0))
        return low <= position.offset < high

    def _config(self) -> Mapping[str, Any]:
        try:
            return self._client_config()
        except SecuritySettingsError as exc:
            # The settings were checked at start, so a secret's file has gone or
            # changed under the worker since: an outage to retry, not a bad request.
            raise Unavailable(f"cannot make a Kafka client: {exc.message}") from None

    def _consumer(self) -> Consumer:
        return Consumer(
            {
                # Partitions are assigned by hand and nothing is committed, so
                # this id never joins a group: reading moves nobody's offsets.
                "group.id": f"wfjobs-dlq-{uuid.uuid4().hex[:12]}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "logger": log,
                **self._config(),
            }
        )

    def _ranges(self, consumer: Consumer) -> dict[int, tuple[int, int]]:
        """Low and high watermark of every partition; empty when the topic does not exist."""
        try:
            metadata = consumer.list_topics(self.dlq_topic, timeout=self._timeout_s)
            topic = metadata.topics.get(self.dlq_topic)
            if topic is None or topic.error is not None:
                if topic is not None and topic.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise Unavailable(f"cannot read {self.dlq_topic}: {topic.error.str()}")
                return {}
            return {
                partition: consumer.get_watermark_offsets(
                    TopicPartition(self.dlq_topic, partition), timeout=self._timeout_s
                )
                for partition in topic.partitions
            }
        except KafkaException as exc:
            raise Unavailable(f"cannot read {self.dlq_topic}: {_describe(exc)}") from None

    def _read(
        self, consumer: Consumer, partition: int, start: int, count: int
    ) -> Iterator[_Record]:
        """Up to ``count`` messages of one partition from ``start``, stopping at its end."""
        consumer.assign([TopicPartition(self.dlq_topic, partition, start)])
        try:
            for _ in range(count):
                message = consumer.poll(self._timeout_s)
                if message is None:
                    raise Unavailable(
                        f"no answer from {self.dlq_topic} partition {partition} within "
                        f"{self._timeout_s:.0f}s"
                    )
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return
                    raise Unavailable(f"cannot read {self.dlq_topic}: {error.str()}")
                yield _record(message)
        finally:
            consumer.unassign()

    def _produce(self, records: Sequence[_Record]) -> None:
        producer = Producer(
            {
                "enable.idempotence": True,
                "acks": "all",
                "message.timeout.ms": int(self._timeout_s * 1000),
                "logger": log,
                **self._config(),
            }
        )
        failures: dict[Position, str] = {}
        acked: set[Position] = set()
        for record in records:

            def delivered(
                error: KafkaError | None, _: Message, position: Position = record.position
            ) -> None:
                if error is None:
                    acked.add(position)
                else:
                    failures[position] = error.str()

            try:
                producer.produce(
                    self.requests_topic,
                    key=record.key,
                    value=record.value,
                    headers=[
                        (REDRIVEN_FROM_HEADER, f"{self.dlq_topic}:{record.position}".encode())
                    ],
                    on_delivery=delivered,
                )
            except KafkaException as exc:
                failures[record.position] = _describe(exc)
        producer.flush(self._timeout_s + 5.0)
        for record in records:
            if record.position not in acked and record.position not in failures:
                failures[record.position] = "no delivery report from the producer"
        if failures:
            detail = "; ".join(
                f"{position}: {reason}" for position, reason in sorted(failures.items())
            )
            raise Unavailable(
                f"{len(failures)} of {len(records)} dead letter(s) not delivered to "
                f"{self.requests_topic} ({detail}); the others were"
            )
        log.info(
            "redrove %d dead letter(s) from %s to %s",
            len(records),
            self.dlq_topic,
            self.requests_topic,
        )

    def _describe(self, record: _Record) -> DeadLetteredRequest:
        reason = ""
        for name, value in record.headers:
            if name == DLQ_REASON_HEADER:
                reason = value.decode("utf-8", "replace")
        job_id = workflow_name = ""
        try:
            request = self._decoder.decode(record.value, topic=self.requests_topic)
        except Exception as exc:
            # Listing must show every dead letter, decodable or not.
            log.debug("dead letter %s does not decode: %s", record.position, exc)
        else:
            job_id, workflow_name = request.job_id, request.workflow_name
        timestamp = (
            datetime.fromtimestamp(record.timestamp_ms / 1000, tz=UTC)
            if record.timestamp_ms is not None
            else None
        )
        return DeadLetteredRequest(
            position=record.position,
            key=record.key.decode("utf-8", "replace") if record.key is not None else None,
            reason=reason,
            timestamp=timestamp,
            size=len(record.value or b""),
            job_id=job_id,
            workflow_name=workflow_name,
        )


def _record(message: Message) -> _Record:
    kind, stamp = message.timestamp()
    raw = message.headers() or []
    # A consumed message's headers are a list of pairs; the type also allows a dict.
    pairs = list(raw.items()) if isinstance(raw, dict) else raw
    headers = tuple(
        (name, value if isinstance(value, bytes) else (value or "").encode())
        for name, value in pairs
    )
    key = message.key()
    value = message.value()
    return _Record(
        position=Position(message.partition() or 0, message.offset() or 0),
        key=key if isinstance(key, bytes) or key is None else str(key).encode(),
        value=value if isinstance(value, bytes) or value is None else str(value).encode(),
        headers=headers,
        timestamp_ms=None if kind == TIMESTAMP_NOT_AVAILABLE else stamp,
    )


def _describe(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    return error.str() if isinstance(error, KafkaError) else str(exc)


__all__ = [
    "DEFAULT_LIST_MAX",
    "DLQ_REASON_HEADER",
    "MAX_LIST_MAX",
    "REDRIVEN_FROM_HEADER",
    "DeadLetterListing",
    "DeadLetteredRequest",
    "Position",
    "RequestsDeadLetters",
    "parse_page_token",
]
