"""Compiling definitions: the happy path, malformed envelopes, junk, the cache."""

from __future__ import annotations

import base64
import contextlib
import copy
import re
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.errors import InvalidArgument
from tests.workflows_fixtures import (
    EMBED,
    REVIEW,
    TOKENIZE,
    descriptor_set,
    envelope,
    with_a_step,
)
from workflows import (
    DEFAULT_DEADLINE_MS,
    DefinitionCache,
    DefinitionError,
    compile_definition,
    definition_hash,
)


def test_the_test_workflow_compiles() -> None:
    workflow = compile_definition(envelope())
    assert workflow.name == "embed-text"
    assert workflow.deadline_ms == DEFAULT_DEADLINE_MS
    assert [step.name for step in workflow.steps] == ["tokenize", "embed", "review"]
    assert [step.method for step in workflow.steps] == [TOKENIZE, EMBED, REVIEW]
    assert [step.external for step in workflow.steps] == [False, False, True]
    tokenize, embed, review = workflow.steps
    assert tokenize.request_type.DESCRIPTOR.full_name == "jobs.test.Text"
    assert tokenize.response_type.DESCRIPTOR.full_name == "jobs.test.Tokens"
    assert embed.response_type.DESCRIPTOR.full_name == "jobs.test.Embedding"
    assert review.response_type.DESCRIPTOR.full_name == "jobs.test.ReviewResult"
    assert tokenize.target == "local" and tokenize.remote_target is None
    assert review.target is None
    assert tokenize.grpc_path == "/jobs.test.Tokenizer/Tokenize"
    assert workflow.has_external_steps


def test_definition_is_immutable() -> None:
    workflow = compile_definition(envelope())
    with pytest.raises(AttributeError):
        workflow.name = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        workflow.steps[0].name = "other"  # type: ignore[misc]


def test_target_and_deadline_are_read() -> None:
    workflow = compile_definition(envelope(target="127.0.0.1:50051", deadline_ms=1500))
    assert workflow.deadline_ms == 1500
    assert workflow.steps[0].remote_target == "127.0.0.1:50051"


def test_deadline_may_arrive_as_a_double() -> None:
    # A definition that passed through a protobuf Struct carries every number as a double.
    definition = envelope()
    definition["deadlineMs"] = 2500.0
    assert compile_definition(definition).deadline_ms == 2500


def test_descriptor_set_without_imports_still_loads() -> None:
    full = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set())
    own_only = descriptor_pb2.FileDescriptorSet()
    own_only.file.extend(f for f in full.file if f.name == "jobs_test.proto")
    definition = envelope()
    definition["schema"]["descriptorSetBase64"] = base64.b64encode(
        own_only.SerializeToString()
    ).decode()
    assert compile_definition(definition).steps[0].name == "tokenize"


def test_hash_is_stable_and_ignores_key_order() -> None:
    one = envelope()
    two = dict(reversed(list(copy.deepcopy(one).items())))
    assert definition_hash(one) == definition_hash(two)
    changed = envelope(deadline_ms=10)
    assert definition_hash(one) != definition_hash(changed)
    assert compile_definition(one).definition_hash == definition_hash(one)


def test_cache_compiles_once_and_evicts_least_recent() -> None:
    cache = DefinitionCache(maxsize=2)
    first = envelope(name="one")
    assert cache.get(first) is cache.get(copy.deepcopy(first))
    assert (cache.hits, cache.misses) == (1, 1)
    cache.get(envelope(name="two"))
    cache.get(first)  # refreshes "one"
    cache.get(envelope(name="three"))  # evicts "two"
    assert len(cache) == 2
    assert definition_hash(first) in cache
    assert definition_hash(envelope(name="two")) not in cache
    known = definition_hash(first)
    assert cache.get({"not": "looked at"}, digest=known).name == "one"


def test_cache_does_not_keep_failures() -> None:
    cache = DefinitionCache()
    with pytest.raises(DefinitionError):
        cache.get({"name": "x"})
    assert len(cache) == 0


def test_definition_error_is_invalid_argument() -> None:
    assert issubclass(DefinitionError, InvalidArgument)
    assert DefinitionError("x").code == "INVALID_ARGUMENT"


