"""The CEL rules on the wire messages hold, and the contract helpers keep them."""

from __future__ import annotations

import itertools
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from google.protobuf import struct_pb2
from hypothesis import given
from hypothesis import strategies as st

from schemas.contract import (
    EventType,
    WorkflowRunEvent,
    WorkflowRunRequest,
    api_pb2,
    build_event,
    check_incoming,
    decode_event,
    encode_event,
    event_obeys_rules,
    parse_job_id,
    violations,
    with_event_id,
)
from schemas.errors import ContractViolation, InvalidArgument
from schemas.gen.workflowjobs.v1 import events_pb2, requests_pb2

JOB_ID = "8a4a0f2e-5b7c-4d1e-9f3a-2b6c8d0e1f24"
WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def event(event_type: int, **fields: Any) -> WorkflowRunEvent:
    return build_event(
        job_id=JOB_ID,
        event_type=event_type,
        workflow_name="tokenize-and-embed",
        attempt=1,
        occurred_at=WHEN,
        **fields,
    )


# --------------------------------------------------------------------------- events


@pytest.mark.parametrize(
    ("event_type", "fields"),
    [
        (EventType.TYPE_ACCEPTED, {}),
        (EventType.TYPE_STEP_CHECKPOINT, {"step_name": "tokenize", "response": {"ids": [1]}}),
        (EventType.TYPE_WAITING, {"step_name": "review"}),
        (EventType.TYPE_COMPLETED, {"verdict": "approved", "result": {"score": 0.9}}),
        (EventType.TYPE_FAILED, {"error": "INVALID_ARGUMENT: text is empty"}),
        (EventType.TYPE_DEAD, {"error": "UNAVAILABLE: embedder down"}),
    ],
)
def test_well_formed_events_are_built(event_type: int, fields: dict[str, Any]) -> None:
    built = event(event_type, **fields)
    assert built.type == event_type
    assert violations(built) == []


def test_completed_without_verdict_is_refused() -> None:
    with pytest.raises(ContractViolation, match="COMPLETED event must carry a verdict"):
        event(EventType.TYPE_COMPLETED, result={"score": 0.9})


@pytest.mark.parametrize("event_type", [EventType.TYPE_FAILED, EventType.TYPE_DEAD])
def test_failure_without_error_is_refused(event_type: int) -> None:
    with pytest.raises(ContractViolation, match="must carry the error verbatim"):
        event(event_type, verdict="it broke")


@pytest.mark.parametrize("event_type", [EventType.TYPE_STEP_CHECKPOINT, EventType.TYPE_WAITING])
def test_step_events_must_name_their_step(event_type: int) -> None:
    with pytest.raises(ContractViolation, match="must name their step"):
        event(event_type)


def test_unspecified_type_is_never_published() -> None:
    with pytest.raises(ContractViolation) as caught:
        event(EventType.TYPE_UNSPECIFIED)
    assert "type:" in caught.value.message
    assert caught.value.code == "INTERNAL"


def test_undefined_type_number_is_refused() -> None:
    with pytest.raises(ContractViolation, match="type:"):
        event(99)


def test_event_with_non_uuid_job_id_is_refused() -> None:
    with pytest.raises(ContractViolation, match="job_id:"):
        build_event(
            job_id="job-42",
            event_type=EventType.TYPE_ACCEPTED,
            workflow_name="w",
            attempt=0,
            occurred_at=WHEN,
        )


def test_event_without_timestamp_breaks_the_contract() -> None:
    bare = WorkflowRunEvent(job_id=JOB_ID, type=EventType.TYPE_ACCEPTED, workflow_name="w")
    assert any(v.startswith("occurred_at:") for v in violations(bare))


# --------------------------------------------------------------------------- requests


def _struct(**values: Any) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(values)
    return s


