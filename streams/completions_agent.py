"""The completions agent: ``workflow-step-completions`` into complete-step calls.

A ``StepCompletion`` on the topic is exactly a complete-step call made over
HTTP: the same ``streams.jobs.Jobs.complete_step``, the same gate under the row
lock, the same outcomes. Each message is answered with one
``StepCompletionResult`` on ``workflow-step-completion-results``, keyed by the
job id and echoing the message's ``request_id`` (an echoed field that breaks
its rules is cut to 200 characters, and the message to 2000, so every answer
fits what the producer may send):

* COMPLETED, ALREADY_DONE, REJECTED: the gate's own answers (REJECTED: the
  response broke the step's rules and the job FAILED with that verdict);
* WRONG_STATE: the job is not parked on that step (a worker's step never
  is), or the step's fallback was taken when its timeout passed and this
  response was not used;
* NOT_FOUND: no such job, or not one the completion's principal may reach,
  or no such step in the job's workflow;
* INVALID: the value is not a StepCompletion, breaks its rules, or names a
  response that does not fit the step. The agent answers and moves on. Also
  the answer to a completion that kept hitting an error of this process (a
  defect, not an outage) for a few tries: the error in its message, its ids
  echoed as ever.

Who completes: a producer sends no token, so a completion acts as
``WFJOBS_REQUEST_PRINCIPAL``, or as its own ``principal`` where
``WFJOBS_TRUST_REQUEST_PRINCIPAL`` is on, exactly as a request submits; it
reaches only that principal's jobs.

The offset is acknowledged once the result is acknowledged by the broker. A
store, registry or broker outage is waited out on the same message; a crash
between the completion and its result replays the message, which then answers
ALREADY_DONE (WRONG_STATE after a REJECTED one: its job has FAILED).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from schemas import defaults
from schemas.contract import StepCompletion, StepCompletionResult, violations
from schemas.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    WrongState,
)
from schemas.serde import MessageDecoder, ProtobufFramer, UndecodableMessage
from store.tokens import malformed_principal
from streams.agents import STUCK_AFTER_S, AttemptClock, stopping_on_crash, worth_waiting_out
from streams.backoff import Backoff
from streams.convert import storable_json
from streams.health import PartHealth
from streams.jobs import Jobs
from streams.topics import declare, raw_topic

if TYPE_CHECKING:
    import faust
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from faust.types import EventT, StreamT

    from streams.runtime import Runtime

log = logging.getLogger(__name__)

Outcome = StepCompletionResult.Outcome

# Sends one result (key, value) and returns once the broker acknowledged it.
Publish = Callable[[bytes, bytes], Awaitable[None]]

# The longest step_name or request_id a StepCompletion may carry (a job id is shorter).
_ECHO_MAX = 200
_MESSAGE_MAX = 2000


class CompletionHandler:
    """Turns one completion message into its result; knows nothing of Faust."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        decoder: MessageDecoder[StepCompletion],
        jobs: Jobs | None = None,
        stuck_after_s: float = STUCK_AFTER_S,
    ) -> None:
        """``stuck_after_s``: how long one attempt may wait for an answer before
        ``health()`` calls the agent stuck."""
        self._clock = AttemptClock("completions_agent", "a completion", stuck_after_s=stuck_after_s)
        self._jobs = jobs if jobs is not None else Jobs(runtime)
        self._principal = runtime.settings.request_principal
        self._trust_principal = runtime.settings.trust_request_principal
        self._decoder = decoder

    def principal_of(self, completion: StepCompletion) -> str:
        """Whose jobs a completion reaches: the configured principal, or its own
        where that is trusted (the request topic's rule)."""
        if self._trust_principal and completion.principal:
            return completion.principal
        return self._principal

    async def handle(self, value: bytes | None) -> StepCompletionResult:
        """One attempt; outages propagate so the caller can wait them out."""
        with self._clock.attempt():
            # In a worker thread: the writer schema may need the registry (a
            # blocking HTTP call), and converting the response is pure Python whose
            # cost the producer chooses (a third of a second for many values near 1 MB).
            decoded = await asyncio.to_thread(self._decode, value)
            if isinstance(decoded, StepCompletionResult):
                return decoded
            return await self._complete(*decoded)

    async def internal_error(self, value: bytes | None, error: str) -> StepCompletionResult:
        """The INVALID answer to a completion that kept hitting ``error``, a defect:
        echoing its ids where the value decodes, so its producer can match it."""

        def echoed() -> StepCompletion:
            try:
                return self._decoder.decode(value)
            except Exception:
                # The defect may lie in decoding itself: then there is nothing to echo.
                return StepCompletion()

        # In a worker thread, as in handle: the writer schema may need the registry.
        completion = await asyncio.to_thread(echoed)
        return _answer(completion, Outcome.INVALID, f"internal error while completing: {error}")

    def health(self) -> PartHealth:
        """Stuck while one attempt has waited past the bound for the store or registry,
        or one completion has kept failing that long (its answer refused). An
        outage is retried in place, which is not stuck."""
        return self._clock.health("completion_waiting_s")

    def failed(self, why: str) -> None:
        """A try at the completion in hand failed, not for an outage."""
        self._clock.failed("a completion", why)

    def done(self) -> None:
        """The completion in hand is answered."""
        self._clock.done()

    def _decode(
        self, value: bytes | None
    ) -> tuple[StepCompletion, dict[str, Any]] | StepCompletionResult:
        """The completion and its response as JSON, or the INVALID answer."""
        try:
            completion = self._decoder.decode(value)
        except UndecodableMessage as exc:
            return _answer(StepCompletion(), Outcome.INVALID, exc.message)
        problems = violations(completion)
        if problems:
            return _answer(completion, Outcome.INVALID, "; ".join(problems))
        if self._trust_principal and completion.principal:
            malformed = malformed_principal(completion.principal)
            if malformed is not None:
                return _answer(completion, Outcome.INVALID, malformed)
        try:
            return completion, storable_json(completion.response, "response")
        except InvalidArgument as exc:
            return _answer(completion, Outcome.INVALID, exc.message)

    async def _complete(
        self, completion: StepCompletion, response: dict[str, Any]
    ) -> StepCompletionResult:
        try:
            result = await self._jobs.complete_step(
                job_id=uuid.UUID(completion.job_id),
                step_name=completion.step_name,
                response=response,
                owner=self.principal_of(completion),
            )
        except NotFound as exc:
            return _answer(completion, Outcome.NOT_FOUND, exc.message)
        except (WrongState, FailedPrecondition) as exc:
            return _answer(completion, Outcome.WRONG_STATE, exc.message)
        except InvalidArgument as exc:
            return _answer(completion, Outcome.INVALID, exc.message)
        return _answer(completion, Outcome.Value(result.outcome), result.message)