# --- malformed definitions -------------------------------------------------------------

Edit = Callable[[dict[str, Any]], Any]


def _set(path: list[Any], value: Any) -> Edit:
    def edit(definition: dict[str, Any]) -> None:
        node: Any = definition
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return edit


def _drop(path: list[Any]) -> Edit:
    def edit(definition: dict[str, Any]) -> None:
        node: Any = definition
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return edit


def _rules(step: int, *rules: Any) -> Edit:
    return _set(["steps", step, "rules"], list(rules))


def _file_set(*files: descriptor_pb2.FileDescriptorProto) -> str:
    return base64.b64encode(
        descriptor_pb2.FileDescriptorSet(file=files).SerializeToString()
    ).decode()


def _replace_all(value: Any) -> Edit:
    def edit(definition: dict[str, Any]) -> Any:
        return value

    return edit


def _rename_key(old: str, new: str) -> Edit:
    def edit(definition: dict[str, Any]) -> None:
        definition[new] = definition.pop(old)

    return edit


def _duplicate_step(definition: dict[str, Any]) -> None:
    definition["steps"][1]["name"] = "tokenize"


MALFORMED: list[tuple[str, Edit, list[str]]] = [
    ("not an object", _replace_all(["steps"]), ["must be a JSON object", "a list"]),
    (
        "snake_case key",
        _rename_key("inputType", "input_type"),
        ["unknown key 'input_type'", "did you mean 'inputType'", "camelCase"],
    ),
    ("unknown top key", _set(["retries"], 3), ["unknown key 'retries'", "allowed keys"]),
    ("missing name", _drop(["name"]), ["'name' is required"]),
    ("blank name", _set(["name"], "  "), ["name: must be a non-blank string"]),
    (
        # A job records its workflow's name, which the store takes only in this form.
        "name with a space",
        _set(["name"], "embed text"),
        ["name: 'embed text' is malformed", "letters, digits, '.', '_' and '-'"],
    ),
    ("missing schema", _drop(["schema"]), ["'schema' is required"]),
    ("schema not object", _set(["schema"], "abc"), ["schema: must be an object"]),
    (
        "schema unknown key",
        _set(["schema", "descriptorSet"], "x"),
        ["schema: unknown key 'descriptorSet'", "did you mean 'descriptorSetBase64'"],
    ),
    (
        "bad base64",
        _set(["schema", "descriptorSetBase64"], "not*base64!"),
        ["schema.descriptorSetBase64: is not valid base64"],
    ),
    (
        "not a descriptor set",
        _set(["schema", "descriptorSetBase64"], base64.b64encode(b"\xff\xff\xff\xff").decode()),
        ["schema.descriptorSetBase64: is not a serialized FileDescriptorSet"],
    ),
    (
        "descriptor set of no files",
        _set(["schema", "descriptorSetBase64"], base64.b64encode(b"\x10\x01").decode()),
        ["schema.descriptorSetBase64: holds no files"],
    ),
    (
        "descriptor set missing an import",
        _set(
            ["schema", "descriptorSetBase64"],
            _file_set(descriptor_pb2.FileDescriptorProto(name="a.proto", dependency=["b.proto"])),
        ),
        ["lacks 'b.proto', imported by 'a.proto'", "--include_imports"],
    ),
    (
        "unknown input type",
        _set(["inputType"], "jobs.test.Txt"),
        ["inputType: 'jobs.test.Txt' is not a message in the descriptor set", "jobs.test.Text"],
    ),
    ("missing steps", _drop(["steps"]), ["'steps' is required"]),
    ("no steps", _set(["steps"], []), ["steps: must be a non-empty list"]),
    ("step not an object", _set(["steps", 1], "embed"), ["steps[1]: must be an object"]),
    (
        "step unknown key",
        _set(["steps", 0, "rule"], []),
        ["steps[0] 'tokenize': unknown key 'rule'", "did you mean 'rules'"],
    ),
    ("step without name", _drop(["steps", 0, "name"]), ["steps[0]: 'name' is required"]),
    (
        "step name not an identifier",
        _set(["steps", 0, "name"], "to-ken"),
        ["steps[0].name: 'to-ken' cannot be used in rules"],
    ),
    (
        "reserved step name",
        _set(["steps", 0, "name"], "input"),
        ["steps[0].name: 'input' is reserved"],
    ),
    (
        "duplicate step",
        _duplicate_step,
        ["steps[1].name: duplicate step name 'tokenize' (also steps[0])"],
    ),
    (
        "method without service",
        _set(["steps", 0, "method"], "Tokenize"),
        ["steps[0] 'tokenize'.method: must have the form `package.Service/Method`"],
    ),
    (
        "unknown service",
        _set(["steps", 0, "method"], "jobs.test.Tokeniser/Tokenize"),
        ["service 'jobs.test.Tokeniser' is not in the descriptor set", "jobs.test.Tokenizer"],
    ),
    (
        "unknown method",
        _set(["steps", 1, "method"], "jobs.test.Embedder/Embedd"),
        ["steps[1] 'embed'.method: service 'jobs.test.Embedder' has no method 'Embedd'", "Embed"],
    ),
    (
        "bad completion",
        _set(["steps", 2, "completion"], "manual"),
        ["steps[2] 'review'.completion: the only completion is \"external\""],
    ),
    (
        "bad target",
        _set(["steps", 0, "target"], "localhost"),
        ["steps[0] 'tokenize'.target: 'localhost' is neither host:port nor 'local'"],
    ),
    (
        "negative deadline",
        _set(["deadlineMs"], -5),
        ["deadlineMs: must be between 1 and 86400000, got -5"],
    ),
    (
        "deadline as text",
        _set(["deadlineMs"], "30s"),
        ["deadlineMs: must be a whole number of milliseconds"],
    ),
    (
        "rules not a list",
        _set(["steps", 0, "rules"], "text = input.text"),
        ["rules: must be a list"],
    ),
    ("rule not a string", _rules(0, "text = input.text", 7), ["rules[1]: a rule must be a string"]),
    (
        "rule without assignment",
        _rules(0, "input.text"),
        ["steps[0] 'tokenize', rules[0] `input.text`: must have the form `field = expression`"],
    ),
    (
        "rule syntax error",
        _rules(0, "text = input.text +"),
        ["steps[0] 'tokenize', rules[0] `text = input.text +`: does not parse as CEL", "column"],
    ),
    (
        "rule reading a missing field",
        _rules(0, "text = input.txt"),
        ["rules[0] `text = input.txt`", "input (jobs.test.Text) has no field 'txt'"],
    ),
    (
        "rule reading a missing nested field",
        _rules(0, "text = has(input.meta) ? input.meta.language : ''"),
        ["input.meta (jobs.test.Meta) has no field 'language'", "its fields: lang, tags"],
    ),
    (
        "rule with a JSON name",
        _rules(0, "delay_ms = input.delayMs"),
        ["has no field 'delayMs'", "did you mean 'delay_ms'?"],
    ),
    (
        "rule assigning a missing field",
        _rules(0, "txt = input.text"),
        ["rules[0] `txt = input.text`: request jobs.test.Text has no field 'txt'"],
    ),
    (
        "rule assigning twice",
        _rules(0, "text = input.text", "text = input.fail"),
        ["rules[1]", "assigns 'text', which rules[0] already assigns"],
    ),
    (
        "rule reading a later step",
        _rules(0, "text = embed.dimensions"),
        ["refers to step 'embed', which runs after this one"],
    ),
    (
        "rule reading its own step",
        _rules(1, "ids = embed.vector"),
        ["steps[1] 'embed', rules[0]", "refers to its own step 'embed'"],
    ),
    (
        "rule reading an unknown name",
        _rules(1, "ids = tokenise.ids"),
        ["refers to 'tokenise', which is not in scope; in scope: input, tokenize"],
    ),
    (
        "rule reading a step's missing field",
        _rules(1, "ids = tokenize.idz"),
        ["steps[1] 'embed', rules[0] `ids = tokenize.idz`", "tokenize (jobs.test.Tokens)"],
    ),
    (
        "rule of the wrong type",
        _rules(0, "text = input.delay_ms"),
        ["produces number 0, which field 'text' (string) cannot hold"],
    ),
    (
        "rule calling an unknown function",
        _rules(0, "text = shout(input.text)"),
        ["calls 'shout', which is not a function CEL knows"],
    ),
    (
        "validate comparing a string with a number",
        _set(["steps", 2, "validate"], ["response.reviewer > 3"]),
        [
            "steps[2] 'review', validate[0] `response.reviewer > 3`",
            "applies an operation to values of types it is not defined for",
            "No such overload",
        ],
    ),
    (
        "rule mixing int and uint",
        _rules(0, "text = input.text", "delay_ms = input.delay_ms + 1u"),
        ["rules[1] `delay_ms = input.delay_ms + 1u`", "types it is not defined for"],
    ),
    (
        "output indexing a string",
        _set(["output"], ["first = input.text[0]"]),
        ["output[0] `first = input.text[0]`", "types it is not defined for"],
    ),
    (
        "validate not boolean",
        _set(["steps", 2, "validate"], ["response.reviewer"]),
        ["steps[2] 'review', validate[0] `response.reviewer`", "must be a boolean expression"],
    ),
    (
        "validate reading a missing field",
        _set(["steps", 2, "validate"], ["response.aproved"]),
        ["response (jobs.test.ReviewResult) has no field 'aproved'"],
    ),
    (
        "output to an unknown step",
        _set(["output"], ["approved = reviews.approved"]),
        ["output[0] `approved = reviews.approved`", "refers to 'reviews'", "neither the input nor"],
    ),
    (
        "output syntax error",
        _set(["output"], ["ids = tokenize.ids["]),
        ["output[0] `ids = tokenize.ids[`: does not parse as CEL"],
    ),
    (
        "too many rules",
        _rules(0, *["text = input.text"] * 257),
        ["steps[0] 'tokenize', rules: at most 256 rules, got 257"],
    ),
    ("output not a list", _set(["output"], "ids = tokenize.ids"), ["output: must be a list"]),
    (
        "output reading a missing field",
        _set(["output"], ["vector = embed.vectors"]),
        ["embed (jobs.test.Embedding) has no field 'vectors'"],
    ),
]


