"""The statements of the operator verbs that act on a job's life, each a named constant.

Sections, one per verb: cancel (below) and resume. Status literals come from
the state machine through the transitions named here, so a move the machine
does not allow fails at import; the ``Job`` columns come from ``store.run_sql``.
As everywhere, a statement that changes a job inserts its event in the same
statement, and nothing when the row did not match.
"""

from __future__ import annotations

from store.history_sql import ErrorClass, Outcome, attempt_insert, error_class_literal
from store.run_sql import (
    LEASE_FENCE,
    PLAIN_COLUMNS,
    SNAPSHOT_LOCK_CLASS,
    WAITING_ONLY,
    job_columns,
    status_literal,
)
from store.states import Status, transition

# =========================================================================== cancel

CANCEL_QUEUED = transition(Status.QUEUED, Status.CANCELLED)
CANCEL_WAITING = transition(Status.WAITING, Status.CANCELLED)
CANCEL_RUNNING = transition(Status.RUNNING, Status.CANCELLED)

# The statuses a cancel acts on: cancelled at once, or asked of the worker.
_AT_ONCE = f"{status_literal(CANCEL_QUEUED[0])}, {status_literal(CANCEL_WAITING[0])}"
_LIVE = f"{_AT_ONCE}, {status_literal(CANCEL_RUNNING[0])}"

# What a cancel answers with is the job as the API shows it, which holds no
# definition: a bulk cancel changes 500 rows a statement, and reading each
# one's snapshot back would ship that many copies of it.
_NO_DEFINITION = "NULL::jsonb"

# A QUEUED or WAITING job has no worker: it is CANCELLED here, with its event.
# The caller holds the rows' locks (it read their status to build the events),
# so the status condition only guards a caller's mistake. Everything else the
# row says (the step it was parked on, its checkpoints) stays as evidence, but
# the review request and step deadline (``WAITING_ONLY``) no longer apply.
CANCEL_NOW_SQL = f"""
WITH asked AS (
    SELECT * FROM unnest(%(job_ids)s::uuid[], %(payloads)s::bytea[]) AS asked(job_id, payload)
), changed AS (
    UPDATE workflow_run AS r
       SET status = {status_literal(CANCEL_QUEUED[1])}, cancel_requested_at = now(),
           cancel_reason = %(reason)s, {WAITING_ONLY}, updated_at = now()
      FROM asked
     WHERE r.job_id = asked.job_id AND r.status IN ({_AT_ONCE})
    RETURNING {job_columns("r", definition=_NO_DEFINITION)}
), event AS (
    INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)
    SELECT asked.job_id, %(event_type)s, asked.payload FROM asked JOIN changed USING (job_id)
)
SELECT {PLAIN_COLUMNS} FROM changed
"""

# A RUNNING job is its worker's: the request is recorded, the worker reads it
# on its next renewal, stops the segment and settles CANCELLED. The first
# request's time and reason stand. ``updated_at`` is left alone: on a RUNNING
# row it is when its worker was last heard from, which the request is not.
REQUEST_CANCEL_SQL = f"""
UPDATE workflow_run AS r
   SET cancel_requested_at = now(), cancel_reason = %(reason)s
 WHERE r.job_id = ANY(%(job_ids)s::uuid[]) AND r.status = {status_literal(CANCEL_RUNNING[0])}
   AND r.cancel_requested_at IS NULL
RETURNING {job_columns("r", definition=_NO_DEFINITION)}
"""

# What the worker's settle reads under the row lock: the row must still be
# its own (the lease, without the cancel condition of the other fenced
# writes) and asked to cancel.
LOCK_CANCEL_REQUESTED_SQL = f"""
SELECT workflow_name, cancel_reason FROM workflow_run
 WHERE {LEASE_FENCE} AND cancel_requested_at IS NOT NULL
   FOR UPDATE
"""

_CANCELLED_ERROR = "'cancelled by an operator' || coalesce(': ' || changed.cancel_reason, '')"
_ENDED = "job_id, attempt, claimed_at, checkpoints, claimed_checkpoints, lease_owner, cancel_reason"


