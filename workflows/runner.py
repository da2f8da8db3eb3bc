"""The runner: one segment of a job, from its checkpoints to done, parked or failed.

A segment is what one claim executes. It replays the stored checkpoints (each
must name the step at its index and still parse as that step's response type),
then runs the remaining steps in order. After every step it awaits the
``on_checkpoint`` observer before starting the next, so the store commits the
step before anything depends on it; whatever that observer raises passes
through untouched (the service tells a lost lease from a store failure).

Outcomes: :class:`Completed` with the result and a one-line verdict,
:class:`Parked` at an external step (never invoked), or a raised
:class:`~workflows.failures.StepFailure` already sorted into the taxonomy.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from schemas.errors import FailedPrecondition
from workflows.cache import DefinitionCache, default_cache
from workflows.failures import FailureKind, SegmentDeadlineExceeded, StepFailure, classify
from workflows.invokers import (
    GrpcChannels,
    HandlerRegistry,
    ProgressSink,
    StepContext,
    StepObserver,
    default_channels,
    invoke,
)
from workflows.steps import CompiledWorkflow

CheckpointObserver = Callable[[dict[str, Any]], Awaitable[None]]
# Told of every step invocation once it ends: the step's name, the seconds it
# took, and whether it answered (False: it raised, timed out or was cancelled).
StepTimer = Callable[[str, float, bool], None]
# What protobuf's JSON writer raises for a value it has no form for: a
# timestamp or duration out of range, an Any of an unknown type or of bytes
# that do not parse.
_NO_JSON_FORM = (ValueError, TypeError, DecodeError)


@dataclass(frozen=True, slots=True)
class Completed:
    """Every step has a checkpoint; ``result`` is the output mapping's proto3 JSON."""

    result: dict[str, Any]
    verdict: str


@dataclass(frozen=True, slots=True)
class Parked:
    """The next step is external: the job waits for complete-step.

    ``request`` is what the step's rules built, for whoever answers it;
    ``timeout_ms`` how long it may wait for that answer (the step's ``timeoutMs``).
    """

    step_name: str
    request: dict[str, Any]
    timeout_ms: int | None = None


SegmentOutcome = Completed | Parked


class SynchronousRunRefused(FailedPrecondition):
    """A workflow that would park cannot run synchronously."""


class _SegmentDeadline:
    """A segment's deadline: one timer for the whole segment, felt only inside step calls.

    A step call that is still running when the deadline passes is cancelled and
    its ``async with`` raises ``TimeoutError``, as ``asyncio.timeout`` would,
    also when the call swallowed the cancellation and returned or raised;
    the checkpoints between the steps are never interrupted (the next step then
    does not start). One ``asyncio.timeout`` per step scheduled and cancelled a
    timer at every step, a tenth of a segment's own CPU on the benchmark's
    three-step workflow. A cancellation from elsewhere passes through as it is.
    """

    __slots__ = ("_cancelled_call", "_cancelling", "_in_call", "_task", "_timer", "expired")

    def __init__(self, seconds: float) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a segment runs inside a task")
        self._task = task
        self._timer = asyncio.get_running_loop().call_later(seconds, self._expire)
        self._in_call = False
        self._cancelled_call = False
        self._cancelling = 0
        self.expired = False

    def _expire(self) -> None:
        self.expired = True
        if self._in_call and not self._cancelled_call:
            self._cancelled_call = True
            self._task.cancel()

    async def __aenter__(self) -> None:
        self._cancelling = self._task.cancelling()
        self._in_call = True

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        self._in_call = False
        if self._cancelled_call:
            self._cancelled_call = False
            # Only this timer's cancellation becomes a timeout; one requested
            # by someone else as well stays a cancellation. A call that caught
            # the cancellation and answered anyway answered past its deadline:
            # a timeout too, or its late answer would be checkpointed.
            if self._task.uncancel() <= self._cancelling:
                raise TimeoutError from exc

    def close(self) -> None:
        self._timer.cancel()


