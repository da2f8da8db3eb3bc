-- One row is one job: the whole runtime state of a workflow run.
CREATE TABLE workflow_run (
    job_id              uuid        PRIMARY KEY,
    workflow_name       text        NOT NULL,
    -- Snapshot taken at submit so a definition edited later never moves a live
    -- job. NULL only for a job refused at submit (unknown stored workflow).
    workflow_definition jsonb,
    -- Key of the engine's compile cache; empty when there is no definition.
    definition_hash     text        NOT NULL DEFAULT '',
    input               jsonb       NOT NULL DEFAULT '{}'::jsonb,
    status              text        NOT NULL,
    attempt             integer     NOT NULL DEFAULT 0,
    max_attempts        integer     NOT NULL,
    run_after           timestamptz NOT NULL DEFAULT now(),
    outstanding_step    text,
    checkpoints         jsonb       NOT NULL DEFAULT '[]'::jsonb,
    result              jsonb,
    verdict             text,
    error               text,
    lease_owner         text,
    lease_until         timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT workflow_run_status_check
        CHECK (status IN ('QUEUED', 'RUNNING', 'WAITING', 'COMPLETED', 'FAILED', 'DEAD')),
    CONSTRAINT workflow_run_attempts_check
        CHECK (attempt >= 0 AND max_attempts >= 1),
    CONSTRAINT workflow_run_checkpoints_array
        CHECK (jsonb_typeof(checkpoints) = 'array'),
    -- A RUNNING row without a lease could never be swept.
    CONSTRAINT workflow_run_running_has_lease
        CHECK (status <> 'RUNNING' OR (lease_owner IS NOT NULL AND lease_until IS NOT NULL))
);

-- The claim: oldest eligible QUEUED row first. Partial, so it stays as small as
-- the backlog rather than the history.
CREATE INDEX workflow_run_claim_idx
    ON workflow_run (run_after, created_at)
    WHERE status = 'QUEUED';

-- The sweeper: RUNNING rows whose lease has passed.
CREATE INDEX workflow_run_lease_idx
    ON workflow_run (lease_until)
    WHERE status = 'RUNNING';

-- list-jobs: newest first, unfiltered or filtered by status or by name; the
-- trailing job_id makes the order total so a cursor never skips or repeats.
CREATE INDEX workflow_run_created_idx
    ON workflow_run (created_at DESC, job_id DESC);
CREATE INDEX workflow_run_status_created_idx
    ON workflow_run (status, created_at DESC, job_id DESC);
CREATE INDEX workflow_run_name_created_idx
    ON workflow_run (workflow_name, created_at DESC, job_id DESC);

-- QUEUED rows whose attempts are used up: never claimed, the sweeper settles
-- them DEAD. Normally empty, so it costs nothing to keep.
CREATE INDEX workflow_run_exhausted_idx
    ON workflow_run (job_id)
    WHERE status = 'QUEUED' AND attempt >= max_attempts;
