"""The checks of request bodies that run before, and right after, a JSON parse."""

from __future__ import annotations

import json
import math

import pytest

from schemas.errors import InvalidArgument
from streams.convert import nul_field
from streams.http_errors import check_json_depth, load_json


def test_depth_counts_arrays_and_objects_but_not_brackets_in_strings() -> None:
    check_json_depth(b"[" * 5 + b"]" * 5, limit=5)
    with pytest.raises(InvalidArgument, match="more than 5 levels"):
        check_json_depth(b'{"a":' * 6 + b"1" + b"}" * 6, limit=5)
    check_json_depth(json.dumps({"a": '[[[[[[[[{{{{{\\"' * 10}).encode(), limit=2)
    # Many shallow siblings are not depth.
    check_json_depth(b"[" + b"[]," * 10_000 + b"[]]", limit=2)


def test_nul_is_found_at_any_depth_and_named_by_its_path() -> None:
    assert nul_field({"a": [1, {"b": "x\x00"}]}) == "a[1].b"
    assert nul_field({"a": {"k\x00": 1}}) == "a field name in a"
    assert nul_field(["ok", "fine"]) is None
    with pytest.raises(InvalidArgument, match=r"^response\.note contains U\+0000"):
        load_json(b'{"response": {"note": "a\\u0000b"}}', "complete-step")


def test_an_integer_past_a_doubles_range_is_read_as_infinity_and_one_within_exactly() -> None:
    # Every number lands in a Struct, a double: infinity is refused there, naming
    # where, as 1e400 is. Below that range an integer keeps every digit.
    assert load_json(b'{"a": [' + b"1" + b"0" * 400 + b"]}", "submit") == {"a": [math.inf]}
    assert load_json(b"-" + b"9" * 5000, "submit") == -math.inf
    assert load_json(b"[9007199254740993, -12]", "submit") == [2**53 + 1, -12]
    assert load_json(b"1" + b"0" * 308, "submit") == 10**308
