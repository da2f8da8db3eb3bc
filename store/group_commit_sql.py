"""The group commit's statement: many runners' commit points in one statement.

Each kind of commit point (checkpoint, complete, park, fail, retry-or-die)
reads its rows from arrays (``unnest``) and changes ``workflow_run`` in its own
data-modifying CTE, fenced row by row exactly as ``store.run_sql._FENCE``
fences one: a row whose lease is gone, or whose job an operator asked to
cancel, matches nothing and is simply absent from that CTE's output. Every
event is inserted by one INSERT fed only by those outputs, so a row change
never goes without its event nor an event without its row change; the
attempt history is appended the same way (``attempt_insert``).

A batch holds at most one commit point per job, so no row is changed twice by
one statement. A complete may carry the segment's last checkpoint: the entry
is appended by the same UPDATE, and its STEP_CHECKPOINT event is inserted
before the COMPLETED one (the INSERT takes its rows ordered by job and then
by ``seq``, and the outbox ids follow that order, which the relay keeps).

The statement names only the kinds a batch holds; the texts are built once
per combination, so the driver prepares each after a few uses.
"""

from __future__ import annotations

from enum import StrEnum
from functools import cache

from store.history_sql import Outcome, attempt_insert
from store.run_sql import (
    COMPLETE,
    FAIL,
    OUT_OF_TIME,
    PARK,
    RETRY,
    retry_ends,
    retry_event,
    retry_status,
    status_literal,
)
from store.states import Status


class Kind(StrEnum):
    """A commit point a group commit can carry."""

    CHECKPOINT = "checkpoint"
    COMPLETE = "complete"
    PARK = "park"
    FAIL = "fail"
    RETRY_OR_DIE = "retry_or_die"


# Every kind's input starts with the lease it is fenced on.
_FENCE_INPUTS = (("job_id", "uuid"), ("worker_id", "text"), ("attempt", "int"), ("token", "bigint"))

# Each kind's further inputs, in order: (name, SQL type).
INPUTS: dict[Kind, tuple[tuple[str, str], ...]] = {
    Kind.CHECKPOINT: (("entry", "jsonb"), ("payload", "bytea")),
    Kind.COMPLETE: (
        ("entry", "jsonb"),
        ("entry_payload", "bytea"),
        ("result", "jsonb"),
        ("verdict", "text"),
        ("payload", "bytea"),
    ),
    Kind.PARK: (
        ("step_name", "text"),
        ("review_request", "jsonb"),
        ("timeout_ms", "bigint"),
        ("payload", "bytea"),
    ),
    Kind.FAIL: (
        ("verdict", "text"),
        ("error", "text"),
        ("error_class", "text"),
        ("payload", "bytea"),
    ),
    Kind.RETRY_OR_DIE: (
        ("next_run_at", "timestamptz"),
        ("error", "text"),
        ("late_error", "text"),
        ("error_class", "text"),
        ("payload", "bytea"),
        ("late_payload", "bytea"),
        ("retry_payload", "bytea"),
    ),
}


def param_name(kind: Kind, column: str) -> str:
    """The statement parameter holding ``column``'s array for ``kind``."""
    return f"{kind.value}_{column}"


def column_types(kind: Kind) -> tuple[tuple[str, str], ...]:
    """Every column a ``kind`` row carries, fence first, with its SQL type."""
    return (*_FENCE_INPUTS, *INPUTS[kind])


def _input_cte(kind: Kind, *, single: bool) -> str:
    given = (*_FENCE_INPUTS, *INPUTS[kind])
    if single:
        values = ", ".join(
            f"%({param_name(kind, name)})s::{sql_type} AS {name}" for name, sql_type in given
        )
        return f"{kind.value}_in AS (SELECT {values})"
    # Binary parameters: psycopg's text form escapes every array element with a
    # regular expression, which cost more client CPU than the rest of the flush.
    arrays = ", ".join(f"%({param_name(kind, name)})b::{sql_type}[]" for name, sql_type in given)
    names = ", ".join(name for name, _ in given)
    return f"{kind.value}_in AS (SELECT * FROM unnest({arrays}) AS i({names}))"


