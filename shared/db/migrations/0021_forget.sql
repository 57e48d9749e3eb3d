-- Forget (issue 16): tombstones the pipeline checks, an audit of every forget, and the indexes that
-- find one user's, agent's or session's rows without scanning a workspace.

-- What was forgotten: (kind, value) = ('workspace', '*'), ('user', id), ('agent', id), ('session', id)
-- or ('drawer', id). Ingest, enrich and the knowledge-graph stage look these up (primary key) in the
-- transaction that would write, so an event still in flight, redelivered or re-driven from the DLQ
-- never re-creates what was forgotten. Identifiers only, never content.
CREATE TABLE forget_tombstones (
    workspace_id  text        NOT NULL,
    kind          text        NOT NULL CHECK (kind IN ('workspace', 'user', 'agent', 'session', 'drawer')),
    value         text        NOT NULL,
    forget_id     text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, kind, value)
);

-- Who asked to forget what, and how much each store lost: counts only, never content.
CREATE TABLE forget_audit (
    workspace_id  text        NOT NULL,
    id            text        NOT NULL,
    requested_by  text        NOT NULL,
    scope_kind    text        NOT NULL,
    scope_value   text        NOT NULL,
    status        text        NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'done', 'failed')),
    counts        jsonb       NOT NULL DEFAULT '{}',
    started_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    PRIMARY KEY (workspace_id, id)
);

CREATE INDEX IF NOT EXISTS sessions_user ON sessions (workspace_id, user_id) WHERE user_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS sessions_agent ON sessions (workspace_id, agent_id) WHERE agent_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS drawers_user ON drawers (workspace_id, user_id) WHERE user_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS drawers_agent ON drawers (workspace_id, agent_id) WHERE agent_id IS NOT NULL;
-- A drawer of the same text elsewhere keeps an embedding-cache entry alive; --verify looks hashes up.
CREATE INDEX IF NOT EXISTS drawers_content_hash ON drawers (workspace_id, content_hash);
CREATE INDEX IF NOT EXISTS messages_content_hash ON messages (workspace_id, content_hash);
CREATE INDEX IF NOT EXISTS drawers_cluster ON drawers (workspace_id, cluster_id) WHERE cluster_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS triples_source_drawer ON triples (workspace_id, source_drawer)
    WHERE source_drawer IS NOT NULL;
CREATE INDEX IF NOT EXISTS episodes_agent ON episodes (workspace_id, agent_id) WHERE agent_id IS NOT NULL;

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['forget_tombstones', 'forget_audit']
    LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format(
            'CREATE POLICY workspace_isolation ON %I AS PERMISSIVE FOR ALL TO palace_app '
            'USING (workspace_id = current_setting(''palace.workspace_id'', true)) '
            'WITH CHECK (workspace_id = current_setting(''palace.workspace_id'', true))', t);
        EXECUTE format(
            'CREATE POLICY maintenance_all ON %I AS PERMISSIVE FOR ALL TO palace_maintenance '
            'USING (true) WITH CHECK (true)', t);
    END LOOP;
END
$$;
GRANT SELECT, INSERT, UPDATE, DELETE ON forget_tombstones, forget_audit TO palace_app, palace_maintenance;
