"""The submit statement (``store.submit_batch``), for one job or many.

The rows arrive as parallel arrays, one element per job, and the distinct
definitions of the batch once each. Every row is inserted unless its job_id
exists, each inserted row writes its event, and the statement answers with
every job the batch names: the new rows (true) and the rows that already stood
(false). A concurrent submit of the same id can make both branches miss a row;
the caller asks again for those.

Snapshots: the submit's share of the snapshot lock is taken for every hash of
the batch, in hash order, before the snapshot's insert looks for a conflict, so
retention (which only try-locks) cannot delete a snapshot between this batch
finding it and its jobs becoming visible. A snapshot is written only for a
hash that a job not yet stored names, so a repeated submit writes nothing. A
new row does not read its definition back (the caller has it), so a submit
never ships the snapshot twice.
"""

from __future__ import annotations

from store.run_sql import PLAIN_COLUMNS, SNAPSHOT_LOCK_CLASS, job_columns

# The arrays travel in binary: in text form psycopg escapes every element with a
# regular expression, and an input or a definition is a long element.
SUBMIT_BATCH_SQL = f"""
WITH given AS (
    SELECT *
      FROM unnest(%(job_id)b::uuid[], %(workflow_name)b::text[], %(definition_hash)b::text[],
                  %(input)b::text[], %(status)b::text[], %(max_attempts)b::int[],
                  %(error)b::text[], %(owner)b::text[], %(deadline_ms)b::bigint[],
                  %(event_type)b::text[], %(payload)b::bytea[], %(traceparent)b::text[],
                  %(tracestate)b::text[])
           AS g(job_id, workflow_name, definition_hash, input, status, max_attempts,
                error, owner, deadline_ms, event_type, payload, traceparent, tracestate)
), snapshot_lock AS MATERIALIZED (
    SELECT s.hash, s.definition,
           pg_advisory_xact_lock_shared({SNAPSHOT_LOCK_CLASS}, hashtext(s.hash)) AS locked
      FROM unnest(%(snapshot_hash)b::text[], %(snapshot)b::text[]) AS s(hash, definition)
     ORDER BY s.hash
), inserted AS (
    INSERT INTO workflow_run (job_id, workflow_name, definition_hash, input, status,
                              max_attempts, error, run_after, owner, deadline_at,
                              traceparent, tracestate)
    SELECT job_id, workflow_name, definition_hash, input::jsonb, status, max_attempts, error,
           now(), owner, now() + deadline_ms * interval '1 millisecond', traceparent, tracestate
      FROM given
     -- After the locks: a row's snapshot is locked before the row can commit.
     WHERE (SELECT count(*) FROM snapshot_lock) >= 0
    ON CONFLICT (job_id) DO NOTHING
    RETURNING {job_columns("workflow_run", definition="NULL::jsonb")}
), snapshot AS (
    -- Every CTE reads the statement's snapshot, so this order is free; the job
    -- insert comes first so that pg_stat_activity's cut query text names it.
    INSERT INTO workflow_definition_snapshot (hash, definition)
    SELECT s.hash, s.definition::jsonb FROM snapshot_lock AS s
     WHERE EXISTS (SELECT FROM given AS g
                    WHERE g.definition_hash = s.hash
                      AND NOT EXISTS (SELECT FROM workflow_run AS r WHERE r.job_id = g.job_id))
    ON CONFLICT (hash) DO NOTHING
), event AS (
    INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)
    SELECT g.job_id, g.event_type, g.payload FROM inserted AS i JOIN given AS g USING (job_id)
)
SELECT true, {PLAIN_COLUMNS} FROM inserted
UNION ALL
SELECT false, {job_columns("workflow_run")} FROM workflow_run
 WHERE job_id = ANY(%(job_id)b::uuid[]) AND job_id NOT IN (SELECT job_id FROM inserted)
"""

# One job alone: the same writes without the arrays, which cost a single submit
# (every HTTP submit) a third more CPU on both sides when it went through them.
SUBMIT_ONE_SQL = f"""
WITH snapshot_lock AS (
    SELECT pg_advisory_xact_lock_shared({SNAPSHOT_LOCK_CLASS}, hashtext(%(definition_hash)s))
), snapshot AS (
    INSERT INTO workflow_definition_snapshot (hash, definition)
    SELECT %(definition_hash)s, %(definition)s::jsonb FROM snapshot_lock
     WHERE %(definition)s::jsonb IS NOT NULL
       AND NOT EXISTS (SELECT FROM workflow_run WHERE job_id = %(job_id)s)
    ON CONFLICT (hash) DO NOTHING
), inserted AS (
    INSERT INTO workflow_run (job_id, workflow_name, definition_hash, input, status,
                              max_attempts, error, run_after, owner, deadline_at,
                              traceparent, tracestate)
    VALUES (%(job_id)s, %(workflow_name)s, %(definition_hash)s,
            %(input)s, %(status)s, %(max_attempts)s, %(error)s, now(), %(owner)s,
            now() + %(deadline_ms)s::bigint * interval '1 millisecond',
            %(traceparent)s, %(tracestate)s)
    ON CONFLICT (job_id) DO NOTHING
    RETURNING {job_columns("workflow_run", definition="NULL::jsonb")}
), event AS (
    INSERT INTO workflow_run_events_outbox (job_id, event_type, payload)
    SELECT job_id, %(event_type)s, %(payload)s FROM inserted
)
SELECT true, {PLAIN_COLUMNS} FROM inserted
UNION ALL
SELECT false, {job_columns("workflow_run")} FROM workflow_run
 WHERE job_id = %(job_id)s AND NOT EXISTS (SELECT FROM inserted)
"""

__all__ = ["SUBMIT_BATCH_SQL", "SUBMIT_ONE_SQL"]
