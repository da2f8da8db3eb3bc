"""The request agent: ``workflow-run-requests`` into job rows.

One message, one outcome, decided in ``RequestHandler.handle``:

* the value cannot be decoded as a ``WorkflowRunRequest`` (framed through the
  registry or plain Protobuf), it breaks the message's rules (a job id that
  is not a UUID, an empty workflow name), its workflow name or trusted
  principal holds U+0000, or its input holds what no JSON
  column can store (a number that is NaN or infinite, text with U+0000) or
  the database refuses it: the same key and value go to the dead-letter topic
  with the reason in the ``x-wfjobs-dlq-reason`` header (a value too large to
  be copied there is left out, the reason saying where on this topic it stays);
* the named workflow is not stored, its definition does not compile, or the
  input does not fit its input type: a FAILED row with the reason (and its
  FAILED event), so whoever produced the request can look the job up by id;
* otherwise the stored workflow is submitted, idempotently on ``job_id``.

The last two are one call of ``streams.jobs.Jobs.submit``, the same submit the
HTTP verb makes, asked to record a refusal as a FAILED job instead of raising it.

The agent submits in batches (``handle_batch``): the requests that arrived
while the previous batch was being written, up to ``WFJOBS_REQUEST_BATCH_MAX``,
go to ``Jobs.submit_many`` as one statement and one commit, with no timer
between batches. Each request of a batch is decided as it would be alone (a
job_id repeated within or across batches is answered with the one job), and
the batch's offsets are acknowledged only after its commit. A batch the store
refuses for a reason other than an outage is handled again one request at a
time, so one bad request cannot hold back the others.

The offset is acknowledged only once that outcome is durable (the row
committed, or the dead letter acknowledged by the broker). When the store, the
registry or the broker cannot be reached the agent retries the same message in
place, with growing pauses, rather than skipping it; a crash meanwhile replays
the message, which the idempotent submit absorbs. A backlog of QUEUED jobs at
``WFJOBS_MAX_QUEUED_JOBS`` is waited out the same way: the request stays on
the topic until there is room (back-pressure, see ``streams.admission``). A
message that keeps hitting an unexpected error (a defect of this process, not
an outage) is dead-lettered after a few tries with that error as the reason, so
it cannot stall its partition forever.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, cast

from aiokafka.errors import MessageSizeTooLargeError  # type: ignore[import-untyped]

from schemas import defaults
from schemas.contract import WorkflowRunRequest, violations
from schemas.errors import InvalidArgument, UnstorableValue
from schemas.serde import RequestDecoder, UndecodableMessage
from store.tokens import malformed_principal
from streams.agents import STUCK_AFTER_S, AttemptClock, stopping_on_crash, worth_waiting_out
from streams.backoff import Backoff
from streams.convert import nul_refusal, storable_json
from streams.health import PartHealth
from streams.jobs import Jobs, SubmitRequest, Submitted
from streams.ownership import install_ownership
from streams.requests_dlq import DLQ_REASON_HEADER
from streams.topics import declare, raw_topic
from streams.tracing import TraceContext, headers_of

if TYPE_CHECKING:
    import faust
    from faust.types import EventT, StreamT

    from streams.runtime import Runtime

log = logging.getLogger(__name__)

OutcomeKind = Literal["submitted", "existing", "failed", "dead_lettered"]

# Sends one dead letter and returns once the broker acknowledged it.
DeadLetter = Callable[[bytes | None, bytes | None, str], Awaitable[None]]

_NUL = "\x00"

# A key longer than this is left off a dead letter that lost its value too.
_KEY_KEPT_MAX = 1024
# A dead letter's reason header is cut here: it must not make the letter too large.
_REASON_MAX = 4000


class Message(NamedTuple):
    """A message as the agent reads it: its key, its value, the W3C trace
    context its headers carried (None when absent or malformed), and where it
    sits on the request topic (``partition:offset``, "" when unknown)."""

    key: bytes | None
    value: bytes | None
    trace: TraceContext | None = None
    position: str = ""


class Decoded(NamedTuple):
    """A request that passed its rules, with its input as the JSON a job stores."""

    request: WorkflowRunRequest
    input: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: OutcomeKind
    job_id: uuid.UUID | None = None
    reason: str = ""


class RequestHandler:
    """Turns one request message into a durable outcome; knows nothing of Faust."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        decoder: RequestDecoder,
        dead_letter: DeadLetter,
        topic: str,
        jobs: Jobs | None = None,
        stuck_after_s: float = STUCK_AFTER_S,
    ) -> None:
        """``stuck_after_s``: how long one attempt may wait for an answer before
        ``health()`` calls the agent stuck."""
        self._clock = AttemptClock("request_agent", "a request batch", stuck_after_s=stuck_after_s)
        self._jobs = jobs if jobs is not None else Jobs(runtime)
        self._principal = runtime.settings.request_principal
        self._trust_principal = runtime.settings.trust_request_principal
        self._decoder = decoder
        self._dead_letter = dead_letter
        self._topic = topic

    async def handle(
        self,
        key: bytes | None,
        value: bytes | None,
        trace: TraceContext | None = None,
        position: str = "",
    ) -> Outcome:
        """One attempt; transient failures propagate so the caller can retry."""
        with self._clock.attempt():
            # In a worker thread, as a batch is (see handle_batch).
            decoded = await asyncio.to_thread(self._decode, value)
            if isinstance(decoded, str):
                return await self.reject(key, value, decoded, position)
            try:
                return await self._submit(decoded, trace)
            except UnstorableValue as exc:
                # The database refuses this request's values, now and on every try.
                return await self.reject(key, value, exc.message, position)

    async def handle_batch(self, messages: Sequence[Message]) -> list[Outcome]:
        """One attempt at many messages, one outcome each, in order.

        The requests are submitted in one statement before any dead letter is
        sent, so a retry after an outage sends no dead letter twice; transient
        failures propagate (nothing is acknowledged), and a retry's replay is
        absorbed by the idempotent submit.
        """
        with self._clock.attempt():
            return await self._handle_batch(messages)

    async def _handle_batch(self, messages: Sequence[Message]) -> list[Outcome]:
        values = [message.value for message in messages]
        # In a worker thread, one hop for the batch: a framed value may need the
        # registry (a blocking HTTP call, once per schema id), and checking and
        # converting an input is pure Python whose cost the producer chooses
        # (a good part of a second for a Struct of many values near 1 MB).
        decoded = await asyncio.to_thread(lambda: [self._decode(value) for value in values])
        requests = [
            (request, message.trace)
            for request, message in zip(decoded, messages, strict=True)
            if not isinstance(request, str)
        ]
        submitted = iter(
            await self._jobs.submit_many(
                [
                    SubmitRequest(
                        job_id=uuid.UUID(request.job_id),
                        input=input,
                        workflow_name=request.workflow_name,
                        owner=self.owner_of(request),
                        deadline_ms=request.deadline_ms or None,
                        trace=trace,
                    )
                    for (request, input), trace in requests
                ],
                record_refusals=True,
                via="kafka",
            )
            if requests
            else []
        )
        outcomes: list[Outcome] = []
        for message, request in zip(messages, decoded, strict=True):
            if isinstance(request, str):
                outcomes.append(
                    await self.reject(message.key, message.value, request, message.position)
                )
            else:
                outcomes.append(_outcome(next(submitted)))
        return outcomes

    def health(self) -> PartHealth:
        """Stuck while one attempt has waited past the bound for the store, registry or
        broker, or one request has kept failing that long (its dead letter refused).
        An outage or a full backlog is retried in place, which is not stuck."""
        return self._clock.health("request_waiting_s")

    def failed(self, why: str) -> None:
        """A try at the request in hand failed, not for an outage."""
        self._clock.failed("a request", why)

    def done(self) -> None:
        """The request in hand is handled."""
        self._clock.done()

    def _decode(self, value: bytes | None) -> Decoded | str:
        """The request and its input, or why it goes to the dead-letter topic."""
        try:
            request = self._decoder.decode(value, topic=self._topic)
        except UndecodableMessage as exc:
            return exc.message
        problems = violations(request)
        if problems:
            return "; ".join(problems)
        # Text no column can store, named here: the database would only say
        # that some text field of the batch held it.
        if _NUL in request.workflow_name:
            return nul_refusal("workflow_name").message
        if _NUL in self.owner_of(request):
            return nul_refusal("principal").message
        if self._trust_principal and request.principal:
            malformed = malformed_principal(request.principal)
            if malformed is not None:
                return malformed
        try:
            return Decoded(request, storable_json(request.input, "input"))
        except InvalidArgument as exc:
            return exc.message

    async def reject(
        self, key: bytes | None, value: bytes | None, reason: str, position: str = ""
    ) -> Outcome:
        """Send the message to the dead-letter topic with ``reason``.

        A message too large to be copied there (the dead letter also carries
        the reason) is dead-lettered without its value, the reason saying where
        it stays: retrying would be refused the same way forever, holding the
        partition.
        """
        reason = reason if len(reason) <= _REASON_MAX else reason[:_REASON_MAX] + "..."
        log.warning("request to the dead-letter topic: %s", reason)
        try:
            await self._dead_letter(key, value, reason)
        except Exception as exc:
            if not _too_large(exc) or (not value and not key):
                raise
            kept_key = key if key is None or len(key) <= _KEY_KEPT_MAX else None
            left_out = "its value was" if kept_key is key else "its key and value were"
            size = len(key or b"") + len(value or b"")
            where = f" at {position}" if position else ""
            reason = (
                f"{reason}; the request ({size} bytes) is too large for the dead-letter topic, "
                f"so {left_out} left out: it stays on {self._topic}{where}"
            )
            log.error("request to the dead-letter topic without its value: %s", reason)
            await self._dead_letter(kept_key, None, reason)
        return Outcome("dead_lettered", reason=reason)

    def owner_of(self, request: WorkflowRunRequest) -> str:
        """Who owns the job a request submits: a producer sends no token, so
        the configured principal, or the request's own where that is trusted."""
        if self._trust_principal and request.principal:
            return request.principal
        return self._principal

    async def _submit(self, decoded: Decoded, trace: TraceContext | None) -> Outcome:
        # A full backlog raises ResourceExhausted, which the caller waits out
        # like an outage: the request stays on the topic until there is room.
        request = decoded.request
        submitted = await self._jobs.submit(
            job_id=uuid.UUID(request.job_id),
            input=decoded.input,
            workflow_name=request.workflow_name,
            record_refusals=True,
            owner=self.owner_of(request),
            deadline_ms=request.deadline_ms or None,
            trace=trace,
            via="kafka",
        )
        return _outcome(submitted)


