"""The statements of the sweeper's deadline pass: whole-job deadlines and step timeouts.

Both are judged against the database's clock (or an instant the caller names,
so tests judge rows at a later time instead of waiting for it). Each pass first
locks the rows it will settle (``SKIP LOCKED``, so sweepers never settle a job
twice), the caller builds their events, and one data-modifying CTE then
changes the rows, inserts their events and, for a job a worker held, the
history row of the attempt the deadline ended. A row that moved in between
(its status is not the one it was locked in) changes nothing and gets no event.
"""

from __future__ import annotations

from store.history_sql import ENDED_COLUMNS, ErrorClass, Outcome, attempt_insert
from store.run_sql import WAITING_ONLY
from store.states import Status, transition

# Every move of the deadline pass, checked against the state machine at import.
# A whole-job deadline fails the job wherever it is; a step timeout fails it or
# takes the step's fallback, which requeues it as an accepted completion does.
JOB_DEADLINE_QUEUED = transition(Status.QUEUED, Status.FAILED)
JOB_DEADLINE_RUNNING = transition(Status.RUNNING, Status.FAILED)
JOB_DEADLINE_WAITING = transition(Status.WAITING, Status.FAILED)
STEP_TIMEOUT = transition(Status.WAITING, Status.FAILED)
STEP_FALLBACK = transition(Status.WAITING, Status.QUEUED)

_LIVE = ", ".join(
    f"'{source}'" for source, _ in (JOB_DEADLINE_QUEUED, JOB_DEADLINE_RUNNING, JOB_DEADLINE_WAITING)
)
_WAITING = f"'{STEP_TIMEOUT[0]}'"
_NOW = "coalesce(%(now)s::timestamptz, now())"

# Served by workflow_run_deadline_idx (partial on live rows with a deadline).
SELECT_JOB_DEADLINES_SQL = f"""
SELECT job_id, workflow_name, status, attempt, deadline_at, outstanding_step
  FROM workflow_run
 WHERE deadline_at IS NOT NULL AND deadline_at <= {_NOW} AND status IN ({_LIVE})
 ORDER BY deadline_at
 LIMIT %(limit)s
 FOR UPDATE SKIP LOCKED
"""

# Served by workflow_run_step_deadline_idx. The snapshot's hash comes along: a
# step may declare a fallback, and only the snapshot says so. The caller reads
# each snapshot once (``store.run_sql.SELECT_SNAPSHOTS_SQL``), however many of
# the rows name it.
SELECT_STEP_DEADLINES_SQL = f"""
SELECT r.job_id, r.workflow_name, r.attempt, r.step_deadline_at, r.outstanding_step,
       r.definition_hash
  FROM workflow_run AS r
 WHERE r.status = {_WAITING} AND r.step_deadline_at IS NOT NULL
   AND r.step_deadline_at <= {_NOW}
 ORDER BY r.step_deadline_at
 LIMIT %(limit)s
 FOR UPDATE OF r SKIP LOCKED
"""

# FAILED with the error, for rows still in the status they were locked in. A
# RUNNING row's worker finds its lease gone at its next fenced write; its
# attempt ends here, in the history, as DEADLINE_PASSED.
DEADLINE_FAIL_SQL = f"""
WITH passed AS (
    SELECT * FROM unnest(%(job_ids)s::uuid[], %(was)s::text[], %(errors)s::text[],
                         %(payloads)s::bytea[])
        AS passed(job_id, was, error, payload)
), changed AS (
    UPDATE workflow_run AS r
       SET status = '{Status.FAILED.value}', error = passed.error, verdict = NULL,
           {WAITING_ONLY}, lease_until = NULL, updated_at = now()
      FROM passed
     WHERE r.job_id = passed.job_id AND r.status = passed.was AND r.status IN ({_LIVE})
    RETURNING {", ".join(f"r.{column}" for column in ENDED_COLUMNS.split(", "))},
              r.lease_owner, r.error, passed.was
), ended AS (
    {
    attempt_insert(
        "changed",
        Outcome.DEADLINE_PASSED,
        worker="changed.lease_owner",
        error="changed.error",
        error_class=f"'{ErrorClass.DEADLINE.value}'",
        where=f"changed.was = '{JOB_DEADLINE_RUNNING[0]}'",
    )
}
)
INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)
SELECT passed.job_id, %(event_type)s, passed.payload FROM passed JOIN changed USING (job_id)
"""

# The fallback as the step's response: checkpointed, and the job queued to
# resume with the parked attempt given back, as an accepted completion does.
STEP_FALLBACK_SQL = f"""
WITH taken AS (
    SELECT * FROM unnest(%(job_ids)s::uuid[], %(entries)s::text[], %(payloads)s::bytea[])
        AS taken(job_id, entry, payload)
), changed AS (
    UPDATE workflow_run AS r
       SET status = '{STEP_FALLBACK[1]}',
           checkpoints = r.checkpoints || jsonb_build_array(taken.entry::jsonb),
           outstanding_step = NULL, {WAITING_ONLY}, run_after = now(),
           attempt = greatest(r.attempt - 1, 0),
           lease_owner = NULL, lease_until = NULL, updated_at = now()
      FROM taken
     WHERE r.job_id = taken.job_id AND r.status = '{STEP_FALLBACK[0]}'
    RETURNING r.job_id
)
INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)
SELECT taken.job_id, %(event_type)s, taken.payload FROM taken JOIN changed USING (job_id)
"""

__all__ = [
    "DEADLINE_FAIL_SQL",
    "JOB_DEADLINE_QUEUED",
    "JOB_DEADLINE_RUNNING",
    "JOB_DEADLINE_WAITING",
    "SELECT_JOB_DEADLINES_SQL",
    "SELECT_STEP_DEADLINES_SQL",
    "STEP_FALLBACK",
    "STEP_FALLBACK_SQL",
    "STEP_TIMEOUT",
]
