"""The wire-format Struct and Timestamp fillers agree with protobuf's own helpers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from google.protobuf.struct_pb2 import ListValue, Struct
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.struct_wire import fill_struct, set_timestamp, struct_bytes

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**1100), max_value=2**1100)  # past a double's range too
    | st.floats()  # NaN and the infinities included
    | st.text()  # lone surrogates included: not UTF-8
)
keys = st.text(max_size=8) | st.integers(max_value=3)  # a key that is not a string
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(keys, inner, max_size=4)
        | st.builds(ListValue)
        | st.just(object())
    ),
    max_leaves=16,
)
mappings = st.dictionaries(keys, values, max_size=5)


def _outcome(fill: Any, mapping: dict[Any, Any]) -> bytes | str:
    target = Struct()
    try:
        fill(target, mapping)
    except Exception as exc:  # both sides must refuse alike
        return type(exc).__name__
    return target.SerializeToString(deterministic=True)


@settings(max_examples=300, deadline=None)
@given(mappings)
def test_fill_struct_builds_what_struct_update_builds_or_fails_as_it_does(
    mapping: dict[Any, Any],
) -> None:
    assert _outcome(fill_struct, mapping) == _outcome(Struct.update, mapping)


def test_plain_json_takes_the_wire_path_and_odd_values_go_to_struct_update() -> None:
    embedding = {"vector": [0.125] * 1536, "model": "m", "dims": 1536, "ok": True, "x": None}
    assert struct_bytes(embedding) is not None
    assert struct_bytes({"deep": {"er": [{"est": []}]}}) is not None
    for odd in ({1: "key not a string"}, {"big": 2**2000}, {"bad": "\ud800"}, {"m": Struct()}):
        assert struct_bytes(odd) is None


moments = st.datetimes(
    min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC)
)


@given(moments | st.datetimes() | st.datetimes(timezones=st.just(timezone(timedelta(hours=5)))))
def test_set_timestamp_matches_from_datetime(moment: datetime) -> None:
    expected, got = Timestamp(), Timestamp()
    expected.FromDatetime(moment)
    set_timestamp(got, moment)
    assert (got.seconds, got.nanos) == (expected.seconds, expected.nanos)


def test_list_words_either_side_of_a_one_byte_length_encode_as_struct_update_does() -> None:
    words = ["x" * size for size in (0, 1, 124, 125, 126, 127, 128, 300)] + ["é" * 63]
    assert _outcome(fill_struct, {"words": words}) == _outcome(Struct.update, {"words": words})
