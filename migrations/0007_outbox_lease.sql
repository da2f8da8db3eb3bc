-- The relay publishes with no transaction open. It leases the rows it takes
-- (a short transaction that locks the heads with FOR UPDATE SKIP LOCKED, as
-- before, and stamps lease_owner and lease_until), publishes, then settles
-- them in one statement fenced on lease_owner. A lease still running keeps a
-- job's head from every other relay; a relay that died mid-publish leaves its
-- lease to expire, and another relay takes the rows again (at least once).
-- A row whose publish failed on a transient fault is handed back with
-- lease_until set to when it may be tried again.
ALTER TABLE workflow_run_events_outbox
    ADD COLUMN lease_owner text,
    ADD COLUMN lease_until timestamptz;

-- A FAILED row holds back the later rows of its job until an operator
-- redrives it, so every fetch asks, for each PENDING row it reads, whether its
-- job has an older FAILED row. FAILED rows are few and stay few: this index is
-- small, and the question is one probe of it.
CREATE INDEX workflow_run_events_outbox_failed_idx
    ON workflow_run_events_outbox (job_id, id)
    WHERE status = 'FAILED';
