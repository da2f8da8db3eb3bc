-- Definition snapshots, stored once per hash. Every job used to carry its own
-- copy of the definition it was submitted with (descriptor set included, up to
-- about a megabyte), so a thousand jobs of one workflow held a thousand equal
-- copies. Jobs now name their snapshot by definition_hash, the key the engine
-- already caches compiled definitions by; the snapshot never changes, so a
-- definition edited later still never moves a live job.
--
-- A snapshot is written by the submit that first needs it (in the submit's own
-- statement) and deleted by retention once no job names it. The two are kept
-- apart by a per-hash advisory lock (see store/retention.py), not a foreign
-- key: a foreign key would share-lock the snapshot's row on every submit, and
-- every submit of one workflow would queue on that one row.
CREATE TABLE workflow_definition_snapshot (
    hash       text        PRIMARY KEY,
    definition jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT workflow_definition_snapshot_hash_check CHECK (hash <> ''),
    CONSTRAINT workflow_definition_snapshot_is_object CHECK (jsonb_typeof(definition) = 'object')
);

-- A hash must name one snapshot. Rows written before this migration trusted
-- the submitter's hash; any row whose hash is empty, or is shared with a
-- different definition, is keyed by its content instead, so no job can end up
-- reading another job's definition. (The engine compiles by whatever key the
-- row holds, so such a row still runs.)
UPDATE workflow_run AS r
   SET definition_hash = 'jsonb-sha256:'
       || encode(sha256(convert_to(r.workflow_definition::text, 'UTF8')), 'hex')
 WHERE r.workflow_definition IS NOT NULL
   AND (r.definition_hash = ''
        OR r.definition_hash IN (
            SELECT definition_hash
              FROM workflow_run
             WHERE workflow_definition IS NOT NULL
             GROUP BY definition_hash
            HAVING count(DISTINCT workflow_definition) > 1));

INSERT INTO workflow_definition_snapshot (hash, definition, created_at)
SELECT definition_hash, workflow_definition, created_at
  FROM workflow_run
 WHERE workflow_definition IS NOT NULL
    ON CONFLICT (hash) DO NOTHING;

-- Dropped rather than emptied: a full rewrite of every row would hold the
-- table for as long as it takes, and a process still running the previous
-- release fails loudly on the missing column instead of writing jobs whose
-- definition is nowhere. The old copies' space returns as rows are updated,
-- deleted by retention, or vacuumed.
ALTER TABLE workflow_run DROP COLUMN workflow_definition;

-- Retention asks "does any job still name this snapshot?". The hash never
-- changes after insert, so updates stay heap-only.
CREATE INDEX workflow_run_definition_hash_idx ON workflow_run (definition_hash);