def _too_large(exc: BaseException) -> bool:
    """The producer (before sending) or the broker refused a record for its size;
    Faust wraps the producer's refusal in its own error."""
    return isinstance(exc, MessageSizeTooLargeError) or isinstance(
        exc.__cause__, MessageSizeTooLargeError
    )


def _outcome(submitted: Submitted) -> Outcome:
    kind: OutcomeKind = "failed" if submitted.refused else "submitted"
    if not submitted.created:
        kind = "existing"
    return Outcome(kind, submitted.job.job_id, submitted.refused)


async def handle_until_done(
    handler: RequestHandler,
    key: bytes | None,
    value: bytes | None,
    *,
    base_s: float = 0.2,
    cap_s: float = 30.0,
    max_defects: int = 3,
    trace: TraceContext | None = None,
    position: str = "",
) -> Outcome:
    """``handler.handle`` until it succeeds: an outage is waited out, never skipped.

    An exception that is not an outage is a defect here, not in the message:
    it is retried too (it may be a passing one), and after ``max_defects`` of
    them the message is dead-lettered with the error as its reason.
    """
    backoff = Backoff(base_s, max(base_s, cap_s))
    defects = 0
    last_defect = ""
    try:
        while True:
            try:
                if defects >= max_defects:
                    return await handler.reject(
                        key,
                        value,
                        f"internal error while handling the request: {last_defect}",
                        position,
                    )
                return await handler.handle(key, value, trace, position=position)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                pause = backoff.next()
                failures = backoff.failures
                if worth_waiting_out(exc):
                    log.warning(
                        "request not handled (%s: %s); retrying in %.1fs (failure %d)",
                        type(exc).__name__,
                        exc,
                        pause,
                        failures,
                    )
                else:
                    defects += 1
                    last_defect = f"{type(exc).__name__}: {exc}"
                    # Past its few tries even the dead letter may be refused
                    # (for good, say by an ACL): health says so once it lasts.
                    handler.failed(last_defect)
                    log.exception(
                        "request not handled; retrying in %.1fs (failure %d)", pause, failures
                    )
            await asyncio.sleep(pause)
    finally:
        handler.done()


