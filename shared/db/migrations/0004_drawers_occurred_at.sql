-- Recall adds the drawers inside a time window the query names ("in June 2023") as candidates:
-- this keeps that lookup a range scan within the workspace instead of a scan of all its drawers.
CREATE INDEX IF NOT EXISTS drawers_occurred ON drawers (workspace_id, occurred_at) WHERE deleted_at IS NULL;
