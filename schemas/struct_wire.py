"""``google.protobuf.Struct`` and ``Timestamp`` fields filled without protobuf's Python helpers.

Every commit point builds an event whose ``response``, ``result`` or
``review_request`` is a Struct made from a step's JSON-like answer.
``Struct.update`` builds it one ``Value`` message at a time in Python, a
protobuf call per key and per list element, so an embedding-sized list costs a
thousand of them. Here the same Struct is written straight in the wire format
and parsed by protobuf's native code in one call.

The encoding follows ``Struct.update`` exactly, type check for type check; any
value it would treat differently or refuse (a key that is not a string, a Struct
or ListValue message, an integer too large for a double, text that is not valid
UTF-8) sends the whole mapping back to ``Struct.update``, which then behaves as
it always did. Keys go in the order deterministic serialization writes them, so
the bytes are also those of a serialized event's Struct (``schemas.event_wire``).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp

_DOUBLE = struct.Struct("<d").pack
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# Tags (field number << 3 | wire type) of google/protobuf/struct.proto.
_ENTRY = b"\x0a"  # Struct.fields (map entry) and ListValue.values: field 1, length-delimited
_ENTRY_KEY = b"\x0a"  # map entry key: field 1, length-delimited
_ENTRY_VALUE = b"\x12"  # map entry value: field 2, length-delimited
_NULL = b"\x08\x00"  # Value.null_value = NULL_VALUE
_NUMBER = b"\x11"  # Value.number_value: field 2, 64-bit
_STRING = b"\x1a"  # Value.string_value: field 3, length-delimited
_TRUE = b"\x20\x01"  # Value.bool_value: field 4, varint
_FALSE = b"\x20\x00"
_STRUCT = b"\x2a"  # Value.struct_value: field 5, length-delimited
_LIST = b"\x32"  # Value.list_value: field 6, length-delimited


class _Unencodable(Exception):
    """A value ``Struct.update`` treats in a way this module does not copy."""


# What sends a mapping back to Struct.update: a value or key it handles
# differently, text that is not UTF-8, an integer past a double's range, nesting
# deeper than the interpreter allows.
_REFUSALS = (_Unencodable, UnicodeEncodeError, OverflowError, RecursionError)


_SHORT_LENGTHS = tuple(bytes((size,)) for size in range(0x80))


def varint(size: int) -> bytes:
    """A non-negative integer as a protobuf varint."""
    if size < 0x80:
        return _SHORT_LENGTHS[size]
    out = bytearray()
    while size >= 0x80:
        out.append((size & 0x7F) | 0x80)
        size >>= 7
    out.append(size)
    return bytes(out)


def _delimited(tag: bytes, payload: bytes) -> bytes:
    return tag + varint(len(payload)) + payload


# A list element holding a number: the entry tag, the Value's length (9), the
# number's tag; the 8 bytes of the double follow.
_NUMBER_ENTRY = _ENTRY + b"\x09" + _NUMBER


def _value(value: Any) -> bytes:
    """The bytes of a ``Value`` message holding ``value``, in ``_SetStructValue``'s order."""
    if value is None:
        return _NULL
    if isinstance(value, bool):
        return _TRUE if value else _FALSE
    if isinstance(value, str):
        return _delimited(_STRING, value.encode())
    if isinstance(value, (int, float)):
        return _NUMBER + _DOUBLE(float(value))
    if isinstance(value, dict):
        return _delimited(_STRUCT, _fields(value))
    if isinstance(value, (list, tuple)):
        return _delimited(_LIST, _elements(value))
    raise _Unencodable


def _elements(items: list[Any] | tuple[Any, ...]) -> bytes:
    """The bytes of a ``ListValue`` message's values."""
    parts = []
    for item in items:
        # Lists of numbers (embeddings, ids) and of words are what gets long.
        kind = type(item)
        if kind is float:
            parts.append(_NUMBER_ENTRY + _DOUBLE(item))
        elif kind is int:
            parts.append(_NUMBER_ENTRY + _DOUBLE(float(item)))
        elif kind is str:
            raw = item.encode()
            size = len(raw)
            if size < 0x7E:
                # A word: both lengths fit a byte, so no varint is worked out.
                parts.append(
                    _ENTRY + _SHORT_LENGTHS[size + 2] + _STRING + _SHORT_LENGTHS[size] + raw
                )
            else:
                text = _delimited(_STRING, raw)
                parts.append(_ENTRY + varint(len(text)) + text)
        else:
            parts.append(_delimited(_ENTRY, _value(item)))
    return b"".join(parts)


def _serialized_order(key: str) -> bytes:
    # Deterministic serialization orders map keys by their bytes, a key that
    # another begins with after that other; no UTF-8 byte is 0xFF.
    return key.encode() + b"\xff"


def _fields(mapping: Mapping[Any, Any]) -> bytes:
    """The bytes of a ``Struct`` message's fields, keys in order."""
    for key in mapping:
        if not isinstance(key, str):
            raise _Unencodable
    entries = []
    for key in sorted(mapping, key=_serialized_order):
        value = mapping[key]
        entry = _delimited(_ENTRY_KEY, key.encode()) + _delimited(_ENTRY_VALUE, _value(value))
        entries.append(_delimited(_ENTRY, entry))
    return b"".join(entries)


def struct_bytes(mapping: Mapping[Any, Any]) -> bytes | None:
    """``mapping`` as a serialized ``Struct``; ``None`` when ``Struct.update`` must decide."""
    try:
        return _fields(mapping)
    except _REFUSALS:
        return None


def fill_struct(target: Struct, mapping: Mapping[Any, Any]) -> None:
    """``target.update(mapping)``, in one native parse whenever the mapping allows."""
    encoded = struct_bytes(mapping)
    if encoded is None:
        target.update(mapping)
    else:
        target.MergeFromString(encoded)


def set_timestamp(target: Timestamp, moment: datetime) -> None:
    """``target.FromDatetime(moment)``, without a time tuple for a moment in UTC."""
    if moment.tzinfo is not UTC:
        target.FromDatetime(moment)
        return
    since = moment - _EPOCH
    target.seconds = since.days * 86_400 + since.seconds
    target.nanos = since.microseconds * 1_000