@pytest.mark.parametrize(
    ("edit", "fragments"), [pytest.param(e, f, id=name) for name, e, f in MALFORMED]
)
def test_malformed_definition_gets_a_precise_error(edit: Edit, fragments: list[str]) -> None:
    definition = envelope()
    replaced = edit(definition)
    if replaced is not None:
        definition = replaced
    with pytest.raises(DefinitionError) as caught:
        compile_definition(definition)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_there_are_plenty_of_malformed_cases() -> None:
    assert len(MALFORMED) >= 20


def test_error_carries_a_path() -> None:
    definition = envelope()
    definition["steps"][1]["rules"] = ["ids = tokenize.idz"]
    with pytest.raises(DefinitionError) as caught:
        compile_definition(definition)
    assert caught.value.path == "steps[1].rules[0]"


# A path names keys and indexes only, so a tool can walk the envelope with it.
_PATH = re.compile(r"(?:[A-Za-z]\w*(?:\[\d+\])*(?:\.[A-Za-z]\w*(?:\[\d+\])*)*)?")


@pytest.mark.parametrize("edit", [pytest.param(e, id=name) for name, e, _ in MALFORMED])
def test_every_error_path_is_keys_and_indexes(edit: Edit) -> None:
    definition = envelope()
    replaced = edit(definition)
    with pytest.raises(DefinitionError) as caught:
        compile_definition(replaced if replaced is not None else definition)
    assert _PATH.fullmatch(caught.value.path), caught.value.path