def test_submit_names_exactly_one_definition_source() -> None:
    inline = api_pb2.SubmitWorkflowRequest(workflow=_struct(name="inline"))
    stored = api_pb2.SubmitWorkflowRequest(workflow_name="stored")
    check_incoming(inline)
    check_incoming(stored)

    both = api_pb2.SubmitWorkflowRequest(workflow=_struct(name="inline"), workflow_name="stored")
    neither = api_pb2.SubmitWorkflowRequest(input=_struct(text="hi"))
    for request in (both, neither):
        with pytest.raises(InvalidArgument, match="exactly one definition source") as caught:
            check_incoming(request)
        # A caller's mistake, not our bug: answered as a bad request.
        assert caught.value.code == "INVALID_ARGUMENT"


def test_an_empty_inline_workflow_still_counts_as_a_source() -> None:
    request = api_pb2.SubmitWorkflowRequest(workflow_name="stored")
    request.workflow.SetInParent()
    with pytest.raises(InvalidArgument, match="exactly one definition source"):
        check_incoming(request)


def test_the_rules_do_not_walk_a_structs_contents() -> None:
    # protovalidate walks a message in native code that holds the interpreter
    # lock: half a second for a Struct of 130 000 values, during which no other
    # thread (the event loop's included) runs. No rule reads into a Struct.
    request = api_pb2.CompleteStepRequest(job_id=str(uuid.uuid4()), step_name="review")
    request.response.update({"x": list(range(130_000))})
    started = time.thread_time()
    check_incoming(request)
    assert time.thread_time() - started < 0.1
    assert len(request.response["x"]) == 130_000
    submit = api_pb2.SubmitWorkflowRequest(workflow_name="stored", input=request.response)
    submit.workflow.update({"huge": list(range(130_000))})
    started = time.thread_time()
    with pytest.raises(InvalidArgument, match="exactly one definition source"):
        check_incoming(submit)
    assert time.thread_time() - started < 0.1
    request.ClearField("response")
    with pytest.raises(InvalidArgument, match="response: value is required"):
        check_incoming(request)


def _struct_fields(message: Any) -> list[Any]:
    return [
        field
        for field in message.DESCRIPTOR.fields
        if field.message_type is not None
        and field.message_type.full_name == "google.protobuf.Struct"
    ]


def test_no_rule_of_the_contract_reads_into_a_struct() -> None:
    """What lets ``violations`` check a message with its Structs' contents left out."""
    from schemas.gen.buf.validate import validate_pb2

    extensions: Any = validate_pb2
    for module in (api_pb2, events_pb2, requests_pb2):
        for message_type in module.DESCRIPTOR.message_types_by_name.values():
            fields = _struct_fields(message_type._concrete_class)
            message_rules = message_type.GetOptions().Extensions[extensions.message]
            for field in fields:
                options = field.GetOptions()
                if options.HasExtension(extensions.field):
                    assert str(options.Extensions[extensions.field]) == "required: true\n", field
                for rule in message_rules.cel:
                    # Only whether it is set: has(this.field), never this.field.key.
                    used = rule.expression.replace(f"has(this.{field.name})", "")
                    read = re.search(rf"\bthis\.{field.name}\b", used)
                    assert read is None, (message_type.name, rule.id)


def test_submit_job_id_is_optional_but_must_be_a_uuid() -> None:
    check_incoming(api_pb2.SubmitWorkflowRequest(workflow_name="stored"))
    check_incoming(api_pb2.SubmitWorkflowRequest(workflow_name="stored", job_id=JOB_ID))
    with pytest.raises(InvalidArgument, match="job_id:"):
        check_incoming(api_pb2.SubmitWorkflowRequest(workflow_name="stored", job_id="42"))


@pytest.mark.parametrize(
    "job_id", ["", "42", JOB_ID.replace("-", ""), f"{{{JOB_ID}}}", f"urn:uuid:{JOB_ID}"]
)
def test_run_request_refuses_non_uuid_job_ids(job_id: str) -> None:
    request = WorkflowRunRequest(job_id=job_id, workflow_name="stored")
    problems = violations(request)
    assert problems
    assert all(p.startswith("job_id:") for p in problems)


