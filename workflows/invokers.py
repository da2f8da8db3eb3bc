"""Step invokers: in-process Python handlers and remote gRPC services.

Which one runs a step is decided per call: a method with a handler registered
in the registry the runner was given runs in-process, whatever the target says
(so a definition pointing at a service can be exercised locally). Otherwise
the step's ``target`` must be ``host:port`` and the method is called there over
gRPC; ``"local"`` or no target with no handler is a non-retryable defect.

Handlers::

    registry = HandlerRegistry()

    @registry.handler("jobs.test.Tokenizer/Tokenize")
    async def tokenize(request: Message, ctx: StepContext) -> Message:
        return ctx.response_type(ids=[len(word) for word in request.text.split()])

A handler receives the request as a message of the definition's own descriptor
pool and may return a message of the response type (from that pool via
``ctx.response_type``, or a generated class with the same full name), or a
proto3 JSON dict. It must be idempotent on ``ctx.idempotency_key``
(``job_id:step_name``): a step can run again when its checkpoint did not land.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import math
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import DecodeError, Message

from workflows.failures import FailureKind, StepFailure, channel_closed_failure, transport_failure
from workflows.protojson import MessageError
from workflows.steps import Step
from workflows.targets import ALLOW_ALL, TargetPolicy, TlsRule, tls_for

log = logging.getLogger(__name__)

Handler = Callable[[Message, "StepContext"], Awaitable[Message | Mapping[str, Any]]]
# Entered around one step call; yields extra metadata for a remote call (the
# service's trace context, say). The engine knows nothing of what it records.
StepObserver = Callable[[Step, "StepContext"], AbstractContextManager[Sequence[tuple[str, str]]]]
H = TypeVar("H", bound=Handler)

# Reports a step's progress: (step name, fraction from 0 to 1, message).
ProgressSink = Callable[[str, float, str], None]

# Longer progress messages are cut: progress is a status line, not a log.
MAX_PROGRESS_MESSAGE_CHARS = 500
# The initial metadata a remote step may send to report its progress.
PROGRESS_HEADER = "wfjobs-progress"
PROGRESS_MESSAGE_HEADER = "wfjobs-progress-message"

_METHOD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*/[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class StepContext:
    """What a handler knows about the call it serves.

    ``expires_at`` is the segment's deadline on ``clock``; ``deadline`` is the
    time left, in seconds, when read. ``progress`` tells watchers how far the
    step has got.
    """

    job_id: str
    step_name: str
    attempt: int
    expires_at: float
    response_type: type[Message]
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    progress_sink: ProgressSink | None = field(default=None, repr=False)

    def progress(self, fraction: float, message: str = "") -> None:
        """Report how far the step has got: ``fraction`` from 0 to 1, and a short message.

        Never blocks and never writes on its own: the worker keeps the latest
        report and stores it at most once per ``WFJOBS_PROGRESS_INTERVAL_S``,
        so calling it in a tight loop is fine. A fraction outside 0..1 (or not
        a number) raises ``ValueError``: a defect of the handler.
        """
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise ValueError(f"progress must be a number from 0 to 1, got {fraction!r}")
        value = float(fraction)
        if not math.isfinite(value) or not 0.0 <= value <= 1.0:
            raise ValueError(f"progress must be a number from 0 to 1, got {fraction!r}")
        if self.progress_sink is not None:
            self.progress_sink(self.step_name, value, str(message)[:MAX_PROGRESS_MESSAGE_CHARS])

    @property
    def idempotency_key(self) -> str:
        return f"{self.job_id}:{self.step_name}"

    @property
    def deadline(self) -> float:
        return max(0.0, self.expires_at - self.clock())


class HandlerRegistry:
    """In-process handlers by method name (``package.Service/Method``)."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def handler(self, method: str) -> Callable[[H], H]:
        """Decorator: register the decorated async function for ``method``."""

        def register(function: H) -> H:
            self.register(method, function)
            return function

        return register

    def register(self, method: str, function: Handler, *, replace: bool = False) -> None:
        if not isinstance(method, str) or not _METHOD.fullmatch(method):
            raise ValueError(
                f"a handler method must look like package.Service/Method, got {method!r}"
            )
        if not inspect.iscoroutinefunction(function):
            raise TypeError(f"the handler for {method} must be an async function")
        if method in self._handlers and not replace and self._handlers[method] is not function:
            raise ValueError(f"a handler for {method} is already registered")
        self._handlers[method] = function

    def get(self, method: str) -> Handler | None:
        return self._handlers.get(method)

    def methods(self) -> list[str]:
        return sorted(self._handlers)

    def __contains__(self, method: object) -> bool:
        return method in self._handlers

    def __len__(self) -> int:
        return len(self._handlers)


