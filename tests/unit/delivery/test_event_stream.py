"""The event stream's wire format: what the server writes, the CLI reads back."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.watch import messages
from streams.watch import KEEPALIVE, Frame


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


def test_messages_follow_the_sse_rules_for_fields_comments_and_blank_lines() -> None:
    stream = (
        b": keep-alive\n\n"
        b'id: 7\ndata: {"a": 1}\n\n'
        b'event: progress\r\ndata:{"f": 0.5}\r\n\r\n'
        b"event: ignored-without-data\n\n"
        b"data: [1,\ndata: 2]\n\n"
        b'id: 9\ndata: "cut off, never dispatched"\n'
    )
    got = [(m.event, m.id, m.data) for m in messages(iter(_lines(stream)))]
    assert got == [
        ("message", "7", {"a": 1}),
        ("progress", "", {"f": 0.5}),
        ("message", "", [1, 2]),
    ]


# A loaded machine (the suite runs on several workers) can slow the recursive
# strategy past Hypothesis's generation budget; the inputs are still right.
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=10,
    ),
    event=st.sampled_from(["", "progress", "end"]),
    event_id=st.sampled_from(["", "1", "123456789"]),
)
def test_what_a_frame_encodes_reads_back_as_the_same_message(
    data: object, event: str, event_id: str
) -> None:
    # Text with line breaks is escaped by JSON, so one frame is one message.
    frame = Frame(json.dumps(data), event=event, id=event_id).encode()
    [message] = list(messages(iter(_lines(KEEPALIVE + frame))))
    assert (message.event, message.id, message.data) == (event or "message", event_id, data)
