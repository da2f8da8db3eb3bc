"""A rule that walks lists is estimated against the job's data before it runs.

The engine holds the interpreter lock while it evaluates and cannot be stopped,
and its ``map`` and ``filter`` are quadratic: a rule over a long list in a
job's input would stall the worker's event loop for seconds. Past
``RuleLimits.max_cost`` such a rule is not evaluated at all.
"""

from __future__ import annotations

import base64
import copy
import re
import time
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

from schemas.gen.buf.validate import validate_pb2
from tests.workflows_fixtures import descriptor_set, envelope, make_registry
from workflows import (
    CompiledWorkflow,
    FailureKind,
    InputError,
    StepFailure,
    compile_definition,
    run_segment,
)
from workflows.rules import RuleLimits, RuleTooCostly, Scope, count_elements, make_rule

SCOPE = ("input", "tokenize")


@pytest.mark.parametrize(
    ("expression", "walks", "widens", "literal"),
    [
        ("input.text", 0, 1, 0),
        ("size(input.ids) > 0 && input.text != ''", 0, 1, 0),
        ("input.ids.all(x, x > 0)", 1, 1, 0),
        ("input.ids.map(x, x + 1)", 2, 2, 0),
        ("input.ids.filter(x, input.ids.exists(y, y == x))", 3, 1, 0),
        ("[1, 2, 3].all(x, x > 0) && input.ids.all(x, x > 0)", 1, 1, 3),
        ("(input.ids + input.ids).map(x, [x, x])", 2, 2, 2),
        ("['a,b', 'c'].exists(x, x == input.text)", 1, 1, 2),  # commas in a string are no elements
    ],
)
def test_a_rule_knows_what_bounds_its_cost(
    expression: str, walks: int, widens: int, literal: int
) -> None:
    rule = make_rule(expression, expression, SCOPE)
    assert (rule.walks, rule.widens, rule.literal) == (walks, widens, literal)


def test_elements_are_counted_at_every_depth() -> None:
    assert count_elements({"a": [1, 2, {"b": [3]}], "c": "text"}) == 2 + 3 + 1 + 1
    assert count_elements("a long string") == 0


def test_a_map_over_a_long_list_is_refused_at_once_and_a_short_one_runs() -> None:
    rule = make_rule("m", "input.ids.map(x, x * 2)", SCOPE)
    long = Scope({"ids": list(range(8_000))})
    started = time.perf_counter()
    with pytest.raises(RuleTooCostly, match=r"lists of up to 8001 elements .* 8001\^2 steps"):
        long.evaluate(rule)
    # Evaluated, the engine would take seconds; the estimate takes a walk of the data.
    assert time.perf_counter() - started < 0.05
    assert Scope({"ids": list(range(900))}).evaluate(rule)[-1] == 1798


def test_a_linear_walk_over_a_long_list_is_within_the_default_limit() -> None:
    rule = make_rule("a", "input.ids.all(x, x >= 0)", SCOPE)
    assert Scope({"ids": list(range(200_000))}).evaluate(rule) is True


def test_the_limit_is_the_scopes_and_joined_lists_count_double() -> None:
    rule = make_rule("j", "(input.ids + input.ids).filter(x, x > 5)", SCOPE)
    values = {"ids": list(range(10))}  # 11 elements, joined: up to 22, squared: 484
    assert len(Scope(values, max_cost=484).evaluate(rule)) == 8
    with pytest.raises(RuleTooCostly, match="over its limit of 483 "):
        Scope(values, max_cost=483).evaluate(rule)


def _mapping_over_tags() -> dict[str, Any]:
    workflow = copy.deepcopy(envelope(review=None))
    workflow["steps"][0]["rules"][0] = (
        "text = input.meta.tags.filter(t, t != '').size() >= 0 ? input.text : ''"
    )
    return workflow


