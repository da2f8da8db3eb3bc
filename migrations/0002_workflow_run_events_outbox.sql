-- One row per commit point of a job, written in the same transaction as the
-- row change it describes. The relay ships `payload` as is, after appending the
-- row id as the event's event_id.
CREATE TABLE workflow_run_events_outbox (
    id           bigserial   PRIMARY KEY,
    job_id       uuid        NOT NULL,
    event_type   text        NOT NULL,
    -- The encoded WorkflowRunEvent, without event_id.
    payload      bytea       NOT NULL,
    status       text        NOT NULL DEFAULT 'PENDING',
    attempts     integer     NOT NULL DEFAULT 0,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz,
    CONSTRAINT workflow_run_events_outbox_status_check
        CHECK (status IN ('PENDING', 'PUBLISHED', 'FAILED')),
    CONSTRAINT workflow_run_events_outbox_type_check
        CHECK (event_type IN ('ACCEPTED', 'STEP_CHECKPOINT', 'WAITING', 'COMPLETED', 'FAILED', 'DEAD'))
);

-- The relay drains PENDING rows oldest first; published rows are kept, so the
-- partial index keeps the hot set small however long the history grows.
CREATE INDEX workflow_run_events_outbox_pending_idx
    ON workflow_run_events_outbox (id)
    WHERE status = 'PENDING';

-- Reading one job's events (debugging, tests) without scanning the history.
CREATE INDEX workflow_run_events_outbox_job_idx
    ON workflow_run_events_outbox (job_id, id);
