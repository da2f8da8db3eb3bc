"""A caller's Struct as the JSON a job stores: numbers JSON cannot hold are refused by path."""

from __future__ import annotations

import math
from typing import Any

import pytest
from google.protobuf.struct_pb2 import Struct

from schemas.errors import InvalidArgument
from streams.convert import storable_json, struct_to_dict


def _struct(value: dict[str, Any]) -> Struct:
    message = Struct()
    message.update(value)
    return message


def test_integral_numbers_come_back_as_ints() -> None:
    assert struct_to_dict(_struct({"n": 3, "x": 1.5, "ok": True, "none": None}), "input") == {
        "n": 3,
        "x": 1.5,
        "ok": True,
        "none": None,
    }


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_a_number_that_is_not_finite_is_refused_naming_its_path(number: float) -> None:
    nested = _struct({"fine": [1, 2], "rows": [{"a": 1}, {"scores": [0.5, "x", number]}]})
    with pytest.raises(InvalidArgument) as refused:
        struct_to_dict(nested, "response")
    assert refused.value.message == (
        "response.rows[1].scores[2] is not a finite number: JSON has no NaN or Infinity,"
        " and a number must fit a double"
    )


def test_storable_json_also_refuses_text_holding_nul_naming_its_path() -> None:
    assert storable_json(_struct({"a": ["x", "y"]}), "input") == {"a": ["x", "y"]}
    with pytest.raises(InvalidArgument) as refused:
        storable_json(_struct({"a": ["x", "y\x00"]}), "input")
    assert refused.value.message == "input.a[1] contains U+0000 (NUL), which is not accepted"


def test_a_path_through_over_long_field_names_is_cut_in_the_refusal() -> None:
    # The refusal becomes a dead letter's reason header or an answer's message:
    # it must not grow with the caller's field names.
    long_name = "k" * 100_000
    with pytest.raises(InvalidArgument) as refused:
        struct_to_dict(_struct({long_name: {long_name: math.nan}}), "input")
    message = refused.value.message
    assert message.startswith("input.kkk") and len(message) < 400, len(message)
    assert message.endswith(
        "... is not a finite number: JSON has no NaN or Infinity, and a number must fit a double"
    )
