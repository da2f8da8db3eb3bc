"""Every statement the run store sends, each a named constant.

Statements are written out whole, in the order of a job's life: submit, claim,
the fenced writes of a running job, the sweeper, complete-step, reads. Only a
few named pieces are composed in, because every statement must agree on them:
the ``Job`` columns, the fence of a worker's lease, and status literals, which
come from the state machine (``store.states``) through the transitions below,
so a move the machine does not allow fails at import.

A commit point changes the row and inserts its event in the same statement (a
data-modifying CTE): when the row does not match, nothing changes and no event
is written.
"""

from __future__ import annotations

from store.history_sql import (
    ENDED_COLUMNS,
    ErrorClass,
    Outcome,
    attempt_insert,
    error_class_literal,
)
from store.states import Status, transition

# --------------------------------------------------------------------------- pieces

JOB_COLUMNS = (
    "job_id",
    "workflow_name",
    "workflow_definition",
    "definition_hash",
    "input",
    "status",
    "attempt",
    "max_attempts",
    "run_after",
    "outstanding_step",
    "checkpoints",
    "result",
    "verdict",
    "error",
    "lease_owner",
    "lease_until",
    "created_at",
    "updated_at",
    "owner",
    "cancel_requested_at",
    "cancel_reason",
    "deadline_at",
    "step_deadline_at",
    "review_request",
    "resumed_from",
    "resumed_by",
    "claimed_at",
    "traceparent",
    "tracestate",
)
# Plain names, for reading a CTE that returned a job's columns.
PLAIN_COLUMNS = ", ".join(JOB_COLUMNS)


def job_columns(table: str, *, definition: str = "") -> str:
    """The ``Job`` columns read from ``table``, the definition through its hash.

    A row holds no definition, only the hash of its snapshot (migration 0008):
    one primary-key lookup per job reads it back. ``definition`` puts another
    expression in that lookup's place.
    """
    definition = definition or (
        "(SELECT s.definition FROM workflow_definition_snapshot AS s"
        f" WHERE s.hash = {table}.definition_hash)"
    )
    return ", ".join(
        f"{definition} AS {column}" if column == "workflow_definition" else f"{table}.{column}"
        for column in JOB_COLUMNS
    )


# What list-jobs reads: the columns of ``JobSummary``, in its order.
SUMMARY_COLUMNS = (
    "job_id",
    "workflow_name",
    "status",
    "attempt",
    "max_attempts",
    "run_after",
    "outstanding_step",
    "verdict",
    "error",
    "lease_owner",
    "lease_until",
    "created_at",
    "updated_at",
    "owner",
    "deadline_at",
    "step_deadline_at",
    "cancel_requested_at",
    "resumed_from",
    "resumed_by",
)

# Submits share this lock on a snapshot's hash with retention, which takes it
# exclusively before deleting a snapshot no job names (store/retention.py). A
# submit holds it from before it finds or writes the snapshot until it
# commits, so a snapshot cannot vanish between a submit finding it and its job
# row becoming visible. Two-key advisory locks: (this class, hashtext(hash)).
SNAPSHOT_LOCK_CLASS = 0x77666A08


def status_literal(status: str) -> str:
    # Statuses are inlined rather than bound: a partial index (the claim's is
    # WHERE status = QUEUED) can only serve a plan that sees the literal.
    return f"'{Status(status).value}'"


# Every move a store method makes, checked against the state machine at import.
CLAIM = transition(Status.QUEUED, Status.RUNNING)
PARK = transition(Status.RUNNING, Status.WAITING)
COMPLETE = transition(Status.RUNNING, Status.COMPLETED)
FAIL = transition(Status.RUNNING, Status.FAILED)
RETRY = transition(Status.RUNNING, Status.QUEUED)
GIVE_UP = transition(Status.RUNNING, Status.DEAD)
EXHAUSTED = transition(Status.QUEUED, Status.DEAD)
RESUME = transition(Status.WAITING, Status.QUEUED)
REJECT = transition(Status.WAITING, Status.FAILED)

