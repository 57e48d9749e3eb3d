-- Memory lifecycle (issue 16): the indexes the batched maintenance jobs walk.
--
-- Every job works in short transactions of a few hundred rows each, found through an index, so none
-- of them scans or locks a whole table while traffic runs beside it.
--
-- The archive is the drawers table itself: a pruned drawer gets deleted_at (every search path,
-- pipeline stage and SQL function already excludes deleted_at IS NOT NULL), keeping its embedding,
-- provenance (drawer_sources) and classification untouched, so `palace restore` brings it back exactly
-- by clearing the mark. The expire job ends archived drawers after PALACE_ARCHIVE_RETENTION_DAYS.

-- expire: archived drawers past retention, oldest first (which workspace), then a batch of that workspace.
CREATE INDEX IF NOT EXISTS drawers_archived ON drawers (deleted_at) WHERE deleted_at IS NOT NULL;
-- restore and expiry within one workspace: its archive, oldest first.
CREATE INDEX IF NOT EXISTS drawers_archived_ws ON drawers (workspace_id, deleted_at) WHERE deleted_at IS NOT NULL;

-- expire: episodes past their expiry. The column is in 0001; the guard keeps this migration valid
-- whichever order it meets a migration that (re)declares it.
ALTER TABLE episodes ADD COLUMN IF NOT EXISTS expires_at timestamptz;
CREATE INDEX IF NOT EXISTS episodes_expires ON episodes (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS episodes_expires_ws ON episodes (workspace_id, expires_at) WHERE expires_at IS NOT NULL;

-- Decay rewrites the importance of every old, idle drawer once a day. An update that changes no
-- indexed column and finds room on its page is a HOT update: no index is touched, in particular not
-- the HNSW graph, whose insert (and the vacuum repair of the replaced element) is by far the most
-- expensive part of rewriting a drawer. So importance is in no index (prune walks the primary key
-- instead of this one, its only user), and drawer pages keep room for an updated row version.
DROP INDEX IF EXISTS drawers_importance;
ALTER TABLE drawers SET (fillfactor = 70);
