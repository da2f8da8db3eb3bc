-- A fencing token that only ever grows, one step per claim. The attempt
-- counter alone cannot fence: a hand-back and a complete-step resume give the
-- attempt back, so the same worker could hold the same (owner, attempt) pair
-- twice, and a write from the earlier holding would pass the fence.
ALTER TABLE workflow_run ADD COLUMN lease_token bigint NOT NULL DEFAULT 0;