async def run_segment(
    workflow: CompiledWorkflow,
    input: Mapping[str, Any],
    checkpoints: Sequence[Mapping[str, Any]],
    *,
    job_id: str,
    attempt: int,
    on_checkpoint: CheckpointObserver,
    registry: HandlerRegistry,
    channels: GrpcChannels | None = None,
    clock: Callable[[], float] = time.monotonic,
    progress: ProgressSink | None = None,
    observe_step: StepObserver | None = None,
    on_step: StepTimer | None = None,
) -> SegmentOutcome:
    """Run ``workflow`` from its first missing checkpoint within ``deadlineMs``.

    ``observe_step`` is entered around each step call (a trace span, say);
    what it yields is sent as metadata with a remote call.
    """
    expires_at = clock() + workflow.deadline_ms / 1000.0
    scope = workflow.replay(input, checkpoints)
    pipes = channels if channels is not None else default_channels
    job = str(job_id)
    deadline = _SegmentDeadline(workflow.deadline_ms / 1000.0)
    try:
        for step in workflow.steps[len(checkpoints) :]:
            if step.external:
                built = step.request_codec.encode(step.build_request(scope))
                return Parked(step.name, built, step.timeout_ms)
            started = clock()
            if expires_at - started <= 0 or deadline.expired:
                raise StepFailure(
                    FailureKind.RETRYABLE,
                    step.name,
                    f"the segment used up its deadline of {workflow.deadline_ms} ms "
                    "before this step could start",
                )
            request = step.build_request(scope)
            context = StepContext(
                job_id=job,
                step_name=step.name,
                attempt=attempt,
                expires_at=expires_at,
                response_type=step.response_type,
                clock=clock,
                progress_sink=progress,
            )
            answered = False
            try:
                async with deadline:
                    if observe_step is None:
                        response = await invoke(step, request, context, registry, pipes)
                    else:
                        with observe_step(step, context) as metadata:
                            response = await invoke(
                                step, request, context, registry, pipes, metadata=metadata
                            )
                answered = True
            except TimeoutError as exc:
                # Either the segment's deadline or the handler's own timeout.
                if deadline.expired:
                    raise classify(
                        SegmentDeadlineExceeded(
                            f"the segment ran past its deadline of {workflow.deadline_ms} ms"
                        ),
                        step.name,
                    ) from exc
                raise classify(exc, step.name) from exc
            except StepFailure:
                raise
            except asyncio.CancelledError as exc:
                current = asyncio.current_task()
                if current is None or current.cancelling():
                    raise
                # Nobody cancelled the segment: the step raised it itself (a
                # task it awaited was cancelled). Let through, it would end the
                # worker's runner, and the job would come back to the next one.
                raise classify(exc, step.name) from exc
            except Exception as exc:
                raise classify(exc, step.name) from exc
            finally:
                if on_step is not None:
                    on_step(step.name, clock() - started, answered)

            try:
                response_json = step.response_codec.encode(response)
            except _NO_JSON_FORM as exc:
                # A value proto3 JSON cannot write (a timestamp out of range, an
                # Any of a type the schema lacks): the answer itself is at fault,
                # and the same call would give it again.
                raise StepFailure(
                    FailureKind.NON_RETRYABLE,
                    step.name,
                    f"the response of {step.method} has no proto3 JSON form: {exc}",
                ) from exc
            scope.bind(step.name, response_json)
            violations = step.judge(scope, response, response_json)
            if violations:
                raise StepFailure(
                    FailureKind.VERDICT,
                    step.name,
                    f"the response was rejected: {'; '.join(violations)}",
                    violations=violations,
                    response=response_json,
                )
            await on_checkpoint({"name": step.name, "skipped": False, "response": response_json})
    finally:
        deadline.close()

    result = workflow.compute_output(scope)
    names = [step.name for step in workflow.steps]
    count = len(names)
    verdict = f"completed {count} step{'s' if count != 1 else ''}: {', '.join(names)}"
    return Completed(result=result, verdict=verdict)


async def _discard(entry: dict[str, Any]) -> None:
    return None


async def run_workflow(
    envelope: Mapping[str, Any],
    input: Mapping[str, Any],
    *,
    registry: HandlerRegistry,
    channels: GrpcChannels | None = None,
    cache: DefinitionCache | None = None,
    job_id: str | None = None,
) -> dict[str, Any]:
    """Run a whole definition now, in-process, and return its result.

    Nothing is stored: no checkpoints, no retries. A workflow with an external
    step is refused before anything runs, because a parked step would hold the
    caller forever. Step failures raise :class:`StepFailure`.
    """
    workflow = (cache if cache is not None else default_cache).get(envelope)
    external = [step.name for step in workflow.steps if step.external]
    if external:
        raise SynchronousRunRefused(
            f"workflow {workflow.name!r} cannot run synchronously: step {external[0]!r} has "
            'completion "external" and would park; submit the workflow as a job '
            "(submit-workflow) so complete-step can supply the response"
        )
    normalized = workflow.validate_input(input)
    outcome = await run_segment(
        workflow,
        normalized,
        (),
        job_id=job_id or str(uuid.uuid4()),
        attempt=1,
        on_checkpoint=_discard,
        registry=registry,
        channels=channels,
    )
    if not isinstance(outcome, Completed):  # unreachable: external steps were refused above
        raise SynchronousRunRefused(f"workflow {workflow.name!r} parked at {outcome.step_name!r}")
    return outcome.result


__all__ = [
    "CheckpointObserver",
    "Completed",
    "Parked",
    "SegmentOutcome",
    "StepTimer",
    "SynchronousRunRefused",
    "run_segment",
    "run_workflow",
]