# ``store.run_sql._FENCE``, row by row: ``r`` is the job row, ``i`` its input.
_ROW_FENCE = (
    f"r.job_id = i.job_id AND r.status = {status_literal(Status.RUNNING)}"
    " AND r.lease_owner = i.worker_id AND r.attempt = i.attempt AND r.lease_token = i.token"
    " AND r.cancel_requested_at IS NULL"
)
# What an attempt's ending returns for ``attempt_insert``, plus who held it.
_ENDED = (
    "r.job_id, r.attempt, r.claimed_at, r.checkpoints, r.claimed_checkpoints, i.worker_id AS worker"
)

# ``store.run_sql.RETRY_OR_DIE_SQL``'s decision, on the row ``r`` and its input ``i``.
_RETRY_STATUS = retry_status("r.", "i.next_run_at")
_REQUEUED = f"({_RETRY_STATUS}) = {status_literal(RETRY[1])}"
_OUT_OF_TIME_NOW = f"({_RETRY_STATUS}) = {status_literal(OUT_OF_TIME[1])}"

_CHANGES: dict[Kind, str] = {
    Kind.CHECKPOINT: f"""checkpointed AS (
    UPDATE workflow_run AS r
       SET checkpoints = r.checkpoints || jsonb_build_array(i.entry), updated_at = now()
      FROM checkpoint_in AS i
     WHERE {_ROW_FENCE}
    RETURNING r.job_id, i.payload
)""",
    Kind.COMPLETE: f"""completed AS (
    UPDATE workflow_run AS r
       SET status = {status_literal(COMPLETE[1])},
           checkpoints = CASE WHEN i.entry IS NULL THEN r.checkpoints
                              ELSE r.checkpoints || jsonb_build_array(i.entry) END,
           result = i.result, verdict = i.verdict,
           error = NULL, outstanding_step = NULL, lease_until = NULL, updated_at = now()
      FROM complete_in AS i
     WHERE {_ROW_FENCE}
    RETURNING {_ENDED}, i.entry_payload, i.payload
), completed_ends AS (
    {attempt_insert("completed", Outcome.COMPLETED, worker="completed.worker")}
)""",
    Kind.PARK: f"""parked AS (
    UPDATE workflow_run AS r
       SET status = {status_literal(PARK[1])}, outstanding_step = i.step_name,
           lease_until = NULL, review_request = i.review_request,
           step_deadline_at = now() + i.timeout_ms * interval '1 millisecond',
           updated_at = now()
      FROM park_in AS i
     WHERE {_ROW_FENCE}
    RETURNING {_ENDED}, i.payload
), parked_ends AS (
    {attempt_insert("parked", Outcome.PARKED, worker="parked.worker")}
)""",
    Kind.FAIL: f"""failed AS (
    UPDATE workflow_run AS r
       SET status = {status_literal(FAIL[1])}, verdict = i.verdict, error = i.error,
           lease_until = NULL, updated_at = now()
      FROM fail_in AS i
     WHERE {_ROW_FENCE}
    RETURNING {_ENDED}, i.error, i.error_class, i.payload
), failed_ends AS (
    {
        attempt_insert(
            "failed",
            Outcome.FAILED,
            worker="failed.worker",
            error="failed.error",
            error_class="failed.error_class",
        )
    }
)""",
    # As ``RETRY_OR_DIE_SQL``: the row's own counters and deadline decide
    # QUEUED, DEAD or FAILED.
    Kind.RETRY_OR_DIE: f"""retried AS (
    UPDATE workflow_run AS r
       SET status = {_RETRY_STATUS},
           run_after = CASE WHEN {_REQUEUED} THEN i.next_run_at ELSE r.run_after END,
           lease_owner = CASE WHEN {_REQUEUED} THEN NULL ELSE r.lease_owner END,
           lease_until = NULL,
           error = CASE WHEN {_OUT_OF_TIME_NOW} THEN i.late_error ELSE i.error END,
           updated_at = now()
      FROM retry_or_die_in AS i
     WHERE {_ROW_FENCE}
    RETURNING {_ENDED}, r.status, r.max_attempts, r.run_after, i.error, i.late_error,
              i.error_class, i.payload, i.late_payload, i.retry_payload
), retried_ends AS (
    {
        retry_ends(
            "retried",
            worker="retried.worker",
            error="retried.error",
            late_error="retried.late_error",
            error_class="retried.error_class",
        )
    }
)""",
}

