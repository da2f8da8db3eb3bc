-- Operator control of a job's life: cancel, resume as a linked run, deadlines,
-- the request a human step carries, and the history of every attempt.

-- CANCELLED is terminal, like COMPLETED, FAILED and DEAD.
ALTER TABLE workflow_run DROP CONSTRAINT workflow_run_status_check;
ALTER TABLE workflow_run ADD CONSTRAINT workflow_run_status_check
    CHECK (status IN ('QUEUED', 'RUNNING', 'WAITING', 'COMPLETED', 'FAILED', 'DEAD', 'CANCELLED'));

ALTER TABLE workflow_run_events_outbox DROP CONSTRAINT workflow_run_events_outbox_type_check;
ALTER TABLE workflow_run_events_outbox ADD CONSTRAINT workflow_run_events_outbox_type_check
    CHECK (event_type IN ('ACCEPTED', 'STEP_CHECKPOINT', 'WAITING', 'COMPLETED', 'FAILED', 'DEAD',
                          'CANCELLED', 'RETRY_SCHEDULED', 'RESUMED'));

ALTER TABLE workflow_run
    -- A RUNNING job is cancelled cooperatively: the request is recorded here,
    -- its worker sees it on its next renewal and settles the job CANCELLED (or
    -- the sweeper does, once the lease has passed).
    ADD COLUMN cancel_requested_at timestamptz,
    ADD COLUMN cancel_reason       text,
    -- The whole-job deadline, counted from submission, queue wait included.
    ADD COLUMN deadline_at         timestamptz,
    -- WAITING: when the parked step's timeout passes.
    ADD COLUMN step_deadline_at    timestamptz,
    -- WAITING: what the parked step's rules built for its reviewer.
    ADD COLUMN review_request      jsonb,
    -- The links of a resume: the terminal job a run resumes, and the run that
    -- resumed a job (the only column a resume writes on the original).
    ADD COLUMN resumed_from        uuid,
    ADD COLUMN resumed_by          uuid,
    -- The current claim's start, and how many checkpoints the row held then:
    -- an attempt's history entry names the steps checkpointed after it.
    ADD COLUMN claimed_at          timestamptz,
    ADD COLUMN claimed_checkpoints integer;

-- The sweeper's deadline pass: only live jobs that have a deadline.
CREATE INDEX workflow_run_deadline_idx
    ON workflow_run (deadline_at)
    WHERE deadline_at IS NOT NULL AND status IN ('QUEUED', 'RUNNING', 'WAITING');
CREATE INDEX workflow_run_step_deadline_idx
    ON workflow_run (step_deadline_at)
    WHERE status = 'WAITING' AND step_deadline_at IS NOT NULL;

-- One row per ended attempt, appended in the statement that ends it; never
-- updated. Deleted with its job.
CREATE TABLE workflow_run_attempt (
    id          bigserial   PRIMARY KEY,
    job_id      uuid        NOT NULL REFERENCES workflow_run (job_id) ON DELETE CASCADE,
    attempt     integer     NOT NULL,
    worker      text,
    claimed_at  timestamptz,
    ended_at    timestamptz NOT NULL DEFAULT now(),
    outcome     text        NOT NULL,
    steps       text[]      NOT NULL DEFAULT '{}',
    error       text,
    error_class text,
    next_run_at timestamptz,
    CONSTRAINT workflow_run_attempt_outcome_check
        CHECK (outcome IN ('COMPLETED', 'FAILED', 'PARKED', 'RETRY_SCHEDULED', 'DEAD', 'SWEPT',
                           'HANDED_BACK', 'CANCELLED', 'DEADLINE_PASSED'))
);

CREATE INDEX workflow_run_attempt_job_idx ON workflow_run_attempt (job_id, id);
