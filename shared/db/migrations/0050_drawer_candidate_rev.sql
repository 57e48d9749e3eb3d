-- Cluster keeps the vectors and wording bands of small workspaces in memory (shared.memory.neighbours)
-- and reads back only the drawers that changed since it last looked. ``rev`` is the id of the
-- transaction that last changed whether a drawer is a candidate (state, deleted_at, embedding), its
-- vector, its wording bands or when it was filed; a read asks for the rows stamped by transactions its
-- previous read could not see (shared.db.clustering.DELTA_SQL), so it misses no change.
-- Rows written before this migration keep a NULL rev until they next change (a first read of a
-- workspace reads all its candidates, whatever their rev). The column has no stored default to write:
-- adding it rewrites nothing.
ALTER TABLE drawers ADD COLUMN IF NOT EXISTS rev xid8;
ALTER TABLE drawers ALTER COLUMN rev SET DEFAULT pg_current_xact_id();

CREATE OR REPLACE FUNCTION palace_drawer_rev() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.rev := pg_current_xact_id();
    RETURN NEW;
END
$$;

-- Only such changes stamp the row: an update of anything else (access counts, importance) stays
-- heap-only when it can.
DROP TRIGGER IF EXISTS drawers_rev ON drawers;
CREATE TRIGGER drawers_rev BEFORE UPDATE ON drawers FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.deleted_at IS DISTINCT FROM NEW.deleted_at
          OR OLD.embedding IS DISTINCT FROM NEW.embedding OR OLD.filed_at IS DISTINCT FROM NEW.filed_at
          OR OLD.dedup_bands IS DISTINCT FROM NEW.dedup_bands)
    EXECUTE FUNCTION palace_drawer_rev();

CREATE INDEX IF NOT EXISTS drawers_rev ON drawers (workspace_id, rev) WHERE rev IS NOT NULL;