def test_run_request_needs_a_workflow_name() -> None:
    with pytest.raises(InvalidArgument, match="workflow_name:"):
        check_incoming(WorkflowRunRequest(job_id=JOB_ID))


# --------------------------------------------------------------------------- job ids


@pytest.mark.parametrize("text", [JOB_ID, JOB_ID.upper()])
def test_parse_job_id_accepts_uuids(text: str) -> None:
    assert parse_job_id(text) == uuid.UUID(JOB_ID)


def test_parse_job_id_passes_uuid_objects_through() -> None:
    value = uuid.uuid4()
    assert parse_job_id(value) is value


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not-a-uuid",
        JOB_ID[:-1],
        JOB_ID + "0",
        f" {JOB_ID}",
        JOB_ID.replace("-", ""),
        f"{{{JOB_ID}}}",
        f"urn:uuid:{JOB_ID}",
        # uuid.UUID() would take this: it drops every hyphen before parsing.
        "8-a4a0f2e5b7c4d1e9f3a2b6c8d0e1f24",
    ],
)
def test_parse_job_id_refuses_what_the_wire_contract_refuses(text: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_job_id(text)
    assert repr(text) in caught.value.message
    # The same string on the wire breaks the `string.uuid` rule too.
    assert violations(WorkflowRunRequest(job_id=text, workflow_name="w"))


# --------------------------------------------------------------------------- event ids


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_with_event_id_round_trips(event_id: int) -> None:
    original = event(EventType.TYPE_COMPLETED, verdict="ok", result={"n": 3})
    decoded = decode_event(with_event_id(encode_event(original), event_id))
    assert decoded.event_id == event_id
    decoded.event_id = 0
    assert decoded == original


def test_with_event_id_overrides_an_id_already_encoded() -> None:
    original = event(EventType.TYPE_ACCEPTED)
    original.event_id = 7
    assert decode_event(with_event_id(encode_event(original), 8)).event_id == 8


# --------------------------------------------------------------------------- the rule mirror

# What events.proto declares today, as protovalidate reads it. event_obeys_rules
# mirrors exactly these; a change here means the mirror must change with it.
DECLARED_EVENT_RULES = {
    "": [
        ("event.completed_has_verdict", "this.type != 4 || this.verdict != ''"),
        ("event.failure_has_error", "!(this.type == 5 || this.type == 6) || this.error != ''"),
        ("event.step_names_step", "!(this.type == 2 || this.type == 3) || this.step_name != ''"),
        (
            "event.retry_has_error_and_time",
            "this.type != 8 || (this.error != '' && has(this.next_run_at))",
        ),
        ("event.resumed_names_run", "this.type != 9 || this.resumed_by != ''"),
    ],
    "message rule kinds": ["cel"],
    "job_id": "string {\n  uuid: true\n}\n",
    "type": "enum {\n  defined_only: true\n  not_in: 0\n}\n",
    "workflow_name": "string {\n  min_len: 1\n}\n",
    "attempt": "int32 {\n  gte: 0\n}\n",
    "occurred_at": "required: true\n",
}


def _declared_event_rules() -> dict[str, Any]:
    from schemas.gen.buf.validate import validate_pb2

    # The generated stubs type the extensions as plain field descriptors.
    extensions: Any = validate_pb2
    descriptor = WorkflowRunEvent.DESCRIPTOR
    message_rules = descriptor.GetOptions().Extensions[extensions.message]
    declared: dict[str, Any] = {
        "": [(rule.id, rule.expression) for rule in message_rules.cel],
    }
    # Anything besides CEL rules on the message (oneof rules, say) shows up here.
    declared["message rule kinds"] = [field.name for field, _ in message_rules.ListFields()]
    for field in descriptor.fields:
        options = field.GetOptions()
        if options.HasExtension(extensions.field):
            declared[field.name] = str(options.Extensions[extensions.field])
    return declared


def test_the_mirror_knows_every_declared_event_rule() -> None:
    assert _declared_event_rules() == DECLARED_EVENT_RULES


# Every declared type, the unset one, and numbers no type has.
_EVENT_TYPES = [*range(10), 99]
_JOB_IDS = [
    JOB_ID,
    JOB_ID.upper(),
    "",
    JOB_ID.replace("-", ""),
    "{" + JOB_ID + "}",
    "urn:uuid:" + JOB_ID,
    JOB_ID + "\n",
    JOB_ID[:-1] + "g",
    JOB_ID[:-1] + "\u0663",  # an Arabic-Indic digit: a digit, but not hex
]


def _raw_event(
    event_type: int,
    job_id: str,
    workflow_name: str,
    attempt: int,
    stamped: bool,
    step_name: str,
    verdict: str,
    error: str,
    next_run: bool = False,
    resumed_by: str = "",
) -> WorkflowRunEvent:
    # Built field by field, without build_event, so invalid events can exist.
    built = WorkflowRunEvent(
        job_id=job_id,
        workflow_name=workflow_name,
        attempt=attempt,
        step_name=step_name,
        verdict=verdict,
        error=error,
        resumed_by=resumed_by,
    )
    built.type = event_type  # type: ignore[assignment]
    if stamped:
        built.occurred_at.FromDatetime(WHEN)
    if next_run:
        built.next_run_at.FromDatetime(WHEN)
    return built


def test_the_mirror_agrees_with_protovalidate_on_every_combination() -> None:
    combinations = list(
        itertools.product(
            _EVENT_TYPES,
            _JOB_IDS,
            ("", "n", "é"),  # workflow_name
            (-1, 0, 3),  # attempt
            (True, False),  # occurred_at set
            ("", "tokenize"),  # step_name
            ("", "ok"),  # verdict
            ("", "boom"),  # error
        )
    )
    assert len(combinations) == 11 * 9 * 3 * 3 * 2 * 2 * 2 * 2
    for combination in combinations:
        built = _raw_event(*combination)
        assert event_obeys_rules(built) == (violations(built) == []), built


def test_the_mirror_agrees_on_the_retry_and_resume_fields() -> None:
    for event_type, stamped, error, next_run, resumed_by in itertools.product(
        _EVENT_TYPES, (True, False), ("", "boom"), (True, False), ("", JOB_ID)
    ):
        built = _raw_event(
            event_type, JOB_ID, "n", 1, stamped, "s", "ok", error, next_run, resumed_by
        )
        assert event_obeys_rules(built) == (violations(built) == []), built


@given(
    event_type=st.integers(min_value=-1, max_value=10),
    job_id=st.one_of(st.uuids().map(str), st.text(max_size=40)),
    workflow_name=st.text(max_size=3),
    attempt=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    stamped=st.booleans(),
    step_name=st.text(max_size=3),
    verdict=st.text(max_size=3),
    error=st.text(max_size=3),
)
def test_the_mirror_agrees_with_protovalidate_on_any_event(
    event_type: int,
    job_id: str,
    workflow_name: str,
    attempt: int,
    stamped: bool,
    step_name: str,
    verdict: str,
    error: str,
) -> None:
    built = _raw_event(
        event_type, job_id, workflow_name, attempt, stamped, step_name, verdict, error
    )
    assert event_obeys_rules(built) == (violations(built) == [])


def test_payloads_do_not_change_the_verdict() -> None:
    # Struct payloads carry no rules: a large response or result is judged by
    # the envelope alone, by both.
    for event_type, fields in [
        (EventType.TYPE_STEP_CHECKPOINT, {"step_name": "s", "response": {"a": [1, {"b": None}]}}),
        (EventType.TYPE_COMPLETED, {"verdict": "v", "result": {"x": "y" * 1000}}),
    ]:
        built = event(event_type, **fields)
        assert event_obeys_rules(built)
        assert violations(built) == []
