"""What a person must fill in to answer an external step: its response type's fields.

The dashboard builds its form from this: one input per field, of a kind a
browser can edit (a checkbox, a number, a line of text, a choice), and a JSON
text box for anything richer (messages, lists, maps, bytes). The values it
sends back are the proto3 JSON of the response, judged like any other answer.
"""

from __future__ import annotations

from typing import Any, cast

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from workflows.protojson import SPECIAL_JSON_TYPES, enum_type_of, field_index, field_type_name

_INTEGERS = {
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_SFIXED32,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_FIXED32,
}
# 64-bit integers travel as JSON strings (proto3 JSON), so a text box keeps them exact.
_TEXTS = {
    FieldDescriptor.TYPE_STRING,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_SFIXED64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_FIXED64,
}
_DECIMALS = {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT}


def _kind(field: FieldDescriptor) -> str:
    if field.is_repeated:
        return "json"
    if field.type == FieldDescriptor.TYPE_BOOL:
        return "boolean"
    if field.type in _INTEGERS:
        return "integer"
    if field.type in _DECIMALS:
        return "number"
    if field.type in _TEXTS:
        return "string"
    if field.type == FieldDescriptor.TYPE_ENUM:
        return "enum"
    return "json"


def response_form(response_type: type[Message]) -> list[dict[str, Any]]:
    """One entry per field of the response, in declaration order: its JSON name,
    the kind of input that edits it, its .proto type and, for an enum, the choices.
    A well-known type with a JSON form of its own is one entry named ``""``."""
    form: list[dict[str, Any]] = []
    # The stubs type a generated class's DESCRIPTOR as either implementation's.
    descriptor = cast(Descriptor, response_type.DESCRIPTOR)
    if descriptor.full_name in SPECIAL_JSON_TYPES:
        # A Struct's or an Any's JSON is not an object of its fields (`fields`,
        # `typeUrl`): the whole response is one JSON value, its unnamed entry.
        return [{"name": "", "kind": "json", "type": descriptor.full_name}]
    fields = field_index(descriptor)
    for name in [field.name for field in descriptor.fields]:
        field = fields[name]
        entry: dict[str, Any] = {
            "name": field.json_name,
            "kind": _kind(field),
            "type": field_type_name(field),
        }
        if entry["kind"] == "enum":
            entry["choices"] = [value.name for value in enum_type_of(field).values]
        form.append(entry)
    return form


__all__ = ["response_form"]