@pytest.mark.parametrize(
    ("edit", "path"),
    [
        (_set(["steps", 0, "rules"], "text = input.text"), "steps[0].rules"),
        (_rules(0, *["text = input.text"] * 257), "steps[0].rules"),
        (_rules(0, "text = input.text", 7), "steps[0].rules[1]"),
        (_rules(1, "ids = tokenize.idz"), "steps[1].rules[0]"),
        (_set(["steps", 0, "target"], "localhost"), "steps[0].target"),
        (_set(["steps", 0, "target"], 5), "steps[0].target"),
        (_set(["steps", 2, "validate"], ["response.aproved"]), "steps[2].validate[0]"),
        (_set(["output"], "ids = tokenize.ids"), "output"),
        (_set(["output"], ["ids = tokenize.idz"]), "output[0]"),
    ],
)
def test_error_paths_locate_the_offending_part(edit: Edit, path: str) -> None:
    definition = envelope()
    edit(definition)
    with pytest.raises(DefinitionError) as caught:
        compile_definition(definition)
    assert caught.value.path == path


def test_comprehension_variables_are_not_unknown_names() -> None:
    definition = envelope()
    definition["steps"][1]["rules"] = ["ids = tokenize.ids.filter(x, x > 0).map(y, y * 2)"]
    definition["steps"][2]["validate"] = ["response.approved && [1, 2].all(n, n > 0)"]
    compile_definition(definition)