# What a job parked on a step shows of it (the request its reviewer is asked,
# the step's deadline) is the parked step's alone: every move out of WAITING
# clears it in the same statement, so a requeued or ended job does not show it.
WAITING_ONLY = "review_request = NULL, step_deadline_at = NULL"

# The fence every write a worker makes names: its lease. Fenced writes only ever
# touch a RUNNING row, as the lease exists only there.
LEASE_FENCE = (
    f"job_id = %(job_id)s AND status = {status_literal(Status.RUNNING)}"
    " AND lease_owner = %(worker_id)s AND attempt = %(attempt)s AND lease_token = %(token)s"
)
# Once an operator asked to cancel the job, its worker may still renew the lease
# (the renewal is how it learns of the request) and settle it CANCELLED
# (store.control), but no checkpoint or other settle lands.
_FENCE = f"{LEASE_FENCE} AND cancel_requested_at IS NULL"

# --------------------------------------------------------------------------- claim

# Sent before the claim, in its transaction and the same round trip. The claim
# index matches the claim's ORDER BY, but whenever the statistics say nothing is
# QUEUED (the last analyze saw a caught-up queue; a burst arrived since) the
# planner costs every scan at one row and may find another index plus a Sort a
# hair cheaper: that plan reads and sorts the whole backlog on every claim, so
# a claim costs more the longer the queue (0.9 ms against 0.2 ms per claim in
# the peers benchmark). Without Sort the only plan left reads the claim index
# in order and stops after ``limit`` rows, whatever the statistics say. That
# plan does not depend on the parameters, so the claim takes the generic plan
# from its first execution on a connection instead of planning it anew for the
# first five (the plan cache's default), which a new pool paid on every one of
# its connections.
#
# A worker claims through a connection of its own that holds these settings
# for its whole session (``CLAIM_SESSION``), so a claim is one statement in
# autocommit; a store without one sends them with each claim, in its
# transaction (``CLAIM_SETTINGS_SQL``), which costs a pipelined BEGIN, the
# settings and COMMIT around the claim: 1.0 against 0.5 ms a claim, alone
# (``benchmarks.round_trips``).
CLAIM_SESSION: dict[str, str] = {
    "enable_sort": "off",
    "plan_cache_mode": "force_generic_plan",
    # And the claimed rows are read by key even while the statistics still
    # describe a table of a few rows (a new deployment's first burst), where a
    # scan of the whole table looks as cheap to the planner.
    "enable_seqscan": "off",
    # A claim does not wait for its WAL flush. It publishes nothing, and every
    # write made under the lease waits for its own flush, which takes the
    # claim's with it (WAL is flushed in order): no checkpoint, event or end
    # of the attempt is ever durable while its claim is not. A claim a server
    # crash loses puts the row back as it was, and the runner that held it
    # then fails its fence on its next write; its step ran without a
    # checkpoint, as after a worker crash. What keeps that runner from passing
    # the fence of a later claim by the same worker is the lease token, which
    # such a claim cannot repeat (``CLAIM_SQL``). Alone, a claim takes about
    # 0.45 instead of 0.58 ms (``benchmarks.round_trips``).
    "synchronous_commit": "off",
}
CLAIM_SETTINGS_SQL = "SELECT " + ", ".join(
    f"set_config('{name}', '{value}', true)" for name, value in CLAIM_SESSION.items()
)


