"""The verbs that speak Kafka themselves: ``produce``, ``produce-completion`` and ``events``.

They read the worker's settings (``KAFKA_BOOTSTRAP_SERVERS``, the topics,
``WFJOBS_SCHEMA_REGISTRY_URL``, the ``WFJOBS_KAFKA_*`` security settings and the
registry's credentials...) rather than the HTTP API, so they reach Kafka and the
registry exactly as the workers do. Credentials the broker refuses end the
command at once with the settings to check, instead of a delivery timeout.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from cli.arguments import job_id_argument, json_object, required, uuid_argument
from cli.errors import CliError
from cli.http import shown_url
from cli.render import Output, print_event
from schemas.contract import StepCompletion, WorkflowRunRequest, check_incoming
from schemas.errors import WorkflowJobsError

if TYPE_CHECKING:
    from streams.settings import Settings


def settings_from_env() -> Settings:
    # Imported here: the verbs that only speak HTTP never read the settings.
    from streams.settings import Settings

    return Settings.from_env()


# librdkafka would print every failed connection attempt to stderr; the commands
# report what went wrong once, as ``code: message``.
QUIET_CLIENT: Mapping[str, Any] = {"log_level": 0}
# librdkafka's default, and what a broker accepts by default: a request above it
# is refused before anything is sent.
PRODUCE_MAX_BYTES = 1_000_000
# How often a command waiting on the broker looks for refused credentials.
_WATCH_S = 0.2


class _Refusals:
    """librdkafka's ``error_cb``: keeps the first error that is the settings' fault."""

    def __init__(self, explain: Callable[[Any, str], str | None], servers: str) -> None:
        self._explain = explain
        self._servers = servers
        self.reason = ""

    def __call__(self, error: Any) -> None:
        explained = self._explain(error, self._servers)
        if explained is not None and not self.reason:
            self.reason = explained

    def check(self) -> None:
        if self.reason:
            raise CliError("UNAUTHENTICATED", self.reason)


def _client_config(settings: Settings) -> tuple[dict[str, Any], _Refusals]:
    """bootstrap.servers, TLS, SASL and pass-through properties, with a refusal watch."""
    config = settings.kafka_client_config()
    refusals = _Refusals(settings.kafka_security().explain, config["bootstrap.servers"])
    config["error_cb"] = refusals
    return config, refusals


def cmd_produce(args: argparse.Namespace, out: Output) -> int:
    settings = settings_from_env()
    request = WorkflowRunRequest(
        job_id=job_id_argument(args.job_id), workflow_name=args.workflow_name
    )
    try:
        request.deadline_ms = args.deadline_ms
    except ValueError as exc:
        # Past an int64 the field cannot hold it, so its rules would never see it.
        raise CliError("INVALID_ARGUMENT", f"--deadline-ms: {exc}") from None
    request.input.update(json_object(args.input, "--input"))
    check_incoming(request)
    value = _framed(settings, request, settings.requests_topic, "request")
    _deliver(
        settings,
        settings.requests_topic,
        key=request.job_id.encode(),
        value=value,
        timeout_s=args.timeout,
        what="request",
    )
    if out.as_json:
        out.json({"job_id": request.job_id, "topic": settings.requests_topic})
    else:
        out.print(
            f"produced job [bold]{request.job_id}[/] to {escape(settings.requests_topic)}; "
            f"follow it with `wfjobs get {request.job_id}`"
        )
    return 0


def _deliver(
    settings: Settings, topic: str, *, key: bytes, value: bytes, timeout_s: float, what: str
) -> None:
    """Produce one message and wait for the broker's acknowledgement, or say why not."""
    from confluent_kafka import KafkaError, KafkaException, Message, Producer

    client_config, refusals = _client_config(settings)
    producer = Producer(
        {
            **client_config,
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": int(timeout_s * 1000),
            "message.max.bytes": PRODUCE_MAX_BYTES,
            **QUIET_CLIENT,
        }
    )
    reports: list[KafkaError | None] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        reports.append(error)

    try:
        producer.produce(topic, key=key, value=value, on_delivery=delivered)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
            raise CliError(
                "PAYLOAD_TOO_LARGE",
                f"the {what} is {len(value)} bytes; a Kafka message may be at most "
                f"{PRODUCE_MAX_BYTES} bytes",
            ) from None
        reason = error.str() if isinstance(error, KafkaError) else str(exc)
        raise CliError("UNAVAILABLE", f"cannot produce to {topic}: {reason}") from None
    deadline = time.monotonic() + timeout_s + 5
    while producer.flush(_WATCH_S) and time.monotonic() < deadline:
        refusals.check()
    refusals.check()
    if not reports or reports[0] is not None:
        reason = reports[0].str() if reports and reports[0] is not None else "no delivery report"
        raise CliError("UNAVAILABLE", f"{what} not delivered to {topic}: {reason}")


def _framed(settings: Settings, message: Any, topic: str, what: str) -> bytes:
    """``message`` as a value of ``topic``: framed through the registry when one is set."""
    from schemas.serde import encode_message

    try:
        return encode_message(
            message,
            registry=settings.open_registry(),
            topic=topic,
            auto_register=settings.schema_registry_auto_register,
        )
    except WorkflowJobsError:
        raise
    except Exception as exc:  # the registry client's transport and API errors alike
        if not settings.schema_registry_url:
            raise
        raise CliError(
            "UNAVAILABLE",
            f"cannot frame the {what} with the schema registry at "
            f"{', '.join(map(shown_url, settings.schema_registry_url.split(',')))}: {exc}",
        ) from None


