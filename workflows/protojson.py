"""proto3 JSON in and out of the messages a descriptor set defines.

The engine keeps every value it hands around - input, checkpoint responses, the
scope rules read - in one canonical form: proto3 JSON with the ``.proto`` field
names, fields without presence always printed (so a rule can read
``input.flag`` even when it is false), fields with presence only when set (so
``has(input.meta)`` means something).

Parsing has two speeds. :func:`parse` trusts protobuf's own parser and only
walks the value itself to explain a failure; :func:`parse_strict` walks first,
so every problem comes back with its field path (``input.meta.tags[1]: ...``).
"""

from __future__ import annotations

import base64
import datetime as dt
import math
import re
from collections.abc import Mapping
from typing import Any, cast

from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

MAX_PROBLEMS = 20

# Well-known types whose JSON form is not an object of their fields.
SPECIAL_JSON_TYPES = frozenset(
    {
        "google.protobuf.Any",
        "google.protobuf.Timestamp",
        "google.protobuf.Duration",
        "google.protobuf.FieldMask",
        "google.protobuf.Struct",
        "google.protobuf.Value",
        "google.protobuf.ListValue",
        "google.protobuf.DoubleValue",
        "google.protobuf.FloatValue",
        "google.protobuf.Int64Value",
        "google.protobuf.UInt64Value",
        "google.protobuf.Int32Value",
        "google.protobuf.UInt32Value",
        "google.protobuf.BoolValue",
        "google.protobuf.StringValue",
        "google.protobuf.BytesValue",
    }
)

# The JSON form each of them takes where it is not an object. Struct and Any
# are objects; a Value is whichever JSON value it holds.
NON_OBJECT_JSON_FORMS = {
    "google.protobuf.Timestamp": "a string",
    "google.protobuf.Duration": "a string",
    "google.protobuf.FieldMask": "a string",
    "google.protobuf.Value": "any value, an object only sometimes",
    "google.protobuf.ListValue": "an array",
    "google.protobuf.DoubleValue": "a number",
    "google.protobuf.FloatValue": "a number",
    "google.protobuf.Int64Value": "a string",
    "google.protobuf.UInt64Value": "a string",
    "google.protobuf.Int32Value": "a number",
    "google.protobuf.UInt32Value": "a number",
    "google.protobuf.BoolValue": "true or false",
    "google.protobuf.StringValue": "a string",
    "google.protobuf.BytesValue": "a string",
}

# Types whose contents no descriptor describes: a rule may read anything from them.
DYNAMIC_TYPES = frozenset(
    {
        "google.protobuf.Any",
        "google.protobuf.Struct",
        "google.protobuf.Value",
        "google.protobuf.ListValue",
    }
)

_INT_RANGES: dict[int, tuple[int, int]] = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
# Doubles at or above this round to infinity as a float; anything below rounds to
# a finite one, so a float field accepts it. json_format alone is stricter: it
# refuses anything above the largest float32, including the 3.4028235e+38 it
# writes for that very value, so it cannot read its own output back.
FLOAT32_LIMIT = 3.4028235677973366e38
_INT_TEXT = re.compile(r"-?\d+")
_BASE64_TEXT = re.compile(r"[A-Za-z0-9+/_-]*={0,2}")
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

_TYPE_NAMES: dict[int, str] = {
    FieldDescriptor.TYPE_DOUBLE: "double",
    FieldDescriptor.TYPE_FLOAT: "float",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_UINT64: "uint64",
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_FIXED64: "fixed64",
    FieldDescriptor.TYPE_FIXED32: "fixed32",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BYTES: "bytes",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_SFIXED32: "sfixed32",
    FieldDescriptor.TYPE_SFIXED64: "sfixed64",
    FieldDescriptor.TYPE_SINT32: "sint32",
    FieldDescriptor.TYPE_SINT64: "sint64",
}


def descriptor_of(message: type[Message] | Message) -> Descriptor:
    return cast(Descriptor, message.DESCRIPTOR)


def message_class(descriptor: Descriptor) -> type[Message]:
    cls: type[Message] = message_factory.GetMessageClass(descriptor)
    return cls


