"""Fast readers of proto3 JSON scalars, shared by the codecs and the request setters.

Both fast paths exist because ``json_format`` dominates the cost of a step's
own work; both stay correct by never accepting a value ``json_format`` would
refuse or read differently. A reader returns what protobuf stores for the
field, or raises :class:`Refuse` when it is not sure, and the caller hands the
value to ``json_format``, the authority. Refusing too much only costs speed,
so every reader errs that way.

One deliberate exception: a float field takes any number that rounds to a
finite float32, as the proto3 JSON mapping says. ``json_format`` refuses the
numbers just above the largest float32, 3.4028235e+38 among them, which is how
it writes that value itself (see ``FLOAT32_LIMIT``).

Integer ranges are left to protobuf itself: assigning an out-of-range int to a
field raises ``ValueError``, which the callers treat like a refusal.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from workflows.protojson import FLOAT32_LIMIT, enum_type_of

INT32_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SFIXED32,
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_FIXED32,
    }
)
INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_SFIXED64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_FIXED64,
    }
)
FLOAT_TYPES = frozenset({FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE})
MESSAGE_TYPES = frozenset({FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP})

_NON_FINITE_NAMES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

Reader = Callable[[Any], Any]


class Refuse(Exception):
    """The fast path is not sure about a value; json_format decides instead."""


def read_str(value: Any) -> str:
    if type(value) is str:
        return value
    raise Refuse


def read_bool(value: Any) -> bool:
    if type(value) is bool:
        return value
    raise Refuse


def read_int(value: Any) -> int:
    if type(value) is int:
        return value
    raise Refuse


def is_int_text(value: Any) -> bool:
    """An optionally negative run of ASCII digits: how proto3 JSON spells 64-bit ints."""
    return type(value) is str and value.isascii() and value.lstrip("-").isdigit()


def read_int64(value: Any) -> int:
    if type(value) is int:
        return value
    if is_int_text(value):
        return int(value)
    raise Refuse


def read_double(value: Any) -> float:
    kind = type(value)
    if kind is float:
        # A non-finite JSON number is refused by json_format: it must be spelled
        # "NaN", "Infinity" or "-Infinity".
        if not math.isfinite(value):
            raise Refuse
        return float(value)
    if kind is int:
        return float(value)
    if kind is str and value in _NON_FINITE_NAMES:
        return _NON_FINITE_NAMES[value]
    raise Refuse


def read_float32(value: Any) -> float:
    number = read_double(value)
    if math.isfinite(number) and abs(number) >= FLOAT32_LIMIT:
        raise Refuse
    return number


def read_bytes(value: Any) -> bytes:
    if type(value) is not str:
        raise Refuse
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise Refuse from None


def reader_for(field: FieldDescriptor) -> Reader:
    """The reader of one scalar or enum field's values (message fields have none)."""
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        return read_str
    if kind == FieldDescriptor.TYPE_BOOL:
        return read_bool
    if kind in INT32_TYPES:
        return read_int
    if kind in INT64_TYPES:
        return read_int64
    if kind == FieldDescriptor.TYPE_DOUBLE:
        return read_double
    if kind == FieldDescriptor.TYPE_FLOAT:
        return read_float32
    if kind == FieldDescriptor.TYPE_BYTES:
        return read_bytes
    if kind == FieldDescriptor.TYPE_ENUM:
        numbers = {value.name: value.number for value in enum_type_of(field).values}

        def read_enum(value: Any) -> int:
            if type(value) is str:
                number = numbers.get(value)
                if number is not None:
                    return number
            elif type(value) is int:
                return value
            raise Refuse

        return read_enum
    raise TypeError(f"{field.full_name} is a message field, not a scalar")


__all__ = [
    "FLOAT_TYPES",
    "INT32_TYPES",
    "INT64_TYPES",
    "MESSAGE_TYPES",
    "Reader",
    "Refuse",
    "is_int_text",
    "read_bool",
    "read_bytes",
    "read_double",
    "read_float32",
    "read_int",
    "read_int64",
    "read_str",
    "reader_for",
]