async def handle_batch_until_done(
    handler: RequestHandler,
    messages: Sequence[Message],
    *,
    base_s: float = 0.2,
    cap_s: float = 30.0,
    max_defects: int = 3,
) -> list[Outcome]:
    """``handler.handle_batch`` until it succeeds: an outage is waited out, never skipped.

    Any other failure is handled again one message at a time
    (``handle_until_done``), so a request that trips a defect is retried and
    dead-lettered on its own while the rest of the batch is submitted.
    """
    backoff = Backoff(base_s, max(base_s, cap_s))
    while True:
        try:
            return await handler.handle_batch(messages)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not worth_waiting_out(exc):
                if isinstance(exc, UnstorableValue):
                    # A value the database refuses: its request is dead-lettered alone.
                    log.warning(
                        "a batch of %d requests was refused (%s); one at a time now",
                        len(messages),
                        exc,
                    )
                else:
                    log.exception("a batch of %d requests failed; one at a time now", len(messages))
                return [
                    await handle_until_done(
                        handler,
                        message.key,
                        message.value,
                        base_s=base_s,
                        cap_s=cap_s,
                        max_defects=max_defects,
                        trace=message.trace,
                        position=message.position,
                    )
                    for message in messages
                ]
            pause = backoff.next()
            log.warning(
                "%d requests not handled (%s: %s); retrying in %.1fs (failure %d)",
                len(messages),
                type(exc).__name__,
                exc,
                pause,
                backoff.failures,
            )
        await asyncio.sleep(pause)