def pool_of(descriptor: Descriptor) -> descriptor_pool.DescriptorPool:
    return descriptor.file.pool


def message_type_of(field: FieldDescriptor) -> Descriptor:
    if field.message_type is None:
        raise TypeError(f"{field.full_name} is not a message field")
    return field.message_type


def enum_type_of(field: FieldDescriptor) -> EnumDescriptor:
    if field.enum_type is None:
        raise TypeError(f"{field.full_name} is not an enum field")
    return field.enum_type


class MessageError(Exception):
    """A JSON value does not fit a message type; ``problems`` carry field paths."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


def to_json(message: Message) -> dict[str, Any]:
    """The canonical proto3 JSON of ``message`` (see the module docstring)."""
    result: dict[str, Any] = json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        descriptor_pool=pool_of(descriptor_of(message)),
    )
    return result


def parse(data: Any, message_type: type[Message], label: str) -> Message:
    """Parse ``data`` into a new ``message_type``; fast when it fits."""
    message = message_type()
    descriptor = descriptor_of(message_type)
    if isinstance(data, Mapping):
        try:
            json_format.ParseDict(
                data,  # type: ignore[arg-type]  # any Mapping works; the stub says dict
                message,
                ignore_unknown_fields=False,
                descriptor_pool=pool_of(descriptor),
            )
            return message
        except Exception as exc:  # the parser raises more than ParseError on odd values
            problems = check(data, descriptor, label)
            raise MessageError(problems or [f"{label}: {_first_line(exc)}"]) from None
    raise MessageError(check(data, descriptor, label))


def parse_strict(data: Any, message_type: type[Message], label: str) -> Message:
    """Parse ``data`` after walking it, so every problem names its field path."""
    problems = check(data, descriptor_of(message_type), label)
    if problems:
        raise MessageError(problems)
    return parse(data, message_type, label)


def check(data: Any, descriptor: Descriptor, label: str) -> list[str]:
    """Every way ``data`` breaks the proto3 JSON form of ``descriptor``, with paths."""
    problems: list[str] = []
    _check_message(data, descriptor, label, problems)
    return problems[:MAX_PROBLEMS]


def describe_value(value: Any) -> str:
    """A short JSON-ish description of a value for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"number {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"string {shown!r}"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"


def field_type_name(field: FieldDescriptor) -> str:
    if is_map(field):
        key, value = message_type_of(field).fields
        return f"map<{field_type_name(key)}, {field_type_name(value)}>"
    if field.type in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP):
        base = message_type_of(field).full_name
    elif field.type == FieldDescriptor.TYPE_ENUM:
        base = enum_type_of(field).full_name
    else:
        base = _TYPE_NAMES.get(field.type, "?")
    return f"repeated {base}" if field.is_repeated else base


def field_index(descriptor: Descriptor) -> dict[str, FieldDescriptor]:
    """Fields by ``.proto`` name and by JSON name, as proto3 JSON accepts both."""
    index: dict[str, FieldDescriptor] = {}
    for field in descriptor.fields:
        index[field.name] = field
        index.setdefault(field.json_name, field)
    return index


def is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and bool(field.message_type.GetOptions().map_entry)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _add(problems: list[str], text: str) -> None:
    if len(problems) < MAX_PROBLEMS:
        problems.append(text)


def _check_message(data: Any, descriptor: Descriptor, path: str, problems: list[str]) -> None:
    if descriptor.full_name in SPECIAL_JSON_TYPES:
        _check_special(data, descriptor, path, problems)
        return
    if not isinstance(data, Mapping):
        _add(
            problems,
            f"{path}: expected an object ({descriptor.full_name}), got {describe_value(data)}",
        )
        return
    index = field_index(descriptor)
    seen: dict[str, str] = {}
    oneofs: dict[str, str] = {}
    for key, value in data.items():
        if len(problems) >= MAX_PROBLEMS:
            return
        if not isinstance(key, str):
            _add(problems, f"{path}: field names must be strings, got {key!r}")
            continue
        field = index.get(key)
        sub = f"{path}.{key}"
        if field is None:
            names = ", ".join(f.name for f in descriptor.fields) or "no fields"
            _add(problems, f"{sub}: unknown field; {descriptor.full_name} has {names}")
            continue
        if field.name in seen:
            _add(
                problems,
                f"{sub}: field {field.name!r} is given twice (also as {seen[field.name]!r})",
            )
            continue
        seen[field.name] = key
        if value is None and not _accepts_null(field):
            continue  # null means "the default" in proto3 JSON
        oneof = field.containing_oneof
        if oneof is not None and not _is_synthetic(oneof.name, field):
            if oneof.name in oneofs:
                _add(
                    problems,
                    f"{sub}: oneof {oneof.name!r} already has {oneofs[oneof.name]!r} set; "
                    "set only one of its fields",
                )
                continue
            oneofs[oneof.name] = field.name
        _check_field(value, field, sub, problems)


