-- A row handed back after a transient fault that only some of a pass's rows
-- met (a partition without a leader) waits out a pause before it is tried
-- again, and so do its job's later rows. The pause has a column of its own,
-- apart from the lease: the relay's window leaves out the rows of every job
-- paused at or before them, one probe of this index per row read, so however
-- many of them pile up during such an outage they never fill the window and
-- hold back the events of the jobs the broker takes. Paused rows are few and
-- stay few; leases never touch the column, so they stay heap-only updates
-- (migration 0014).
ALTER TABLE workflow_run_events_outbox ADD COLUMN paused_until timestamptz;

CREATE INDEX workflow_run_events_outbox_paused_idx
    ON workflow_run_events_outbox (job_id, id)
    WHERE paused_until IS NOT NULL;
