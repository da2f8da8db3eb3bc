"""Pure pieces of the store: page tokens, migration files, channels, entry checks."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from importlib import resources
from typing import get_args

import pytest

from schemas.contract import api_pb2
from schemas.errors import InvalidArgument
from store.channels import JOBS_QUEUED_CHANNEL, OUTBOX_CHANNEL
from store.dead_letters import parse_page_token
from store.definitions import validate_workflow_name
from store.migrate import load_migrations
from store.pool import (
    APPLICATION_NAME,
    DEFAULT_MAX_SIZE,
    DEFAULT_MIN_SIZE,
    DEFAULT_TIMEOUT_S,
    create_pool,
)
from store.records import StepOutcome
from store.run_sql import list_jobs_sql
from store.runs import decode_page_token, encode_page_token


def test_a_page_token_round_trips() -> None:
    created_at = datetime(2026, 3, 1, 12, 30, 0, 123456, tzinfo=UTC)
    job_id = uuid.uuid4()
    token = encode_page_token(created_at, job_id)
    assert decode_page_token(token) == (created_at, job_id)
    assert str(job_id) not in token  # opaque to callers


@pytest.mark.parametrize("token", ["", "%%%", "YWJj", "MjAyNi0wMS0wMXx4eXo="])
def test_a_malformed_page_token_is_refused(token: str) -> None:
    with pytest.raises(InvalidArgument, match="previous answer"):
        decode_page_token(token)


def test_a_page_token_with_anything_added_is_refused() -> None:
    token = encode_page_token(datetime(2026, 3, 1, tzinfo=UTC), uuid.uuid4())
    for changed in (token + " ", " " + token, token + "!", token[:4] + "\n" + token[4:]):
        with pytest.raises(InvalidArgument, match="previous answer"):
            decode_page_token(changed)


@pytest.mark.parametrize("token", [" 5", "5 ", "+5", "0x5", "9" * 20, str(2**63)])
def test_an_outbox_page_token_the_listing_never_gives_is_refused(token: str) -> None:
    with pytest.raises(InvalidArgument, match="previous answer"):
        parse_page_token(token)


def test_an_outbox_page_token_is_the_last_row_id() -> None:
    assert (parse_page_token(""), parse_page_token("7"), parse_page_token(str(2**63 - 1))) == (
        0,
        7,
        2**63 - 1,
    )


def test_migration_files_are_numbered_in_order_and_shipped() -> None:
    names = [migration.name for migration in load_migrations()]
    assert names == sorted(names)
    assert [name[:4] for name in names] == [f"{n:04d}" for n in range(1, len(names) + 1)]
    assert names[:3] == [
        "0001_workflow_run.sql",
        "0002_workflow_run_events_outbox.sql",
        "0003_workflow_definition.sql",
    ]


def test_the_notify_channels_are_the_ones_the_triggers_use() -> None:
    sql = "\n".join(migration.sql for migration in load_migrations())
    assert f"pg_notify('{JOBS_QUEUED_CHANNEL}'" in sql
    assert f"pg_notify('{OUTBOX_CHANNEL}'" in sql


def test_the_migrations_package_ships_its_sql() -> None:
    shipped = {entry.name for entry in resources.files("migrations").iterdir()}
    assert {migration.name for migration in load_migrations()} <= shipped


def test_list_sql_has_one_shape_per_filter() -> None:
    assert "WHERE" not in list_jobs_sql(by_status=False, by_name=False, after=False)
    both = list_jobs_sql(by_status=True, by_name=True, after=True)
    assert "status = %(status)s AND workflow_name = %(workflow_name)s AND (created_at" in both


@pytest.mark.parametrize("name", ["a", "embed-text", "v1.2_beta", "X" * 200])
def test_good_workflow_names(name: str) -> None:
    assert validate_workflow_name(name) == name


@pytest.mark.parametrize("name", ["", ".hidden", "a b", "a/b", "X" * 201, "naïve"])
def test_bad_workflow_names(name: str) -> None:
    with pytest.raises(InvalidArgument, match="malformed"):
        validate_workflow_name(name)


def test_a_pool_takes_its_options_and_defaults() -> None:
    pool = create_pool("postgresql://nowhere", min_size=1, max_size=3, timeout_s=4.0)
    assert (pool.min_size, pool.max_size, pool.timeout) == (1, 3, 4.0)
    assert pool.kwargs == {"autocommit": True, "application_name": APPLICATION_NAME}
    named = create_pool("postgresql://nowhere", application_name="wfjobs w1")
    assert (named.min_size, named.max_size, named.timeout) == (
        DEFAULT_MIN_SIZE,
        DEFAULT_MAX_SIZE,
        DEFAULT_TIMEOUT_S,
    )
    assert named.kwargs is not None and named.kwargs["application_name"] == "wfjobs w1"
    for sizes in ({"min_size": 3, "max_size": 2}, {"max_size": 0}, {"min_size": -1}):
        with pytest.raises(ValueError, match="0 <= min <= max"):
            create_pool("postgresql://nowhere", **sizes)  # type: ignore[arg-type]


def test_complete_step_outcomes_are_the_contracts() -> None:
    outcomes = [value.name for value in api_pb2.CompleteStepResponse.Outcome.DESCRIPTOR.values]
    assert ["OUTCOME_UNSPECIFIED", *get_args(StepOutcome)] == outcomes
