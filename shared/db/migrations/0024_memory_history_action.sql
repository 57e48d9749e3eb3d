-- `palace history --action A` and the quality report's proposals count by action within a workspace.
CREATE INDEX memory_history_action ON memory_history (workspace_id, action, created_at);
