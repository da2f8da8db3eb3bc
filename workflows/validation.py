"""protovalidate over a definition's messages, the cost of their CEL rules bounded first.

Rules declared on the schema's messages (``buf.validate`` options) are evaluated
by protovalidate's engine, which holds the interpreter lock like the rules'
engine does, and whose ``map`` and ``filter`` are quadratic as well: it gives a
rule up only after seconds of work. So the custom CEL expressions of the
schema's own files are read once, when the definition is compiled, and a
message is validated only while its data keeps the costliest of them within
``RuleLimits.max_cost`` (see :func:`workflows.rules.estimate_cost`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import protovalidate
from google.protobuf import descriptor_pb2
from google.protobuf.message import Message

from schemas.gen.buf.validate import validate_pb2
from workflows.descriptors import Schema
from workflows.failures import FailureKind, StepFailure
from workflows.rules import cost_shape, count_elements, estimate_cost

_NO_WALKS = (0, 1, 0)


class MessageValidation:
    """One protovalidate validator for a schema, and the shape of its costliest rule."""

    __slots__ = ("_max_cost", "_shape", "validator")

    def __init__(
        self, validator: protovalidate.Validator, shape: tuple[int, int, int], max_cost: int
    ) -> None:
        self.validator = validator
        self._shape = shape
        self._max_cost = max_cost

    @classmethod
    def of(cls, schema: Schema, max_cost: int) -> MessageValidation | None:
        """The schema's validation; None when no file of it uses protovalidate."""
        if not schema.uses_protovalidate:
            return None
        shape = _NO_WALKS
        for name in schema.files:
            file = descriptor_pb2.FileDescriptorProto()
            schema.pool.FindFileByName(name).CopyToProto(file)
            for expression in _custom_expressions(file):
                walks, widens, literal = cost_shape(expression)
                if walks:
                    shape = (
                        max(shape[0], walks),
                        max(shape[1], widens),
                        max(shape[2], literal),
                    )
        return cls(protovalidate.Validator(), shape, max_cost)

    def violations(self, message: Message, value: Any, label: str, step_name: str) -> list[str]:
        """``message``'s violations, each with its field path under ``label``.

        ``value`` is the message's JSON form, which the cost is estimated from.
        """
        type_name = message.DESCRIPTOR.full_name
        if self._shape[0]:
            problem = estimate_cost(count_elements(value), self._shape, self._max_cost)
            if problem is not None:
                raise StepFailure(
                    FailureKind.NON_RETRYABLE,
                    step_name,
                    f"the rules declared on {type_name} were not evaluated: one of the "
                    f"schema's CEL rules {problem}",
                )
        try:
            found = self.validator.collect_violations(message)
        except Exception as exc:
            raise StepFailure(
                FailureKind.NON_RETRYABLE,
                step_name,
                f"the rules declared on {type_name} cannot be evaluated: {exc}",
            ) from None
        problems: list[str] = []
        for violation in found:
            proto = violation.proto
            elements = proto.field.elements if proto.field is not None else []
            path = ".".join(element.field_name for element in elements if element.field_name)
            problems.append(
                f"{label}.{path}: {proto.message}" if path else f"{label}: {proto.message}"
            )
        return problems


def _custom_expressions(file: descriptor_pb2.FileDescriptorProto) -> Iterator[str]:
    """Every custom CEL expression a file declares: on messages, fields and predefined rules."""
    extensions = list(file.extension)
    messages = list(file.message_type)
    while messages:
        message = messages.pop()
        messages.extend(message.nested_type)
        extensions.extend(message.extension)
        rules = _option(message.options, validate_pb2.message)
        if rules is not None:
            yield from rules.cel_expression
            yield from (rule.expression for rule in rules.cel)
        for field in message.field:
            field_rules = _option(field.options, validate_pb2.field)
            if field_rules is not None:
                yield from _field_expressions(field_rules)
    for extension in extensions:
        predefined = _option(extension.options, validate_pb2.predefined)
        if predefined is not None:
            yield from (rule.expression for rule in predefined.cel)


def _option(options: Message, extension: Any) -> Any:
    """The ``buf.validate`` option ``extension`` set on ``options``, or None.

    (The generated stubs type the extensions as plain field descriptors.)
    """
    return options.Extensions[extension] if options.HasExtension(extension) else None


def _field_expressions(rules: validate_pb2.FieldRules) -> Iterator[str]:
    yield from rules.cel_expression
    yield from (rule.expression for rule in rules.cel)
    if rules.HasField("repeated") and rules.repeated.HasField("items"):
        yield from _field_expressions(rules.repeated.items)
    if rules.HasField("map"):
        if rules.map.HasField("keys"):
            yield from _field_expressions(rules.map.keys)
        if rules.map.HasField("values"):
            yield from _field_expressions(rules.map.values)