# The registry that the module-level ``handler`` decorator fills. Handler modules
# loaded from configuration may use it; code that can pass a registry should.
default_registry = HandlerRegistry()
handler = default_registry.handler


def load_handler_modules(
    names: Iterable[str] | str, registry: HandlerRegistry | None = None
) -> list[ModuleType]:
    """Import the configured handler modules (a list, or one comma-separated string).

    A module registers its handlers either with the module-level ``handler``
    decorator on import, or by defining ``register_handlers(registry)``, which
    is called with ``registry`` (or :data:`default_registry`).
    """
    if isinstance(names, str):
        names = names.split(",")
    target = registry if registry is not None else default_registry
    modules: list[ModuleType] = []
    for raw in names:
        name = raw.strip()
        if not name:
            continue
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            raise ImportError(f"handler module {name!r} cannot be imported: {exc}") from exc
        register = getattr(module, "register_handlers", None)
        if callable(register):
            try:
                register(target)
            except Exception as exc:
                # An ImportError, as for a module that cannot be imported: the
                # worker refuses to start with this one line, not a traceback.
                raise ImportError(
                    f"handler module {name!r} cannot register its handlers: {exc}"
                ) from exc
        modules.append(module)
    return modules


class GrpcChannels:
    """``grpc.aio`` channels by target, at most ``max_channels``, and callables per method.

    ``policy`` lists the targets a channel may be opened to (by default any);
    a call to another fails the step before anything is dialled. ``tls`` picks
    the credentials per target (``workflows.targets``); a target no rule
    matches is called over plaintext. The least recently used channel is
    closed when one more would pass ``max_channels``: calls already running on
    it get ``close_grace_s`` to finish.

    Channels belong to the event loop they were made on; a call from another
    loop gets a fresh channel rather than a broken one.
    """

    def __init__(
        self,
        options: Iterable[tuple[str, Any]] = (),
        *,
        policy: TargetPolicy = ALLOW_ALL,
        tls: Iterable[TlsRule] = (),
        max_channels: int = 64,
        close_grace_s: float = 30.0,
    ) -> None:
        if max_channels < 1:
            raise ValueError("max_channels must be at least 1")
        self._options = tuple(options)
        self.policy = policy
        self._tls = tuple(tls)
        self.max_channels = max_channels
        self._close_grace_s = close_grace_s
        self._channels: OrderedDict[str, tuple[asyncio.AbstractEventLoop, grpc.aio.Channel]] = (
            OrderedDict()
        )
        self._calls: dict[tuple[str, str], grpc.aio.UnaryUnaryMultiCallable] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._channels)

    def unary(self, target: str, path: str) -> grpc.aio.UnaryUnaryMultiCallable:
        """The method at ``path`` on ``target``; it answers the response's bytes.

        The caller parses them: steps of different definitions (a workflow's
        next version, say) call the same method with response classes of their
        own pools, which may not even declare the same fields.
        """
        loop = asyncio.get_running_loop()
        held = self._channels.get(target)
        if held is None or held[0] is not loop:
            if not self.policy.allows(target):
                raise TargetRefused(self.policy.refusal(target))
            if held is not None:
                self._retire(target)
            channel = self._open(target)
            self._channels[target] = (loop, channel)
            while len(self._channels) > self.max_channels:
                self._retire(next(iter(self._channels)))
        else:
            channel = held[1]
            self._channels.move_to_end(target)
        key = (target, path)
        call = self._calls.get(key)
        if call is None:
            call = channel.unary_unary(path, request_serializer=_serialize)
            self._calls[key] = call
        return call

    def _open(self, target: str) -> grpc.aio.Channel:
        rule = tls_for(self._tls, target)
        # The scheme is spelled out so gRPC resolves the host by DNS, whatever
        # resolver schemes it has registered besides those the policy refuses.
        address = f"dns:///{target}"
        if rule is None:
            return grpc.aio.insecure_channel(address, options=self._options)
        options = self._options
        if rule.authority:
            options += (("grpc.ssl_target_name_override", rule.authority),)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=rule.ca, private_key=rule.key, certificate_chain=rule.cert
        )
        return grpc.aio.secure_channel(address, credentials, options=options)

    def _retire(self, target: str) -> None:
        loop, channel = self._channels.pop(target)
        self._calls = {key: call for key, call in self._calls.items() if key[0] != target}
        if loop.is_closed():
            return
        task = loop.create_task(channel.close(self._close_grace_s))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        channels = [channel for _, channel in self._channels.values()]
        self._channels.clear()
        self._calls.clear()
        for channel in channels:
            await channel.close()
        closing = list(self._closing)
        for task in closing:
            task.cancel()
        if closing:
            await asyncio.gather(*closing, return_exceptions=True)


