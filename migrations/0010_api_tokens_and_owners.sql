-- API tokens, job owners, and versions of stored definitions.
--
-- A token is "wfj_<id>_<secret>". Only the SHA-256 of the secret is kept: the
-- secret is 32 random bytes, so a plain hash cannot be reversed by guessing,
-- and a leaked table leaks no usable token. A revoked token keeps its row
-- (revoked_at set), so `wfjobs tokens list` still tells who held what.
CREATE TABLE api_token (
    id          text        PRIMARY KEY,
    secret_hash bytea       NOT NULL,
    principal   text        NOT NULL,
    scopes      text[]      NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz,
    CONSTRAINT api_token_principal_check CHECK (principal <> ''),
    CONSTRAINT api_token_secret_hash_check CHECK (octet_length(secret_hash) = 32)
);

-- The principal that submitted the job. Jobs recorded before owners existed
-- keep NULL: they belong to nobody, so only a fleet-wide token reaches them.
ALTER TABLE workflow_run ADD COLUMN owner text;

-- list-jobs of one owner, newest first. Owners never change, so a commit
-- point's update touches no column of this index and stays a HOT update.
CREATE INDEX workflow_run_owner_created_idx
    ON workflow_run (owner, created_at DESC, job_id DESC);

-- Optimistic concurrency for stored definitions: every write bumps the
-- version, and a write that names a version (If-Match) only lands on it.
ALTER TABLE workflow_definition ADD COLUMN version bigint NOT NULL DEFAULT 1;