def register_request_agent(app: faust.App, runtime: Runtime) -> None:
    """Attach the agent consuming the requests topic to ``app``."""
    settings = runtime.settings
    requests = raw_topic(app, settings, settings.requests_topic)
    decoder = RequestDecoder(runtime.schema_registry, topic=settings.requests_topic)

    async def dead_letter(key: bytes | None, value: bytes | None, reason: str) -> None:
        # Waits for the broker's acknowledgement: the request's own offset must
        # not move past a dead letter that was never written.
        await app.producer.send_and_wait(
            settings.dlq_topic,
            key,
            value,
            None,
            None,
            [(DLQ_REASON_HEADER, reason.encode("utf-8", "replace"))],
        )

    handler = RequestHandler(
        runtime, decoder=decoder, dead_letter=dead_letter, topic=settings.requests_topic
    )
    runtime.register_health(handler.health)

    async def consume(stream: StreamT[bytes]) -> None:
        await declare(app, settings, settings.dlq_topic, settings.events_topic)
        await runtime.wait_ready()
        # Manual acks: Faust acks an event when the agent asks for the next one
        # and also when the agent is cancelled mid-event; only the explicit ack
        # below, after the outcome is durable, may move the offset.
        manual = cast(Any, stream).noack()
        # Holds what arrives while a batch is written; full, it stops the
        # reading, so at most two batches are read and not yet acknowledged.
        waiting: asyncio.Queue[EventT[bytes]] = asyncio.Queue(settings.request_batch_max)

        async def read() -> None:
            event: EventT[bytes]
            async for event in manual.events():
                await waiting.put(event)

        async def submit() -> None:
            while True:
                batch = [await waiting.get()]
                while len(batch) < settings.request_batch_max and not waiting.empty():
                    batch.append(waiting.get_nowait())
                outcomes = await handle_batch_until_done(
                    handler, [_message(event) for event in batch], cap_s=settings.store_retry_max_s
                )
                for event, outcome in zip(batch, outcomes, strict=True):
                    log.debug("request at offset %s: %s", event.message.offset, outcome.kind)
                    await manual.ack(event)

        # Either task failing stops the other and fails the agent, which stops
        # the process (streams.agents).
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(read())
            tasks.create_task(submit())

    app.agent(requests, name=defaults.REQUESTS_TOPIC)(
        stopping_on_crash(app, "request", consume, grace_s=settings.shutdown_grace_s)
    )
    # Every partition of the topic must have an owner in the group, or no
    # request on it is ever submitted (see streams.ownership).
    install_ownership(app, runtime, settings.requests_topic)


def _message(event: EventT[bytes]) -> Message:
    key = event.key if isinstance(event.key, bytes) or event.key is None else None
    value = event.value if isinstance(event.value, bytes) else None
    position = f"{event.message.partition}:{event.message.offset}"
    return Message(key, value, headers_of(event.message.headers), position)


__all__ = [
    "Message",
    "Outcome",
    "RequestHandler",
    "handle_batch_until_done",
    "handle_until_done",
    "register_request_agent",
]