# The claim, whole: the oldest eligible row is locked (skipping rows another
# claimer holds) and flipped to RUNNING with its lease in the same statement.
# Each claimed row's definition comes back through its hash, one primary-key
# lookup per row after the pick: the pick itself is unchanged.
#
# The lease token grows with every claim and, past the previous token, is
# the database clock in microseconds: a claim lost in a server crash (claims
# do not wait for their WAL flush, see ``CLAIM_SESSION``) returns the row to
# its old token, and the next claim, made later, takes a token the lost one
# never had (unless the server's clock went back by more than the outage).
# Counting up by one alone, the same worker's next claim would repeat the lost
# claim's (worker, attempt, token) exactly, and the fence could not tell the
# two runners apart.
#
# A job whose whole-job deadline has passed is not picked: its steps would run
# only to be thrown away, and the sweeper fails it where it waits, with its
# event (``store.deadline_sql``). The claim index still serves the pick; such
# a row is passed over until that sweep, at most one interval.
#
# The picked rows are updated through their ids as an array, so the update
# reads them by primary key whatever the planner guesses. Joined to the pick
# instead, the generic plan (which cannot know the limit) guessed a tenth of
# the backlog claimed at once and hashed the pick against a scan of the whole
# table: 27 ms a claim with 100 000 jobs queued, against 0.4 ms.
def _claim_sql(definition: str = "") -> str:
    return f"""
WITH picked AS (
    SELECT job_id FROM workflow_run
     WHERE status = {status_literal(CLAIM[0])} AND run_after <= now() AND attempt < max_attempts
       AND (deadline_at IS NULL OR deadline_at > now())
     ORDER BY run_after, created_at
     LIMIT %(limit)s
     FOR UPDATE SKIP LOCKED
)
UPDATE workflow_run AS r
   SET status = {status_literal(CLAIM[1])},
       lease_owner = %(worker_id)s,
       lease_until = now() + %(lease_s)s * interval '1 second',
       attempt = r.attempt + 1,
       lease_token = greatest(
           r.lease_token + 1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
       ),
       claimed_at = now(),
       claimed_checkpoints = jsonb_array_length(r.checkpoints),
       updated_at = now()
 WHERE r.job_id = ANY (ARRAY(SELECT job_id FROM picked))
RETURNING {job_columns("r", definition=definition)}, r.lease_token
"""


CLAIM_SQL = _claim_sql()
# The same claim for a worker that compiled most definitions already: no
# snapshot is read, sent or parsed per job; the few it lacks it reads by hash
# (SELECT_SNAPSHOTS_SQL).
CLAIM_WITHOUT_DEFINITIONS_SQL = _claim_sql(definition="NULL::jsonb")
SELECT_SNAPSHOTS_SQL = """
SELECT hash, definition FROM workflow_definition_snapshot WHERE hash = ANY (%(hashes)s::text[])
"""

# --------------------------------------------------------------------------- fenced writes

# Renewals answer with the cancel request, if any: the worker stops the segment.
EXTEND_LEASE_SQL = f"""
UPDATE workflow_run
   SET lease_until = now() + %(lease_s)s * interval '1 second', updated_at = now()
 WHERE {LEASE_FENCE}
RETURNING lease_until, cancel_requested_at
"""

# A renewal that reports its segment's progress (see migration 0009). The
# progress time moves only when the mark does, so a renewer that keeps
# reporting the same mark cannot keep the job: once its stall_at has passed,
# the renewal changes nothing and the sweeper takes the row.
_RENEWED_PROGRESS_AT = (
    "CASE WHEN progress_token = %(token)s AND progress_mark = %(mark)s THEN progress_at"
    " ELSE now() - %(idle_s)s * interval '1 second' END"
)
RENEW_SEGMENT_SQL = f"""
UPDATE workflow_run
   SET lease_until = now() + %(lease_s)s * interval '1 second',
       progress_token = %(token)s,
       progress_mark = %(mark)s,
       progress_at = {_RENEWED_PROGRESS_AT},
       stall_at = {_RENEWED_PROGRESS_AT}
                  + (%(deadline_s)s + %(lease_s)s) * interval '1 second',
       updated_at = now()
 WHERE {LEASE_FENCE}
   AND NOT (progress_token IS NOT DISTINCT FROM %(token)s
            AND progress_mark IS NOT DISTINCT FROM %(mark)s
            AND stall_at <= now())
RETURNING lease_until, cancel_requested_at
"""

