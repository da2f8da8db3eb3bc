"""Workflow definitions: the JSON envelope, compiled once into an immutable workflow.

The envelope (keys are camelCase; anything else is refused, not ignored)::

    {
      "name": "embed-text",
      "schema": {"descriptorSetBase64": "<base64 FileDescriptorSet>"},
      "inputType": "jobs.test.Text",
      "steps": [
        {"name": "tokenize", "target": "127.0.0.1:50051",
         "method": "jobs.test.Tokenizer/Tokenize", "rules": ["text = input.text"]},
        {"name": "review", "method": "jobs.test.ReviewDesk/Review",
         "rules": ["text = input.text"], "completion": "external",
         "validate": ["response.approved"]}
      ],
      "output": ["ids = tokenize.ids", "approved = review.approved"],
      "deadlineMs": 30000
    }

``workflows/README.md`` documents every key. Compilation resolves every method
and message type in the descriptor set, compiles every CEL rule and checks it
against the types in scope, so a definition that compiles cannot fail later for
a reason visible in the definition alone. Every error names where it is
(``steps[1] 'embed', rules[0] `ids = tokenize.idz```) and what is wrong.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import protovalidate
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message import Message

from schemas.errors import InvalidArgument
from workflows import descriptors
from workflows.codec import Codec, Codecs
from workflows.failures import FailureKind, StepFailure
from workflows.protojson import (
    MessageError,
    describe_value,
    descriptor_of,
    message_class,
    pool_of,
)
from workflows.rules import (
    Explain,
    Probes,
    Rule,
    RuleError,
    Scope,
    Setter,
    assign,
    check_rule,
    describe_error,
    make_rule,
    make_setter,
    resolve_assignment_target,
    split_assignment,
)

DEFAULT_DEADLINE_MS = 30_000
MAX_DEADLINE_MS = 24 * 60 * 60 * 1000
MAX_STEPS = 64
MAX_RULES = 256
MAX_NAME_CHARS = 200
EXTERNAL = "external"
LOCAL_TARGET = "local"

_TOP_KEYS = frozenset({"name", "schema", "inputType", "steps", "output", "deadlineMs"})
_SCHEMA_KEYS = frozenset({"descriptorSetBase64"})
_STEP_KEYS = frozenset({"name", "target", "method", "rules", "completion", "validate"})
_STEP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_HOST_PORT = re.compile(
    r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?):([0-9]{1,5})"
)
# CEL's reserved words, plus the two scope names the engine binds itself.
RESERVED_NAMES = frozenset(
    {
        "input",
        "response",
        "true",
        "false",
        "null",
        "in",
        "as",
        "break",
        "const",
        "continue",
        "else",
        "for",
        "function",
        "if",
        "import",
        "let",
        "loop",
        "package",
        "namespace",
        "return",
        "var",
        "void",
        "while",
    }
)
_CHECKPOINT_KEYS = frozenset({"name", "skipped", "response"})
_CHANGED = "the definition changed under a live job"


class DefinitionError(InvalidArgument):
    """A workflow definition is malformed. ``path`` locates the offending part."""

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class InputError(InvalidArgument):
    """A job's input does not fit the workflow; ``problems`` carry field paths."""

    def __init__(self, type_name: str, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__(f"input is not a valid {type_name}: {'; '.join(self.problems)}")


class ResponseError(InvalidArgument):
    """A response supplied for an external step does not fit its type."""

    def __init__(self, step_name: str, type_name: str, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__(
            f"response for step {step_name!r} is not a valid {type_name}: "
            f"{'; '.join(self.problems)}"
        )


def definition_hash(envelope: Any) -> str:
    """SHA-256 of the envelope's canonical JSON (sorted keys, no whitespace)."""
    try:
        canonical = json.dumps(
            envelope, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError, RecursionError) as exc:
        raise DefinitionError(f"a workflow definition must be plain JSON: {exc}") from None
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True)
class StepVerdict:
    """The answer to a response supplied for an external step.

    Accepted: ``entry`` is the checkpoint to append. Rejected: ``violations``
    say why, and the job fails with them as its verdict.
    """

    step_name: str
    accepted: bool
    entry: dict[str, Any] | None = None
    violations: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        if self.accepted:
            return f"step {self.step_name!r} accepted"
        return f"step {self.step_name!r} rejected: {'; '.join(self.violations)}"


@dataclass(frozen=True, slots=True, eq=False)
class Step:
    """One compiled step. ``target`` is None when the definition gave none."""

    index: int
    name: str
    target: str | None
    method: str
    external: bool
    request_type: type[Message]
    response_type: type[Message]
    rules: tuple[Rule, ...]
    validate: tuple[Rule, ...]
    request_codec: Codec = field(repr=False)
    response_codec: Codec = field(repr=False)
    reads_scope: bool = False
    validator: protovalidate.Validator | None = field(default=None, repr=False)
    setters: tuple[Setter | None, ...] = field(default=(), repr=False)

    @property
    def _pool(self) -> DescriptorPool:
        return pool_of(descriptor_of(self.request_type))

    @property
    def grpc_path(self) -> str:
        return "/" + self.method

    @property
    def remote_target(self) -> str | None:
        """The ``host:port`` to call when no in-process handler serves the method."""
        if self.target is None or self.target == LOCAL_TARGET:
            return None
        return self.target

    def build_request(self, scope: Scope) -> Message:
        """Evaluate the mapping rules into a request; a failing rule is a mapping defect."""
        values = [_evaluate(scope, rule, self.name, "rule", as_json=True) for rule in self.rules]
        request = self.request_type()
        rest: dict[str, Any] = {}
        try:
            for rule, setter, value in zip(self.rules, self.setters, values, strict=True):
                if setter is None or not setter(request, value):
                    assign(rest, rule.target, value)
            if rest:
                json_format.ParseDict(rest, request, descriptor_pool=self._pool)
        except Exception:
            return self._build_slowly(values)
        return request

    def _build_slowly(self, values: list[Any]) -> Message:
        # json_format alone decides, so its verdict (and its error) is the reference one.
        data: dict[str, Any] = {}
        for rule, value in zip(self.rules, values, strict=True):
            assign(data, rule.target, value)
        request = self.request_type()
        try:
            json_format.ParseDict(data, request, descriptor_pool=self._pool)
        except Exception as exc:
            raise StepFailure(
                FailureKind.NON_RETRYABLE, self.name, self._blame(values, exc)
            ) from None
        return request

    def _blame(self, values: list[Any], exc: Exception) -> str:
        # Only on the failure path: find the one rule whose value the request refuses.
        for rule, value in zip(self.rules, values, strict=True):
            data: dict[str, Any] = {}
            assign(data, rule.target, value)
            try:
                json_format.ParseDict(data, self.request_type())
            except Exception as inner:
                return (
                    f"rule `{rule.text}` produced {describe_value(value)}, which "
                    f"{self.request_type.DESCRIPTOR.full_name}.{'.'.join(rule.target)} "
                    f"cannot hold: {_first_line(inner)}"
                )
        return f"the rules build no valid {self.request_type.DESCRIPTOR.full_name}: {exc}"

    def judge(self, scope: Scope, response: Message, response_json: dict[str, Any]) -> list[str]:
        """The violations of ``response``: its message rules, then the step's ``validate``.

        The step's own name must already be bound in ``scope``.
        """
        violations: list[str] = []
        if self.validator is not None:
            violations.extend(_protovalidate(self.validator, response, "response", self.name))
        if not self.validate:
            return violations
        scope.bind("response", response_json)
        for rule in self.validate:
            verdict = _evaluate(scope, rule, self.name, "validate rule", as_json=False)
            if verdict is True:
                continue
            if verdict is False:
                violations.append(f"validate rule `{rule.text}` is false")
                continue
            raise StepFailure(
                FailureKind.NON_RETRYABLE,
                self.name,
                f"validate rule `{rule.text}` produced {describe_value(verdict)}, "
                "not true or false",
            )
        return violations


@dataclass(frozen=True, slots=True, eq=False)
class CompiledWorkflow:
    """An immutable, compiled definition: what the runner and the store work from."""

    name: str
    definition_hash: str
    input_type: type[Message]
    steps: tuple[Step, ...]
    output: tuple[Rule, ...]
    deadline_ms: int
    schema: descriptors.Schema = field(repr=False)
    input_codec: Codec = field(repr=False)
    validator: protovalidate.Validator | None = field(default=None, repr=False)
    _by_name: Mapping[str, Step] = field(default_factory=dict, repr=False)

    @property
    def has_external_steps(self) -> bool:
        return any(step.external for step in self.steps)

    def step(self, name: str) -> Step:
        found = self._by_name.get(name)
        if found is None:
            raise InvalidArgument(f"workflow {self.name!r} has no step {name!r}")
        return found

    def validate_input(self, input: Any) -> dict[str, Any]:
        """Refuse an input that does not fit; return its canonical proto3 JSON.

        Refused, each with its field path: a value that is not a JSON object,
        unknown fields, values of the wrong type or out of range, violations of
        protovalidate rules declared on the input type, and input the first
        step cannot be built from (its mapping rules are run against the input,
        so a rule reading ``input.meta.lang`` refuses an input without ``meta``).
        """
        type_name = self.input_type.DESCRIPTOR.full_name
        if not isinstance(input, Mapping):
            raise InputError(
                type_name, [f"input: expected a JSON object, got {describe_value(input)}"]
            )
        try:
            message = self.input_codec.decode_strict(input, "input")
        except MessageError as exc:
            raise InputError(type_name, exc.problems) from None
        if self.validator is not None:
            problems = _protovalidate(self.validator, message, "input", "")
            if problems:
                raise InputError(type_name, problems)
        normalized = self.input_codec.encode(message)
        first = self.steps[0]
        try:
            first.build_request(Scope(normalized))
        except StepFailure as failure:
            raise InputError(
                type_name, [f"step {first.name!r} cannot be built from it: {failure.message}"]
            ) from None
        return normalized

    def next_step(self, checkpoints: Sequence[Mapping[str, Any]]) -> Step | None:
        """The first step without a checkpoint, None when all have one.

        Checks the names of the prefix (cheaply, without parsing responses); a
        mismatch raises the same non-retryable failure the runner would.
        """
        if len(checkpoints) > len(self.steps):
            raise self._too_many(len(checkpoints))
        for position, entry in enumerate(checkpoints):
            name = entry.get("name") if isinstance(entry, Mapping) else None
            expected = self.steps[position]
            if name != expected.name:
                raise self._misnamed(position, name, expected)
        if len(checkpoints) == len(self.steps):
            return None
        return self.steps[len(checkpoints)]

    def replay(self, input: Any, checkpoints: Sequence[Any]) -> Scope:
        """Rebuild the scope from stored input and checkpoints, trusting none of it."""
        try:
            message = self.input_codec.decode(input, "input")
        except MessageError as exc:
            raise StepFailure(
                FailureKind.NON_RETRYABLE,
                "",
                f"the stored input no longer parses as {self.input_type.DESCRIPTOR.full_name}: "
                f"{exc}; {_CHANGED}",
            ) from None
        scope = Scope(self.input_codec.encode(message))
        if len(checkpoints) > len(self.steps):
            raise self._too_many(len(checkpoints))
        for position, entry in enumerate(checkpoints):
            step = self.steps[position]
            name, response = self._entry_parts(position, entry, step)
            if name != step.name:
                raise self._misnamed(position, name, step)
            try:
                parsed = step.response_codec.decode(response, f"checkpoints[{position}].response")
            except MessageError as exc:
                raise StepFailure(
                    FailureKind.NON_RETRYABLE,
                    step.name,
                    f"checkpoint {position} ({name!r}) no longer parses as "
                    f"{step.response_type.DESCRIPTOR.full_name}: {exc}; {_CHANGED}",
                ) from None
            scope.bind(step.name, step.response_codec.encode(parsed))
        return scope

    def _entry_parts(self, position: int, entry: Any, step: Step) -> tuple[Any, Any]:
        if not isinstance(entry, Mapping):
            raise StepFailure(
                FailureKind.NON_RETRYABLE,
                step.name,
                f"checkpoint {position} is {describe_value(entry)}, not an object "
                "with name, skipped and response",
            )
        extra = sorted(str(key) for key in entry if key not in _CHECKPOINT_KEYS)
        if extra or "name" not in entry or "response" not in entry:
            raise StepFailure(
                FailureKind.NON_RETRYABLE,
                step.name,
                f"checkpoint {position} is malformed: it must hold exactly name, skipped "
                f"and response, it holds {', '.join(sorted(map(str, entry))) or 'nothing'}",
            )
        if entry.get("skipped", False) not in (False, None):
            raise StepFailure(
                FailureKind.NON_RETRYABLE,
                step.name,
                f"checkpoint {position} ({entry['name']!r}) says the step was skipped, "
                f"but this definition never skips a step; {_CHANGED}",
            )
        return entry["name"], entry["response"]

    def _too_many(self, count: int) -> StepFailure:
        return StepFailure(
            FailureKind.NON_RETRYABLE,
            "",
            f"the job has {count} checkpoints but workflow {self.name!r} has only "
            f"{len(self.steps)} steps; {_CHANGED}",
        )

    def _misnamed(self, position: int, name: Any, step: Step) -> StepFailure:
        return StepFailure(
            FailureKind.NON_RETRYABLE,
            step.name,
            f"checkpoint {position} names step {name!r}, but step {position} of workflow "
            f"{self.name!r} is {step.name!r}; {_CHANGED}",
        )

    def accept_external(
        self,
        step_name: str,
        response: Any,
        *,
        input: Any = None,
        checkpoints: Sequence[Any] | None = None,
    ) -> StepVerdict:
        """Judge a response supplied for a parked external step (a pure function).

        Raises :class:`InvalidArgument` for an unknown or non-external step and
        :class:`ResponseError` for a response that does not parse as the step's
        type: the caller's mistake, nothing about the job changes. A validate
        rule that cannot be evaluated raises a non-retryable :class:`StepFailure`.
        When the step's validate rules read ``input`` or earlier steps, pass the
        job's ``input`` and ``checkpoints``; they are replayed like a claim does.
        """
        step = self.step(step_name)
        if not step.external:
            raise InvalidArgument(
                f"step {step_name!r} of workflow {self.name!r} is not an external step; "
                'only steps with completion "external" take a response'
            )
        type_name = step.response_type.DESCRIPTOR.full_name
        try:
            message = step.response_codec.decode_strict(response, "response")
        except MessageError as exc:
            raise ResponseError(step_name, type_name, exc.problems) from None
        response_json = step.response_codec.encode(message)
        if input is not None:
            scope = self.replay(input, checkpoints or ())
            if len(checkpoints or ()) != step.index:
                raise StepFailure(
                    FailureKind.NON_RETRYABLE,
                    step.name,
                    f"the job has {len(checkpoints or ())} checkpoints; a response for step "
                    f"{step.index} ({step.name!r}) needs exactly {step.index}",
                )
        elif step.reads_scope:
            raise TypeError(
                f"step {step_name!r} has validate rules that read input or earlier steps; "
                "pass input= and checkpoints="
            )
        else:
            scope = Scope(None)
        scope.bind(step.name, response_json)
        violations = step.judge(scope, message, response_json)
        if violations:
            return StepVerdict(step_name, False, None, tuple(violations))
        entry = {"name": step.name, "skipped": False, "response": response_json}
        return StepVerdict(step_name, True, entry, ())

    def compute_output(self, scope: Scope) -> dict[str, Any]:
        """The job's result: the output mapping, or the last step's response."""
        if not self.output:
            last = scope.values.get(self.steps[-1].name)
            return dict(last) if isinstance(last, Mapping) else {}
        result: dict[str, Any] = {}
        for rule in self.output:
            assign(result, rule.target, _evaluate(scope, rule, "", "output rule", as_json=True))
        return result


def _evaluate(scope: Scope, rule: Rule, step_name: str, kind: str, *, as_json: bool) -> Any:
    """The rule's value; a rule that cannot be evaluated is a mapping defect, named."""
    try:
        return scope.evaluate_json(rule) if as_json else scope.evaluate(rule)
    except Exception as exc:
        raise StepFailure(
            FailureKind.NON_RETRYABLE,
            step_name,
            f"{kind} `{rule.text}` failed to evaluate: {describe_error(exc)}",
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _protovalidate(
    validator: protovalidate.Validator, message: Message, label: str, step_name: str
) -> list[str]:
    try:
        found = validator.collect_violations(message)
    except Exception as exc:
        raise StepFailure(
            FailureKind.NON_RETRYABLE,
            step_name,
            f"the rules declared on {message.DESCRIPTOR.full_name} cannot be evaluated: {exc}",
        ) from None
    problems: list[str] = []
    for violation in found:
        proto = violation.proto
        elements = proto.field.elements if proto.field is not None else []
        path = ".".join(element.field_name for element in elements if element.field_name)
        problems.append(f"{label}.{path}: {proto.message}" if path else f"{label}: {proto.message}")
    return problems


# --- compilation ---------------------------------------------------------------------


def compile_definition(envelope: Any, *, digest: str | None = None) -> CompiledWorkflow:
    """Parse, resolve and compile a definition envelope; raise :class:`DefinitionError`."""
    if not isinstance(envelope, Mapping):
        raise DefinitionError(
            f"a workflow definition must be a JSON object, got {describe_value(envelope)}"
        )
    digest = digest or definition_hash(envelope)
    _only_keys(envelope, _TOP_KEYS, "definition", "")
    name = _name(envelope)
    schema_value = _required(envelope, "schema", "definition", "")
    if not isinstance(schema_value, Mapping):
        got = describe_value(schema_value)
        raise DefinitionError(
            f"schema: must be an object with descriptorSetBase64, got {got}", path="schema"
        )
    _only_keys(schema_value, _SCHEMA_KEYS, "schema", "schema")
    encoded = _required(schema_value, "descriptorSetBase64", "schema", "schema")
    try:
        schema = descriptors.load(encoded)
    except descriptors.DescriptorSetError as exc:
        raise DefinitionError(
            f"schema.descriptorSetBase64: {exc}", path="schema.descriptorSetBase64"
        ) from None
    input_name = _required(envelope, "inputType", "definition", "")
    try:
        input_descriptor = schema.message(input_name)
    except descriptors.DescriptorSetError as exc:
        raise DefinitionError(f"inputType: {exc}", path="inputType") from None
    deadline_ms = _deadline(envelope.get("deadlineMs"))

    validator = protovalidate.Validator() if schema.uses_protovalidate else None
    raw_steps = _required(envelope, "steps", "definition", "")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise DefinitionError(
            f"steps: must be a non-empty list of steps, got {describe_value(raw_steps)}",
            path="steps",
        )
    if len(raw_steps) > MAX_STEPS:
        raise DefinitionError(
            f"steps: at most {MAX_STEPS} steps, got {len(raw_steps)}", path="steps"
        )
    names = _step_names(raw_steps)

    probes = Probes()
    codecs = Codecs()
    env: dict[str, Descriptor] = {"input": input_descriptor}
    steps: list[Step] = []
    for index, raw in enumerate(raw_steps):
        step = _compile_step(index, raw, names, schema, env, probes, validator, codecs)
        steps.append(step)
        env[step.name] = descriptor_of(step.response_type)

    output = _compile_output(envelope.get("output"), env, probes)
    input_type = message_class(input_descriptor)
    if validator is not None:
        _precheck_validator(validator, input_type, "inputType")
        for step in steps:
            _precheck_validator(validator, step.response_type, f"steps[{step.index}] {step.name!r}")
    return CompiledWorkflow(
        name=name,
        definition_hash=digest,
        input_type=input_type,
        steps=tuple(steps),
        output=output,
        deadline_ms=deadline_ms,
        schema=schema,
        validator=validator,
        input_codec=codecs.of(input_descriptor),
        _by_name={step.name: step for step in steps},
    )


def _precheck_validator(
    validator: protovalidate.Validator, message_type: type[Message], where: str
) -> None:
    # Broken rules in the descriptor set would otherwise surface on the first job.
    try:
        validator.collect_violations(message_type())
    except Exception as exc:
        raise DefinitionError(
            f"{where}: the protovalidate rules on {message_type.DESCRIPTOR.full_name} "
            f"do not compile: {_first_line(exc)}"
        ) from None


def _only_keys(value: Mapping[Any, Any], allowed: frozenset[str], where: str, path: str) -> None:
    for key in value:
        if key in allowed:
            continue
        hint = _suggest(key, allowed)
        raise DefinitionError(
            f"{where}: unknown key {key!r}{hint}; allowed keys: {', '.join(sorted(allowed))}",
            path=f"{path}.{key}" if path else str(key),
        )


def _suggest(key: Any, allowed: frozenset[str]) -> str:
    if not isinstance(key, str):
        return ""
    camel = re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), key)
    if camel in allowed:
        return f" (did you mean {camel!r}? keys are camelCase)"
    close = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _required(value: Mapping[Any, Any], key: str, where: str, path: str) -> Any:
    if key not in value or value[key] is None:
        raise DefinitionError(
            f"{where}: {key!r} is required", path=f"{path}.{key}" if path else key
        )
    return value[key]


