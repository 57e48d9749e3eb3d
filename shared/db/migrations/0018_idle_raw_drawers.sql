-- maintain's re-drive and give-up sweeps look for raw drawers idle for a while, every minute: only the
-- few drawers in flight are raw, so a partial index of them keeps the sweeps off the rest of the table.
-- Keyed by filed_at, which never changes: a key on updated_at would make every update of a drawer (the
-- embedding, the access stats) a non-HOT update that rewrites every index entry of the row.
CREATE INDEX IF NOT EXISTS drawers_raw_idle ON drawers (filed_at) WHERE state = 'raw' AND deleted_at IS NULL;
