-- What knowledge-graph extraction noted when it kept only part of what it read (memory_history rows with
-- action KG_EXTRACT: their reason quotes the names and facts it refused, and the model's error text) has no
-- drawer_id: it names the episode it read (new_value->>'episode_id') or the drawers (new_value->'drawers').
-- A forget scrubs those of what it forgets; these two small partial indexes let it find them without
-- walking the workspace's history.
CREATE INDEX IF NOT EXISTS memory_history_kg_episode
    ON memory_history (workspace_id, (new_value->>'episode_id')) WHERE action = 'KG_EXTRACT';
CREATE INDEX IF NOT EXISTS memory_history_kg_drawers
    ON memory_history USING gin ((new_value->'drawers')) WHERE action = 'KG_EXTRACT';
