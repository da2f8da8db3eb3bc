"""A compiled workflow and its steps: the immutable objects the runner works from.

``workflows.compiler`` builds them from an envelope; from then on they build
requests, judge responses, replay checkpoints and compute a job's result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message import Message

from schemas.errors import InvalidArgument
from schemas.verdicts import StepVerdict
from workflows import descriptors
from workflows.codec import Codec
from workflows.envelope import LOCAL_TARGET
from workflows.failures import FailureKind, StepFailure
from workflows.protojson import MessageError, describe_value, descriptor_of, pool_of
from workflows.rules import (
    DEFAULT_RULE_COST,
    Rule,
    RuleTooCostly,
    Scope,
    Setter,
    assign,
    describe_error,
)
from workflows.validation import MessageValidation

_CHECKPOINT_KEYS = frozenset({"name", "skipped", "response"})
_CHANGED = "the definition changed under a live job"


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
    validation: MessageValidation | None = field(default=None, repr=False)
    setters: tuple[Setter | None, ...] = field(default=(), repr=False)
    # External steps only: how long a parked job waits for the completion, and
    # the response (proto3 JSON of the step's output type) it takes then, if any.
    timeout_ms: int | None = None
    fallback: Mapping[str, Any] | None = field(default=None, repr=False)

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
                    f"cannot hold: {first_line(inner)}"
                )
        return f"the rules build no valid {self.request_type.DESCRIPTOR.full_name}: {exc}"

    def judge(self, scope: Scope, response: Message, response_json: dict[str, Any]) -> list[str]:
        """The violations of ``response``: its message rules, then the step's ``validate``.

        The step's own name must already be bound in ``scope``.
        """
        violations: list[str] = []
        if self.validation is not None:
            violations.extend(
                self.validation.violations(response, response_json, "response", self.name)
            )
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
    validation: MessageValidation | None = field(default=None, repr=False)
    # The whole-job deadline a submit takes when it names none (``jobDeadlineMs``).
    job_deadline_ms: int | None = None
    # The cost limit of every rule's evaluation (``RuleLimits.max_cost``).
    rule_max_cost: int = DEFAULT_RULE_COST
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
        if self.validation is not None:
            try:
                problems = self.validation.violations(message, input, "input", "")
            except StepFailure as failure:
                raise InputError(type_name, [failure.message]) from None
            if problems:
                raise InputError(type_name, problems)
        normalized = self.input_codec.encode(message)
        first = self.steps[0]
        try:
            first.build_request(Scope(normalized, max_cost=self.rule_max_cost))
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
        scope = Scope(self.input_codec.encode(message), max_cost=self.rule_max_cost)
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
            scope = Scope(None, max_cost=self.rule_max_cost)
        scope.bind(step.name, response_json)
        violations = step.judge(scope, message, response_json)
        if violations:
            return StepVerdict(step_name, False, response_json, tuple(violations))
        return StepVerdict(step_name, True, response_json)

    def lost_to_fallback(self, step_name: str, recorded: Any, response: Any) -> bool:
        """Whether ``response``, sent for a step that is done, was beaten by its
        fallback: the step's checkpoint (``recorded``) is the fallback it
        declares, and ``response`` is another one (or none the step can take).

        A pure function; an unknown step or one without a fallback never lost."""
        step = self._by_name.get(step_name)
        if step is None or step.fallback is None or recorded != step.fallback:
            return False
        codec = step.response_codec
        try:
            sent = codec.encode(codec.decode_strict(response, "response"))
        except MessageError:
            return True
        return bool(sent != recorded)

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
    except RuleTooCostly as exc:
        raise StepFailure(
            FailureKind.NON_RETRYABLE,
            step_name,
            f"{kind} `{rule.text}` was not evaluated: it {exc}",
        ) from None
    except Exception as exc:
        raise StepFailure(
            FailureKind.NON_RETRYABLE,
            step_name,
            f"{kind} `{rule.text}` failed to evaluate: {describe_error(exc)}",
        ) from None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