class TargetRefused(Exception):
    """A step's target is not on the allow-list; nothing was dialled."""


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


# Used when the runner is given no channel cache of its own.
default_channels = GrpcChannels()


async def invoke(
    step: Step,
    request: Message,
    context: StepContext,
    registry: HandlerRegistry,
    channels: GrpcChannels,
    *,
    metadata: Sequence[tuple[str, str]] = (),
) -> Message:
    """Run one step: its in-process handler if registered, else its gRPC target.

    ``metadata`` goes with a remote call, after the job's own keys.
    """
    function = registry.get(step.method)
    if function is not None:
        return coerce_response(await function(request, context), step)
    if step.remote_target is None:
        raise StepFailure(
            FailureKind.NON_RETRYABLE,
            step.name,
            f"no in-process handler is registered for {step.method} and the step has "
            "no host:port target; load the module that registers it, or give the step a target",
        )
    target = step.remote_target
    try:
        call = channels.unary(target, step.grpc_path)
    except TargetRefused as exc:
        raise StepFailure(FailureKind.NON_RETRYABLE, step.name, str(exc)) from None
    sent = (
        ("x-job-id", context.job_id),
        ("x-step-name", context.step_name),
        ("x-attempt", str(context.attempt)),
        ("x-idempotency-key", context.idempotency_key),
        *metadata,
    )
    rpc = call(request, timeout=max(context.deadline, 0.001), metadata=sent)
    reporting = (
        asyncio.ensure_future(_remote_progress(rpc, context))
        if context.progress_sink is not None
        else None
    )
    try:
        answer: bytes = await rpc
    except grpc.RpcError as exc:
        # The transport's text stays in the log, for operators only.
        log.warning("step %r: call to %s failed: %s", step.name, target, exc)
        raise transport_failure(exc, step.name, target) from None
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is None or current.cancelling():
            raise
        # grpc.aio raises a call it cancelled itself (its channel was retired
        # and closed) as a CancelledError; the step was not cancelled.
        raise channel_closed_failure(step.name, target) from None
    finally:
        if reporting is not None:
            reporting.cancel()
    try:
        return step.response_type.FromString(answer)
    except DecodeError:
        raise StepFailure(
            FailureKind.NON_RETRYABLE,
            step.name,
            f"{target} answered bytes that do not parse as "
            f"{step.response_type.DESCRIPTOR.full_name}",
        ) from None


async def _remote_progress(rpc: Any, context: StepContext) -> None:
    """The progress a remote step sends in its initial metadata, reported as its own.

    A unary call has one moment to speak before its answer: its headers. A
    service that takes long can send them early (``send_initial_metadata``)
    with ``wfjobs-progress`` (a fraction from 0 to 1) and, optionally,
    ``wfjobs-progress-message``. A value that is not a fraction is ignored:
    a remote service's headers must not fail its step.
    """
    try:
        headers = await rpc.initial_metadata()
    except (grpc.RpcError, asyncio.CancelledError):
        return
    values = {str(key): value for key, value in headers or ()}
    raw = values.get(PROGRESS_HEADER)
    if raw is None:
        return
    message = values.get(PROGRESS_MESSAGE_HEADER, "")
    try:
        context.progress(float(raw), message if isinstance(message, str) else "")
    except ValueError:
        log.debug("step %r: ignored progress header %r", context.step_name, raw)


def coerce_response(value: Any, step: Step) -> Message:
    """Accept a handler's answer in any of the forms the module docstring allows."""
    expected = step.response_type
    if isinstance(value, expected):
        return value
    full_name = expected.DESCRIPTOR.full_name
    if isinstance(value, Message):
        if value.DESCRIPTOR.full_name == full_name:
            return expected.FromString(value.SerializeToString())
        raise StepFailure(
            FailureKind.NON_RETRYABLE,
            step.name,
            f"the handler for {step.method} returned a {value.DESCRIPTOR.full_name}, "
            f"expected {full_name}",
        )
    if isinstance(value, Mapping):
        try:
            return step.response_codec.decode_strict(value, "response")
        except MessageError as exc:
            raise StepFailure(
                FailureKind.NON_RETRYABLE,
                step.name,
                f"the handler for {step.method} returned a dict that is not a {full_name}: {exc}",
            ) from None
    raise StepFailure(
        FailureKind.NON_RETRYABLE,
        step.name,
        f"the handler for {step.method} returned {type(value).__name__}, expected {full_name}",
    )


__all__ = [
    "GrpcChannels",
    "Handler",
    "HandlerRegistry",
    "StepContext",
    "StepObserver",
    "TargetRefused",
    "coerce_response",
    "default_channels",
    "default_registry",
    "handler",
    "invoke",
    "load_handler_modules",
]
