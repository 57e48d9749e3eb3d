-- Tenant isolation in the database, not only in code.
--
-- Services connect, then switch to the role palace_app (PALACE_DB_ROLE) for the life of the
-- connection, and every transaction names its workspace with
--     SELECT set_config('palace.workspace_id', <workspace>, true)   -- local to the transaction
-- Row-level security then limits every read and write to that workspace, so a query that forgets
-- its `workspace_id = ...` filter still cannot see, change or create another workspace's rows.
-- With no workspace set, palace_app sees nothing at all.
--
-- Cross-workspace jobs (the maintenance sweeps, operators' tools) switch to palace_maintenance
-- for one transaction (SET LOCAL ROLE), which has an explicit allow-all policy: no BYPASSRLS
-- attribute is needed, so this works on managed PostgreSQL too. Roles are cluster-wide, hence the
-- IF NOT EXISTS guards. RLS is FORCEd, so even the tables' owner gets no rows without one of the
-- two roles; only a superuser (the embedded stack's, or an operator's psql) bypasses it.
--
-- A later migration that adds a workspace table must repeat the ENABLE/FORCE/POLICY block
-- (tests/integration/test_isolation_int.py fails otherwise).

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'palace_app') THEN
        CREATE ROLE palace_app NOLOGIN NOBYPASSRLS;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'palace_maintenance') THEN
        CREATE ROLE palace_maintenance NOLOGIN NOBYPASSRLS;
    END IF;
END
$$;

-- The login role must be a member to SET ROLE (a superuser already may).
GRANT palace_app TO CURRENT_USER;
GRANT palace_maintenance TO CURRENT_USER;

GRANT USAGE ON SCHEMA public TO palace_app, palace_maintenance;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO palace_app, palace_maintenance;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO palace_app, palace_maintenance;
ALTER DEFAULT PRIVILEGES IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO palace_app, palace_maintenance;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO palace_app, palace_maintenance;
-- Bookkeeping tables of the migration runner are read-only for the services.
REVOKE INSERT, UPDATE, DELETE ON schema_migrations, palace_meta FROM palace_app, palace_maintenance;

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['sessions', 'messages', 'drawers', 'drawer_sources', 'embedding_cache',
                             'memory_history', 'episodes', 'entities', 'entity_mentions', 'triples',
                             'identities', 'type_centroids', 'api_keys', 'job_leases']
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

-- Authentication finds a key's workspace before it knows the workspace: the API names the key id
-- it is checking (palace.api_key_id) and may read that one row, nothing else.
CREATE POLICY api_key_lookup ON api_keys AS PERMISSIVE FOR SELECT TO palace_app
    USING (key_id = current_setting('palace.api_key_id', true));

-- Full-text candidates. `@@` is not a leakproof operator, so under a row-level-security policy
-- PostgreSQL may not use it as an index condition: the GIN index would be ignored and every row
-- of the workspace matched one by one (measured: a full workspace scan instead of a bitmap index
-- scan). This function runs as palace_maintenance, whose allow-all policy leaves the planner free
-- to use the index, and enforces the same rule itself: it answers only for the workspace the
-- calling transaction has set, and nothing when none is set.
GRANT CREATE ON SCHEMA public TO palace_maintenance;  -- an owner of a function needs it (ALTER ... OWNER)

CREATE FUNCTION palace_text_candidates(ws text, query tsquery, scan_limit integer, top_n integer)
RETURNS TABLE (id text, text_rank real)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, public
AS $$
    SELECT m.id, ts_rank_cd(m.tsv, query, 1)
      FROM (SELECT d.id, d.tsv FROM public.drawers d
             WHERE d.workspace_id = ws
               AND ws = current_setting('palace.workspace_id', true)
               AND d.tsv @@ query AND d.deleted_at IS NULL AND d.state <> 'merged'
             LIMIT scan_limit) m
     ORDER BY 2 DESC
     LIMIT top_n
$$;
ALTER FUNCTION palace_text_candidates(text, tsquery, integer, integer) OWNER TO palace_maintenance;
REVOKE ALL ON FUNCTION palace_text_candidates(text, tsquery, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION palace_text_candidates(text, tsquery, integer, integer) TO palace_app, palace_maintenance;
