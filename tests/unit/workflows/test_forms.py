"""The fields of a step's response form."""

from __future__ import annotations

from google.protobuf import any_pb2, struct_pb2

from workflows.forms import response_form


def test_a_struct_or_any_response_is_one_json_value_not_its_fields() -> None:
    # Their proto3 JSON is the object itself (or `@type` and its fields),
    # never {"fields": ...} or {"typeUrl": ..., "value": ...}.
    assert response_form(struct_pb2.Struct) == [
        {"name": "", "kind": "json", "type": "google.protobuf.Struct"}
    ]
    assert response_form(any_pb2.Any) == [
        {"name": "", "kind": "json", "type": "google.protobuf.Any"}
    ]