# The entry is appended server-side: the array is never shipped back and forth.
CHECKPOINT_SQL = f"""
WITH changed AS (
    UPDATE workflow_run
       SET checkpoints = checkpoints || jsonb_build_array(%(entry)s::jsonb),
           updated_at = now()
     WHERE {_FENCE}
    RETURNING job_id
)
INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)
SELECT job_id, %(event_type)s, %(payload)s FROM changed
RETURNING id
"""

PARK_SQL = f"""
WITH changed AS (
    UPDATE workflow_run
       SET status = {status_literal(PARK[1])}, outstanding_step = %(step_name)s, lease_until = NULL,
           review_request = %(review_request)s,
           step_deadline_at = now() + %(timeout_ms)s::bigint * interval '1 millisecond',
           updated_at = now()
     WHERE {_FENCE}
    RETURNING {ENDED_COLUMNS}
), ended AS (
    {attempt_insert("changed", Outcome.PARKED, worker="%(worker_id)s")}
)
INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)
SELECT job_id, %(event_type)s, %(payload)s FROM changed
RETURNING id
"""

COMPLETE_SQL = f"""
WITH changed AS (
    UPDATE workflow_run
       SET status = {status_literal(COMPLETE[1])}, result = %(result)s, verdict = %(verdict)s,
           error = NULL, outstanding_step = NULL, lease_until = NULL,
           updated_at = now()
     WHERE {_FENCE}
    RETURNING {ENDED_COLUMNS}
), ended AS (
    {attempt_insert("changed", Outcome.COMPLETED, worker="%(worker_id)s")}
)
INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)
SELECT job_id, %(event_type)s, %(payload)s FROM changed
RETURNING id
"""

_FAILED_ENDS = attempt_insert(
    "changed",
    Outcome.FAILED,
    worker="%(worker_id)s",
    error="%(error)s",
    error_class="%(error_class)s",
)
FAIL_SQL = f"""
WITH changed AS (
    UPDATE workflow_run
       SET status = {status_literal(FAIL[1])}, verdict = %(verdict)s, error = %(error)s,
           lease_until = NULL, updated_at = now()
     WHERE {_FENCE}
    RETURNING {ENDED_COLUMNS}
), ended AS (
    {_FAILED_ENDS}
)
INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)
SELECT job_id, %(event_type)s, %(payload)s FROM changed
RETURNING id
"""

# A retryable failure's three ends, decided under the row lock from the row's
# own counters and deadline: DEAD with no attempt left; FAILED when the retry
# would start after the job's whole-job deadline (no claim takes a job past it,
# so a RETRY_SCHEDULED would promise a run that never comes and leave the job
# waiting for the deadline sweep); QUEUED with the backoff otherwise. All three
# events are prepared by the caller, and the one that matches is inserted:
# RETRY_SCHEDULED carries the next run time, so the caller names it
# (``next_run_at``: the backoff counted on the database clock, see
# ``RunStore.retry_or_die``) and the row takes that same instant.
OUT_OF_TIME = transition(Status.RUNNING, Status.FAILED)


def retry_status(row: str, next_run_at: str) -> str:
    """The status a retry-or-die moves the row to: ``row`` prefixes its columns
    ("" or "r."), ``next_run_at`` is the retry's instant as an SQL expression."""
    return (
        f"CASE WHEN {row}attempt >= {row}max_attempts THEN {status_literal(GIVE_UP[1])}"
        f" WHEN {row}deadline_at <= {next_run_at} THEN {status_literal(OUT_OF_TIME[1])}"
        f" ELSE {status_literal(RETRY[1])} END"
    )