def cmd_produce_completion(args: argparse.Namespace, out: Output) -> int:
    """Complete a parked step through the completions topic, as a producer would."""
    settings = settings_from_env()
    completion = StepCompletion(
        job_id=uuid_argument(args.job_id, "job id"),
        step_name=required(args.step, "step"),
        principal=args.principal or "",
        request_id=args.request_id or str(uuid.uuid4()),
    )
    # Present even when empty: {} is a response (every field of the output type
    # left out), and Struct.update of nothing would leave the required field unset.
    completion.response.SetInParent()
    completion.response.update(json_object(args.response, "--response"))
    check_incoming(completion)
    value = _framed(settings, completion, settings.completions_topic, "completion")
    _deliver(
        settings,
        settings.completions_topic,
        key=completion.job_id.encode(),
        value=value,
        timeout_s=args.timeout,
        what="completion",
    )
    if out.as_json:
        out.json(
            {
                "job_id": completion.job_id,
                "request_id": completion.request_id,
                "topic": settings.completions_topic,
            }
        )
    else:
        out.print(
            f"produced a completion of step {escape(completion.step_name)!r} of job "
            f"[bold]{completion.job_id}[/] to {escape(settings.completions_topic)} (request id "
            f"{escape(completion.request_id)}); the answer is published to "
            f"{escape(settings.completion_results_topic)}"
        )
    return 0


def cmd_events(args: argparse.Namespace, out: Output) -> int:
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition

    from schemas.serde import EventDecoder, UndecodableMessage

    job = None if args.job is None else uuid_argument(args.job, "--job")
    settings = settings_from_env()
    decoder = EventDecoder(
        settings.open_registry(), topic=settings.events_topic, event_format=settings.event_format
    )
    client_config, refusals = _client_config(settings)
    consumer = Consumer(
        {
            **client_config,
            # Partitions are assigned by hand below and nothing is committed, so
            # this id never joins a group: reading moves nobody's offsets.
            "group.id": f"wfjobs-cli-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            # Reaching a partition's end is reported: where "only new events" begin.
            "enable.partition.eof": True,
            **QUIET_CLIENT,
        }
    )
    start = OFFSET_BEGINNING if args.from_beginning else OFFSET_END
    # Partitions read up to the end they had when we joined. Seeking to OFFSET_END
    # is not enough: Tansu answers it with an offset inside the partition's last
    # batch, so the rest of that batch would be printed as if it were new.
    caught_up: set[int | None] = set()
    seen: set[int] = set()
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    try:
        partitions = _partitions(
            consumer,
            settings.events_topic,
            bootstrap=client_config["bootstrap.servers"],
            timeout_s=min(15.0, args.timeout) if args.timeout else 15.0,
            refusals=refusals,
        )
        consumer.assign([TopicPartition(settings.events_topic, p, start) for p in partitions])
        if not out.as_json:
            out.errors.print(f"[dim]reading {escape(settings.events_topic)}; Ctrl-C to stop[/]")
        while args.max is None or len(seen) < args.max:
            if deadline is not None and time.monotonic() >= deadline:
                break
            message = consumer.poll(0.5)
            refusals.check()
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    caught_up.add(message.partition())
                else:
                    out.error("KAFKA", str(error))
                continue
            if not args.from_beginning and message.partition() not in caught_up:
                continue
            try:
                event = decoder.decode(message.value(), topic=message.topic())
            except UndecodableMessage as exc:
                out.error("UNDECODABLE", f"offset {message.offset()}: {exc.message}")
                continue
            # At-least-once delivery: a republished event carries the same id.
            if event.event_id in seen or (job is not None and event.job_id != job):
                continue
            seen.add(event.event_id)
            print_event(out, event)
    finally:
        # Ctrl-C goes on to main, which exits 130: a script must see that it was
        # interrupted, not that it ended as asked.
        consumer.close()
    return 0


def _partitions(
    consumer: Any, topic: str, *, bootstrap: str, timeout_s: float, refusals: _Refusals
) -> list[int]:
    """Every partition of ``topic``: read them all without joining a consumer group."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout_s
    try:
        # In short steps, so refused credentials end the wait at once.
        while True:
            try:
                metadata = consumer.list_topics(topic, timeout=_WATCH_S).topics.get(topic)
                break
            except KafkaException:
                refusals.check()
                if time.monotonic() >= deadline:
                    raise
    except KafkaException as exc:
        error = exc.args[0] if exc.args else exc
        reason = error.str() if hasattr(error, "str") else str(error)
        raise CliError(
            "UNAVAILABLE", f"cannot read {topic} from {bootstrap}: {reason} (is Kafka running?)"
        ) from None
    if metadata is None or metadata.error is not None or not metadata.partitions:
        reason = metadata.error if metadata is not None else "no metadata"
        raise CliError("NOT_FOUND", f"topic {topic} is not readable: {reason}")
    return sorted(metadata.partitions)
