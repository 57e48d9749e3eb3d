-- Forget (issue 16) reaches what was derived from the forgotten content, through indexes:
--
-- * the dreaming runs that consolidated a forgotten session's episode (their drawers were synthesised
--   from it): found by episode id, whichever session or user is forgotten;
-- * the drawers a forgotten drawer superseded (they rank below a successor that no longer exists and
--   name it): few rows, hence a partial index;
-- * the look-alike flags naming a forgotten entity as the second of the pair (the key serves the first).
CREATE INDEX IF NOT EXISTS dreaming_runs_episodes ON dreaming_runs USING gin (episode_ids);
CREATE INDEX IF NOT EXISTS drawers_superseded_by ON drawers (workspace_id, superseded_by)
    WHERE superseded_by IS NOT NULL;
CREATE INDEX IF NOT EXISTS entity_flags_b ON entity_flags (workspace_id, entity_b);
