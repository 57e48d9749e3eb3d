-- maintain's re-drive and give-up sweeps look for raw drawers idle for a while, every minute: only the
-- few drawers in flight are raw, so a partial index keeps those sweeps off the rest of the table.
CREATE INDEX IF NOT EXISTS drawers_raw_idle ON drawers (updated_at) WHERE state = 'raw' AND deleted_at IS NULL;
