-- Palace graph: a per-workspace version that changes whenever the wing/room layout of its live
-- drawers may have changed, so the taxonomy aggregate (a GROUP BY over every drawer of the
-- workspace) can be cached in each api/MCP process and reused until the version moves. Reading
-- the version is one primary-key lookup.
--
-- The triggers fire only on what changes the layout: new or removed drawers, and updates of wing,
-- room, state (merged drawers leave the taxonomy) or deleted_at (soft deletes). Embedding and
-- access-stat updates leave it alone. Within one transaction a workspace's counter is bumped once
-- (a transaction-local marker), so a session of many drawers costs one upsert, not one per drawer.
-- The triggers are deferred to commit: the counter row's lock is then taken after every insert of
-- the transaction, so two transactions filing the same drawer id cannot deadlock on it (one waiting
-- for the other's drawer row while holding the counter), and it is held only for the commit itself.

CREATE TABLE palace_graph_versions (
    workspace_id  text        NOT NULL,
    version       bigint      NOT NULL DEFAULT 1,
    changed_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id)
);

ALTER TABLE palace_graph_versions ENABLE ROW LEVEL SECURITY;
ALTER TABLE palace_graph_versions FORCE ROW LEVEL SECURITY;
CREATE POLICY workspace_isolation ON palace_graph_versions AS PERMISSIVE FOR ALL TO palace_app
    USING (workspace_id = current_setting('palace.workspace_id', true))
    WITH CHECK (workspace_id = current_setting('palace.workspace_id', true));
CREATE POLICY maintenance_all ON palace_graph_versions AS PERMISSIVE FOR ALL TO palace_maintenance
    USING (true) WITH CHECK (true);
GRANT SELECT, INSERT, UPDATE, DELETE ON palace_graph_versions TO palace_app, palace_maintenance;

CREATE FUNCTION palace_graph_bump() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    ws text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        ws := OLD.workspace_id;
    ELSE
        ws := NEW.workspace_id;
    END IF;
    IF current_setting('palace.graph_bumped', true) IS DISTINCT FROM ws THEN
        INSERT INTO palace_graph_versions AS v (workspace_id) VALUES (ws)
        ON CONFLICT (workspace_id) DO UPDATE SET version = v.version + 1, changed_at = now();
        PERFORM set_config('palace.graph_bumped', ws, true);
    END IF;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER drawers_graph_insert AFTER INSERT ON drawers
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION palace_graph_bump();
CREATE CONSTRAINT TRIGGER drawers_graph_delete AFTER DELETE ON drawers
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION palace_graph_bump();
CREATE CONSTRAINT TRIGGER drawers_graph_update AFTER UPDATE OF wing, room, state, deleted_at ON drawers
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (OLD.wing IS DISTINCT FROM NEW.wing OR OLD.room IS DISTINCT FROM NEW.room
          OR (OLD.state = 'merged') IS DISTINCT FROM (NEW.state = 'merged')
          OR (OLD.deleted_at IS NULL) IS DISTINCT FROM (NEW.deleted_at IS NULL))
    EXECUTE FUNCTION palace_graph_bump();

-- An agent's diary (wing 'diary', hall = the agent), newest first by when each entry was written
-- (filing order can differ: ingest handles concurrent events in parallel).
CREATE INDEX drawers_diary ON drawers (workspace_id, hall, occurred_at DESC NULLS LAST, filed_at DESC)
    WHERE wing = 'diary' AND deleted_at IS NULL;

-- The taxonomy aggregate, read from the index alone (an index-only scan once autovacuum has marked
-- the pages all-visible) instead of visiting every wide drawer row of the workspace.
CREATE INDEX drawers_live_layout ON drawers (workspace_id, wing, room)
    WHERE deleted_at IS NULL AND state <> 'merged';