def _settle_running(where: str, source: str) -> str:
    """RUNNING -> CANCELLED for the rows of ``source`` matching ``where``: the
    attempt's history row (outcome CANCELLED) and the event go with it."""
    return f"""
WITH {source}, changed AS (
    UPDATE workflow_run AS r
       SET status = {status_literal(CANCEL_RUNNING[1])}, lease_until = NULL, updated_at = now()
      FROM asked
     WHERE {where}
    RETURNING {", ".join(f"r.{column}" for column in _ENDED.split(", "))}
), ended AS (
    {
        attempt_insert(
            "changed",
            Outcome.CANCELLED,
            worker="changed.lease_owner",
            error=_CANCELLED_ERROR,
            error_class=error_class_literal(ErrorClass.CANCEL),
        )
    }
)
INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)
SELECT asked.job_id, %(event_type)s, asked.payload FROM asked JOIN changed USING (job_id)
RETURNING job_id
"""


# The worker's settle, fenced on its lease, after ``LOCK_CANCEL_REQUESTED_SQL``.
SETTLE_CANCELLED_SQL = _settle_running(
    "r.job_id = asked.job_id AND "
    + LEASE_FENCE.replace("job_id =", "r.job_id =", 1)
    + " AND r.cancel_requested_at IS NOT NULL",
    "asked AS (SELECT %(job_id)s::uuid AS job_id, %(payload)s::bytea AS payload)",
)

# The sweeper's clock: the database's, unless the caller names the instant.
_SWEEP_NOW = "coalesce(%(now)s::timestamptz, now())"

# RUNNING rows asked to cancel whose worker let the lease pass (it died, or
# could not reach the store): nobody else will settle them.
SELECT_CANCEL_ABANDONED_SQL = f"""
SELECT job_id, workflow_name, attempt, cancel_reason FROM workflow_run
 WHERE status = {status_literal(CANCEL_RUNNING[0])} AND cancel_requested_at IS NOT NULL
   AND lease_until < {_SWEEP_NOW}
 ORDER BY lease_until
 LIMIT %(limit)s
 FOR UPDATE SKIP LOCKED
"""

SWEEP_CANCELLED_SQL = _settle_running(
    f"r.job_id = asked.job_id AND r.status = {status_literal(CANCEL_RUNNING[0])}"
    " AND r.cancel_requested_at IS NOT NULL",
    "asked AS (SELECT * FROM unnest(%(job_ids)s::uuid[], %(payloads)s::bytea[])"
    " AS asked(job_id, payload))",
)


def cancel_candidates_sql(*, by_status: bool, by_name: bool, by_owner: bool, before: bool) -> str:
    """A bulk cancel's next batch: live jobs not yet asked to cancel, oldest first.

    Locked (waiting for a claim or a complete-step that holds one, which takes
    milliseconds), so each row's status is read as it will be changed.
    """
    conditions = [f"status IN ({_LIVE})", "cancel_requested_at IS NULL"]
    if by_status:
        conditions.append("status = %(status)s")
    if by_name:
        conditions.append("workflow_name = %(workflow_name)s")
    if by_owner:
        conditions.append("owner = %(owner)s")
    if before:
        conditions.append("created_at < %(created_before)s")
    return (
        "SELECT job_id, workflow_name, status, attempt FROM workflow_run"
        f" WHERE {' AND '.join(conditions)}"
        " ORDER BY created_at, job_id LIMIT %(limit)s FOR UPDATE"
    )


# =========================================================================== resume

# A resume reads the original under its row lock first: a second resume of the
# same job (the same request key or another) waits here, then finds the link
# the first one wrote.
LOCK_RESUMABLE_SQL = """
SELECT status, resumed_by, cancel_requested_at FROM workflow_run
 WHERE job_id = %(original_id)s FOR UPDATE
"""

