"""The compiled proto3 JSON codec agrees with json_format, the reference."""

from __future__ import annotations

import math
from typing import Any

import pytest
from google.protobuf import json_format
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.workflows_fixtures import message_class
from workflows.codec import Codec, Codecs
from workflows.protojson import MessageError, descriptor_of

EVERYTHING = message_class("jobs.test.Everything")
META = message_class("jobs.test.Meta")
INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
UINT32 = st.integers(min_value=0, max_value=2**32 - 1)
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
UINT64 = st.integers(min_value=0, max_value=2**64 - 1)
FLOAT32 = st.floats(width=32, allow_nan=False)
DOUBLE = st.floats(allow_nan=False)


def _codec() -> Codec:
    return Codecs().of(descriptor_of(EVERYTHING))


@st.composite
def metas(draw: st.DrawFn) -> Message:
    return META(
        lang=draw(st.text(max_size=5)), tags=draw(st.lists(st.text(max_size=3), max_size=3))
    )


@st.composite
def everything(draw: st.DrawFn, depth: int = 0) -> Message:
    message: Any = EVERYTHING()
    scalars: dict[str, Any] = {
        "s": st.text(max_size=10),
        "b": st.booleans(),
        "i32": INT32,
        "i64": INT64,
        "u32": UINT32,
        "u64": UINT64,
        "si32": INT32,
        "si64": INT64,
        "f32": UINT32,
        "f64": UINT64,
        "sf32": INT32,
        "sf64": INT64,
        "fl": FLOAT32,
        "db": DOUBLE,
        "by": st.binary(max_size=8),
        "color": st.sampled_from([0, 1, 2, 7]),
        "camel_case_name": st.text(max_size=5),
    }
    for name, strategy in scalars.items():
        if draw(st.booleans()):
            setattr(message, name, draw(strategy))
    repeated: dict[str, Any] = {
        "rs": st.text(max_size=4),
        "ri64": INT64,
        "rfl": FLOAT32,
        "rdb": DOUBLE,
        "rby": st.binary(max_size=4),
        "rcolor": st.sampled_from([0, 1, 2]),
        "rb": st.booleans(),
        "ru32": UINT32,
    }
    for name, strategy in repeated.items():
        getattr(message, name).extend(draw(st.lists(strategy, max_size=4)))
    if draw(st.booleans()):
        message.meta.CopyFrom(draw(metas()))
    for item in draw(st.lists(metas(), max_size=2)):
        message.rmeta.add().CopyFrom(item)
    for name, value in draw(st.dictionaries(st.text(max_size=4), INT64, max_size=3)).items():
        message.counts[name] = value
    for number, meta in draw(st.dictionaries(INT32, metas(), max_size=2)).items():
        message.metas[number].CopyFrom(meta)
    for flag, text in draw(st.dictionaries(st.booleans(), st.text(max_size=3), max_size=2)).items():
        message.flags[flag] = text
    if draw(st.booleans()):
        message.maybe = draw(INT32)
    choice = draw(st.sampled_from(["", "word", "detail"]))
    if choice == "word":
        message.word = draw(st.text(max_size=4))
    elif choice == "detail":
        message.detail.CopyFrom(draw(metas()))
    if draw(st.booleans()):
        message.at.seconds = draw(st.integers(min_value=0, max_value=253_402_300_799))
        message.at.nanos = draw(st.integers(min_value=0, max_value=999_999_999))
    if draw(st.booleans()):
        message.extra.update(
            draw(st.dictionaries(st.text(max_size=4), st.text(max_size=4) | st.booleans()))
        )
    for seconds in draw(st.lists(st.integers(min_value=0, max_value=10**9), max_size=2)):
        message.times.add().seconds = seconds
    if depth == 0 and draw(st.booleans()):
        message.child.CopyFrom(draw(everything(depth=1)))
    result: Message = message
    return result


def _reference(message: Message, **options: Any) -> dict[str, Any]:
    result: dict[str, Any] = json_format.MessageToDict(
        message, always_print_fields_with_no_presence=True, **options
    )
    return result


