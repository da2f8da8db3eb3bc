"""Deadline keys of the envelope: a whole-job deadline, an external step's timeout and fallback."""

from __future__ import annotations

from typing import Any

import pytest

from tests.workflows_fixtures import envelope, make_registry
from workflows.compiler import compile_definition
from workflows.envelope import DefinitionError
from workflows.runner import Parked, run_segment


def _reviewed(**review: Any) -> dict[str, Any]:
    definition = envelope(name="timed")
    definition["steps"][2].update(review)
    return definition


def test_job_deadline_and_step_timeout_compile() -> None:
    definition = _reviewed(timeoutMs=60_000, fallback={"approved": True, "reviewer": "auto"})
    definition["jobDeadlineMs"] = 3_600_000
    workflow = compile_definition(definition)
    assert workflow.job_deadline_ms == 3_600_000
    review = workflow.step("review")
    assert review.timeout_ms == 60_000
    assert review.fallback == {"approved": True, "reviewer": "auto", "note": ""}
    assert workflow.step("tokenize").timeout_ms is None


def test_no_deadline_keys_means_none() -> None:
    workflow = compile_definition(envelope(name="plain"))
    assert workflow.job_deadline_ms is None
    assert workflow.step("review").timeout_ms is None
    assert workflow.step("review").fallback is None


@pytest.mark.parametrize(
    ("change", "path", "words"),
    [
        ({"jobDeadlineMs": 0}, "jobDeadlineMs", "between 1 and"),
        ({"jobDeadlineMs": "soon"}, "jobDeadlineMs", "whole number of milliseconds"),
    ],
)
def test_a_bad_job_deadline_is_refused(change: dict[str, Any], path: str, words: str) -> None:
    with pytest.raises(DefinitionError) as refused:
        compile_definition({**envelope(name="bad"), **change})
    assert refused.value.path == path
    assert words in refused.value.message


def test_a_timeout_belongs_to_external_steps_only() -> None:
    definition = envelope(name="bad")
    definition["steps"][0]["timeoutMs"] = 1000
    with pytest.raises(DefinitionError) as refused:
        compile_definition(definition)
    assert refused.value.path == "steps[0].timeoutMs"
    assert 'completion "external"' in refused.value.message


def test_a_fallback_needs_a_timeout_and_must_fit_the_response_type() -> None:
    with pytest.raises(DefinitionError) as no_timeout:
        compile_definition(_reviewed(fallback={"approved": True}))
    assert no_timeout.value.path == "steps[2].fallback"
    assert "set timeoutMs" in no_timeout.value.message

    with pytest.raises(DefinitionError) as misfit:
        compile_definition(_reviewed(timeoutMs=1000, fallback={"approved": "maybe"}))
    assert misfit.value.path == "steps[2].fallback"
    assert "jobs.test.Review" in misfit.value.message


async def test_a_parked_segment_carries_the_built_request_and_the_timeout() -> None:
    workflow = compile_definition(_reviewed(timeoutMs=5000))
    registry = make_registry()

    async def keep(entry: dict[str, Any]) -> None:
        return None

    outcome = await run_segment(
        workflow,
        {"text": "hello world"},
        (),
        job_id="00000000-0000-0000-0000-000000000001",
        attempt=1,
        on_checkpoint=keep,
        registry=registry,
    )
    assert isinstance(outcome, Parked)
    assert outcome.step_name == "review" and outcome.timeout_ms == 5000
    assert outcome.request["text"] == "hello world"
    assert outcome.request["dimensions"] == 4