def _name(envelope: Mapping[Any, Any]) -> str:
    name = _required(envelope, "name", "definition", "")
    if not isinstance(name, str) or not name.strip():
        raise DefinitionError(
            f"name: must be a non-blank string, got {describe_value(name)}", path="name"
        )
    if len(name) > MAX_NAME_CHARS:
        raise DefinitionError(
            f"name: at most {MAX_NAME_CHARS} characters, got {len(name)}", path="name"
        )
    return name


def _deadline(value: Any) -> int:
    if value is None:
        return DEFAULT_DEADLINE_MS
    whole: int | None = None
    if isinstance(value, bool):
        whole = None
    elif isinstance(value, int):
        whole = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        whole = int(value)  # JSON that went through a protobuf Struct carries doubles
    if whole is None:
        raise DefinitionError(
            f"deadlineMs: must be a whole number of milliseconds, got {describe_value(value)}",
            path="deadlineMs",
        )
    if not 1 <= whole <= MAX_DEADLINE_MS:
        raise DefinitionError(
            f"deadlineMs: must be between 1 and {MAX_DEADLINE_MS}, got {whole}", path="deadlineMs"
        )
    return whole


def _step_names(raw_steps: list[Any]) -> list[str]:
    names: list[str] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(raw_steps):
        where = f"steps[{index}]"
        if not isinstance(raw, Mapping):
            raise DefinitionError(
                f"{where}: must be an object, got {describe_value(raw)}", path=where
            )
        name = raw.get("name")
        if name is None:
            raise DefinitionError(f"{where}: 'name' is required", path=f"{where}.name")
        if not isinstance(name, str) or not _STEP_NAME.fullmatch(name):
            raise DefinitionError(
                f"{where}.name: {name!r} cannot be used in rules; a step name is 1-64 letters, "
                "digits or _ and does not start with a digit",
                path=f"{where}.name",
            )
        if name in RESERVED_NAMES:
            raise DefinitionError(
                f"{where}.name: {name!r} is reserved; rules use it for something else",
                path=f"{where}.name",
            )
        if name in seen:
            raise DefinitionError(
                f"{where}.name: duplicate step name {name!r} (also steps[{seen[name]}])",
                path=f"{where}.name",
            )
        seen[name] = index
        names.append(name)
    return names