def _is_synthetic(oneof_name: str, field: FieldDescriptor) -> bool:
    # proto3 `optional` wraps its field in a one-member oneof named after it.
    oneof = field.containing_oneof
    return oneof is not None and oneof_name == f"_{field.name}" and len(oneof.fields) == 1


def _accepts_null(field: FieldDescriptor) -> bool:
    return (
        not field.is_repeated
        and field.message_type is not None
        and field.message_type.full_name == "google.protobuf.Value"
    )


def _check_field(value: Any, field: FieldDescriptor, path: str, problems: list[str]) -> None:
    if is_map(field):
        if not isinstance(value, Mapping):
            shape = field_type_name(field)
            _add(problems, f"{path}: expected an object ({shape}), got {describe_value(value)}")
            return
        key_field, value_field = message_type_of(field).fields
        for key, item in value.items():
            sub = f"{path}[{key!r}]"
            if not isinstance(key, str):
                _add(problems, f"{sub}: map keys must be strings in JSON")
                continue
            _check_map_key(key, key_field, sub, problems)
            if item is None and not _accepts_null(value_field):
                _add(problems, f"{sub}: null is not a {field_type_name(value_field)}")
                continue
            _check_single(item, value_field, sub, problems)
        return
    if field.is_repeated:
        if not isinstance(value, list | tuple):
            _add(
                problems,
                f"{path}: expected a list ({field_type_name(field)}), got {describe_value(value)}",
            )
            return
        for position, item in enumerate(value):
            sub = f"{path}[{position}]"
            if item is None and not (
                field.message_type is not None
                and field.message_type.full_name == "google.protobuf.Value"
            ):
                _add(problems, f"{sub}: null is not allowed in a repeated field")
                continue
            _check_single(item, field, sub, problems)
        return
    _check_single(value, field, path, problems)


def _check_map_key(key: str, field: FieldDescriptor, path: str, problems: list[str]) -> None:
    if field.type == FieldDescriptor.TYPE_BOOL:
        if key not in ("true", "false"):
            _add(problems, f"{path}: map key must be 'true' or 'false'")
    elif field.type in _INT_RANGES:
        if not _INT_TEXT.fullmatch(key):
            _add(problems, f"{path}: map key must be an integer, got {key!r}")
        else:
            low, high = _INT_RANGES[field.type]
            if not low <= int(key) <= high:
                _add(
                    problems, f"{path}: map key {key} is out of range for {_TYPE_NAMES[field.type]}"
                )


def _check_single(value: Any, field: FieldDescriptor, path: str, problems: list[str]) -> None:
    kind = field.type
    if kind in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP):
        _check_message(value, message_type_of(field), path, problems)
        return
    expected = _TYPE_NAMES.get(kind, "value")
    if kind == FieldDescriptor.TYPE_STRING:
        if not isinstance(value, str):
            _add(problems, f"{path}: expected a string, got {describe_value(value)}")
    elif kind == FieldDescriptor.TYPE_BOOL:
        if not isinstance(value, bool):
            _add(problems, f"{path}: expected true or false, got {describe_value(value)}")
    elif kind == FieldDescriptor.TYPE_BYTES:
        if not isinstance(value, str) or not _BASE64_TEXT.fullmatch(value):
            _add(problems, f"{path}: expected base64 text (bytes), got {describe_value(value)}")
    elif kind == FieldDescriptor.TYPE_ENUM:
        _check_enum(value, field, path, problems)
    elif kind in _INT_RANGES:
        _check_int(value, kind, expected, path, problems)
    elif kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        _check_float(value, kind, expected, path, problems)


