"""Log lines as plain text (a terminal's default) or as JSON lines.

With ``WFJOBS_LOG_FORMAT=json`` every handler the worker's logging set up
(Faust's and mode's included: ``install`` runs once they exist) writes one
JSON object per line: ``timestamp`` (UTC, ISO 8601), ``level``, ``logger``,
``message``, ``worker_id``, ``exception`` when there is one, and, on every
line about a job, ``job_id`` and ``attempt``; with tracing on, ``trace_id``
and ``span_id`` of the span current when the line was logged.

A line is about a job when it is logged while a job's segment runs or a
submit is handled (``about_job`` sets the job in a context variable that the
tasks started meanwhile inherit), or when the call passes ``extra={"job_id":
..., "attempt": ...}`` itself, for lines logged elsewhere.

In either format, the Kafka client's lines that repeat (``RepeatedLines``) are
written once per minute with a count of those left out: with the broker away,
aiokafka logs each failed connection and metadata request, some 75 lines a
second, which would bury every other line of an outage.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

_job_id: ContextVar[str | None] = ContextVar("wfjobs_job_id", default=None)
_attempt: ContextVar[int | None] = ContextVar("wfjobs_attempt", default=None)

TraceIds = Callable[[], "tuple[str, str] | None"]


@contextlib.contextmanager
def about_job(job_id: object, attempt: int | None = None) -> Iterator[None]:
    """Lines logged inside (and in tasks started inside) are about this job."""
    job_token = _job_id.set(str(job_id))
    attempt_token = _attempt.set(attempt)
    try:
        yield
    finally:
        _attempt.reset(attempt_token)
        _job_id.reset(job_token)


class JobFields(logging.Filter):
    """Puts the job, the worker and the trace on each record, unless ``extra`` did."""

    def __init__(self, worker_id: str, trace_ids: TraceIds | None = None) -> None:
        super().__init__()
        self._worker_id = worker_id
        self._trace_ids = trace_ids

    def filter(self, record: logging.LogRecord) -> bool:
        fields = record.__dict__
        if "job_id" not in fields:
            job_id = _job_id.get()
            if job_id is not None:
                fields["job_id"] = job_id
                if "attempt" not in fields:
                    fields["attempt"] = _attempt.get()
        fields.setdefault("worker_id", self._worker_id)
        if self._trace_ids is not None and "trace_id" not in fields:
            ids = self._trace_ids()
            if ids is not None:
                fields["trace_id"], fields["span_id"] = ids
        return True


# What a record may carry beyond the standard attributes, in the order written.
_FIELDS = ("worker_id", "job_id", "attempt", "trace_id", "span_id")


class JsonLines(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = record.__dict__
        for name in _FIELDS:
            value = fields.get(name)
            if value is not None:
                line[name] = value if isinstance(value, int | float | bool) else str(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


# The most distinct messages RepeatedLines keeps books on at once.
_MAX_MESSAGES = 1024
# The record attribute that carries RepeatedLines' verdict to a logger's other handlers.
_DECIDED = "wfjobs_repeated_lines_let_through"


class RepeatedLines(logging.Filter):
    """Lets through a line of the ``loggers`` once per ``window_s`` for each of
    their messages (its format string, whatever its arguments), noting on the
    next one let through how many were left out in between.

    Lines of other loggers all pass: the service's own outage lines are
    already one per outage (or per tenth failed pass).
    """

    def __init__(
        self,
        loggers: tuple[str, ...] = ("aiokafka",),
        *,
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._prefixes = tuple(loggers)
        self._window_s = window_s
        self._clock = clock
        # Per message: when it was last let through, how many left out since.
        self._seen: dict[tuple[str, int, str], list[float]] = {}
        # aiokafka's consumer logs from its own thread.
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        # Every handler of a logger calls this for the same record: the first
        # call decides for all, or the second would count the line as a repeat.
        decided = getattr(record, _DECIDED, None)
        if decided is not None:
            return bool(decided)
        let_through = self._let_through(record)
        setattr(record, _DECIDED, let_through)
        return let_through

    def _let_through(self, record: logging.LogRecord) -> bool:
        name = record.name
        if not any(name == p or name.startswith(p + ".") for p in self._prefixes):
            return True
        key = (name, record.levelno, str(record.msg))
        now = self._clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen[0] < self._window_s:
                seen[1] += 1
                return False
            if len(self._seen) >= _MAX_MESSAGES:
                # A message formatted before it was logged is a new key each
                # time: the quiet ones go, so the book stays small.
                self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self._window_s}
            self._seen[key] = [now, 0]
        if seen is not None and seen[1]:
            record.msg = (
                f"{record.getMessage()} ({seen[1]:.0f} more like this in the last "
                f"{now - seen[0]:.0f}s not logged)"
            )
            record.args = None
        return True


def install(
    logger: logging.Logger,
    *,
    log_format: str,
    worker_id: str,
    trace_ids: TraceIds | None = None,
) -> None:
    """Give every handler of ``logger`` (the root, once configured) the format asked
    for, and ``RepeatedLines``.

    Text keeps the handlers' own formatters, as Faust and mode made them.
    """
    repeated = RepeatedLines()
    for handler in logger.handlers:
        handler.addFilter(repeated)
    if log_format != "json":
        return
    fields = JobFields(worker_id, trace_ids)
    formatter = JsonLines()
    for handler in logger.handlers:
        handler.setFormatter(formatter)
        handler.addFilter(fields)


__all__ = ["JobFields", "JsonLines", "RepeatedLines", "about_job", "install"]
