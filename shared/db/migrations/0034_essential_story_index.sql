-- The essential story (L1 of wake_up: a workspace's most important drawers) read from an index again,
-- without giving up HOT decay (migration 0020 dropped drawers_importance so that decay's daily rewrite
-- of importance touches no index).
--
-- The index orders an upper bound of importance that decay rarely changes: importance_peak. A trigger
-- keeps importance <= importance_peak <= PEAK_SLACK x importance after every write of importance:
-- a rise (classification, curation, a revert) raises the peak with it, and a fall leaves it alone
-- until importance has dropped below peak / PEAK_SLACK, when the peak comes down to it. So a decay
-- step leaves every indexed value as it was (a HOT update) except on the rare step where a drawer's
-- peak comes down, and a reader walking the index by peak can stop as soon as the next peak is below
-- the importance of the last drawer it keeps (shared/db/layers.py): peaks bound importances from above.

ALTER TABLE drawers ADD COLUMN IF NOT EXISTS importance_peak real NOT NULL DEFAULT 3.0;

-- Existing drawers: their peak is their importance (one pass, at upgrade time, before the trigger).
UPDATE drawers SET importance_peak = importance WHERE importance_peak IS DISTINCT FROM importance;

CREATE OR REPLACE FUNCTION palace_importance_peak() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    -- PEAK_SLACK = 1.5: a drawer decaying by 0.98 a day gets one non-HOT step in about twenty.
    IF TG_OP = 'INSERT' THEN
        NEW.importance_peak := NEW.importance;
    ELSIF NEW.importance > OLD.importance_peak OR NEW.importance * 1.5 < OLD.importance_peak THEN
        NEW.importance_peak := NEW.importance;
    ELSE
        NEW.importance_peak := OLD.importance_peak;
    END IF;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS drawers_importance_peak ON drawers;
CREATE TRIGGER drawers_importance_peak BEFORE INSERT OR UPDATE OF importance, importance_peak ON drawers
    FOR EACH ROW EXECUTE FUNCTION palace_importance_peak();

-- The order of the essential story: importance (bounded by its peak), then the most recent, then the id.
CREATE INDEX IF NOT EXISTS drawers_essential
    ON drawers (workspace_id, importance_peak DESC, (coalesce(occurred_at, filed_at)) DESC, id)
    WHERE deleted_at IS NULL AND state <> 'merged';
