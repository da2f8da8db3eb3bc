"""Compilation: a definition envelope in, an immutable :class:`CompiledWorkflow` out.

Compilation resolves every method and message type in the descriptor set,
compiles every CEL rule and checks it against the types in scope, so a
definition that compiles cannot fail later for a reason visible in the
definition alone. The envelope's own shape is checked by ``workflows.envelope``,
part by part, in envelope order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import protovalidate
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message

from workflows import descriptors
from workflows.codec import Codec, Codecs
from workflows.envelope import (
    STEP_KEYS,
    TOP_KEYS,
    DefinitionError,
    definition_hash,
    descriptor_set_base64,
    is_external,
    only_keys,
    parse_deadline,
    parse_job_deadline,
    parse_name,
    parse_step_timeout,
    parse_target,
    raw_steps,
    required,
    rule_texts,
    step_names,
)
from workflows.protojson import (
    NON_OBJECT_JSON_FORMS,
    MessageError,
    describe_value,
    descriptor_of,
    message_class,
)
from workflows.rules import (
    DEFAULT_LIMITS,
    Explain,
    Probes,
    Rule,
    RuleError,
    RuleLimits,
    check_limits,
    check_rule,
    make_rule,
    make_setter,
    resolve_assignment_target,
    split_assignment,
)
from workflows.steps import CompiledWorkflow, Step, first_line
from workflows.validation import MessageValidation

Progress = Callable[[str], None]


def compile_definition(
    envelope: Any,
    *,
    digest: str | None = None,
    limits: RuleLimits = DEFAULT_LIMITS,
    probe: bool = True,
    progress: Progress | None = None,
) -> CompiledWorkflow:
    """Parse, resolve and compile a definition envelope; raise :class:`DefinitionError`.

    Every rule must fit ``limits`` before anything is compiled. ``probe``
    evaluates each rule against probe values of its types (see
    ``workflows.rules``); that is the one part whose cost a rule's author
    controls, so the service runs it in ``workflows.checker`` and compiles
    without it. ``progress`` is told where each rule is before it is checked.
    """
    if not isinstance(envelope, Mapping):
        raise DefinitionError(
            f"a workflow definition must be a JSON object, got {describe_value(envelope)}"
        )
    digest = digest or definition_hash(envelope)
    only_keys(envelope, TOP_KEYS, "definition", "")
    name = parse_name(envelope)
    check_envelope_limits(envelope, limits)
    checking = _Checking(probe, progress)
    encoded = descriptor_set_base64(envelope)
    try:
        schema = descriptors.load(encoded)
    except descriptors.DescriptorSetError as exc:
        raise DefinitionError(
            f"schema.descriptorSetBase64: {exc}", path="schema.descriptorSetBase64"
        ) from None
    input_name = required(envelope, "inputType", "definition", "")
    try:
        input_descriptor = schema.message(input_name)
    except descriptors.DescriptorSetError as exc:
        raise DefinitionError(f"inputType: {exc}", path="inputType") from None
    input_form = NON_OBJECT_JSON_FORMS.get(input_descriptor.full_name)
    if input_form is not None and input_descriptor.full_name != "google.protobuf.Value":
        # Every job's input arrives as a JSON object (a Struct on the topic),
        # which no message of this type reads: every submit would be refused.
        raise DefinitionError(
            f"inputType: the JSON form of {input_descriptor.full_name} is {input_form}, "
            "never an object, and a job's input is always a JSON object; name a message "
            "whose fields hold it",
            path="inputType",
        )
    deadline_ms = parse_deadline(envelope.get("deadlineMs"))
    job_deadline_ms = parse_job_deadline(envelope.get("jobDeadlineMs"))

    validation = MessageValidation.of(schema, limits.max_cost)
    envelope_steps = raw_steps(envelope)
    names = step_names(envelope_steps)

    probes = Probes()
    codecs = Codecs()
    env: dict[str, Descriptor] = {"input": input_descriptor}
    steps: list[Step] = []
    for index, raw in enumerate(envelope_steps):
        step = _compile_step(index, raw, names, schema, env, probes, validation, codecs, checking)
        steps.append(step)
        env[step.name] = descriptor_of(step.response_type)

    output = _compile_output(envelope.get("output"), env, probes, checking)
    input_type = message_class(input_descriptor)
    if validation is not None and probe:
        _precheck_validator(validation.validator, input_type, "inputType")
        for step in steps:
            _precheck_validator(
                validation.validator, step.response_type, f"steps[{step.index}] {step.name!r}"
            )
    return CompiledWorkflow(
        name=name,
        definition_hash=digest,
        input_type=input_type,
        steps=tuple(steps),
        output=output,
        deadline_ms=deadline_ms,
        schema=schema,
        validation=validation,
        input_codec=codecs.of(input_descriptor),
        job_deadline_ms=job_deadline_ms,
        rule_max_cost=limits.max_cost,
        _by_name={step.name: step for step in steps},
    )


def check_envelope_limits(envelope: Mapping[Any, Any], limits: RuleLimits) -> None:
    """Every rule text of ``envelope`` against ``limits``, before anything is compiled.

    Only well-formed parts are looked at; the compiler reports the rest.
    """
    places: list[tuple[str, str, Any]] = [("output", "output", envelope.get("output"))]
    steps = envelope.get("steps")
    if isinstance(steps, list):
        for index, raw in enumerate(steps):
            if not isinstance(raw, Mapping):
                continue
            name = raw.get("name")
            where = f"steps[{index}] {name!r}" if isinstance(name, str) else f"steps[{index}]"
            for key in ("rules", "validate"):
                places.append((f"{where}, {key}", f"steps[{index}].{key}", raw.get(key)))
    for where, path, value in places:
        if not isinstance(value, list):
            continue
        for position, text in enumerate(value):
            if not isinstance(text, str):
                continue
            try:
                check_limits(text, limits)
            except RuleError as exc:
                shown = text.strip()
                shown = shown if len(shown) <= 80 else shown[:77] + "..."
                raise DefinitionError(
                    f"{where}[{position}] `{shown}`: {exc}", path=f"{path}[{position}]"
                ) from None


@dataclass(frozen=True, slots=True)
class _Checking:
    probe: bool
    progress: Progress | None


def _precheck_validator(
    validator: protovalidate.Validator, message_type: type[Message], where: str
) -> None:
    # Broken rules in the descriptor set would otherwise surface on the first job.
    try:
        validator.collect_violations(message_type())
    except Exception as exc:
        raise DefinitionError(
            f"{where}: the protovalidate rules on {message_type.DESCRIPTOR.full_name} "
            f"do not compile: {first_line(exc)}"
        ) from None


def _compile_rules(
    value: Any,
    where: str,
    path: str,
    compile_one: Callable[[int, str], Rule],
    checking: _Checking,
) -> tuple[Rule, ...]:
    """Compile each rule under one key; a RuleError comes out quoting the rule and its place."""
    rules: list[Rule] = []
    for position, text in enumerate(rule_texts(value, where, path)):
        if checking.progress is not None:
            checking.progress(f"{where}[{position}]")
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
    checking: _Checking,
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
        check_rule(
            rule,
            env,
            probes,
            explain_unknown=explain,
            target_class=target_class,
            probe=checking.probe,
        )
        return rule

    return compile_one


def _compile_step(
    index: int,
    raw: Mapping[Any, Any],
    names: list[str],
    schema: descriptors.Schema,
    env: dict[str, Descriptor],
    probes: Probes,
    validation: MessageValidation | None,
    codecs: Codecs,
    checking: _Checking,
) -> Step:
    name = names[index]
    where = f"steps[{index}] {name!r}"
    path = f"steps[{index}]"
    only_keys(raw, STEP_KEYS, where, path)
    method_text = required(raw, "method", where, path)
    try:
        method = schema.method(method_text)
    except descriptors.DescriptorSetError as exc:
        raise DefinitionError(f"{where}.method: {exc}", path=f"{path}.method") from None
    external = is_external(raw.get("completion"), where, path)
    target = parse_target(raw.get("target"), where, path)
    answers = method.output_type.full_name
    answer_form = NON_OBJECT_JSON_FORMS.get(answers)
    if answer_form is not None:
        # A response is checkpointed and published as an object (the events'
        # Struct): one of this type could never be stored, and every job would
        # die at its first checkpoint.
        raise DefinitionError(
            f"{where}.method: {method_text} answers {answers}, whose JSON form is "
            f"{answer_form}; a step's response is kept and published as a JSON object, so "
            "the method must answer a message with fields (or a google.protobuf.Struct)",
            path=f"{path}.method",
        )
    asks = method.input_type.full_name
    request_form = NON_OBJECT_JSON_FORMS.get(asks)
    if external and request_form is not None:
        # An external step's request is kept on the row and carried on its
        # WAITING event as an object: the job could never park.
        raise DefinitionError(
            f"{where}.method: {method_text} takes {asks}, whose JSON form is "
            f"{request_form}; an external step's request is kept and published as a JSON "
            "object for whoever completes it, so the method must take a message with fields "
            "(or a google.protobuf.Struct)",
            path=f"{path}.method",
        )
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
            checking,
            request=method.input_type,
        ),
        checking,
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
            probe=checking.probe,
        )
        return rule

    checks = _compile_rules(
        raw.get("validate"), f"{where}, validate", f"{path}.validate", compile_check, checking
    )
    # Judging a complete-step response needs the job's input and checkpoints only then.
    reads_scope = any(variable in env for rule in checks for variable in rule.program.variables())
    timeout_ms = parse_step_timeout(raw, external, where, path)
    response_codec = codecs.of(method.output_type)
    fallback = _compile_fallback(raw.get("fallback"), response_codec, where, path)

    return Step(
        index=index,
        name=name,
        target=target,
        method=method_text,
        external=external,
        request_type=request_type,
        response_type=response_type,
        rules=rules,
        validate=checks,
        reads_scope=reads_scope,
        validation=validation,
        setters=tuple(make_setter(method.input_type, rule.target) for rule in rules),
        request_codec=codecs.of(method.input_type),
        response_codec=response_codec,
        timeout_ms=timeout_ms,
        fallback=fallback,
    )


def _compile_fallback(
    value: Any, response_codec: Codec, where: str, path: str
) -> dict[str, Any] | None:
    """The fallback response as the step's output type, in canonical proto3 JSON.

    Checked here, whole, because nobody is there to correct it when it is taken.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise DefinitionError(
            f"{where}.fallback: must be a JSON object (the step's response), "
            f"got {describe_value(value)}",
            path=f"{path}.fallback",
        )
    try:
        message = response_codec.decode_strict(value, "fallback")
    except MessageError as exc:
        type_name = response_codec.message_class.DESCRIPTOR.full_name
        raise DefinitionError(
            f"{where}.fallback: not a valid {type_name}: {'; '.join(exc.problems)}",
            path=f"{path}.fallback",
        ) from None
    return response_codec.encode(message)


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


def _compile_output(
    value: Any, env: dict[str, Descriptor], probes: Probes, checking: _Checking
) -> tuple[Rule, ...]:
    def explain(unknown: str) -> str:
        return (
            f"refers to {unknown!r}, which is neither the input nor a step; "
            f"in scope: {', '.join(env)}"
        )

    return _compile_rules(
        value, "output", "output", _assignment_compiler(env, probes, explain, checking), checking
    )