def _check_enum(value: Any, field: FieldDescriptor, path: str, problems: list[str]) -> None:
    enum = enum_type_of(field)
    if isinstance(value, bool) or not isinstance(value, str | int):
        _add(problems, f"{path}: expected a {enum.full_name} name, got {describe_value(value)}")
    elif isinstance(value, str) and value not in enum.values_by_name:
        names = ", ".join(v.name for v in enum.values)
        _add(problems, f"{path}: {value!r} is not a value of {enum.full_name} ({names})")


def _check_int(value: Any, kind: int, expected: str, path: str, problems: list[str]) -> None:
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float):
        number = int(value) if math.isfinite(value) and value.is_integer() else None
    elif isinstance(value, str) and _INT_TEXT.fullmatch(value):
        number = int(value)
    if number is None:
        _add(problems, f"{path}: expected an integer ({expected}), got {describe_value(value)}")
        return
    low, high = _INT_RANGES[kind]
    if not low <= number <= high:
        _add(problems, f"{path}: {number} is out of range for {expected}")


def _check_float(value: Any, kind: int, expected: str, path: str, problems: list[str]) -> None:
    number: float | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        if value in _NON_FINITE:
            return
        try:
            number = float(value)
        except ValueError:
            number = None
    if number is None:
        _add(problems, f"{path}: expected a number ({expected}), got {describe_value(value)}")
        return
    if (
        kind == FieldDescriptor.TYPE_FLOAT
        and math.isfinite(number)
        and abs(number) >= FLOAT32_LIMIT
    ):
        _add(problems, f"{path}: {number} is out of range for float")


def _check_special(data: Any, descriptor: Descriptor, path: str, problems: list[str]) -> None:
    message = message_class(descriptor)()
    try:
        json_format.ParseDict(data, message, descriptor_pool=descriptor.file.pool)
    except Exception as exc:
        _add(problems, f"{path}: not a valid {descriptor.full_name}: {_first_line(exc)}")


def to_json_value(value: Any) -> Any:
    """Turn a CEL result into a value proto3 JSON can carry.

    Bytes become base64, timestamps RFC 3339, durations ``"1.5s"``, non-finite
    floats their proto3 JSON names; containers are converted throughout.
    """
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        return value if math.isfinite(value) else _non_finite_name(value)
    if kind is list or kind is tuple:
        return [to_json_value(item) for item in value]
    if kind is dict:
        return {_json_key(key): to_json_value(item) for key, item in value.items()}
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dt.datetime):
        return _rfc3339(value)
    if isinstance(value, dt.timedelta):
        return _duration_text(value)
    if hasattr(value, "has_value") and hasattr(value, "value"):
        return to_json_value(value.value()) if value.has_value() else None
    if isinstance(value, Mapping):
        return {_json_key(key): to_json_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_value(item) for item in value]
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return to_json_value(float(value))
    if isinstance(value, str):
        return str(value)
    raise TypeError(f"a CEL value of type {kind.__name__} has no JSON form")


def _non_finite_name(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _json_key(key: Any) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    return key if isinstance(key, str) else str(key)


def _rfc3339(value: dt.datetime) -> str:
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    text = value.isoformat(timespec="microseconds")
    if text.endswith(".000000"):
        text = text[: -len(".000000")]
    return text + "Z"


def _duration_text(value: dt.timedelta) -> str:
    micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    sign = "-" if micros < 0 else ""
    seconds, fraction = divmod(abs(micros), 1_000_000)
    if fraction:
        return f"{sign}{seconds}.{fraction:06d}".rstrip("0") + "s"
    return f"{sign}{seconds}s"


__all__ = [
    "DYNAMIC_TYPES",
    "FLOAT32_LIMIT",
    "NON_OBJECT_JSON_FORMS",
    "SPECIAL_JSON_TYPES",
    "MessageError",
    "check",
    "describe_value",
    "field_index",
    "field_type_name",
    "is_map",
    "message_class",
    "parse",
    "parse_strict",
    "to_json",
    "to_json_value",
]
