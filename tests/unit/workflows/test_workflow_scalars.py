"""The fast scalar paths (codec decoding, request setters) never outvote json_format.

Each fast path may refuse a value and leave it to json_format, but whatever it
accepts must come out exactly as json_format would have made it, and whatever
json_format refuses it must refuse too. The one exception is documented in
``workflows.scalars``: a number that rounds to the largest float32 is read as
that value, where json_format refuses it (even though it writes that value so).
"""

from __future__ import annotations

import base64
import math
import struct
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, json_format
from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.workflows_fixtures import message_class
from workflows import FailureKind, InputError, StepFailure, compile_definition
from workflows.codec import Codecs
from workflows.protojson import FLOAT32_LIMIT, MessageError, descriptor_of
from workflows.rules import Scope, make_setter

EVERYTHING = message_class("jobs.test.Everything")
_POOL = descriptor_of(EVERYTHING).file.pool
FLOAT32_MAX: float = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]

# Values at the edges of what proto3 JSON allows, per field of jobs.test.Everything.
EDGES: list[tuple[str, Any]] = [
    ("fl", 1e39),
    ("fl", -1e39),
    ("fl", 3.4028235e38),  # how json_format writes the largest float32
    ("fl", FLOAT32_MAX),
    ("rfl", [-3.4028235e38]),
    ("fl", FLOAT32_LIMIT),  # rounds to infinity
    ("fl", math.inf),
    ("fl", math.nan),
    ("fl", "NaN"),
    ("fl", "-Infinity"),
    ("fl", 10**39),
    ("fl", 1),
    ("fl", True),
    ("fl", "1.5"),
    ("db", math.inf),
    ("db", -math.inf),
    ("db", math.nan),
    ("db", "Infinity"),
    ("db", 1e308),
    ("db", 5),
    ("rfl", [1e39]),
    ("rfl", [1.0, 2.5]),
    ("rfl", [1.0, math.inf]),
    ("rfl", ["NaN", 1.0]),
    ("rdb", [math.nan]),
    ("rdb", [1e308, 1e308]),  # the sum overflows, the values do not
    ("i32", 2**31),
    ("i32", 1.0),
    ("i32", True),
    ("i32", "5"),
    ("u32", -1),
    ("i64", "12"),
    ("i64", "-3"),
    ("i64", "1e3"),
    ("i64", " 1"),
    ("i64", "\u0661\u0662"),  # digits, but not ASCII ones
    ("i64", 2**63),
    ("u64", "-1"),
    ("b", 1),
    ("b", "true"),
    ("s", 5),
    ("by", "eA=="),
    ("by", "eA"),
    ("by", "-_8="),
    ("color", "RED"),
    ("color", 7),
    ("color", "BLUE"),
    ("rcolor", ["GREEN", 1]),
    ("ri64", ["1", 2]),
    ("rb", [True, 0]),
]


def _rounds_to_max(value: Any) -> Any:
    """A number that rounds to the largest float32 in magnitude, as that float32."""
    if type(value) is float and FLOAT32_MAX < abs(value) < FLOAT32_LIMIT:
        return math.copysign(FLOAT32_MAX, value)
    if type(value) is list:
        return [_rounds_to_max(item) for item in value]
    return value


def _reference(name: str, value: Any) -> bytes | None:
    """json_format's reading of ``{name: value}``, serialized; None when it refuses."""
    if name in ("fl", "rfl"):
        value = _rounds_to_max(value)
    try:
        message = json_format.ParseDict({name: value}, EVERYTHING(), descriptor_pool=_POOL)
    except Exception:
        return None
    return message.SerializeToString(deterministic=True)


def _via_codec(name: str, value: Any) -> bytes | None:
    codec = Codecs().of(descriptor_of(EVERYTHING))
    try:
        message = codec.decode({name: value}, "m")
    except MessageError:
        return None
    return message.SerializeToString(deterministic=True)


def _via_setter(name: str, value: Any) -> bytes | str:
    """The setter's reading; "refused" when it hands the value back to json_format."""
    setter = make_setter(descriptor_of(EVERYTHING), (name,))
    if setter is None:
        return "refused"
    message: Message = EVERYTHING()
    try:
        if not setter(message, value):
            return "refused"
    except Exception:
        return "refused"
    return message.SerializeToString(deterministic=True)


@pytest.mark.parametrize(("name", "value"), EDGES, ids=[f"{n}={v!r}" for n, v in EDGES])
def test_the_codec_reads_a_scalar_as_json_format_does(name: str, value: Any) -> None:
    assert _via_codec(name, value) == _reference(name, value)


@pytest.mark.parametrize(("name", "value"), EDGES, ids=[f"{n}={v!r}" for n, v in EDGES])
def test_a_request_setter_never_accepts_what_json_format_refuses(name: str, value: Any) -> None:
    fast = _via_setter(name, value)
    if fast != "refused":
        assert fast == _reference(name, value)


_SCALAR_FIELDS = [
    field.name for field in EVERYTHING.DESCRIPTOR.fields if field.message_type is None
]
_VALUES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.sampled_from(["NaN", "Infinity", "-Infinity", "RED", "7", "-7", "eA==", "1.5", ""])
    | st.text(max_size=4)
)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(_SCALAR_FIELDS), _VALUES | st.lists(_VALUES, max_size=3))
def test_fast_paths_agree_with_json_format_on_any_value(name: str, value: Any) -> None:
    reference = _reference(name, value)
    assert _via_codec(name, value) == reference
    fast = _via_setter(name, value)
    if fast != "refused":
        assert fast == reference


def _float_request_workflow() -> Any:
    """One step whose request holds a float32 mapped from a double in the input."""
    file = descriptor_pb2.FileDescriptorProto(
        name="floats.proto", package="floats", syntax="proto3"
    )
    number = descriptor_pb2.FieldDescriptorProto
    for message_name, kind in (("In", number.TYPE_DOUBLE), ("Req", number.TYPE_FLOAT)):
        message = file.message_type.add(name=message_name)
        message.field.add(name="x", number=1, type=kind, label=number.LABEL_OPTIONAL)
    file.message_type.add(name="Out")
    file.service.add(name="S").method.add(
        name="M", input_type=".floats.Req", output_type=".floats.Out"
    )
    encoded = base64.b64encode(
        descriptor_pb2.FileDescriptorSet(file=[file]).SerializeToString()
    ).decode()
    return compile_definition(
        {
            "name": "floats",
            "schema": {"descriptorSetBase64": encoded},
            "inputType": "floats.In",
            "steps": [{"name": "narrow", "method": "floats.S/M", "rules": ["x = input.x"]}],
        }
    )


def test_a_mapped_value_too_large_for_a_float_is_a_mapping_defect() -> None:
    workflow = _float_request_workflow()
    step = workflow.steps[0]
    assert step.build_request(Scope({"x": 1.5})).x == 1.5  # type: ignore[attr-defined]

    with pytest.raises(StepFailure) as caught:
        step.build_request(Scope({"x": 1e39}))
    assert caught.value.kind is FailureKind.NON_RETRYABLE
    assert "rule `x = input.x` produced number 1e+39" in caught.value.message
    assert "floats.Req.x cannot hold" in caught.value.message

    with pytest.raises(InputError, match=r"step 'narrow' cannot be built from it"):
        workflow.validate_input({"x": 1e39})
