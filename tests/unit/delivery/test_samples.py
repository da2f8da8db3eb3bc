"""The sample workflow: its descriptor set matches its .proto, it compiles, its handlers work."""

from __future__ import annotations

import math
import time
import uuid

from workflows.compiler import compile_definition
from workflows.invokers import HandlerRegistry, StepContext, coerce_response, load_handler_modules
from workflows.protojson import to_json
from workflows.rules import Scope
from workflows.samples import (
    HANDLER_MODULE,
    SAMPLE_INPUT,
    SAMPLE_REVIEW,
    SAMPLE_WORKFLOW_NAME,
    automatic_workflow,
    sample_workflow,
)
from workflows.samples import build as sample_build
from workflows.samples.handlers import EMBED, REVIEW, TOKENIZE, embed_ids, tokenize_text


def test_checked_in_descriptor_set_matches_the_proto() -> None:
    assert sample_build.main(["--check"]) == 0
    workflow = sample_build.load_workflow()
    files = sample_build.parse_set(sample_build.checked_in_set(workflow))
    assert [f.name for f in files.file] == ["embed_review.proto"]
    assert files.file[0].package == "wfjobs.samples.v1"


def test_sample_compiles_with_an_external_review() -> None:
    workflow = compile_definition(sample_workflow())
    assert workflow.name == SAMPLE_WORKFLOW_NAME
    assert [(step.name, step.external) for step in workflow.steps] == [
        ("tokenize", False),
        ("embed", False),
        ("review", True),
    ]
    assert workflow.validate_input(SAMPLE_INPUT) == SAMPLE_INPUT


def test_automatic_variant_runs_every_step_in_process() -> None:
    workflow = compile_definition(automatic_workflow())
    assert not any(step.external for step in workflow.steps)
    assert workflow.name != SAMPLE_WORKFLOW_NAME


def test_review_response_is_judged_by_its_validate_rule() -> None:
    workflow = compile_definition(sample_workflow())
    accepted = workflow.accept_external("review", SAMPLE_REVIEW)
    assert accepted.accepted
    rejected = workflow.accept_external("review", {"approved": False, "note": ""})
    assert not rejected.accepted
    assert workflow.accept_external("review", {"approved": False, "note": "needs work"}).accepted


async def test_handlers_answer_every_step_of_the_automatic_workflow() -> None:
    registry = HandlerRegistry()
    load_handler_modules(HANDLER_MODULE, registry)
    assert set(registry.methods()) >= {TOKENIZE, EMBED, REVIEW}
    workflow = compile_definition(automatic_workflow())
    scope = Scope(SAMPLE_INPUT)
    job_id = str(uuid.uuid4())
    responses = {}
    for step in workflow.steps:
        handler = registry.get(step.method)
        assert handler is not None
        context = StepContext(
            job_id=job_id,
            step_name=step.name,
            attempt=1,
            expires_at=time.monotonic() + 30,
            response_type=step.response_type,
        )
        request = step.build_request(scope)
        response = to_json(coerce_response(await handler(request, context), step))
        scope.bind(step.name, response)
        responses[step.name] = response
    assert responses["tokenize"]["tokens"][:2] == ["durable", "jobs"]
    assert responses["embed"]["dimensions"] == 8
    assert responses["review"] == {"approved": True, "note": "approved automatically"}


def test_tokens_and_vectors_are_deterministic() -> None:
    tokens, ids = tokenize_text("Hello, hello WORLD! it's")
    assert tokens == ["hello", "hello", "world", "it's"]
    assert ids[0] == ids[1] != ids[2]
    assert tokenize_text("Hello, hello WORLD! it's") == (tokens, ids)
    vector = embed_ids(ids)
    assert vector == embed_ids(ids)
    assert math.isclose(math.sqrt(sum(v * v for v in vector)), 1.0, abs_tol=1e-5)
    assert embed_ids([]) == [0.0] * 8
