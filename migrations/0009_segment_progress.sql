-- Segment progress, so a lease is only worth renewing while its segment runs.
--
-- A lease alone cannot tell a running segment from a worker whose heartbeat
-- outlived it: both renew. Every renewal now also says which segment it is for
-- (progress_token, the lease token of the claim it renews) and how far that
-- segment got (progress_mark: steps started or checkpointed). progress_at only
-- moves when the mark does, on the database's clock, and stall_at is when a
-- segment with no further progress stops being one: progress_at plus the
-- workflow's deadlineMs plus the lease. The sweeper requeues a RUNNING row past
-- its stall_at like one past its lease_until, renewed or not.
--
-- A claim does not reset these: a row whose progress_token differs from its
-- lease_token has no report from its current claim yet, and only its lease
-- counts until the first renewal.
ALTER TABLE workflow_run
    ADD COLUMN progress_token bigint,
    ADD COLUMN progress_mark  integer,
    ADD COLUMN progress_at    timestamptz,
    ADD COLUMN stall_at       timestamptz;
--
-- No index of its own: the sweeper reads the RUNNING rows through
-- workflow_run_lease_idx (partial on RUNNING, as many rows as segments run
-- across the fleet) and checks stall_at on each, so a renewal updates no
-- further index.
