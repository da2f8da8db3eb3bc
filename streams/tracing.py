"""OpenTelemetry traces of a job, when ``WFJOBS_TRACING=on``; nothing otherwise.

Off (the default) no ``Tracing`` exists: the runtime holds ``None``, every
place that would make a span tests that once, and OpenTelemetry is not even
imported, so the service runs without the ``tracing`` extra installed.

One job is one trace, whichever processes it crosses. Its W3C context is
stored on the job's row at submit (``traceparent``, ``tracestate``), and every
later span of the job continues from it:

* ``submit`` - one per submitted job, over HTTP or from the request topic,
  child of the ``traceparent`` the client sent (a new trace without one);
  its context is what the row stores;
* ``claim`` - one per claimed job, spanning the claim statement that took it;
* ``segment`` - the run of steps between a claim and its settle, with a
  ``step <name>`` span around each step call, whose context travels in the
  gRPC metadata of a remote call;
* ``publish`` - one per event the relay produces, whose context travels in
  the event's Kafka headers, so a consumer continues the same trace.

Malformed incoming context is ignored, as the W3C spec asks: the job starts
a new trace, and the request is never refused for it.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, TracerProvider

    from store.records import ClaimedJob
    from workflows.invokers import StepContext
    from workflows.steps import Step

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# The extra that holds OpenTelemetry, named by every refusal to trace without it.
EXTRA = "workflow-jobs[tracing]"
EXPORTERS = ("otlp", "console", "none")

# version-trace_id-parent_id-flags, lowercase hex; a later version may append
# fields after a dash, version 00 may not (W3C Trace Context, section 3.2).
# Those fields are header text: printable ASCII. Anything else (a NUL from a
# Kafka header, which no text column stores) would refuse the whole submit.
_TRACEPARENT = re.compile(
    r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[\x20-\x7e]*)?"
)
# The spec asks vendors to pass on at least 512 characters of tracestate; a
# longer one is dropped whole rather than cut mid-entry.
_TRACESTATE_MAX = 512
_TRACESTATE = re.compile(r"[\x20-\x7e]*")


@dataclass(frozen=True, slots=True)
class TraceContext:
    """A W3C trace context as its two headers carry it."""

    traceparent: str
    tracestate: str | None = None

    def headers(self) -> dict[str, str]:
        found = {TRACEPARENT: self.traceparent}
        if self.tracestate:
            found[TRACESTATE] = self.tracestate
        return found


def incoming(
    traceparent: str | bytes | None, tracestate: str | bytes | None
) -> TraceContext | None:
    """The context a client sent, or None when there is none or it is malformed."""
    parent = _text(traceparent)
    if parent is None:
        return None
    parent = parent.strip()
    match = _TRACEPARENT.fullmatch(parent)
    if match is None:
        return None
    version, trace_id, span_id, _flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    state = _text(tracestate)
    if state is not None:
        state = state.strip()
        if not state or len(state) > _TRACESTATE_MAX or not _TRACESTATE.fullmatch(state):
            state = None
    return TraceContext(parent, state)


def _text(value: str | bytes | None) -> str | None:
    if isinstance(value, bytes):
        try:
            return value.decode("ascii")
        except UnicodeDecodeError:
            return None
    return value


def stored(traceparent: str | None, tracestate: str | None) -> TraceContext | None:
    """The context a row or an outbox row carries (checked when it was stored)."""
    return TraceContext(traceparent, tracestate) if traceparent else None


def missing_packages(exporter: str) -> str:
    """Empty when tracing can start with ``exporter``, else what to install."""
    import importlib.util

    wanted = ["opentelemetry.sdk.trace"]
    if exporter == "otlp":
        wanted.append("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    for module in wanted:
        try:
            found = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            found = None
        if found is None:
            return f"{module} cannot be imported; install {EXTRA}"
    return ""


class Tracing:
    """Every span the service makes, on one tracer of ``provider``."""

    def __init__(
        self, provider: TracerProvider, *, worker_id: str = "", owns_provider: bool = False
    ) -> None:
        """``owns_provider``: ``shutdown`` flushes and stops it (one built from settings)."""
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._trace = trace
        self._empty = Context
        self._provider = provider
        self._owns_provider = owns_provider
        self._tracer = provider.get_tracer("workflow-jobs")
        # W3C Trace Context always, whatever global propagator a host configured:
        # the stored columns and the headers are that format.
        self._propagator = TraceContextTextMapPropagator()
        self._worker_id = worker_id

    @classmethod
    def from_settings(cls, worker_id: str, exporter: str) -> Tracing:
        """An SDK provider exporting through ``exporter`` (``otlp``, ``console``, ``none``).

        The SDK reads the standard variables itself: ``OTEL_SERVICE_NAME`` and
        ``OTEL_RESOURCE_ATTRIBUTES`` (the service name defaults to
        ``workflow-jobs``), ``OTEL_TRACES_SAMPLER`` and ``_ARG``, ``OTEL_BSP_*``
        for the batching, and ``OTEL_EXPORTER_OTLP_*`` for the OTLP endpoint.
        """
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        resource = Resource.create({"service.instance.id": worker_id} if worker_id else {})
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": "workflow-jobs"}))
        provider = TracerProvider(resource=resource)
        if exporter == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        elif exporter == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        # "none": spans are still made, for the propagated context and the
        # trace ids in the logs, and exported nowhere.
        return cls(provider, worker_id=worker_id, owns_provider=True)

    def shutdown(self) -> None:
        """Export what is buffered and stop the exporter (blocking: run it in a thread)."""
        if self._owns_provider:
            shutdown = getattr(self._provider, "shutdown", None)
            if callable(shutdown):
                shutdown()

    # ------------------------------------------------------------------ contexts

    def _parent(self, context: TraceContext | None) -> Context:
        """The context a span continues; a fresh one, never the ambient, without it."""
        if context is None:
            return self._empty()
        return self._propagator.extract(context.headers(), context=self._empty())

    def _context_of(self, span: Span) -> TraceContext:
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=self._trace.set_span_in_context(span))
        return TraceContext(carrier[TRACEPARENT], carrier.get(TRACESTATE))

    def current_ids(self) -> tuple[str, str] | None:
        """The current span's trace and span ids in hex, for log lines; None outside one."""
        span_context = self._trace.get_current_span().get_span_context()
        if not span_context.is_valid:
            return None
        return f"{span_context.trace_id:032x}", f"{span_context.span_id:016x}"

    # ------------------------------------------------------------------ submit

    def start_submit(self, via: str, parent: TraceContext | None) -> tuple[Span, TraceContext]:
        """A ``submit`` span and the context the job's row stores; end it with ``end_submit``."""
        span = self._tracer.start_span(
            "submit",
            context=self._parent(parent),
            kind=self._trace.SpanKind.SERVER if via == "http" else self._trace.SpanKind.CONSUMER,
            attributes={"wfjobs.submit.via": via, "wfjobs.worker_id": self._worker_id},
        )
        return span, self._context_of(span)

    def end_submit(
        self,
        span: Span,
        *,
        job_id: str = "",
        created: bool = False,
        refused: str = "",
        error: BaseException | None = None,
    ) -> None:
        if job_id:
            span.set_attribute("wfjobs.job_id", job_id)
            span.set_attribute("wfjobs.created", created)
        if refused:
            span.set_attribute("wfjobs.refused", refused)
        if error is not None:
            span.record_exception(error)
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(error)))
        span.end()

    # ------------------------------------------------------------------ worker

    def claimed(self, claimed: ClaimedJob, started_ns: int, ended_ns: int) -> None:
        """The ``claim`` span of one job, over the statement that claimed it."""
        job = claimed.job
        span = self._tracer.start_span(
            "claim",
            context=self._parent(stored(job.traceparent, job.tracestate)),
            attributes=self._job_attributes(str(job.job_id), claimed.lease.attempt),
            start_time=started_ns,
        )
        span.end(end_time=ended_ns)

    @contextlib.contextmanager
    def segment(self, claimed: ClaimedJob) -> Iterator[None]:
        """The current span while a claimed job's segment runs and settles."""
        job = claimed.job
        with self._tracer.start_as_current_span(
            "segment",
            context=self._parent(stored(job.traceparent, job.tracestate)),
            attributes=self._job_attributes(str(job.job_id), claimed.lease.attempt),
        ):
            yield

    @contextlib.contextmanager
    def step(self, step: Step, context: StepContext) -> Iterator[Sequence[tuple[str, str]]]:
        """A step call's span; yields the gRPC metadata that carries it to a remote target."""
        remote = step.remote_target
        attributes: dict[str, str | int] = {
            **self._job_attributes(context.job_id, context.attempt),
            "wfjobs.step": step.name,
            "rpc.method": step.method,
        }
        if remote is not None:
            attributes["server.address"] = remote
        with self._tracer.start_as_current_span(
            f"step {step.name}",
            kind=self._trace.SpanKind.CLIENT if remote else self._trace.SpanKind.INTERNAL,
            attributes=attributes,
        ):
            carrier: dict[str, str] = {}
            self._propagator.inject(carrier)
            yield tuple(carrier.items())

    # ------------------------------------------------------------------ relay

    def start_publish(
        self, *, job_id: str, event_id: int, parent: TraceContext | None, topic: str
    ) -> tuple[Span, list[tuple[str, str | bytes | None]]]:
        """One event's ``publish`` span and the Kafka headers that carry it."""
        span = self._tracer.start_span(
            "publish",
            context=self._parent(parent),
            kind=self._trace.SpanKind.PRODUCER,
            attributes={
                "wfjobs.job_id": job_id,
                "wfjobs.event_id": event_id,
                "wfjobs.worker_id": self._worker_id,
                "messaging.system": "kafka",
                "messaging.destination.name": topic,
            },
        )
        carried = self._context_of(span)
        return span, list(carried.headers().items())

    def end_publish(self, span: Span, failure: str | None) -> None:
        if failure is not None:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, failure))
        span.end()

    def _job_attributes(self, job_id: str, attempt: int) -> dict[str, str | int]:
        return {
            "wfjobs.job_id": job_id,
            "wfjobs.attempt": attempt,
            "wfjobs.worker_id": self._worker_id,
        }


def now_ns() -> int:
    """The wall clock spans are stamped with."""
    return time.time_ns()


def headers_of(pairs: Sequence[tuple[str, Any]] | Mapping[str, Any] | None) -> TraceContext | None:
    """The trace context among Kafka message headers, if a valid one is there."""
    if not pairs:
        return None
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    parent = state = None
    for name, value in items:
        lowered = name.lower() if isinstance(name, str) else ""
        if lowered == TRACEPARENT:
            parent = value
        elif lowered == TRACESTATE:
            state = value
    return incoming(parent, state)


__all__ = [
    "EXPORTERS",
    "EXTRA",
    "TRACEPARENT",
    "TRACESTATE",
    "TraceContext",
    "Tracing",
    "headers_of",
    "incoming",
    "missing_packages",
    "now_ns",
    "stored",
]
