"""Step handlers for worker processes started by the end-to-end tests.

Loaded by the worker with ``WFJOBS_HANDLERS=tests.e2e.handlers`` (the worker's
working directory is the repository root). They are the engine fixtures'
handlers (``tests.workflows_fixtures.make_registry``): faults and delays come
from the job input (``fail``, ``embed_fail``, ``delay_ms``).

Because they run in another process, every call is also appended as one line
to the file named by ``WFJOBS_E2E_CALLS``: ``worker_id method job_id attempt``.
A line is one ``write`` on an ``O_APPEND`` descriptor, so lines from several
workers never interleave.

A handler whose task is cancelled while it runs (a cancelled job's step)
appends ``worker cancelled:METHOD job_id attempt`` before the cancellation
goes on.

``WFJOBS_E2E_SLOW_METHOD`` and ``WFJOBS_E2E_SLOW_S`` make one method of this
worker process hold its answer that long after recording the call: the crash
test kills a worker while it sits there, before the step's checkpoint.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from google.protobuf.message import Message

from tests.workflows_fixtures import CallLog, make_registry
from workflows.invokers import Handler, HandlerRegistry, StepContext

CALLS_ENV = "WFJOBS_E2E_CALLS"


def _append(method: str, key: str, attempt: int) -> None:
    path = os.environ.get(CALLS_ENV)
    if not path:
        return
    job_id = key.partition(":")[0]
    worker = os.environ.get("WFJOBS_WORKER_ID", "?")
    line = f"{worker} {method} {job_id} {attempt}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


class FileCallLog(CallLog):
    def record(self, method: str, key: str, attempt: int) -> None:
        super().record(method, key, attempt)
        _append(method, key, attempt)


def _noting_cancel(method: str, inner: Handler) -> Handler:
    async def noted(request: Message, ctx: StepContext) -> Any:
        try:
            return await inner(request, ctx)
        except asyncio.CancelledError:
            _append(f"cancelled:{method}", ctx.idempotency_key, ctx.attempt)
            raise

    return noted


def _slowed(inner: Handler, seconds: float) -> Handler:
    async def slow(request: Message, ctx: StepContext) -> Any:
        response = await inner(request, ctx)
        await asyncio.sleep(seconds)
        return response

    return slow


def register_handlers(registry: HandlerRegistry) -> None:
    """Called by ``load_handler_modules`` with the worker's registry."""
    fixtures = make_registry(FileCallLog())
    slow_method = os.environ.get("WFJOBS_E2E_SLOW_METHOD", "")
    slow_s = float(os.environ.get("WFJOBS_E2E_SLOW_S", "0") or 0)
    for method in fixtures.methods():
        function = fixtures.get(method)
        assert function is not None
        if method == slow_method and slow_s > 0:
            function = _slowed(function, slow_s)
        registry.register(method, _noting_cancel(method, function), replace=True)
