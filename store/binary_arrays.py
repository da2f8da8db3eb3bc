"""One-dimensional array parameters in Postgres's binary form, built in one pass.

The group commit and the submit batch send their rows as parallel arrays that
the statement unnests. psycopg dumps a list parameter element by element
through its general list dumper, which first looks for the element type and
nesting, then finds and calls a dumper per element. The types these
statements use are few and known, so their arrays are written here directly
(the layout of ``array_send``: dimensions, flags, element type, then each
element's length and bytes), and psycopg passes the bytes through as they are
(``register``): a flush of eight checkpoints costs its client about 90 µs
before anything is sent instead of 150 (benchmarks/README.md).

An element is checked as psycopg's own dumpers check it: text holding a NUL,
or an integer outside its column's range, raises ``psycopg.DataError``
before anything is sent, so a batch that holds one is split as any refused
batch is (``store.gather``).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from psycopg import DataError
from psycopg.abc import Buffer
from psycopg.adapt import AdaptersMap, Dumper
from psycopg.postgres import types as builtin_types
from psycopg.pq import Format
from psycopg.types.json import Jsonb

_HEADER = struct.Struct(">iiIii")  # ndim, has-null flag, element oid, length, lower bound
_EMPTY = struct.Struct(">iiI")  # ndim 0: no dimension follows
_LENGTH = struct.Struct(">i")
_NULL = _LENGTH.pack(-1)
_INT4 = struct.Struct(">ii")
_INT8 = struct.Struct(">iq")
_UUID_LENGTH = _LENGTH.pack(16)
_JSONB_VERSION = b"\x01"
_POSTGRES_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_INT4_RANGE = range(-(2**31), 2**31)
_INT8_RANGE = range(-(2**63), 2**63)


class BinaryArray(bytes):
    """An array parameter already in binary form; each subclass is one element type."""

    element_type: str = ""
    element_oid: int = 0
    array_oid: int = 0


def _text(value: str) -> bytes:
    if "\x00" in value:
        raise DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
    data = value.encode()
    return _LENGTH.pack(len(data)) + data


def _int4(value: int) -> bytes:
    if value not in _INT4_RANGE:
        raise DataError(f"{value} is out of range for an int array element")
    return _INT4.pack(4, value)


def _int8(value: int) -> bytes:
    if value not in _INT8_RANGE:
        raise DataError(f"{value} is out of range for a bigint array element")
    return _INT8.pack(8, value)


def _uuid(value: UUID) -> bytes:
    return _UUID_LENGTH + value.bytes


def _bytea(value: bytes) -> bytes:
    return _LENGTH.pack(len(value)) + value


def _jsonb(value: Jsonb) -> bytes:
    dumps = value.dumps or json.dumps
    text = dumps(value.obj)
    data = _JSONB_VERSION + (text.encode() if isinstance(text, str) else bytes(text))
    return _LENGTH.pack(len(data)) + data


def _timestamptz(value: datetime) -> bytes:
    if value.tzinfo is None:
        raise DataError(f"{value.isoformat()} has no time zone; a timestamptz element needs one")
    return _INT8.pack(8, (value - _POSTGRES_EPOCH) // _MICROSECOND)


def _oids(sql_type: str) -> tuple[int, int]:
    """The element type's oid and its array type's."""
    info = builtin_types[{"int": "int4", "bigint": "int8"}.get(sql_type, sql_type)]
    return info.oid, info.array_oid


def _array_class(sql_type: str) -> type[BinaryArray]:
    element_oid, array_oid = _oids(sql_type)
    attributes = {"element_type": sql_type, "element_oid": element_oid, "array_oid": array_oid}
    return type(f"{sql_type.capitalize()}Array", (BinaryArray,), attributes)


# SQL element type -> (Python types it takes, element writer, array class).
_ELEMENTS: dict[str, tuple[tuple[type, ...], Callable[[Any], bytes], type[BinaryArray]]] = {
    name: (accepted, write, _array_class(name))
    for name, accepted, write in (
        ("uuid", (UUID,), _uuid),
        ("text", (str,), _text),
        ("int", (int,), _int4),
        ("bigint", (int,), _int8),
        ("bytea", (bytes,), _bytea),
        ("jsonb", (Jsonb,), _jsonb),
        ("timestamptz", (datetime,), _timestamptz),
    )
}


def binary_array(sql_type: str, values: Iterable[Any]) -> BinaryArray:
    """``values`` as a ``sql_type[]`` parameter; None elements are NULL.

    Raises ``psycopg.DataError`` for an element psycopg would refuse to send,
    and ``TypeError`` for one of another type than the column's.
    """
    accepted, write, cls = _ELEMENTS[sql_type]
    elements: list[bytes] = []
    has_null = 0
    for value in values:
        if value is None:
            has_null = 1
            elements.append(_NULL)
        elif isinstance(value, accepted) and not isinstance(value, bool):
            elements.append(write(value))
        else:
            raise TypeError(f"a {sql_type}[] element cannot be {type(value).__name__}")
    if not elements:
        return cls(_EMPTY.pack(0, 0, cls.element_oid))
    return cls(_HEADER.pack(1, has_null, cls.element_oid, len(elements), 1) + b"".join(elements))


def _dumper(cls: type[BinaryArray]) -> type[Dumper]:
    class ArrayDumper(Dumper):
        format = Format.BINARY
        oid = cls.array_oid

        def dump(self, obj: Any) -> Buffer:
            return obj  # type: ignore[no-any-return]

    ArrayDumper.__name__ = f"{cls.__name__}Dumper"
    return ArrayDumper


_DUMPERS = [(cls, _dumper(cls)) for _, _, cls in _ELEMENTS.values()]


def register(adapters: AdaptersMap) -> None:
    """Let connections of ``adapters`` send ``BinaryArray`` parameters as they are."""
    for cls, dumper in _DUMPERS:
        adapters.register_dumper(cls, dumper)


__all__ = ["BinaryArray", "binary_array", "register"]