def test_an_input_too_large_for_the_first_steps_rules_is_refused_at_submit() -> None:
    workflow = compile_definition(_mapping_over_tags(), limits=RuleLimits(max_cost=10_000))
    assert workflow.validate_input({"text": "a", "meta": {"tags": ["t"] * 90}})
    with pytest.raises(InputError) as refused:
        workflow.validate_input({"text": "a", "meta": {"tags": ["t"] * 120}})
    assert "step 'tokenize' cannot be built from it: rule `text = input.meta.tags" in str(
        refused.value
    )
    # The tags and the input's other members.
    assert re.search(
        r"was not evaluated: it would walk lists of up to 12\d elements", str(refused.value)
    )


async def test_a_rule_too_costly_for_a_steps_response_fails_the_job_for_good() -> None:
    workflow = copy.deepcopy(envelope(review=None))
    workflow["steps"][1]["rules"].append("delay_ms = tokenize.ids.map(i, i).size() * 0")
    compiled = compile_definition(workflow, limits=RuleLimits(max_cost=100))
    text = " ".join(f"w{index}" for index in range(12))  # twelve ids and two members: 14^2 steps
    caught = await _failure_of(compiled, text)
    assert caught.kind is FailureKind.NON_RETRYABLE
    assert caught.step_name == "embed"
    assert "rule `delay_ms = tokenize.ids.map(i, i).size() * 0` was not evaluated" in (
        caught.message
    )
    assert "(WFJOBS_RULE_MAX_COST)" in caught.message


async def _failure_of(workflow: CompiledWorkflow, text: str) -> StepFailure:
    """How a segment of ``workflow`` over the input ``text`` fails."""

    async def ignore(entry: dict[str, Any]) -> None:
        return None

    with pytest.raises(StepFailure) as caught:
        await run_segment(
            workflow,
            workflow.validate_input({"text": text}),
            [],
            job_id="job-1",
            attempt=1,
            on_checkpoint=ignore,
            registry=make_registry(),
        )
    return caught.value


def _with_message_rule(message: str, field_name: str, expression: str) -> dict[str, Any]:
    """The test workflow, ``message.field_name`` carrying a custom protovalidate rule."""
    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set())
    [own] = [file for file in files.file if file.name == "jobs_test.proto"]
    [found] = [m for m in own.message_type if m.name == message]
    [target] = [f for f in found.field if f.name == field_name]
    rules = validate_pb2.FieldRules()
    rules.cel.add(id="walk", message="walked", expression=expression)
    target.options.Extensions[validate_pb2.field].CopyFrom(rules)  # type: ignore[index]
    workflow = copy.deepcopy(envelope(review=None))
    workflow["schema"]["descriptorSetBase64"] = base64.b64encode(files.SerializeToString()).decode(
        "ascii"
    )
    return workflow


def test_an_input_too_large_for_its_types_rules_is_refused_before_they_run() -> None:
    workflow = compile_definition(
        _with_message_rule("Meta", "tags", "this.map(t, t + '!').size() >= 0"),
        limits=RuleLimits(max_cost=10_000),
    )
    assert workflow.validate_input({"text": "a", "meta": {"tags": ["t"] * 40}})
    started = time.perf_counter()
    with pytest.raises(InputError) as refused:
        workflow.validate_input({"text": "a", "meta": {"tags": ["t"] * 5_000}})
    assert time.perf_counter() - started < 0.1
    assert (
        "the rules declared on jobs.test.Text were not evaluated: one of the schema's "
        "CEL rules would walk lists of up to 10006 elements"
    ) in str(refused.value)


async def test_a_response_too_large_for_its_types_rules_fails_the_step_for_good() -> None:
    workflow = compile_definition(
        _with_message_rule("Tokens", "ids", "this.filter(i, i >= 0).size() >= 0"),
        limits=RuleLimits(max_cost=100),
    )
    text = " ".join(f"w{index}" for index in range(12))
    caught = await _failure_of(workflow, text)
    assert caught.kind is FailureKind.NON_RETRYABLE
    assert caught.step_name == "tokenize"
    assert "the rules declared on jobs.test.Tokens were not evaluated" in caught.message