_RETRY_EVENT_TYPE = retry_event(
    "status", dead="%(dead_type)s", late="%(fail_type)s", retry="%(retry_type)s"
)
_RETRY_PAYLOAD = retry_event("status", dead="payload", late="late_payload", retry="retry_payload")

# Each kind's events, as (job_id, seq, event_type, payload) rows; the types
# are statement parameters named by ``event_type_param``.
_EVENTS: dict[Kind, tuple[str, ...]] = {
    Kind.CHECKPOINT: (
        "SELECT job_id, 0 AS seq, %(checkpoint_type)s::text AS event_type, payload"
        " FROM checkpointed",
    ),
    Kind.COMPLETE: (
        "SELECT job_id, 0, %(checkpoint_type)s::text, entry_payload FROM completed"
        " WHERE entry_payload IS NOT NULL",
        "SELECT job_id, 1, %(complete_type)s::text, payload FROM completed",
    ),
    Kind.PARK: ("SELECT job_id, 0, %(park_type)s::text, payload FROM parked",),
    Kind.FAIL: ("SELECT job_id, 0, %(fail_type)s::text, payload FROM failed",),
    Kind.RETRY_OR_DIE: (
        f"SELECT job_id, 0, {_RETRY_EVENT_TYPE}::text, {_RETRY_PAYLOAD} FROM retried",
    ),
}

# What the statement answers per changed row: (job_id, status, attempt,
# max_attempts, run_after); only a retry-or-die fills the last four.
_ANSWERS: dict[Kind, str] = {
    Kind.CHECKPOINT: "SELECT job_id, NULL::text, NULL::int, NULL::int, NULL::timestamptz"
    " FROM checkpointed",
    Kind.COMPLETE: "SELECT job_id, NULL, NULL, NULL, NULL FROM completed",
    Kind.PARK: "SELECT job_id, NULL, NULL, NULL, NULL FROM parked",
    Kind.FAIL: "SELECT job_id, NULL, NULL, NULL, NULL FROM failed",
    Kind.RETRY_OR_DIE: "SELECT job_id, status, attempt, max_attempts, run_after FROM retried",
}

# The event types each kind's events name, as statement parameters.
EVENT_TYPE_PARAMS: dict[Kind, tuple[str, ...]] = {
    Kind.CHECKPOINT: ("checkpoint_type",),
    Kind.COMPLETE: ("checkpoint_type", "complete_type"),
    Kind.PARK: ("park_type",),
    Kind.FAIL: ("fail_type",),
    Kind.RETRY_OR_DIE: ("dead_type", "fail_type", "retry_type"),
}


@cache
def group_commit_sql(kinds: frozenset[Kind], *, single: bool = False) -> str:
    """The one statement that writes a batch holding commit points of ``kinds``.

    ``single``: the batch is one commit point, passed as plain values rather
    than arrays (``param_name`` names both). The planner then knows it writes
    one row; a lone commit point (every one, at a low rate) costs about 0.6
    instead of 1.0 ms through the arrays (``benchmarks.round_trips``).
    """
    if not kinds:
        raise ValueError("a group commit writes at least one kind of commit point")
    if single and len(kinds) != 1:
        raise ValueError("a single commit point is of one kind")
    ordered = [kind for kind in Kind if kind in kinds]
    ctes = [_input_cte(kind, single=single) for kind in ordered]
    ctes += [_CHANGES[kind] for kind in ordered]
    events = "\n    UNION ALL\n    ".join(part for kind in ordered for part in _EVENTS[kind])
    answers = "\nUNION ALL\n".join(_ANSWERS[kind] for kind in ordered)
    return f"""
WITH {", ".join(ctes)}, events AS (
    INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)
    SELECT e.job_id, e.event_type, e.payload FROM (
    {events}
    ) AS e(job_id, seq, event_type, payload)
     ORDER BY e.job_id, e.seq
)
{answers}
"""


__all__ = [
    "EVENT_TYPE_PARAMS",
    "INPUTS",
    "Kind",
    "column_types",
    "group_commit_sql",
    "param_name",
]
