"""The runner against in-process handlers: checkpoints, replay, parking, failures."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

import pytest
from google.protobuf import json_format

from schemas.errors import InvalidArgument, LeaseLost
from tests.workflows_fixtures import (
    EMBED,
    REVIEW,
    TOKENIZE,
    CallLog,
    embed_vector,
    envelope,
    make_registry,
    message_class,
    tokenize_ids,
    with_a_step,
)
from workflows import (
    CompiledWorkflow,
    Completed,
    FailureKind,
    HandlerRegistry,
    InputError,
    Parked,
    ResponseError,
    StepContext,
    StepFailure,
    SynchronousRunRefused,
    compile_definition,
    run_segment,
    run_workflow,
)
from workflows.invokers import Handler
from workflows.runner import CheckpointObserver

TEXT = "hello brave new world"


class Recorder:
    """An on_checkpoint observer that also notes when it ran relative to handlers."""

    def __init__(self, events: list[str] | None = None) -> None:
        self.entries: list[dict[str, Any]] = []
        self.events = events if events is not None else []

    async def __call__(self, entry: dict[str, Any]) -> None:
        self.entries.append(entry)
        self.events.append(f"checkpoint:{entry['name']}")


def _registry_with(method: str, handler: Handler) -> HandlerRegistry:
    """The test handlers, with ``method`` served by ``handler`` instead."""
    registry = make_registry()
    registry.register(method, handler, replace=True)
    return registry


async def _run(
    workflow: CompiledWorkflow,
    input: dict[str, Any],
    checkpoints: list[dict[str, Any]] | None = None,
    *,
    registry: HandlerRegistry | None = None,
    observer: CheckpointObserver | None = None,
    attempt: int = 1,
) -> Any:
    return await run_segment(
        workflow,
        workflow.validate_input(input),
        checkpoints or [],
        job_id="job-1",
        attempt=attempt,
        on_checkpoint=observer if observer is not None else Recorder(),
        registry=registry if registry is not None else make_registry(),
    )


async def test_three_steps_run_and_checkpoint_proto3_json() -> None:
    workflow = compile_definition(envelope(review="invoke"))
    calls = CallLog()
    observer = Recorder()
    outcome = await _run(workflow, {"text": TEXT}, registry=make_registry(calls), observer=observer)

    assert isinstance(outcome, Completed)
    assert outcome.verdict == "completed 3 steps: tokenize, embed, review"
    ids = tokenize_ids(TEXT)
    assert outcome.result == {
        "ids": ids,
        "vector": embed_vector(ids),
        "approved": True,
        "reviewer": "auto",
    }
    assert [entry["name"] for entry in observer.entries] == ["tokenize", "embed", "review"]
    assert all(entry["skipped"] is False for entry in observer.entries)
    expected_types = ["jobs.test.Tokens", "jobs.test.Embedding", "jobs.test.ReviewResult"]
    for entry, type_name in zip(observer.entries, expected_types, strict=True):
        assert set(entry) == {"name", "skipped", "response"}
        json.dumps(entry)  # plain JSON, ready for JSONB
        json_format.ParseDict(entry["response"], message_class(type_name)())
    assert observer.entries[0]["response"] == {"ids": ids, "count": len(ids)}
    assert observer.entries[1]["response"] == {"vector": embed_vector(ids), "dimensions": 4}
    assert observer.entries[2]["response"] == {"approved": True, "reviewer": "auto", "note": ""}
    assert calls.counts == {TOKENIZE: 1, EMBED: 1, REVIEW: 1}


async def test_each_checkpoint_is_awaited_before_the_next_step_starts() -> None:
    events: list[str] = []
    inner = make_registry().get(EMBED)
    assert inner is not None

    async def embed(request: Any, ctx: StepContext) -> Any:
        events.append("call:embed")
        return await inner(request, ctx)

    registry = _registry_with(EMBED, embed)
    workflow = compile_definition(envelope(review=None))
    await _run(workflow, {"text": TEXT}, registry=registry, observer=Recorder(events))
    assert events == ["checkpoint:tokenize", "call:embed", "checkpoint:embed"]


async def test_resume_with_one_checkpoint_does_not_call_the_first_step_again() -> None:
    workflow = compile_definition(envelope(review="invoke"))
    first = Recorder()
    await _run(workflow, {"text": TEXT}, observer=first)

    calls = CallLog()
    resumed = Recorder()
    outcome = await _run(
        workflow,
        {"text": TEXT},
        first.entries[:1],
        registry=make_registry(calls),
        observer=resumed,
        attempt=2,
    )
    assert isinstance(outcome, Completed)
    assert calls[TOKENIZE] == 0
    assert calls[EMBED] == 1 and calls[REVIEW] == 1
    assert [entry["name"] for entry in resumed.entries] == ["embed", "review"]
    assert calls.keys == ["job-1:embed", "job-1:review"]
    assert calls.attempts == [2, 2]
    assert outcome.result["ids"] == tokenize_ids(TEXT)


async def test_a_checkpoint_under_another_name_fails_non_retryably() -> None:
    workflow = compile_definition(envelope(review="invoke"))
    calls = CallLog()
    stale = [{"name": "tokenise", "skipped": False, "response": {"ids": [1], "count": 1}}]
    with pytest.raises(StepFailure) as caught:
        await _run(workflow, {"text": TEXT}, stale, registry=make_registry(calls))
    failure = caught.value
    assert failure.kind is FailureKind.NON_RETRYABLE
    assert "checkpoint 0 names step 'tokenise'" in failure.message
    assert "step 0 of workflow 'embed-text' is 'tokenize'" in failure.message
    assert "the definition changed under a live job" in failure.message
    assert sum(calls.counts.values()) == 0


async def test_a_checkpoint_of_another_shape_fails_non_retryably() -> None:
    workflow = compile_definition(envelope(review="invoke"))
    stale = [{"name": "tokenize", "skipped": False, "response": {"tokens": ["a"]}}]
    with pytest.raises(StepFailure) as caught:
        await _run(workflow, {"text": TEXT}, stale)
    failure = caught.value
    assert failure.kind is FailureKind.NON_RETRYABLE
    assert failure.step_name == "tokenize"
    assert "checkpoint 0 ('tokenize') no longer parses as jobs.test.Tokens" in failure.message
    assert "checkpoints[0].response.tokens: unknown field" in failure.message
    assert "the definition changed under a live job" in failure.message


async def test_a_checkpoint_with_the_wrong_value_type_fails_non_retryably() -> None:
    workflow = compile_definition(envelope(review="invoke"))
    stale = [{"name": "tokenize", "skipped": False, "response": {"ids": ["one"]}}]
    with pytest.raises(StepFailure) as caught:
        await _run(workflow, {"text": TEXT}, stale)
    assert "checkpoints[0].response.ids[0]: expected an integer" in caught.value.message


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [
        ([{"name": "tokenize"}], "must hold exactly name, skipped and response"),
        ([{"name": "tokenize", "response": {}, "at": 1}], "it holds at, name, response"),
        (["tokenize"], "is string 'tokenize', not an object"),
        ([{"name": "tokenize", "skipped": True, "response": {}}], "says the step was skipped"),
        ([{"name": n, "skipped": False, "response": {}} for n in "abcd"], "has only 3 steps"),
    ],
)
async def test_malformed_checkpoints_fail_non_retryably(entries: list[Any], fragment: str) -> None:
    workflow = compile_definition(envelope(review="invoke"))
    with pytest.raises(StepFailure) as caught:
        await _run(workflow, {"text": TEXT}, entries)
    assert caught.value.kind is FailureKind.NON_RETRYABLE
    assert fragment in caught.value.message


@pytest.mark.parametrize(
    ("fault", "kind", "message"),
    [
        ("RETRYABLE", FailureKind.RETRYABLE, "test fault RETRYABLE"),
        ("NON_RETRYABLE", FailureKind.NON_RETRYABLE, "test fault NON_RETRYABLE"),
        ("CRASH", FailureKind.NON_RETRYABLE, "RuntimeError: test fault CRASH"),
        ("UNAVAILABLE", FailureKind.RETRYABLE, "gRPC UNAVAILABLE: test fault UNAVAILABLE"),
        (
            "DEADLINE_EXCEEDED",
            FailureKind.RETRYABLE,
            "gRPC DEADLINE_EXCEEDED: test fault DEADLINE_EXCEEDED",
        ),
        (
            "RESOURCE_EXHAUSTED",
            FailureKind.RETRYABLE,
            "gRPC RESOURCE_EXHAUSTED: test fault RESOURCE_EXHAUSTED",
        ),
        (
            "INVALID_ARGUMENT",
            FailureKind.NON_RETRYABLE,
            "gRPC INVALID_ARGUMENT: test fault INVALID_ARGUMENT",
        ),
        ("INTERNAL", FailureKind.NON_RETRYABLE, "gRPC INTERNAL: test fault INTERNAL"),
    ],
)
async def test_handler_failures_are_classified(fault: str, kind: FailureKind, message: str) -> None:
    workflow = compile_definition(envelope(review="invoke"))
    observer = Recorder()
    with pytest.raises(StepFailure) as caught:
        await _run(workflow, {"text": TEXT, "embed_fail": fault}, observer=observer)
    failure = caught.value
    assert failure.kind is kind
    assert failure.step_name == "embed"
    assert failure.message == message
    assert str(failure) == f"step 'embed': {message}"
    assert [entry["name"] for entry in observer.entries] == ["tokenize"]


async def test_a_fault_limited_to_the_first_attempt_clears_on_the_second() -> None:
    workflow = compile_definition(envelope(review="invoke"))
    with pytest.raises(StepFailure):
        await _run(workflow, {"text": TEXT, "fail": "RETRYABLE@1"}, attempt=1)
    outcome = await _run(workflow, {"text": TEXT, "fail": "RETRYABLE@1"}, attempt=2)
    assert isinstance(outcome, Completed)


async def test_a_failed_validate_rule_is_a_verdict() -> None:
    workflow = compile_definition(envelope(review="invoke"))
    observer = Recorder()
    with pytest.raises(StepFailure) as caught:
        await _run(workflow, {"text": "please reject this"}, observer=observer)
    failure = caught.value
    assert failure.kind is FailureKind.VERDICT
    assert failure.step_name == "review"
    assert failure.violations == ("validate rule `response.approved` is false",)
    assert failure.response == {"approved": False, "reviewer": "auto", "note": ""}
    assert [entry["name"] for entry in observer.entries] == ["tokenize", "embed"]


async def test_an_external_step_parks_without_being_invoked() -> None:
    workflow = compile_definition(envelope(review="external"))
    calls = CallLog()
    observer = Recorder()
    outcome = await _run(workflow, {"text": TEXT}, registry=make_registry(calls), observer=observer)
    assert outcome == Parked("review", {"text": TEXT, "dimensions": 4})
    assert calls[REVIEW] == 0
    assert calls[TOKENIZE] == 1 and calls[EMBED] == 1
    assert [entry["name"] for entry in observer.entries] == ["tokenize", "embed"]

    verdict = workflow.accept_external(
        "review",
        {"approved": True, "reviewer": "ann"},
        input={"text": TEXT},
        checkpoints=observer.entries,
    )
    assert verdict.accepted
    answered = {"name": "review", "skipped": False, "response": verdict.response}
    resumed = await _run(
        workflow,
        {"text": TEXT},
        [*observer.entries, answered],
        registry=make_registry(calls),
    )
    assert isinstance(resumed, Completed)
    assert resumed.result["reviewer"] == "ann"
    assert calls[REVIEW] == 0 and calls[TOKENIZE] == 1


async def test_a_segment_over_its_deadline_is_retryable() -> None:
    workflow = compile_definition(envelope(review="invoke", deadline_ms=100))
    started = time.monotonic()
    with pytest.raises(StepFailure) as caught:
        await _run(workflow, {"text": TEXT, "delay_ms": 2000})
    assert time.monotonic() - started < 1.5
    assert caught.value.kind is FailureKind.RETRYABLE
    assert caught.value.step_name == "tokenize"
    assert "deadline of 100 ms" in caught.value.message


async def test_a_deadline_used_up_between_steps_is_retryable() -> None:
    workflow = compile_definition(envelope(review="invoke", deadline_ms=1000))
    ticks = itertools.count(step=0.4)  # each reading of the clock moves it 400 ms on

    with pytest.raises(StepFailure) as caught:
        await run_segment(
            workflow,
            workflow.validate_input({"text": TEXT}),
            [],
            job_id="job-1",
            attempt=1,
            on_checkpoint=Recorder(),
            registry=make_registry(),
            clock=lambda: next(ticks),
        )
    assert caught.value.kind is FailureKind.RETRYABLE
    assert "before this step could start" in caught.value.message


async def test_a_deadline_passing_during_a_checkpoint_lets_it_finish_and_stops_the_next_step() -> (
    None
):
    workflow = compile_definition(envelope(review=None, deadline_ms=500))
    finished: list[str] = []

    async def slow_checkpoint(entry: dict[str, Any]) -> None:
        await asyncio.sleep(0.8)  # the deadline passes while the store commits
        finished.append(entry["name"])

    with pytest.raises(StepFailure) as caught:
        await _run(workflow, {"text": TEXT}, observer=slow_checkpoint)
    assert finished == ["tokenize"]
    assert caught.value.kind is FailureKind.RETRYABLE
    assert caught.value.step_name == "embed"
    assert "before this step could start" in caught.value.message


async def test_a_step_that_swallows_its_deadline_has_timed_out_whatever_it_answers() -> None:
    answered_late: list[str] = []

    async def embed(request: Any, ctx: StepContext) -> Any:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            answered_late.append(ctx.step_name)
        return {"vector": [0.5], "dimensions": 1}

    registry = _registry_with(EMBED, embed)
    recorder = Recorder()
    workflow = compile_definition(envelope(review=None, deadline_ms=100))
    with pytest.raises(StepFailure) as caught:
        await _run(workflow, {"text": TEXT}, registry=registry, observer=recorder)
    assert answered_late == ["embed"]
    assert caught.value.kind is FailureKind.RETRYABLE
    assert caught.value.step_name == "embed"
    assert "deadline of 100 ms" in caught.value.message
    assert [entry["name"] for entry in recorder.entries] == ["tokenize"]


async def test_a_cancelled_segment_is_cancelled_not_timed_out() -> None:
    workflow = compile_definition(envelope(review="invoke", deadline_ms=60_000))
    segment = asyncio.create_task(_run(workflow, {"text": TEXT, "delay_ms": 2000}))
    await asyncio.sleep(0.05)
    segment.cancel()
    with pytest.raises(asyncio.CancelledError):
        await segment


async def test_a_cancellation_racing_the_deadline_stays_a_cancellation() -> None:
    workflow = compile_definition(envelope(review="invoke", deadline_ms=50))
    segment = asyncio.create_task(_run(workflow, {"text": TEXT, "delay_ms": 2000}))

    def cancel_after_the_deadline() -> None:
        # The deadline's cancellation is already requested; this one is the caller's.
        segment.cancel()

    loop = asyncio.get_running_loop()
    loop.call_later(0.05, cancel_after_the_deadline)
    with pytest.raises(asyncio.CancelledError):
        await segment


async def test_a_handlers_own_timeout_is_not_the_segment_deadline() -> None:
    async def tokenize(request: Any, ctx: StepContext) -> Any:
        raise TimeoutError("the handler's upstream timed out")

    registry = _registry_with(TOKENIZE, tokenize)
    workflow = compile_definition(envelope(review=None))
    with pytest.raises(StepFailure) as caught:
        await _run(workflow, {"text": TEXT}, registry=registry)
    assert caught.value.kind is FailureKind.NON_RETRYABLE
    assert "TimeoutError: the handler's upstream timed out" in caught.value.message


async def test_whatever_the_observer_raises_passes_through_unchanged() -> None:
    workflow = compile_definition(envelope(review="invoke"))
    calls = CallLog()
    lost = LeaseLost("lease gone")

    async def observer(entry: dict[str, Any]) -> None:
        raise lost

    with pytest.raises(LeaseLost) as caught:
        await run_segment(
            workflow,
            workflow.validate_input({"text": TEXT}),
            [],
            job_id="job-1",
            attempt=1,
            on_checkpoint=observer,
            registry=make_registry(calls),
        )
    assert caught.value is lost
    assert calls[EMBED] == 0


async def test_the_handler_context_carries_the_job() -> None:
    seen: list[StepContext] = []
    inner = make_registry().get(TOKENIZE)
    assert inner is not None

    async def tokenize(request: Any, ctx: StepContext) -> Any:
        seen.append(ctx)
        return await inner(request, ctx)

    registry = _registry_with(TOKENIZE, tokenize)
    workflow = compile_definition(envelope(review=None, deadline_ms=5000))
    await _run(workflow, {"text": TEXT}, registry=registry, attempt=3)
    (ctx,) = seen
    assert (ctx.job_id, ctx.step_name, ctx.attempt) == ("job-1", "tokenize", 3)
    assert ctx.idempotency_key == "job-1:tokenize"
    assert 0 < ctx.deadline <= 5.0
    assert ctx.response_type.DESCRIPTOR.full_name == "jobs.test.Tokens"


async def test_a_rule_that_fails_at_run_time_is_a_mapping_defect() -> None:
    definition = envelope(review=None)
    definition["steps"][0]["rules"] = ["text = input.meta.lang"]
    workflow = compile_definition(definition)
    with pytest.raises(StepFailure) as caught:
        # Stored input bypasses validate_input, as a replayed job's does.
        await run_segment(
            workflow,
            {"text": TEXT},
            [],
            job_id="job-1",
            attempt=1,
            on_checkpoint=Recorder(),
            registry=make_registry(),
        )
    assert caught.value.kind is FailureKind.NON_RETRYABLE
    assert "rule `text = input.meta.lang` failed to evaluate" in caught.value.message
    assert "'meta'" in caught.value.message


async def test_cel_expressions_build_requests() -> None:
    definition = envelope(review=None)
    definition["steps"][0]["rules"] = [
        "text = input.text + ' ' + input.text",
        "meta.tags = ['n' + string(size(input.text))]",
    ]
    definition["steps"][1]["rules"] = ["ids = tokenize.ids.map(x, x + 1)"]
    definition["output"] = ["summary.count = tokenize.count", "summary.first = tokenize.ids[0]"]
    workflow = compile_definition(definition)
    outcome = await _run(workflow, {"text": "ab"})
    assert isinstance(outcome, Completed)
    assert outcome.result == {"summary": {"count": 2, "first": tokenize_ids("ab")[0]}}


async def test_without_an_output_mapping_the_result_is_the_last_response() -> None:
    definition = envelope(review=None)
    del definition["output"]
    workflow = compile_definition(definition)
    outcome = await _run(workflow, {"text": TEXT})
    assert isinstance(outcome, Completed)
    assert outcome.result == {"vector": embed_vector(tokenize_ids(TEXT)), "dimensions": 4}
    assert outcome.verdict == "completed 2 steps: tokenize, embed"


async def test_a_handler_answering_the_wrong_type_is_non_retryable() -> None:
    async def tokenize(request: Any, ctx: StepContext) -> Any:
        return message_class("jobs.test.Embedding")()

    registry = _registry_with(TOKENIZE, tokenize)
    workflow = compile_definition(envelope(review=None))
    with pytest.raises(StepFailure) as caught:
        await _run(workflow, {"text": TEXT}, registry=registry)
    assert caught.value.kind is FailureKind.NON_RETRYABLE
    assert "returned a jobs.test.Embedding, expected jobs.test.Tokens" in caught.value.message


async def test_a_handler_may_answer_with_another_pools_class() -> None:
    async def tokenize(request: Any, ctx: StepContext) -> Any:
        return message_class("jobs.test.Tokens")(ids=[7], count=1)

    registry = _registry_with(TOKENIZE, tokenize)
    workflow = compile_definition(envelope(review=None))
    outcome = await _run(workflow, {"text": TEXT}, registry=registry)
    assert isinstance(outcome, Completed)
    assert outcome.result["ids"] == [7]


async def test_a_local_step_without_a_handler_is_non_retryable() -> None:
    workflow = compile_definition(envelope(review=None))
    with pytest.raises(StepFailure) as caught:
        await _run(workflow, {"text": TEXT}, registry=HandlerRegistry())
    assert caught.value.kind is FailureKind.NON_RETRYABLE
    assert "no in-process handler is registered for jobs.test.Tokenizer/Tokenize" in str(
        caught.value
    )


async def test_next_step_follows_the_checkpoints() -> None:
    workflow = compile_definition(envelope())
    entry = {"name": "tokenize", "skipped": False, "response": {}}
    first = workflow.next_step([])
    assert first is not None and first.name == "tokenize"
    second = workflow.next_step([entry])
    assert second is not None and second.name == "embed"
    done = [entry, {**entry, "name": "embed"}, {**entry, "name": "review"}]
    assert workflow.next_step(done) is None
    with pytest.raises(StepFailure, match="changed under a live job"):
        workflow.next_step([{**entry, "name": "embed"}])


# --- synchronous mode ---------------------------------------------------------------


async def test_run_workflow_returns_the_result() -> None:
    result = await run_workflow(envelope(review="invoke"), {"text": TEXT}, registry=make_registry())
    assert result["approved"] is True
    assert result["ids"] == tokenize_ids(TEXT)


async def test_run_workflow_refuses_an_external_step() -> None:
    calls = CallLog()
    with pytest.raises(SynchronousRunRefused) as caught:
        await run_workflow(
            envelope(review="external"), {"text": TEXT}, registry=make_registry(calls)
        )
    message = str(caught.value)
    assert "cannot run synchronously" in message
    assert "step 'review' has completion \"external\"" in message
    assert "submit the workflow as a job (submit-workflow)" in message
    assert caught.value.code == "FAILED_PRECONDITION"
    assert sum(calls.counts.values()) == 0


async def test_run_workflow_validates_the_input() -> None:
    with pytest.raises(InputError, match=r"input\.txt: unknown field"):
        await run_workflow(envelope(review="invoke"), {"txt": TEXT}, registry=make_registry())


# --- complete-step's gate -------------------------------------------------------------


def _parked_checkpoints(workflow: CompiledWorkflow) -> list[dict[str, Any]]:
    ids = tokenize_ids(TEXT)
    return [
        {"name": "tokenize", "skipped": False, "response": {"ids": ids, "count": len(ids)}},
        {"name": "embed", "skipped": False, "response": {"vector": [0.5], "dimensions": 1}},
    ]


def test_accept_external_accepts_a_valid_response() -> None:
    workflow = compile_definition(envelope())
    verdict = workflow.accept_external(
        "review",
        {"approved": True, "reviewer": "ann"},
        input={"text": TEXT},
        checkpoints=_parked_checkpoints(workflow),
    )
    assert verdict.accepted
    assert verdict.step_name == "review"
    # Normalized: the response as the checkpoint will hold it.
    assert verdict.response == {"approved": True, "reviewer": "ann", "note": ""}


def test_accept_external_rejects_a_response_that_breaks_validate() -> None:
    workflow = compile_definition(envelope())
    verdict = workflow.accept_external("review", {"approved": False, "note": "no"})
    assert not verdict.accepted
    assert verdict.violations == ("validate rule `response.approved` is false",)
    assert "rejected" in verdict.message


def test_accept_external_refuses_a_malformed_response() -> None:
    workflow = compile_definition(envelope())
    with pytest.raises(ResponseError) as caught:
        workflow.accept_external("review", {"aproved": True, "reviewer": 3})
    message = str(caught.value)
    assert "response for step 'review' is not a valid jobs.test.ReviewResult" in message
    assert "response.aproved: unknown field" in message
    assert "response.reviewer: expected a string, got number 3" in message


def test_accept_external_refuses_other_steps() -> None:
    workflow = compile_definition(envelope())
    with pytest.raises(InvalidArgument, match="not an external step"):
        workflow.accept_external("embed", {})
    with pytest.raises(InvalidArgument, match="has no step 'nope'"):
        workflow.accept_external("nope", {})


def test_accept_external_with_rules_reading_the_input_needs_it() -> None:
    definition = envelope()
    definition["steps"][2]["validate"] = ["response.approved", "response.note != input.text"]
    workflow = compile_definition(definition)
    with pytest.raises(TypeError, match="pass input= and checkpoints="):
        workflow.accept_external("review", {"approved": True})
    verdict = workflow.accept_external(
        "review",
        {"approved": True, "note": TEXT},
        input={"text": TEXT},
        checkpoints=_parked_checkpoints(workflow),
    )
    assert verdict.violations == ("validate rule `response.note != input.text` is false",)


# --- input validation ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("input", "fragments"),
    [
        ({"txt": "x"}, ["input.txt: unknown field; jobs.test.Text has text, fail"]),
        ({"text": 5}, ["input.text: expected a string, got number 5"]),
        ({"text": "x", "meta": {"tags": ["a", 2]}}, ["input.meta.tags[1]: expected a string"]),
        ({"text": "x", "meta": {"lang": None, "extra": 1}}, ["input.meta.extra: unknown field"]),
        ({"text": "x", "delay_ms": -1}, ["input.delay_ms: -1 is out of range for uint32"]),
        ({"text": "x", "delay_ms": "soon"}, ["input.delay_ms: expected an integer (uint32)"]),
        ({"text": "x", "meta": []}, ["input.meta: expected an object (jobs.test.Meta)"]),
        ({}, ["input.text: must be at least 1 characters"]),
        (["x"], ["input: expected a JSON object, got a list"]),
    ],
)
def test_invalid_input_is_refused_with_field_paths(input: Any, fragments: list[str]) -> None:
    workflow = compile_definition(envelope())
    with pytest.raises(InputError) as caught:
        workflow.validate_input(input)
    message = str(caught.value)
    assert message.startswith("input is not a valid jobs.test.Text: ")
    for fragment in fragments:
        assert fragment in message


def test_input_the_first_step_needs_is_required() -> None:
    definition = envelope(review=None)
    definition["steps"][0]["rules"] = ["text = input.text", "meta.lang = input.meta.lang"]
    workflow = compile_definition(definition)
    with pytest.raises(InputError) as caught:
        workflow.validate_input({"text": TEXT})
    assert "step 'tokenize' cannot be built from it" in str(caught.value)
    assert "rule `meta.lang = input.meta.lang` failed to evaluate" in str(caught.value)
    assert workflow.validate_input({"text": TEXT, "meta": {"lang": "en"}})["meta"] == {
        "lang": "en",
        "tags": [],
    }


def test_valid_input_comes_back_canonical() -> None:
    workflow = compile_definition(envelope())
    canonical = {"text": TEXT, "fail": "", "delay_ms": 5, "embed_fail": ""}
    assert workflow.validate_input({"text": TEXT, "delayMs": "5"}) == canonical
    # Input that came through a protobuf Struct carries every number as a double.
    assert workflow.validate_input({"text": TEXT, "delay_ms": 5.0}) == canonical


@pytest.mark.parametrize(
    ("answer", "fragment"),
    [
        ({"at": {"seconds": 10**12}}, "Timestamp is not valid"),
        ({"at": {"nanos": 2_000_000_000}}, "Timestamp is not valid"),
    ],
)
async def test_a_response_with_no_json_form_fails_non_retryably_naming_it(
    answer: dict[str, Any], fragment: str
) -> None:
    # Retrying would ask for the same answer again; before, the codec's own
    # error escaped the runner and the claim loop spent every attempt on it.
    async def everything(request: Any, ctx: StepContext) -> Any:
        message = ctx.response_type()
        for field, values in answer.items():
            for name, value in values.items():
                setattr(getattr(message, field), name, value)
        return message

    workflow = compile_definition(with_a_step(answers="jobs.test.Everything"))
    registry = _registry_with("answers.Answers/Answer", everything)
    observer = Recorder()
    with pytest.raises(StepFailure) as caught:
        await _run(workflow, {"text": TEXT}, registry=registry, observer=observer)
    assert caught.value.kind is FailureKind.NON_RETRYABLE
    assert caught.value.step_name == "answer"
    assert "the response of answers.Answers/Answer has no proto3 JSON form" in caught.value.message
    assert fragment in caught.value.message
    assert [entry["name"] for entry in observer.entries] == ["tokenize", "embed"]


async def test_a_response_holding_an_any_of_an_unknown_type_fails_non_retryably() -> None:
    async def boxed(request: Any, ctx: StepContext) -> Any:
        return ctx.response_type(type_url="type.googleapis.com/nowhere.Unknown", value=b"\x01")

    workflow = compile_definition(with_a_step(answers="google.protobuf.Any"))
    registry = _registry_with("answers.Answers/Answer", boxed)
    with pytest.raises(StepFailure) as caught:
        await _run(workflow, {"text": TEXT}, registry=registry)
    assert caught.value.kind is FailureKind.NON_RETRYABLE
    assert "type.googleapis.com/nowhere.Unknown" in caught.value.message


async def test_a_handler_raising_cancelled_error_unasked_fails_its_step_non_retryably() -> None:
    # Nobody cancelled the segment: the CancelledError is the handler's own
    # (an inner task it awaited was cancelled), a defect of the handler. Let
    # through, it would end the worker's runner and hand the job back forever.
    async def tokenize(request: Any, ctx: StepContext) -> Any:
        inner = asyncio.ensure_future(asyncio.sleep(10))
        inner.cancel()
        return await inner

    registry = _registry_with(TOKENIZE, tokenize)
    workflow = compile_definition(envelope(review=None))
    with pytest.raises(StepFailure) as caught:
        await _run(workflow, {"text": TEXT}, registry=registry)
    assert caught.value.kind is FailureKind.NON_RETRYABLE
    assert caught.value.step_name == "tokenize"
    assert "CancelledError" in caught.value.message
