"""Compiled proto3 JSON codecs, one per message type, built once per definition.

``json_format`` walks descriptors on every call and formats each 32-bit float
by trial and error; for a 1,536-float embedding that is milliseconds per
conversion, and a segment converts every checkpoint it replays. A codec looks
the fields up once and converts containers at C speed (``python -m
benchmarks.codec`` measures both on such an embedding).

Its output is the canonical form described in :mod:`workflows.protojson`, with
one deliberate difference from ``json_format``: a ``float`` (32-bit) field is
written as the exact value it holds (``0.8999999761581421`` for ``0.9f``)
rather than the shortest decimal that rounds to it. Both parse back to the same
bits; only the first is free.

Decoding takes a fast path that refuses anything it is not sure of; refused
input goes through ``json_format`` (the authority on proto3 JSON), and a
failure there is explained field by field by :func:`workflows.protojson.check`.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from workflows.protojson import (
    FLOAT32_LIMIT,
    SPECIAL_JSON_TYPES,
    descriptor_of,
    enum_type_of,
    is_map,
    message_class,
    message_type_of,
    parse,
    parse_strict,
    pool_of,
)
from workflows.scalars import (
    FLOAT_TYPES,
    INT32_TYPES,
    INT64_TYPES,
    MESSAGE_TYPES,
    Refuse,
    is_int_text,
    read_double,
    read_float32,
    read_str,
    reader_for,
)

Encode = Callable[[Any], Any]
Decode = Callable[[Message, Any], None]


class Codecs:
    """The codecs of one descriptor pool, by message full name."""

    def __init__(self) -> None:
        self._codecs: dict[str, Codec] = {}

    def of(self, descriptor: Descriptor) -> Codec:
        codec = self._codecs.get(descriptor.full_name)
        if codec is None:
            codec = Codec(descriptor, self)
            self._codecs[descriptor.full_name] = codec
        return codec


class Codec:
    """proto3 JSON for one message type (see the module docstring)."""

    __slots__ = (
        "_aliases",
        "_codecs",
        "_compiled",
        "_decoders",
        "_encoders",
        "_special",
        "descriptor",
        "message_class",
    )

    def __init__(self, descriptor: Descriptor, codecs: Codecs) -> None:
        self.descriptor = descriptor
        self.message_class = message_class(descriptor)
        self._codecs = codecs
        self._special = descriptor.full_name in SPECIAL_JSON_TYPES
        # Filled on first use: recursive types refer to their own codec.
        self._compiled = False
        self._encoders: tuple[tuple[str, bool, Encode | None], ...] = ()
        self._decoders: dict[str, tuple[str, str | None, Decode]] = {}
        self._aliases = False

    # --- encoding ------------------------------------------------------------------

    def encode(self, message: Message) -> dict[str, Any]:
        if self._special:
            encoded: dict[str, Any] = _generic_encode(message)
            return encoded
        if not self._compiled:
            self._compile()
        out: dict[str, Any] = {}
        for name, presence, convert in self._encoders:
            if presence and not message.HasField(name):
                continue
            value = getattr(message, name)
            out[name] = value if convert is None else convert(value)
        return out

    # --- decoding ------------------------------------------------------------------

    def decode(self, data: Any, label: str) -> Message:
        """Parse proto3 JSON; errors raise ``MessageError`` with field paths."""
        return self._decode(data, label, parse)

    def decode_strict(self, data: Any, label: str) -> Message:
        """Like :meth:`decode`, refusing also what ``json_format`` lets through."""
        return self._decode(data, label, parse_strict)

    def _decode(
        self, data: Any, label: str, slow: Callable[[Any, type[Message], str], Message]
    ) -> Message:
        message = self.message_class()
        try:
            self._decode_into(message, data)
            return message
        except Exception:  # the fast path gives up on anything unusual; json_format decides
            return slow(data, self.message_class, label)

    def _decode_into(self, message: Message, data: Any) -> None:
        if self._special:
            json_format.ParseDict(data, message, descriptor_pool=pool_of(self.descriptor))
            return
        if not isinstance(data, dict):
            raise Refuse
        if not self._compiled:
            self._compile()
        decoders = self._decoders
        oneofs: dict[str, str] | None = None
        seen: set[str] | None = set() if self._aliases else None
        for key, value in data.items():
            entry = decoders.get(key)
            if entry is None:
                raise Refuse
            name, oneof, decode = entry
            if seen is not None:
                if name in seen:
                    raise Refuse
                seen.add(name)
            if value is None:
                raise Refuse  # null handling differs by type; leave it to json_format
            if oneof is not None:
                if oneofs is None:
                    oneofs = {}
                if oneof in oneofs:
                    raise Refuse
                oneofs[oneof] = name
            decode(message, value)

    # --- compilation ---------------------------------------------------------------

    def _compile(self) -> None:
        self._compiled = True
        encoders: list[tuple[str, bool, Encode | None]] = []
        decoders: dict[str, tuple[str, str | None, Decode]] = {}
        for field in self.descriptor.fields:
            name = field.name
            presence = field.has_presence and not field.is_repeated
            encoders.append((name, presence, self._field_encoder(field)))
            oneof = field.containing_oneof
            oneof_name = oneof.name if oneof is not None else None
            entry = (name, oneof_name, self._field_decoder(field))
            decoders[name] = entry
            if field.json_name != name:
                decoders.setdefault(field.json_name, entry)
                self._aliases = True
        self._encoders = tuple(encoders)
        self._decoders = decoders

    def _field_encoder(self, field: FieldDescriptor) -> Encode | None:
        """None means the attribute value is already its JSON form."""
        if is_map(field):
            key_field, value_field = message_type_of(field).fields
            key = _map_key_encoder(key_field)
            value = self._single_encoder(value_field) or _identity
            return lambda container: {key(k): value(v) for k, v in container.items()}
        single = self._single_encoder(field)
        if not field.is_repeated:
            return single
        if field.type in FLOAT_TYPES:
            return _encode_float_list
        if single is None:
            return list
        convert = single
        return lambda container: [convert(item) for item in container]

    def _single_encoder(self, field: FieldDescriptor) -> Encode | None:
        kind = field.type
        if kind in MESSAGE_TYPES:
            sub = message_type_of(field)
            if sub.full_name in SPECIAL_JSON_TYPES:
                return _generic_encode
            return self._codecs.of(sub).encode
        if kind in INT64_TYPES:
            return str
        if kind in FLOAT_TYPES:
            return _encode_float
        if kind == FieldDescriptor.TYPE_BYTES:
            return _encode_bytes
        if kind == FieldDescriptor.TYPE_ENUM:
            names = {value.number: value.name for value in enum_type_of(field).values}
            return lambda number: names.get(number, number)
        return None

    def _field_decoder(self, field: FieldDescriptor) -> Decode:
        name = field.name
        if is_map(field):
            key_field, value_field = message_type_of(field).fields
            convert_key = _map_key_decoder(key_field)
            if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                fill = self._message_filler(message_type_of(value_field))

                def decode_message_map(message: Message, value: Any) -> None:
                    if type(value) is not dict:
                        raise Refuse
                    container = getattr(message, name)
                    for key, item in value.items():
                        if item is None:
                            raise Refuse
                        fill(container[convert_key(key)], item)

                return decode_message_map
            convert_value = reader_for(value_field)

            def decode_map(message: Message, value: Any) -> None:
                if type(value) is not dict:
                    raise Refuse
                container = getattr(message, name)
                for key, item in value.items():
                    container[convert_key(key)] = convert_value(item)

            return decode_map
        if field.type in MESSAGE_TYPES:
            fill = self._message_filler(message_type_of(field))
            if field.is_repeated:

                def decode_messages(message: Message, value: Any) -> None:
                    if type(value) is not list:
                        raise Refuse
                    container = getattr(message, name)
                    for item in value:
                        if item is None:
                            raise Refuse
                        fill(container.add(), item)

                return decode_messages

            def decode_message(message: Message, value: Any) -> None:
                child = getattr(message, name)
                child.SetInParent()
                fill(child, value)

            return decode_message
        if field.is_repeated:
            convert_all = _list_decoder(field)

            def decode_list(message: Message, value: Any) -> None:
                if type(value) is not list:
                    raise Refuse
                getattr(message, name).extend(convert_all(value))

            return decode_list
        convert = reader_for(field)

        def decode_scalar(message: Message, value: Any) -> None:
            setattr(message, name, convert(value))

        return decode_scalar

    def _message_filler(self, descriptor: Descriptor) -> Decode:
        if descriptor.full_name in SPECIAL_JSON_TYPES:
            pool = pool_of(descriptor)

            def fill_special(child: Message, value: Any) -> None:
                json_format.ParseDict(value, child, descriptor_pool=pool)

            return fill_special
        codec = self._codecs.of(descriptor)
        return codec._decode_into


def _identity(value: Any) -> Any:
    return value


def _generic_encode(message: Message) -> Any:
    return json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        descriptor_pool=pool_of(descriptor_of(message)),
    )


def _encode_float(value: float) -> Any:
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _encode_float_list(container: Any) -> list[Any]:
    values = list(container)
    # A non-finite element makes the sum non-finite; only then look at each one.
    if math.isfinite(sum(values)):
        return values
    return [_encode_float(value) for value in values]


def _encode_bytes(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _map_key_encoder(field: FieldDescriptor) -> Encode:
    if field.type == FieldDescriptor.TYPE_BOOL:
        return lambda key: "true" if key else "false"
    if field.type == FieldDescriptor.TYPE_STRING:
        return _identity
    return str


def _map_key_decoder(field: FieldDescriptor) -> Callable[[Any], Any]:
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        return read_str
    if kind == FieldDescriptor.TYPE_BOOL:

        def bool_key(key: Any) -> bool:
            if key == "true":
                return True
            if key == "false":
                return False
            raise Refuse

        return bool_key

    def int_key(key: Any) -> int:
        if is_int_text(key):
            return int(key)
        raise Refuse

    return int_key


def _list_decoder(field: FieldDescriptor) -> Callable[[list[Any]], list[Any]]:
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING or kind in INT32_TYPES:
        # The container's own type check refuses anything else (bools included).
        return _identity
    if kind in FLOAT_TYPES:
        float32 = kind == FieldDescriptor.TYPE_FLOAT
        one = read_float32 if float32 else read_double

        def floats(values: list[Any]) -> list[Any]:
            for value in values:
                kind_of = type(value)
                if kind_of is not float and kind_of is not int:
                    return [one(item) for item in values]  # "NaN", "Infinity", or a refusal
            if not values:
                return values
            if float32 and (max(values) >= FLOAT32_LIMIT or min(values) <= -FLOAT32_LIMIT):
                raise Refuse
            if not math.isfinite(sum(values)):
                return [one(item) for item in values]
            return values

        return floats
    convert = reader_for(field)
    return lambda values: [convert(value) for value in values]


__all__ = ["Codec", "Codecs"]