def test_a_type_error_is_refused_only_where_the_types_are_known() -> None:
    # A google.protobuf.Value may hold a number on every run; its probe is null.
    definition = with_a_step(answers="google.protobuf.Struct")
    files = descriptor_pb2.FileDescriptorSet.FromString(
        base64.b64decode(definition["schema"]["descriptorSetBase64"])
    )
    answers = next(file for file in files.file if file.name == "answers.proto")
    loose = answers.message_type.add(name="Loose")
    loose.field.add(
        name="score",
        number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
        type_name=".google.protobuf.Value",
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    answers.service[0].method[0].output_type = ".answers.Loose"
    definition["schema"]["descriptorSetBase64"] = base64.b64encode(
        files.SerializeToString()
    ).decode()
    definition["steps"][-1]["validate"] = ["response.score > 3"]
    compile_definition(definition)

    definition["steps"][-1]["validate"] = ["input.text > 3"]
    with pytest.raises(DefinitionError) as caught:
        compile_definition(definition)
    assert caught.value.path == "steps[2].validate[0]"
    assert "types it is not defined for" in caught.value.message


def test_string_literals_are_not_member_chains() -> None:
    definition = envelope()
    definition["steps"][0]["rules"] = ["text = 'see input.nothing' + input.text"]
    compile_definition(definition)


def test_nested_assignment_paths_compile() -> None:
    definition = envelope()
    definition["steps"][0]["rules"] = ["text = input.text", "meta.lang = 'en'", "meta.tags = ['a']"]
    workflow = compile_definition(definition)
    assert workflow.steps[0].rules[1].target == ("meta", "lang")


def test_assignment_into_a_scalar_is_refused() -> None:
    definition = envelope()
    definition["steps"][0]["rules"] = ["text.length = 3"]
    with pytest.raises(DefinitionError, match="cannot assign inside 'text'"):
        compile_definition(definition)


def test_overlapping_assignments_are_refused() -> None:
    definition = envelope()
    definition["steps"][0]["rules"] = ["meta = input.meta", "meta.lang = 'en'"]
    with pytest.raises(DefinitionError, match="overlaps 'meta'"):
        compile_definition(definition)


# --- types whose JSON form is not an object ---------------------------------------------


@pytest.mark.parametrize(
    ("answer", "form"),
    [
        ("google.protobuf.Timestamp", "a string"),
        ("google.protobuf.Duration", "a string"),
        ("google.protobuf.FieldMask", "a string"),
        ("google.protobuf.ListValue", "an array"),
        ("google.protobuf.Value", "any value, an object only sometimes"),
        ("google.protobuf.StringValue", "a string"),
        ("google.protobuf.BoolValue", "true or false"),
    ],
)
def test_a_step_answering_what_is_no_json_object_is_refused(answer: str, form: str) -> None:
    # Its response could never be checkpointed (an entry's response is an
    # object, the event's a Struct): every job would spend its attempts at
    # its first checkpoint and end DEAD.
    with pytest.raises(DefinitionError) as caught:
        compile_definition(with_a_step(answers=answer))
    assert caught.value.path == "steps[2].method"
    message = str(caught.value)
    assert f"answers.Answers/Answer answers {answer}, whose JSON form is {form}" in message
    assert "a message with fields (or a google.protobuf.Struct)" in message


def test_a_step_answering_a_struct_still_compiles() -> None:
    workflow = compile_definition(with_a_step(answers="google.protobuf.Struct"))
    assert workflow.steps[-1].response_type.DESCRIPTOR.full_name == "google.protobuf.Struct"


@pytest.mark.parametrize(
    ("request_type", "form"),
    [("google.protobuf.Timestamp", "a string"), ("google.protobuf.ListValue", "an array")],
)
def test_an_external_step_taking_what_is_no_json_object_is_refused(
    request_type: str, form: str
) -> None:
    # Its request is kept on the row and carried on the WAITING event as an
    # object: the job could never park, and would end DEAD.
    with pytest.raises(DefinitionError) as caught:
        compile_definition(with_a_step(takes=request_type, external=True))
    assert caught.value.path == "steps[2].method"
    assert f"takes {request_type}, whose JSON form is {form}" in str(caught.value)


def test_a_step_it_calls_may_take_a_well_known_type() -> None:
    # A called step's request goes to its handler as a message, never stored.
    workflow = compile_definition(with_a_step(takes="google.protobuf.Timestamp"))
    assert workflow.steps[-1].request_type.DESCRIPTOR.full_name == "google.protobuf.Timestamp"


@pytest.mark.parametrize("input_type", ["google.protobuf.Timestamp", "google.protobuf.ListValue"])
def test_an_input_type_that_is_no_json_object_is_refused(input_type: str) -> None:
    # A job's input is always a JSON object: every submit would be refused.
    definition = envelope()
    definition["inputType"] = input_type
    with pytest.raises(DefinitionError) as caught:
        compile_definition(definition)
    assert caught.value.path == "inputType"
    assert f"the JSON form of {input_type} is" in str(caught.value)
    assert "never an object" in str(caught.value)


# --- junk never raises anything but DefinitionError -------------------------------------

_KEYS = st.sampled_from(
    [
        "name",
        "schema",
        "descriptorSetBase64",
        "inputType",
        "steps",
        "target",
        "method",
        "rules",
        "completion",
        "validate",
        "output",
        "deadlineMs",
        "x",
    ]
)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
    | st.sampled_from(["external", "local", "jobs.test.Text", TOKENIZE, "text = input.text"])
)
_JSON = st.recursive(
    _SCALARS,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(_KEYS | st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=20,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found.extend(_paths(child, (*prefix, key)))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found.extend(_paths(child, (*prefix, index)))
    return found


@st.composite
def _mutated_envelopes(draw: st.DrawFn) -> Any:
    definition = envelope()
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = _paths(definition)
        path = draw(st.sampled_from(paths))
        junk = draw(_JSON)
        if not path:
            return junk
        node: Any = definition
        for key in path[:-1]:
            node = node[key]
        if draw(st.booleans()) and isinstance(node, dict):
            del node[path[-1]]
        else:
            node[path[-1]] = junk
    return definition


def _only_definition_errors(definition: Any) -> None:
    with contextlib.suppress(DefinitionError):
        compile_definition(definition)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_JSON)
def test_junk_envelopes_raise_only_definition_errors(junk: Any) -> None:
    _only_definition_errors(junk)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated_envelopes())
def test_mutated_envelopes_raise_only_definition_errors(definition: Any) -> None:
    _only_definition_errors(definition)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_corrupted_descriptor_sets_raise_only_definition_errors(data: st.DataObject) -> None:
    raw = bytearray(descriptor_set())
    for _ in range(data.draw(st.integers(min_value=1, max_value=6))):
        position = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
        raw[position] = data.draw(st.integers(min_value=0, max_value=255))
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(min_value=0, max_value=len(raw)))]
    definition = envelope()
    definition["schema"]["descriptorSetBase64"] = base64.b64encode(bytes(raw)).decode()
    _only_definition_errors(definition)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_junk_rules_raise_only_definition_errors(rule: str) -> None:
    definition = envelope()
    definition["steps"][1]["rules"] = [rule]
    definition["steps"][2]["validate"] = [rule]
    definition["output"] = [rule]
    _only_definition_errors(definition)