def _without_float32(value: Any) -> Any:
    # 32-bit floats are written exactly rather than shortest; everything else must match.
    if isinstance(value, dict):
        return {k: _without_float32(v) for k, v in value.items() if k not in ("fl", "rfl")}
    if isinstance(value, list):
        return [_without_float32(item) for item in value]
    return value


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(everything())
def test_encoding_round_trips_and_matches_json_format(message: Message) -> None:
    codec = _codec()
    encoded = codec.encode(message)
    assert codec.decode(encoded, "m") == message
    assert json_format.ParseDict(encoded, EVERYTHING()) == message
    reference = _reference(message, preserving_proto_field_name=True)
    assert _without_float32(encoded) == _without_float32(reference)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(everything())
def test_decoding_reads_json_format_output(message: Message) -> None:
    codec = _codec()
    assert codec.decode(_reference(message, preserving_proto_field_name=True), "m") == message
    assert codec.decode(_reference(message), "m") == message  # lowerCamelCase names
    assert codec.decode_strict(_reference(message), "m") == message


def test_float32_values_are_written_exactly() -> None:
    message: Any = EVERYTHING(fl=0.9, rfl=[0.1, math.inf], db=0.9)
    encoded = _codec().encode(message)
    assert encoded["fl"] == message.fl != 0.9
    assert encoded["rfl"] == [message.rfl[0], "Infinity"]
    assert encoded["db"] == 0.9
    assert _codec().decode(encoded, "m") == message


def test_presence_decides_what_is_printed() -> None:
    encoded = _codec().encode(EVERYTHING())
    assert encoded["s"] == "" and encoded["rs"] == [] and encoded["counts"] == {}
    assert encoded["i64"] == "0"
    assert "meta" not in encoded and "maybe" not in encoded and "word" not in encoded
    assert "at" not in encoded
    encoded = _codec().encode(EVERYTHING(maybe=0, word=""))
    assert encoded["maybe"] == 0 and encoded["word"] == ""


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"nope": 1}, "m.nope: unknown field"),
        ({"i32": 2**40}, "m.i32: 1099511627776 is out of range for int32"),
        ({"rs": ["a", 1]}, "m.rs[1]: expected a string"),
        ({"meta": {"tags": "a"}}, "m.meta.tags: expected a list"),
        ({"metas": {"x": {}}}, "m.metas['x']: map key must be an integer"),
        ({"color": "BLUE"}, "m.color: 'BLUE' is not a value of jobs.test.Color"),
        ({"word": "a", "detail": {}}, "oneof 'choice' already has 'word' set"),
        ({"at": "yesterday"}, "m.at: not a valid google.protobuf.Timestamp"),
        ({"b": 1}, "m.b: expected true or false, got number 1"),
        ({"s": "x", "camelCaseName": "a", "camel_case_name": "b"}, "is given twice"),
    ],
)
def test_bad_json_is_refused_with_paths(data: dict[str, Any], fragment: str) -> None:
    with pytest.raises(MessageError) as caught:
        _codec().decode_strict(data, "m")
    assert any(fragment in problem for problem in caught.value.problems), caught.value.problems


def test_strict_decoding_refuses_what_json_format_lets_through() -> None:
    codec = _codec()
    assert codec.decode({"meta": []}, "m") == EVERYTHING(meta=META())
    with pytest.raises(MessageError, match="expected an object"):
        codec.decode_strict({"meta": []}, "m")


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=6)
    | st.sampled_from(["NaN", "Infinity", "RED", "2020-01-01T00:00:00Z", "AAE="]),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from([f.name for f in EVERYTHING.DESCRIPTOR.fields] + ["lang", "tags", "x"]),
            children,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_junk_raises_only_message_errors(data: Any) -> None:
    codec = _codec()
    for decode in (codec.decode, codec.decode_strict):
        try:
            message = decode(data, "m")
        except MessageError:
            continue
        assert json_format.ParseDict(codec.encode(message), EVERYTHING()) == message
