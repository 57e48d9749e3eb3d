-- Edited messages (shared/memory/revisions.py). A session published again with new words at a position
-- keeps every text that position held: the earlier one moves here, the new one becomes the message's
-- current revision (messages.revision counts them). Before this, the first text stayed in messages while
-- the edited text was filed as a drawer whose raw message was stored nowhere.
-- Read by the session's primary-key range (ingest, browse) and by content hash (forget's proof).
ALTER TABLE messages ADD COLUMN IF NOT EXISTS revision integer NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS message_revisions (
    workspace_id   text        NOT NULL,
    session_id     text        NOT NULL,
    seq            integer     NOT NULL,
    revision       integer     NOT NULL,
    role           text        NOT NULL,
    name           text,
    content        text        NOT NULL,
    content_hash   text        NOT NULL,
    created_at     timestamptz,
    metadata       jsonb       NOT NULL DEFAULT '{}',
    is_noise       boolean     NOT NULL DEFAULT false,
    replaced_at    timestamptz NOT NULL DEFAULT now(),
    replaced_by    text,       -- the event that brought the next revision
    PRIMARY KEY (workspace_id, session_id, seq, revision),
    FOREIGN KEY (workspace_id, session_id) REFERENCES sessions ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS message_revisions_content_hash ON message_revisions (workspace_id, content_hash);

ALTER TABLE message_revisions ENABLE ROW LEVEL SECURITY;
ALTER TABLE message_revisions FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS workspace_isolation ON message_revisions;
CREATE POLICY workspace_isolation ON message_revisions AS PERMISSIVE FOR ALL TO palace_app
    USING (workspace_id = current_setting('palace.workspace_id', true))
    WITH CHECK (workspace_id = current_setting('palace.workspace_id', true));
DROP POLICY IF EXISTS maintenance_all ON message_revisions;
CREATE POLICY maintenance_all ON message_revisions AS PERMISSIVE FOR ALL TO palace_maintenance
    USING (true) WITH CHECK (true);
