-- A curation decision is filed under its target drawer, but its proposal (the new content, the LLM's
-- reason) comes from the source drawer whose fact prompted it. Forgetting the source must scrub those
-- rows too, found through this index rather than a scan of the workspace's history.
CREATE INDEX IF NOT EXISTS memory_history_source_drawer
    ON memory_history (workspace_id, (new_value ->> 'source_drawer'))
    WHERE new_value ? 'source_drawer';
