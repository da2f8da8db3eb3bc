-- The latest progress a running step reported, one row per job, overwritten.
-- Kept beside the job rather than on it: a handler may report many times a
-- second (the recorder throttles it), and the job row's updates should stay
-- the commit points they are, with the row narrow and its updates HOT.
-- Written only while the claim that reports it still holds the job (the write
-- is fenced on the lease token), deleted with its job.
CREATE TABLE workflow_run_progress (
    job_id     uuid        PRIMARY KEY REFERENCES workflow_run (job_id) ON DELETE CASCADE,
    attempt    integer     NOT NULL,
    step_name  text        NOT NULL,
    fraction   real        NOT NULL,
    message    text        NOT NULL DEFAULT '',
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT workflow_run_progress_fraction_check CHECK (fraction >= 0 AND fraction <= 1)
);
