-- Vector search scoped by tenant. pgvector 0.6 filters an HNSW walk by workspace only *after* the walk,
-- so one index shared by every workspace gave a 50k-drawer workspace in a 1M-drawer table about ten
-- of its own neighbours. Instead: a workspace small enough is scanned exactly (its rows through the
-- primary key, distances computed inline), and a workspace past PALACE_VECTOR_INDEX_MIN_DRAWERS gets
-- an HNSW index of its own (partial, WHERE workspace_id = ...), built concurrently by maintain on
-- request and used by search once ready. The shared index goes: it served no workspace well, and
-- every drawer paid for inserting into it (twice, with the classification update).
DROP INDEX IF EXISTS drawers_embedding_hnsw;

CREATE TABLE vector_indexes (
    workspace_id  text        PRIMARY KEY,
    index_name    text        NOT NULL,
    state         text        NOT NULL DEFAULT 'wanted' CHECK (state IN ('wanted', 'building', 'ready', 'failed')),
    drawers       integer     NOT NULL,   -- live drawers when requested
    requested_at  timestamptz NOT NULL DEFAULT now(),
    ready_at      timestamptz,
    error         text
);

ALTER TABLE vector_indexes ENABLE ROW LEVEL SECURITY;
ALTER TABLE vector_indexes FORCE ROW LEVEL SECURITY;
CREATE POLICY workspace_isolation ON vector_indexes AS PERMISSIVE FOR ALL TO palace_app
    USING (workspace_id = current_setting('palace.workspace_id', true))
    WITH CHECK (workspace_id = current_setting('palace.workspace_id', true));
CREATE POLICY maintenance_all ON vector_indexes AS PERMISSIVE FOR ALL TO palace_maintenance
    USING (true) WITH CHECK (true);
GRANT SELECT, INSERT, UPDATE, DELETE ON vector_indexes TO palace_app, palace_maintenance;
