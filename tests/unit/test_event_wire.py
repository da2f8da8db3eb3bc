"""The wire-written ACCEPTED, STEP_CHECKPOINT and COMPLETED events are the message path's bytes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import event_wire
from schemas.contract import EventType, build_event, encode_event
from schemas.event_wire import accepted_bytes, completed_bytes, step_checkpoint_bytes

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats()
    | st.text(max_size=6)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=16,
)
mappings = st.dictionaries(st.text(max_size=6), json_values, max_size=5)
names = st.text(max_size=12)
attempts = st.integers(min_value=-2, max_value=2**31 + 2)
moments = st.datetimes(
    min_value=datetime(1960, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC)
) | st.datetimes(timezones=st.just(timezone(timedelta(hours=2))))


def _message_bytes(**fields: Any) -> bytes | None:
    """What the message path stores, or None where it refuses."""
    try:
        return encode_event(build_event(**fields))
    except Exception:
        return None


def test_the_event_types_are_the_contracts() -> None:
    assert event_wire.ACCEPTED == EventType.TYPE_ACCEPTED
    assert event_wire.STEP_CHECKPOINT == EventType.TYPE_STEP_CHECKPOINT
    assert event_wire.COMPLETED == EventType.TYPE_COMPLETED


@settings(max_examples=400, deadline=None)
@given(names, attempts, moments, names, mappings, st.booleans())
def test_a_step_checkpoint_is_the_message_paths_bytes_or_left_to_it(
    workflow: str,
    attempt: int,
    moment: datetime,
    step: str,
    response: dict[str, Any],
    skipped: bool,
) -> None:
    job_id = uuid.uuid4()
    fast = step_checkpoint_bytes(
        job_id=job_id,
        workflow_name=workflow,
        attempt=attempt,
        occurred_at=moment,
        step_name=step,
        response=response,
        skipped=skipped,
    )
    if fast is None:
        return
    assert fast == _message_bytes(
        job_id=job_id,
        event_type=EventType.TYPE_STEP_CHECKPOINT,
        workflow_name=workflow,
        attempt=attempt,
        occurred_at=moment,
        step_name=step,
        response=response,
        skipped=skipped,
    )


@settings(max_examples=400, deadline=None)
@given(names, attempts, moments, names, mappings)
def test_a_completed_event_is_the_message_paths_bytes_or_left_to_it(
    workflow: str, attempt: int, moment: datetime, verdict: str, result: dict[str, Any]
) -> None:
    job_id = uuid.uuid4()
    fast = completed_bytes(
        job_id=job_id,
        workflow_name=workflow,
        attempt=attempt,
        occurred_at=moment,
        verdict=verdict,
        result=result,
    )
    if fast is None:
        return
    assert fast == _message_bytes(
        job_id=job_id,
        event_type=EventType.TYPE_COMPLETED,
        workflow_name=workflow,
        attempt=attempt,
        occurred_at=moment,
        verdict=verdict,
        result=result,
    )


def test_ordinary_events_take_the_wire_path_and_doubtful_ones_do_not() -> None:
    now = datetime.now(UTC)
    job_id = uuid.uuid4()
    common: dict[str, Any] = {
        "job_id": job_id,
        "workflow_name": "w",
        "attempt": 1,
        "occurred_at": now,
    }
    response = {"tokens": ["a", "b"], "ids": [1, 2], "nested": {"z": None, "a": [True, 1.5]}}
    assert step_checkpoint_bytes(**common, step_name="s", response=response, skipped=False)
    assert completed_bytes(**common, verdict="done", result={"x": 1})
    # Each of these the message path must decide (and may refuse, with its words).
    assert step_checkpoint_bytes(**common, step_name="", response=response, skipped=False) is None
    assert step_checkpoint_bytes(**common, step_name="s", response={}, skipped=False) is None
    assert (
        step_checkpoint_bytes(**common, step_name="\ud800", response=response, skipped=False)
        is None
    )
    assert completed_bytes(**common, verdict="", result={"x": 1}) is None
    assert completed_bytes(**common, verdict="done", result={"x": 2**2000}) is None
    assert completed_bytes(**{**common, "workflow_name": ""}, verdict="v", result={"x": 1}) is None
    assert completed_bytes(**{**common, "attempt": -1}, verdict="v", result={"x": 1}) is None
    assert completed_bytes(**{**common, "attempt": 2**31}, verdict="v", result={"x": 1}) is None
    local = now.astimezone(timezone(timedelta(hours=1)))
    assert completed_bytes(**{**common, "occurred_at": local}, verdict="v", result={"x": 1}) is None
    early = datetime(1969, 12, 31, tzinfo=UTC)
    assert completed_bytes(**{**common, "occurred_at": early}, verdict="v", result={"x": 1}) is None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names, moments)
def test_an_accepted_event_is_the_message_paths_bytes_or_left_to_it(
    workflow: str, moment: datetime
) -> None:
    job_id = uuid.uuid4()
    fast = accepted_bytes(job_id=job_id, workflow_name=workflow, occurred_at=moment)
    expected = _message_bytes(
        job_id=job_id,
        event_type=EventType.TYPE_ACCEPTED,
        workflow_name=workflow,
        attempt=0,
        occurred_at=moment,
    )
    if fast is None:
        return
    assert fast == expected


def test_an_accepted_event_the_wire_path_cannot_vouch_for_is_left_to_the_message() -> None:
    moment = datetime(2026, 12, 2, 11, 0, tzinfo=UTC)
    job_id = uuid.uuid4()
    assert accepted_bytes(job_id=job_id, workflow_name="", occurred_at=moment) is None
    assert accepted_bytes(job_id=job_id, workflow_name="\ud800", occurred_at=moment) is None
    assert accepted_bytes(job_id=str(job_id), workflow_name="w", occurred_at=moment) is None  # type: ignore[arg-type]
    east = moment.astimezone(timezone(timedelta(hours=2)))
    assert accepted_bytes(job_id=job_id, workflow_name="w", occurred_at=east) is None
    assert (
        accepted_bytes(
            job_id=job_id, workflow_name="w", occurred_at=datetime(1969, 1, 1, tzinfo=UTC)
        )
        is None
    )


def test_events_of_one_job_keep_each_attempts_own_fields_when_written_again() -> None:
    # The fields every event of an attempt repeats are made once per attempt:
    # a job's later attempt, or another job, must never get an earlier one's.
    now = datetime(2026, 12, 2, 21, 30, 15, 123456, tzinfo=UTC)
    jobs = [uuid.uuid4(), uuid.uuid4()]
    for _ in range(2):
        for job_id in jobs:
            for workflow, attempt in (("w", 0), ("w", 1), ("w", 2), ("other", 1)):
                for moment in (now, now + timedelta(seconds=1), now + timedelta(microseconds=1)):
                    fields: dict[str, Any] = {
                        "job_id": job_id,
                        "workflow_name": workflow,
                        "attempt": attempt,
                        "occurred_at": moment,
                    }
                    assert completed_bytes(
                        **fields, verdict="done", result={"x": 1}
                    ) == _message_bytes(
                        event_type=EventType.TYPE_COMPLETED,
                        **fields,
                        verdict="done",
                        result={"x": 1},
                    )