def retry_ends(source: str, *, worker: str, error: str, late_error: str, error_class: str) -> str:
    """The attempt history of a retry-or-die, from ``source``'s returned rows."""
    status = f"{source}.status"
    return attempt_insert(
        source,
        f"CASE {status} WHEN {status_literal(GIVE_UP[1])} THEN '{Outcome.DEAD}'"
        f" WHEN {status_literal(OUT_OF_TIME[1])} THEN '{Outcome.DEADLINE_PASSED}'"
        f" ELSE '{Outcome.RETRY_SCHEDULED}' END",
        worker=worker,
        error=f"CASE WHEN {status} = {status_literal(OUT_OF_TIME[1])} THEN {late_error}"
        f" ELSE {error} END",
        error_class=f"CASE WHEN {status} = {status_literal(OUT_OF_TIME[1])}"
        f" THEN {error_class_literal(ErrorClass.DEADLINE)} ELSE {error_class} END",
        next_run_at=f"CASE WHEN {status} = {status_literal(RETRY[1])} THEN {source}.run_after END",
    )


def retry_event(status: str, *, dead: str, late: str, retry: str) -> str:
    """Of a retry-or-die's three prepared values, the one its new ``status`` names."""
    return (
        f"CASE {status} WHEN {status_literal(GIVE_UP[1])} THEN {dead}"
        f" WHEN {status_literal(OUT_OF_TIME[1])} THEN {late} ELSE {retry} END"
    )


_RETRY_STATUS = retry_status("", "%(next_run_at)s::timestamptz")
_REQUEUED = f"({_RETRY_STATUS}) = {status_literal(RETRY[1])}"
_OUT_OF_TIME_NOW = f"({_RETRY_STATUS}) = {status_literal(OUT_OF_TIME[1])}"
_RETRY_OR_DIE_ENDS = retry_ends(
    "changed",
    worker="%(worker_id)s",
    error="%(error)s",
    late_error="%(late_error)s",
    error_class="%(error_class)s",
)
_RETRY_OR_DIE_EVENT_TYPE = retry_event(
    "status", dead="%(event_type)s", late="%(late_event_type)s", retry="%(retry_event_type)s"
)
_RETRY_OR_DIE_PAYLOAD = retry_event(
    "status", dead="%(payload)s", late="%(late_payload)s", retry="%(retry_payload)s"
)
RETRY_OR_DIE_SQL = f"""
WITH changed AS (
    UPDATE workflow_run
       SET status = {_RETRY_STATUS},
           run_after = CASE WHEN {_REQUEUED} THEN %(next_run_at)s::timestamptz ELSE run_after END,
           lease_owner = CASE WHEN {_REQUEUED} THEN NULL ELSE lease_owner END,
           lease_until = NULL,
           error = CASE WHEN {_OUT_OF_TIME_NOW} THEN %(late_error)s ELSE %(error)s END,
           updated_at = now()
     WHERE {_FENCE}
    RETURNING {ENDED_COLUMNS}, status, max_attempts, run_after
), ended AS (
    {_RETRY_OR_DIE_ENDS}
), event AS (
    INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)
    SELECT job_id, {_RETRY_OR_DIE_EVENT_TYPE}, {_RETRY_OR_DIE_PAYLOAD}
      FROM changed
)
SELECT status, attempt, max_attempts, run_after FROM changed
"""

# No event: the attempt is given back and the job simply waits for a claim.
# The history keeps it (HANDED_BACK), under the number it was claimed with.
HAND_BACK_SQL = f"""
WITH changed AS (
    UPDATE workflow_run
       SET status = {status_literal(RETRY[1])}, attempt = attempt - 1, run_after = now(),
           lease_owner = NULL, lease_until = NULL, updated_at = now()
     WHERE {_FENCE}
    RETURNING job_id, attempt + 1 AS attempt, claimed_at, checkpoints, claimed_checkpoints
), ended AS (
    {attempt_insert("changed", Outcome.HANDED_BACK, worker="%(worker_id)s")}
)
SELECT job_id FROM changed
"""

# --------------------------------------------------------------------------- sweeper

# The sweeper's clock: the database's, unless the caller names the instant
# (tests judge rows at a later time instead of waiting for it).
_SWEEP_NOW = "coalesce(%(now)s::timestamptz, now())"