# The new run, its link on the original and both events, in one statement. The
# run starts from nothing but the original's input and the first ``keep`` of its
# checkpoints (copied server-side, never shipped back and forth), at attempt 0.
# It names the original's snapshot by its hash, or a new definition, stored
# once per hash under the submit's share of the snapshot lock (see
# ``store.submit_batch_sql.SUBMIT_BATCH_SQL``). The original keeps every column but
# ``resumed_by``, ``updated_at`` included: retention still ages it from the
# moment it ended. Its RESUMED event follows its earlier events (outbox ids only
# grow). The new row's definition is not read back: a snapshot this statement
# inserts is not visible to it, and the caller has it anyway.
RESUME_SQL = f"""
WITH snapshot_lock AS (
    SELECT pg_advisory_xact_lock_shared({SNAPSHOT_LOCK_CLASS}, hashtext(%(definition_hash)s))
), snapshot AS (
    INSERT INTO workflow_definition_snapshot (hash, definition)
    SELECT %(definition_hash)s, %(definition)s::jsonb FROM snapshot_lock
     WHERE %(definition)s::jsonb IS NOT NULL
    ON CONFLICT (hash) DO NOTHING
), inserted AS (
    INSERT INTO workflow_run (job_id, workflow_name, definition_hash, input, status, attempt,
                              max_attempts, run_after, owner, deadline_at, checkpoints,
                              resumed_from, traceparent, tracestate)
    SELECT %(job_id)s, o.workflow_name, %(definition_hash)s, o.input,
           {status_literal(Status.QUEUED)}, 0,
           coalesce(%(max_attempts)s, o.max_attempts), now(), %(owner)s,
           now() + %(deadline_ms)s::bigint * interval '1 millisecond',
           coalesce((SELECT jsonb_agg(kept.entry ORDER BY kept.position)
                       FROM jsonb_array_elements(o.checkpoints)
                            WITH ORDINALITY AS kept(entry, position)
                      WHERE kept.position <= %(keep)s), '[]'::jsonb),
           o.job_id,
           -- A resumed run goes on with the original's story: the same trace.
           o.traceparent, o.tracestate
      FROM workflow_run AS o, snapshot_lock
     WHERE o.job_id = %(original_id)s
    ON CONFLICT (job_id) DO NOTHING
    RETURNING {job_columns("workflow_run", definition="NULL::jsonb")}
), linked AS (
    UPDATE workflow_run AS o
       SET resumed_by = inserted.job_id
      FROM inserted
     WHERE o.job_id = inserted.resumed_from
), events AS (
    INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)
    SELECT job_id, 'ACCEPTED', %(accepted_payload)s FROM inserted
    UNION ALL
    SELECT resumed_from, 'RESUMED', %(resumed_payload)s FROM inserted
)
SELECT {PLAIN_COLUMNS} FROM inserted
"""


def resumable_jobs_sql(
    *,
    by_name: bool,
    by_owner: bool,
    before: bool,
    with_snapshot: bool = False,
    with_stored_definition: bool = False,
) -> str:
    """Bulk resume's candidates: ended jobs nothing resumes yet, oldest first;
    ``with_snapshot``: only those with a definition snapshot to run again;
    ``with_stored_definition``: only those whose workflow has a stored definition."""
    conditions = ["status = ANY(%(statuses)s)", "resumed_by IS NULL"]
    if with_snapshot:
        # A job refused at submit names no snapshot (its hash is empty).
        conditions.append("definition_hash <> ''")
    if with_stored_definition:
        conditions.append(
            "EXISTS (SELECT 1 FROM workflow_definition AS d"
            " WHERE d.name = workflow_run.workflow_name)"
        )
    if by_name:
        conditions.append("workflow_name = %(workflow_name)s")
    if by_owner:
        conditions.append("owner = %(owner)s")
    if before:
        conditions.append("created_at < %(created_before)s")
    return (
        f"SELECT job_id FROM workflow_run WHERE {' AND '.join(conditions)}"
        " ORDER BY created_at, job_id LIMIT %(limit)s"
    )
