-- Episodes are built once their session's drawers are embedded (enrich), so an episode row now
-- goes through two states:
--   pending: session.stored was seen; the summary, topics and embedding are not built yet;
--   ready:   built from the session's drawers as they were (source_hash names that set).
-- announced_at is set after episodic.created was published, so a crash between the commit and the
-- publish is finished by the next attempt instead of losing the event, and a replay publishes nothing.
ALTER TABLE episodes
    ADD COLUMN status        text        NOT NULL DEFAULT 'ready' CHECK (status IN ('pending', 'ready')),
    ADD COLUMN source_hash   text,         -- hash of the session's drawer ids it was (or is to be) built from
    ADD COLUMN pending_since timestamptz,
    ADD COLUMN announced_at  timestamptz;

-- Episodes built before this migration were announced by the code that built them.
UPDATE episodes SET announced_at = created_at;

-- The enrich sweep's question, "which episodes have waited too long?", reads only unannounced rows.
CREATE INDEX episodes_unannounced ON episodes (pending_since) WHERE announced_at IS NULL;