# RUNNING rows whose lease expired, or whose segment stalled: renewed, but
# without progress past its deadline plus the lease. A stall only counts when
# the current claim reported it (progress_token = lease_token). A row an
# operator asked to cancel is never requeued: the cancel sweep settles it
# (store.control). Nor is a row past its whole-job deadline, which no claim
# would take again: the deadline sweep fails it (store.deadline_sql), rather
# than a RETRY_SCHEDULED for a run that never comes, or DEAD.
_BEFORE_DEADLINE = "(deadline_at IS NULL OR deadline_at > {now})"
SELECT_EXPIRED_SQL = f"""
SELECT job_id, workflow_name, status, attempt, max_attempts, lease_owner, error,
       lease_until >= {_SWEEP_NOW} AS stalled
  FROM workflow_run
 WHERE status = {status_literal(GIVE_UP[0])} AND cancel_requested_at IS NULL
   AND (lease_until < {_SWEEP_NOW}
        OR (stall_at < {_SWEEP_NOW} AND progress_token = lease_token))
   AND {_BEFORE_DEADLINE.format(now=_SWEEP_NOW)}
 ORDER BY lease_until
 LIMIT %(limit)s
 FOR UPDATE SKIP LOCKED
"""

SELECT_EXHAUSTED_SQL = f"""
SELECT job_id, workflow_name, status, attempt, max_attempts, lease_owner, error
  FROM workflow_run
 WHERE status = {status_literal(EXHAUSTED[0])} AND attempt >= max_attempts
   AND {_BEFORE_DEADLINE.format(now="now()")}
 ORDER BY job_id
 LIMIT %(limit)s
 FOR UPDATE SKIP LOCKED
"""

# The attempt that expired stays counted: a worker still running it must
# never match a later claim's lease. Each requeue ends the attempt (SWEPT, in
# the history) and publishes its RETRY_SCHEDULED event, whose next run time is
# this transaction's now(): the caller read it in the same transaction.
_SWEPT_ENDS = attempt_insert(
    "changed",
    Outcome.SWEPT,
    worker="changed.worker",
    error="changed.error",
    error_class="changed.error_class",
    next_run_at="now()",
)
SWEEP_REQUEUE_SQL = f"""
WITH swept AS (
    SELECT * FROM unnest(%(job_ids)s::uuid[], %(errors)s::text[], %(error_classes)s::text[],
                         %(workers)s::text[], %(payloads)s::bytea[])
        AS swept(job_id, error, error_class, worker, payload)
), changed AS (
    UPDATE workflow_run AS r
       SET status = {status_literal(RETRY[1])}, run_after = now(), lease_owner = NULL,
           lease_until = NULL, error = swept.error, updated_at = now()
      FROM swept
     WHERE r.job_id = swept.job_id AND r.status = {status_literal(RETRY[0])}
    RETURNING r.job_id, r.attempt, r.claimed_at, r.checkpoints, r.claimed_checkpoints,
              swept.error, swept.error_class, swept.worker, swept.payload
), ended AS (
    {_SWEPT_ENDS}
)
INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)
SELECT job_id, %(event_type)s, payload FROM changed
"""

# A RUNNING row's attempt ends here (DEAD, in the history); a QUEUED row whose
# attempts were used up ends none, and the caller names no error class for it.
_SWEPT_DEAD_ENDS = attempt_insert(
    "changed",
    Outcome.DEAD,
    worker="changed.worker",
    error="changed.error",
    error_class="changed.error_class",
    where="changed.error_class IS NOT NULL",
)
SWEEP_DEAD_SQL = f"""
WITH swept AS (
    SELECT * FROM unnest(%(job_ids)s::uuid[], %(errors)s::text[], %(payloads)s::bytea[],
                         %(error_classes)s::text[], %(workers)s::text[])
        AS swept(job_id, error, payload, error_class, worker)
), changed AS (
    UPDATE workflow_run AS r
       SET status = {status_literal(GIVE_UP[1])}, lease_until = NULL, error = swept.error,
           updated_at = now()
      FROM swept
     WHERE r.job_id = swept.job_id
       AND r.status IN ({status_literal(GIVE_UP[0])}, {status_literal(EXHAUSTED[0])})
    RETURNING r.job_id, r.attempt, r.claimed_at, r.checkpoints, r.claimed_checkpoints,
              swept.error, swept.error_class, swept.worker
), ended AS (
    {_SWEPT_DEAD_ENDS}
)
INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)
SELECT swept.job_id, %(event_type)s, swept.payload
  FROM swept JOIN changed USING (job_id)
"""

