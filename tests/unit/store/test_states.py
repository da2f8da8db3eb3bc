"""The state machine as data: walk it, and hold the schema to it."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from schemas.contract import EventType, api_pb2
from schemas.errors import InvalidArgument
from store import control_sql, deadline_sql, outbox, run_sql
from store.states import (
    STATUSES,
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    Status,
    allowed,
    parse_status,
    sources_of,
    transition,
)

# The edges of DESIGN.md's diagram, written out independently of the table.
DESIGN_EDGES = {
    ("QUEUED", "RUNNING"),
    ("QUEUED", "DEAD"),
    ("RUNNING", "COMPLETED"),
    ("RUNNING", "FAILED"),
    ("RUNNING", "WAITING"),
    ("RUNNING", "QUEUED"),
    ("RUNNING", "DEAD"),
    ("WAITING", "QUEUED"),
    ("WAITING", "FAILED"),
    ("QUEUED", "CANCELLED"),
    ("QUEUED", "FAILED"),
    ("RUNNING", "CANCELLED"),
    ("WAITING", "CANCELLED"),
}


def test_the_table_is_the_design() -> None:
    edges = {
        (source.value, target.value)
        for source, targets in TRANSITIONS.items()
        for target in targets
    }
    assert edges == DESIGN_EDGES
    assert set(TRANSITIONS) == set(Status)
    assert {status.value for status in TERMINAL} == {"COMPLETED", "FAILED", "DEAD", "CANCELLED"}


def test_walk_every_status_is_reachable_and_every_path_ends() -> None:
    reachable = {Status.QUEUED}
    frontier = [Status.QUEUED]
    while frontier:
        for target in TRANSITIONS[frontier.pop()]:
            if target not in reachable:
                reachable.add(target)
                frontier.append(target)
    assert reachable == set(Status)

    for status in Status:
        if status in TERMINAL:
            assert TRANSITIONS[status] == frozenset(), f"{status} is terminal but has exits"
            continue
        # From every live status some path reaches a terminal one.
        seen, frontier = {status}, [status]
        while frontier:
            for target in TRANSITIONS[frontier.pop()]:
                if target not in seen:
                    seen.add(target)
                    frontier.append(target)
        assert seen & TERMINAL, f"{status} can never finish"


def test_transition_refuses_what_the_table_does_not_allow() -> None:
    for source in Status:
        for target in Status:
            if allowed(source, target):
                assert transition(source, target) == (source.value, target.value)
                assert source in sources_of(target)
            else:
                with pytest.raises(IllegalTransition, match=f"{source} -> {target}"):
                    transition(source, target)
                assert source not in sources_of(target)


def test_every_store_move_is_in_the_table() -> None:
    moves = [run_sql.CLAIM, run_sql.PARK, run_sql.COMPLETE, run_sql.FAIL, run_sql.RETRY]
    moves += [run_sql.GIVE_UP, run_sql.EXHAUSTED, run_sql.RESUME, run_sql.REJECT]
    moves += [control_sql.CANCEL_QUEUED, control_sql.CANCEL_WAITING, control_sql.CANCEL_RUNNING]
    moves += [deadline_sql.JOB_DEADLINE_QUEUED]
    assert set(moves) == DESIGN_EDGES


def test_parse_status_names_the_valid_ones() -> None:
    assert parse_status("WAITING") is Status.WAITING
    with pytest.raises(InvalidArgument) as refused:
        parse_status("waiting")
    assert refused.value.message == (
        "unknown status 'waiting'; valid statuses are "
        "QUEUED, RUNNING, WAITING, COMPLETED, FAILED, DEAD, CANCELLED"
    )


def _latest_check(pattern: str) -> str:
    """The list of the last migration that (re)defines a CHECK matching ``pattern``."""
    found = ""
    migrations = sorted(
        entry for entry in resources.files("migrations").iterdir() if entry.name.endswith(".sql")
    )
    for migration in migrations:
        for match in re.finditer(pattern, migration.read_text()):
            found = match.group(1)
    assert found, f"no migration defines {pattern}"
    return found


def test_the_schema_check_constraint_lists_exactly_the_statuses() -> None:
    listed = _latest_check(r"CHECK \(status IN \(([^)]*)\)\)")
    assert tuple(re.findall(r"'(\w+)'", listed)) == STATUSES


def test_the_job_view_enumerates_exactly_the_statuses() -> None:
    names = [value.name for value in api_pb2.Job.Status.DESCRIPTOR.values][1:]
    assert tuple(names) == STATUSES


def test_the_outbox_check_constraint_lists_exactly_the_event_types() -> None:
    listed = _latest_check(r"CHECK \(event_type IN \(([^)]*)\)\)")
    # Every type but TYPE_UNSPECIFIED, which is never written.
    published = [value.name.removeprefix("TYPE_") for value in EventType.DESCRIPTOR.values][1:]
    assert re.findall(r"'(\w+)'", listed) == published


@pytest.mark.parametrize(
    "module",
    [
        "runs",
        "run_sql",
        "records",
        "definitions",
        "migrate",
        "pool",
        "channels",
        "retention",
        "control",
        "control_sql",
    ],
)
def test_job_statuses_are_spelled_only_in_the_state_machine(module: str) -> None:
    # outbox.py is left out on purpose: its PENDING/PUBLISHED/FAILED are the
    # outbox row's own states, not a job's.
    source = resources.files("store").joinpath(f"{module}.py").read_text()
    names = "|".join(STATUSES)
    assert re.findall(rf"'({names})'", source) == []  # an SQL literal
    assert re.findall(rf"(?:==|!=|\bis)\s*\"({names})\"", source) == []  # a comparison


def test_time_is_compared_only_against_the_database_clock() -> None:
    statements = [
        value
        for module in (run_sql, outbox)
        for value in vars(module).values()
        if isinstance(value, str) and "workflow_run" in value
    ]
    statements += [run_sql.list_jobs_sql(by_status=True, by_name=True, after=True)]
    # A test may ask the sweep about a later instant instead of sleeping until
    # the database clock gets there; left out, the database clock decides.
    database_clock = ("now()", "coalesce(%(now)s::timestamptz, now())")
    compared = 0
    for sql in statements:
        for column, operator, other in re.findall(
            r"\b(run_after|lease_until|stall_at)\s*(<=|>=|<|>)\s*"
            r"(coalesce\(%\(now\)s::timestamptz, now\(\)\)|\S+)",
            sql,
        ):
            compared += 1
            assert other.startswith(database_clock), f"{column} {operator} {other} in {sql}"
    assert compared >= 2  # the claim and the sweeper
