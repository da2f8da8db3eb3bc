-- Stored workflow definitions, addressed by name. A job snapshots the
-- definition at submit, so editing a row here never moves a live job.
CREATE TABLE workflow_definition (
    name       text        PRIMARY KEY,
    definition jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT workflow_definition_is_object CHECK (jsonb_typeof(definition) = 'object')
);