def _rule_texts(value: Any, where: str, path: str) -> list[str]:
    """The rule strings under one key; ``where`` names it for people, ``path`` for tools."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise DefinitionError(
            f"{where}: must be a list of strings, got {describe_value(value)}", path=path
        )
    if len(value) > MAX_RULES:
        raise DefinitionError(f"{where}: at most {MAX_RULES} rules, got {len(value)}", path=path)
    for position, text in enumerate(value):
        if not isinstance(text, str):
            raise DefinitionError(
                f"{where}[{position}]: a rule must be a string, got {describe_value(text)}",
                path=f"{path}[{position}]",
            )
    return list(value)


def _compile_rules(
    value: Any, where: str, path: str, compile_one: Callable[[int, str], Rule]
) -> tuple[Rule, ...]:
    """Compile each rule under one key; a RuleError comes out quoting the rule and its place."""
    rules: list[Rule] = []
    for position, text in enumerate(_rule_texts(value, where, path)):
        try:
            rules.append(compile_one(position, text))
        except RuleError as exc:
            raise DefinitionError(
                f"{where}[{position}] `{text.strip()}`: {exc}", path=f"{path}[{position}]"
            ) from None
    return tuple(rules)


def _assignment_compiler(
    env: Mapping[str, Descriptor],
    probes: Probes,
    explain: Explain,
    request: Descriptor | None = None,
) -> Callable[[int, str], Rule]:
    """Compiles ``field = expression`` rules, refusing two that assign the same field.

    With ``request`` they build that message (a step's mapping); without, the
    job's result (the output mapping).
    """
    assigned: dict[tuple[str, ...], int] = {}
    target_class = message_class(request) if request is not None else None

    def compile_one(position: int, text: str) -> Rule:
        target_path, expression = split_assignment(text)
        if request is not None:
            problem = resolve_assignment_target(request, target_path)
            if problem is not None:
                raise RuleError(f"request {problem}")
        _check_overlap(target_path, assigned, position)
        assigned[target_path] = position
        rule = make_rule(text.strip(), expression, env, target_path)
        check_rule(rule, env, probes, explain_unknown=explain, target_class=target_class)
        return rule

    return compile_one


def _target(value: Any, where: str, path: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise DefinitionError(
            f"{where}.target: must be a string, got {describe_value(value)}", path=f"{path}.target"
        )
    if value == LOCAL_TARGET:
        return value
    match = _HOST_PORT.fullmatch(value)
    if match is None or not 1 <= int(match.group(1)) <= 65535:
        raise DefinitionError(
            f"{where}.target: {value!r} is neither host:port nor {LOCAL_TARGET!r} "
            "(an in-process handler)",
            path=f"{path}.target",
        )
    return value


def _compile_step(
    index: int,
    raw: Mapping[Any, Any],
    names: list[str],
    schema: descriptors.Schema,
    env: dict[str, Descriptor],
    probes: Probes,
    validator: protovalidate.Validator | None,
    codecs: Codecs,
) -> Step:
    name = names[index]
    where = f"steps[{index}] {name!r}"
    path = f"steps[{index}]"
    _only_keys(raw, _STEP_KEYS, where, path)
    method_text = _required(raw, "method", where, path)
    try:
        method = schema.method(method_text)
    except descriptors.DescriptorSetError as exc:
        raise DefinitionError(f"{where}.method: {exc}", path=f"{path}.method") from None
    completion = raw.get("completion")
    if completion is not None and completion != EXTERNAL:
        got = describe_value(completion)
        raise DefinitionError(
            f'{where}.completion: the only completion is "external", got {got}',
            path=f"{path}.completion",
        )
    target = _target(raw.get("target"), where, path)
    request_type = message_class(method.input_type)
    response_type = message_class(method.output_type)

    later = set(names[index + 1 :])

    def explain(unknown: str, *, validating: bool) -> str:
        if unknown in later:
            return (
                f"refers to step {unknown!r}, which runs after this one; "
                "a step's rules see input and earlier steps only"
            )
        if unknown == name and not validating:
            return (
                f"refers to its own step {name!r}; mapping rules build the request, "
                "before there is a response"
            )
        if unknown == "response" and not validating:
            return "uses `response`, which only validate rules see"
        in_scope = ", ".join(list(env) + (["response", name] if validating else []))
        return f"refers to {unknown!r}, which is not in scope; in scope: {in_scope}"

    rules = _compile_rules(
        raw.get("rules"),
        f"{where}, rules",
        f"{path}.rules",
        _assignment_compiler(
            env,
            probes,
            lambda unknown: explain(unknown, validating=False),
            request=method.input_type,
        ),
    )

    validate_env = {**env, name: method.output_type, "response": method.output_type}

    def compile_check(position: int, text: str) -> Rule:
        expression = text.strip()
        rule = make_rule(expression, expression, validate_env)
        check_rule(
            rule,
            validate_env,
            probes,
            explain_unknown=lambda unknown: explain(unknown, validating=True),
            boolean=True,
        )
        return rule

    checks = _compile_rules(
        raw.get("validate"), f"{where}, validate", f"{path}.validate", compile_check
    )
    # Judging a complete-step response needs the job's input and checkpoints only then.
    reads_scope = any(variable in env for rule in checks for variable in rule.program.variables())

    return Step(
        index=index,
        name=name,
        target=target,
        method=method_text,
        external=completion == EXTERNAL,
        request_type=request_type,
        response_type=response_type,
        rules=rules,
        validate=checks,
        reads_scope=reads_scope,
        validator=validator,
        setters=tuple(make_setter(method.input_type, rule.target) for rule in rules),
        request_codec=codecs.of(method.input_type),
        response_codec=codecs.of(method.output_type),
    )


def _check_overlap(
    path: tuple[str, ...], assigned: Mapping[tuple[str, ...], int], position: int
) -> None:
    for other, other_position in assigned.items():
        shorter = min(len(path), len(other))
        if path[:shorter] == other[:shorter]:
            if path == other:
                raise RuleError(
                    f"assigns {'.'.join(path)!r}, which rules[{other_position}] already assigns"
                )
            raise RuleError(
                f"assigns {'.'.join(path)!r}, which overlaps {'.'.join(other)!r} "
                f"assigned by rules[{other_position}]"
            )


def _compile_output(value: Any, env: dict[str, Descriptor], probes: Probes) -> tuple[Rule, ...]:
    def explain(unknown: str) -> str:
        return (
            f"refers to {unknown!r}, which is neither the input nor a step; "
            f"in scope: {', '.join(env)}"
        )

    return _compile_rules(value, "output", "output", _assignment_compiler(env, probes, explain))


# --- the cache -----------------------------------------------------------------------


class DefinitionCache:
    """Compiled workflows by definition hash, least recently used dropped first.

    A claim looks its snapshot up here, so base64 is decoded and CEL compiled
    once per distinct definition per process, not once per job. Safe to share
    between threads. Failed compilations are not cached.
    """

    def __init__(self, maxsize: int = 256) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.maxsize = maxsize
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[str, CompiledWorkflow] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, envelope: Any, *, digest: str | None = None) -> CompiledWorkflow:
        """The compiled form of ``envelope``; pass ``digest`` when it is already known."""
        key = digest or definition_hash(envelope)
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return found
        compiled = compile_definition(envelope, digest=key)
        with self._lock:
            self.misses += 1
            self._entries[key] = compiled
            self._entries.move_to_end(key)
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)
        return compiled

    def __contains__(self, digest: object) -> bool:
        with self._lock:
            return digest in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


CompiledCache = DefinitionCache

# A process-wide cache for callers that have no reason to keep their own.
default_cache = DefinitionCache()


__all__ = [
    "DEFAULT_DEADLINE_MS",
    "CompiledCache",
    "CompiledWorkflow",
    "DefinitionCache",
    "DefinitionError",
    "InputError",
    "ResponseError",
    "Step",
    "StepVerdict",
    "compile_definition",
    "default_cache",
    "definition_hash",
]
