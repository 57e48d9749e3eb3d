-- Cluster keeps the vectors and wording bands of small workspaces in memory (shared.memory.neighbours)
-- and reads back only the drawers that changed since it last looked. ``rev`` is the id of the
-- transaction that last changed whether a drawer is a candidate (state, deleted_at, embedding), its
-- vector, its wording bands or when it was filed; a read asks for the rows stamped by transactions its
-- previous read could not see (shared.db.clustering.DELTA_SQL), so it misses no change. (A re-embedding
-- swaps the embedding columns without touching a row; the reads return the active space, and a new one
-- makes the cache read the workspace whole again.)
-- Rows written before this migration keep a NULL rev until they next change (a first read of a
-- workspace reads all its candidates, whatever their rev). The column has no stored default to write:
-- adding it rewrites nothing.
ALTER TABLE drawers ADD COLUMN IF NOT EXISTS rev xid8;
ALTER TABLE drawers ALTER COLUMN rev SET DEFAULT pg_current_xact_id();

-- The comparison is in the function, by column name, not in the trigger's WHEN: a WHEN naming
-- ``embedding`` would tie the trigger to that column, and `palace reembed` renames it to
-- ``embedding_old`` and drops it. Only such changes stamp the row: an update of anything else (access
-- counts, importance) stays heap-only when it can.
CREATE OR REPLACE FUNCTION palace_drawer_rev() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state IS DISTINCT FROM OLD.state OR NEW.deleted_at IS DISTINCT FROM OLD.deleted_at
       OR NEW.filed_at IS DISTINCT FROM OLD.filed_at OR NEW.dedup_bands IS DISTINCT FROM OLD.dedup_bands
       OR NEW.embedding IS DISTINCT FROM OLD.embedding THEN
        NEW.rev := pg_current_xact_id();
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS drawers_rev ON drawers;
CREATE TRIGGER drawers_rev BEFORE UPDATE ON drawers FOR EACH ROW EXECUTE FUNCTION palace_drawer_rev();

CREATE INDEX IF NOT EXISTS drawers_rev ON drawers (workspace_id, rev) WHERE rev IS NOT NULL;
