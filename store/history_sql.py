"""The statements of a job's attempt history, and the piece every ending shares.

An attempt's row is appended by the statement that ends the attempt, as one
more data-modifying CTE of that statement (``attempt_insert``), so the history
can never miss an ending or record one that did not happen: when the row does
not match, nothing is appended.

Outcomes and error classes are the ``workflow_run_attempt`` CHECK list and the
``Attempt`` message's vocabulary; both are inlined as literals here.
"""

from __future__ import annotations

from enum import StrEnum

from store.states import Status


class Outcome(StrEnum):
    """How an attempt ended (``workflow_run_attempt.outcome``, ``Attempt.Outcome``)."""

    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    PARKED = "PARKED"
    RETRY_SCHEDULED = "RETRY_SCHEDULED"
    DEAD = "DEAD"
    SWEPT = "SWEPT"
    HANDED_BACK = "HANDED_BACK"
    CANCELLED = "CANCELLED"
    DEADLINE_PASSED = "DEADLINE_PASSED"


class ErrorClass(StrEnum):
    """Why an attempt's error happened, as an operator acts on it."""

    # A step failed in a way worth trying again (UNAVAILABLE, a timeout...).
    RETRYABLE = "retryable"
    # A mapping, gate or definition defect: trying again fails the same way.
    NON_RETRYABLE = "non-retryable"
    # The step's response failed its validate rules.
    VERDICT = "verdict"
    # The worker stopped renewing its lease (it died, hung or was cut off).
    LEASE = "lease"
    # The worker renewed, but its segment made no progress past its deadline.
    STALL = "stall"
    DEADLINE = "deadline"
    CANCEL = "cancel"


def _lit(value: str) -> str:
    return f"'{value}'"


def steps_since_claim(table: str) -> str:
    """The names of the checkpoints ``table``'s row gained since its claim, in order.

    The claim records how many checkpoints the row held (``claimed_checkpoints``);
    every later entry was written by the attempt that claim started.
    """
    return (
        "ARRAY(SELECT c.entry->>'name'"
        f" FROM jsonb_array_elements({table}.checkpoints) WITH ORDINALITY AS c(entry, n)"
        f" WHERE c.n > coalesce({table}.claimed_checkpoints, 0) ORDER BY c.n)"
    )


# What a CTE that ends an attempt must return for ``attempt_insert`` to read.
ENDED_COLUMNS = "job_id, attempt, claimed_at, checkpoints, claimed_checkpoints"


def attempt_insert(
    source: str,
    outcome: Outcome | str,
    *,
    worker: str,
    error: str = "NULL",
    error_class: str = "NULL",
    next_run_at: str = "NULL",
    where: str = "",
) -> str:
    """An INSERT of one history row per row of ``source``, for use as a CTE body.

    ``source`` names a CTE that returned ``ENDED_COLUMNS`` of the rows whose
    attempt ends. ``outcome`` is an ``Outcome`` (inlined) or an SQL expression
    over ``source``; ``worker``, ``error``, ``error_class`` and ``next_run_at``
    are SQL expressions (parameters, columns of ``source``, literals), and
    ``where`` an optional condition on ``source``'s rows.
    """
    outcome_sql = _lit(outcome.value) if isinstance(outcome, Outcome) else outcome
    condition = f" WHERE {where}" if where else ""
    return (
        "INSERT INTO workflow_run_attempt"
        " (job_id, attempt, worker, claimed_at, outcome, steps, error, error_class, next_run_at)"
        f" SELECT {source}.job_id, {source}.attempt, {worker}, {source}.claimed_at, {outcome_sql},"
        f" {steps_since_claim(source)}, {error}, {error_class}, {next_run_at}"
        f" FROM {source}{condition}"
    )


def error_class_literal(error_class: ErrorClass) -> str:
    """``error_class`` as an SQL literal, for statements that know it up front."""
    return _lit(error_class.value)


# The first statement of a transaction whose reads must all see one moment.
ONE_SNAPSHOT_SQL = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"

# One job's history, oldest first.
SELECT_ATTEMPTS_SQL = """
SELECT attempt, worker, claimed_at, ended_at, outcome, steps, error, error_class, next_run_at
  FROM workflow_run_attempt
 WHERE job_id = %(job_id)s
 ORDER BY id
"""

# The outbox state of one job's events, by status, with the oldest unsent
# one's time and the last delivery error.
SELECT_OUTBOX_STATE_SQL = """
SELECT count(*) FILTER (WHERE status = 'PENDING'),
       count(*) FILTER (WHERE status = 'FAILED'),
       count(*) FILTER (WHERE status = 'PUBLISHED'),
       min(created_at) FILTER (WHERE status <> 'PUBLISHED'),
       (SELECT o.last_error FROM workflow_run_events_outbox AS o
         WHERE o.job_id = %(job_id)s AND o.status <> 'PUBLISHED' AND o.last_error IS NOT NULL
         ORDER BY o.id LIMIT 1)
  FROM workflow_run_events_outbox
 WHERE job_id = %(job_id)s
"""

# Where a QUEUED job stands: the database's clock, and how many claimable jobs
# a claim takes before it (claim order), counted no further than ``limit``.
SELECT_QUEUE_POSITION_SQL = f"""
SELECT now(), (
    SELECT count(*) FROM (
        SELECT 1 FROM workflow_run
         WHERE status = '{Status.QUEUED.value}' AND run_after <= now() AND attempt < max_attempts
           AND (deadline_at IS NULL OR deadline_at > now())
           AND (run_after, created_at) < (%(run_after)s, %(created_at)s)
         LIMIT %(limit)s
    ) AS ahead
)
"""

__all__ = [
    "ENDED_COLUMNS",
    "ONE_SNAPSHOT_SQL",
    "SELECT_ATTEMPTS_SQL",
    "SELECT_OUTBOX_STATE_SQL",
    "SELECT_QUEUE_POSITION_SQL",
    "ErrorClass",
    "Outcome",
    "attempt_insert",
    "error_class_literal",
    "steps_since_claim",
]
