"""Retention ages: one syntax, terminal statuses only, errors that name the variable."""

from __future__ import annotations

from datetime import timedelta

import pytest

from store.states import Status
from streams.retention import describe, parse_duration
from streams.settings import Settings, SettingsError

DAY = timedelta(days=1)


def test_the_defaults_keep_outbox_rows_a_week_and_jobs_a_month() -> None:
    policy = Settings.from_env({}).retention_policy()
    assert policy.outbox == 7 * DAY
    assert policy.jobs == {
        Status.COMPLETED: 30 * DAY,
        Status.FAILED: 30 * DAY,
        Status.DEAD: 30 * DAY,
        Status.CANCELLED: 30 * DAY,
    }
    assert describe(policy) == "outbox 7d; jobs CANCELLED 30d, COMPLETED 30d, DEAD 30d, FAILED 30d"


@pytest.mark.parametrize(
    ("raw", "age"),
    [
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("12h", timedelta(hours=12)),
        ("30d", 30 * DAY),
        ("0", None),
        ("0d", None),
    ],
)
def test_ages(raw: str, age: timedelta | None) -> None:
    assert parse_duration("X", raw) == age


def test_per_status_overrides_and_keep_forever() -> None:
    settings = Settings.from_env(
        {"WFJOBS_JOB_RETENTION": "12h, COMPLETED=7d,dead=0", "WFJOBS_OUTBOX_RETENTION": "0"}
    )
    policy = settings.retention_policy()
    assert policy.outbox is None
    assert policy.jobs == {
        Status.COMPLETED: 7 * DAY,
        Status.FAILED: timedelta(hours=12),
        Status.DEAD: None,
        Status.CANCELLED: timedelta(hours=12),
    }
    only = Settings.from_env({"WFJOBS_JOB_RETENTION": "FAILED=1d"}).retention_policy()
    assert only.jobs == {
        Status.COMPLETED: 30 * DAY,
        Status.FAILED: DAY,
        Status.DEAD: 30 * DAY,
        Status.CANCELLED: 30 * DAY,
    }


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WFJOBS_OUTBOX_RETENTION": "7 days"}, "WFJOBS_OUTBOX_RETENTION must be an age like"),
        ({"WFJOBS_OUTBOX_RETENTION": "-1d"}, "WFJOBS_OUTBOX_RETENTION must be an age like"),
        ({"WFJOBS_JOB_RETENTION": "1.5d"}, "WFJOBS_JOB_RETENTION must be an age like"),
        ({"WFJOBS_OUTBOX_RETENTION": "36501d"}, "WFJOBS_OUTBOX_RETENTION must be at most 36500d"),
        ({"WFJOBS_JOB_RETENTION": "DEAD=99999999999999d"}, r"\(DEAD\) must be at most 36500d"),
        ({"WFJOBS_JOB_RETENTION": "QUEUED=1d"}, "WFJOBS_JOB_RETENTION: 'QUEUED' is not a terminal"),
        ({"WFJOBS_JOB_RETENTION": "DONE=1d"}, "WFJOBS_JOB_RETENTION: 'DONE' is not a terminal"),
        ({"WFJOBS_JOB_RETENTION": "DEAD=1d,DEAD=2d"}, "gives the age of DEAD jobs twice"),
        ({"WFJOBS_JOB_RETENTION": "1d,2d"}, "WFJOBS_JOB_RETENTION has more than one age"),
        ({"WFJOBS_JOB_RETENTION": "COMPLETED=soon"}, r"WFJOBS_JOB_RETENTION \(COMPLETED\) must"),
        ({"WFJOBS_RETENTION_BATCH": "0"}, "WFJOBS_RETENTION_BATCH must be positive"),
        ({"WFJOBS_RETENTION_INTERVAL_S": "0"}, "WFJOBS_RETENTION_INTERVAL_S must be positive"),
        ({"WFJOBS_RETENTION_PAUSE_S": "-1"}, "WFJOBS_RETENTION_PAUSE_S must not be negative"),
    ],
)
def test_a_bad_value_names_its_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)