def _answer(completion: StepCompletion, outcome: int, message: str) -> StepCompletionResult:
    # Echoed fields that broke their rules are cut to the longest the contract
    # accepts: a completion the broker took, echoed whole and keyed by its job
    # id, could exceed what the producer may send, and be refused on every try.
    return StepCompletionResult(
        job_id=completion.job_id[:_ECHO_MAX],
        step_name=completion.step_name[:_ECHO_MAX],
        request_id=completion.request_id[:_ECHO_MAX],
        outcome=outcome,  # type: ignore[arg-type]
        message=message[:_MESSAGE_MAX],
    )


class ResultEncoder:
    """A result as a value of the results topic: framed through the registry when
    one is configured, plain Protobuf otherwise."""

    def __init__(
        self, registry: SchemaRegistryClient | None, topic: str, *, auto_register: bool = True
    ) -> None:
        self._framer = (
            ProtobufFramer(StepCompletionResult, registry, topic, auto_register=auto_register)
            if registry is not None
            else None
        )

    async def encode(self, result: StepCompletionResult) -> bytes:
        if self._framer is None:
            return result.SerializeToString(deterministic=True)
        # The first frame registers (or looks up) the schema: a blocking HTTP call.
        return await asyncio.to_thread(self._framer.frame_message, result)


async def answer_until_done(
    handler: CompletionHandler,
    encoder: ResultEncoder,
    publish: Publish,
    value: bytes | None,
    *,
    base_s: float = 0.2,
    cap_s: float = 30.0,
    max_defects: int = 3,
) -> StepCompletionResult:
    """Handle ``value`` and publish its result, waiting out outages.

    An error that is not an outage is retried a few times and then answered
    INVALID with the error, so one message cannot stall its partition.
    """
    backoff = Backoff(base_s, max(base_s, cap_s))
    defects = 0
    last_defect = ""
    result: StepCompletionResult | None = None
    try:
        while True:
            try:
                if result is None:
                    if defects >= max_defects:
                        result = await handler.internal_error(value, last_defect)
                    else:
                        result = await handler.handle(value)
                key = result.job_id.encode() if result.job_id else b""
                await publish(key, await encoder.encode(result))
                return result
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                pause = backoff.next()
                if worth_waiting_out(exc):
                    log.warning(
                        "completion not answered (%s: %s); retrying in %.1fs",
                        type(exc).__name__,
                        exc,
                        pause,
                    )
                else:
                    defects += 1
                    last_defect = f"{type(exc).__name__}: {exc}"
                    # An answer the broker refuses for good is tried again
                    # forever: health says so once it lasts.
                    handler.failed(last_defect)
                    log.exception("completion not answered; retrying in %.1fs", pause)
            await asyncio.sleep(pause)
    finally:
        handler.done()


def register_completions_agent(app: faust.App, runtime: Runtime) -> None:
    """Attach the agent consuming the completions topic to ``app``."""
    settings = runtime.settings
    completions = raw_topic(app, settings, settings.completions_topic)
    registry = runtime.schema_registry
    handler = CompletionHandler(
        runtime,
        decoder=MessageDecoder(StepCompletion, registry, topic=settings.completions_topic),
    )
    runtime.register_health(handler.health)
    encoder = ResultEncoder(
        registry,
        settings.completion_results_topic,
        auto_register=settings.schema_registry_auto_register,
    )

    async def publish(key: bytes, value: bytes) -> None:
        await app.producer.send_and_wait(
            settings.completion_results_topic, key or None, value, None, None, None
        )

    async def consume(stream: StreamT[bytes]) -> None:
        await declare(app, settings, settings.completion_results_topic)
        await runtime.wait_ready()
        # Manual acks, as the request agent: only a published result moves the offset.
        manual = cast(Any, stream).noack()
        event: EventT[bytes]
        async for event in manual.events():
            value = event.value if isinstance(event.value, bytes) else None
            result = await answer_until_done(
                handler, encoder, publish, value, cap_s=settings.store_retry_max_s
            )
            log.debug(
                "completion at offset %s: %s",
                event.message.offset,
                Outcome.Name(result.outcome),
            )
            await manual.ack(event)

    app.agent(completions, name=defaults.COMPLETIONS_TOPIC)(
        stopping_on_crash(app, "completions", consume, grace_s=settings.shutdown_grace_s)
    )


__all__ = [
    "CompletionHandler",
    "ResultEncoder",
    "answer_until_done",
    "register_completions_agent",
]