# The sweeper's transaction's own clock: a requeue's next run time.
TRANSACTION_NOW_SQL = "SELECT now()"

# --------------------------------------------------------------------------- complete-step

# The callers that lock a job (complete-step, cancel) answer with it, and an
# answer holds no definition: read under the lock, the snapshot (most of a
# megabyte, for some) would only be shipped and dropped while the lock is held.
LOCK_JOB_SQL = f"""
SELECT {job_columns("workflow_run", definition="NULL::jsonb")} FROM workflow_run
 WHERE job_id = %(job_id)s
   FOR UPDATE
"""

# The resume gives the parked attempt back (see ``store.runs``). The review
# request and the step deadline are the parked step's (``WAITING_ONLY``).
ACCEPT_STEP_SQL = f"""
WITH changed AS (
    UPDATE workflow_run
       SET status = {status_literal(RESUME[1])},
           checkpoints = checkpoints || jsonb_build_array(%(entry)s::jsonb),
           outstanding_step = NULL, {WAITING_ONLY}, run_after = now(),
           attempt = greatest(attempt - 1, 0),
           lease_owner = NULL, lease_until = NULL, updated_at = now()
     WHERE job_id = %(job_id)s AND status = {status_literal(RESUME[0])}
    RETURNING {job_columns("workflow_run", definition="NULL::jsonb")}
), event AS (
    INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)
    SELECT job_id, %(event_type)s, %(payload)s FROM changed
)
SELECT {PLAIN_COLUMNS} FROM changed
"""

REJECT_STEP_SQL = f"""
WITH changed AS (
    UPDATE workflow_run
       SET status = {status_literal(REJECT[1])}, verdict = %(verdict)s, error = %(error)s,
           {WAITING_ONLY}, updated_at = now()
     WHERE job_id = %(job_id)s AND status = {status_literal(REJECT[0])}
    RETURNING {job_columns("workflow_run", definition="NULL::jsonb")}
), event AS (
    INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)
    SELECT job_id, %(event_type)s, %(payload)s FROM changed
)
SELECT {PLAIN_COLUMNS} FROM changed
"""

# --------------------------------------------------------------------------- reads

SELECT_JOB_SQL = f"""
SELECT {job_columns("workflow_run")} FROM workflow_run WHERE job_id = %(job_id)s
"""

# The backlog for admission control, counted no further than the cap: the claim
# index is partial on QUEUED, so this reads at most ``limit`` index entries.
COUNT_QUEUED_SQL = f"""
SELECT count(*) FROM (
    SELECT 1 FROM workflow_run WHERE status = {status_literal(Status.QUEUED)} LIMIT %(limit)s
) AS backlog
"""


def list_jobs_sql(*, by_status: bool, by_name: bool, after: bool, by_owner: bool = False) -> str:
    """Newest first, with whichever filters and cursor the call uses.

    Summaries only (``SUMMARY_COLUMNS``): the payload columns are never read,
    so a page costs the same whatever its jobs carry.
    """
    conditions = []
    if by_owner:
        conditions.append("owner = %(owner)s")
    if by_status:
        conditions.append("status = %(status)s")
    if by_name:
        conditions.append("workflow_name = %(workflow_name)s")
    if after:
        # A row comparison the (created_at DESC, job_id DESC) indexes serve.
        conditions.append("(created_at, job_id) < (%(after_created_at)s, %(after_job_id)s)")
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    return (
        f"SELECT {', '.join(SUMMARY_COLUMNS)} FROM workflow_run{where}"
        " ORDER BY created_at DESC, job_id DESC LIMIT %(limit)s"
    )
