"""The state machine as data: walk it, and hold the schema to it."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from schemas.errors import InvalidArgument
from store import runs
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
}


def test_the_table_is_the_design() -> None:
    edges = {
        (source.value, target.value)
        for source, targets in TRANSITIONS.items()
        for target in targets
    }
    assert edges == DESIGN_EDGES
    assert set(TRANSITIONS) == set(Status)
    assert {status.value for status in TERMINAL} == {"COMPLETED", "FAILED", "DEAD"}


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
    moves = [runs.CLAIM, runs.PARK, runs.COMPLETE, runs.FAIL, runs.RETRY, runs.GIVE_UP]
    moves += [runs.EXHAUSTED, runs.RESUME, runs.REJECT]
    assert set(moves) == DESIGN_EDGES


def test_parse_status_names_the_valid_ones() -> None:
    assert parse_status("WAITING") is Status.WAITING
    with pytest.raises(InvalidArgument) as refused:
        parse_status("waiting")
    assert refused.value.message == (
        "unknown status 'waiting'; valid statuses are "
        "QUEUED, RUNNING, WAITING, COMPLETED, FAILED, DEAD"
    )


def test_the_schema_check_constraint_lists_exactly_the_statuses() -> None:
    sql = resources.files("migrations").joinpath("0001_workflow_run.sql").read_text()
    match = re.search(r"CHECK \(status IN \(([^)]*)\)\)", sql)
    assert match is not None
    assert tuple(re.findall(r"'(\w+)'", match.group(1))) == STATUSES
