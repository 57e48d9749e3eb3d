-- Full-text candidates chosen by how rare the query's words are in the workspace. In a large workspace
-- a plain OR of the query's lexemes matches a large share of it, so search asked for two lexemes
-- together (an OR of pairs); but a pair of common words ("caroline" and "support" in a workspace about
-- Caroline) still matches thousands of drawers, and GIN must evaluate the whole query for each of them
-- before any LIMIT applies: a cost that grew with the workspace. The lexicon lists, per workspace past
-- exact search, the lexemes that occur in a sizeable share of its drawers (ts_stat, refreshed by
-- maintain). A lexeme absent from it is rare there: its matches are few and are the ones BM25 values
-- most, so when a query holds one, the candidates are the drawers holding any of its rare lexemes and
-- the common words only weigh in the ranking. No rare lexeme in the query: the OR of pairs as before.
ALTER TABLE vector_indexes ADD COLUMN IF NOT EXISTS lexicon_at timestamptz;

CREATE TABLE workspace_lexicon (
    workspace_id  text    NOT NULL REFERENCES vector_indexes (workspace_id) ON DELETE CASCADE,
    lexeme        text    NOT NULL,
    ndoc          integer NOT NULL,
    PRIMARY KEY (workspace_id, lexeme)
);

ALTER TABLE workspace_lexicon ENABLE ROW LEVEL SECURITY;
ALTER TABLE workspace_lexicon FORCE ROW LEVEL SECURITY;
CREATE POLICY workspace_isolation ON workspace_lexicon AS PERMISSIVE FOR ALL TO palace_app
    USING (workspace_id = current_setting('palace.workspace_id', true))
    WITH CHECK (workspace_id = current_setting('palace.workspace_id', true));
CREATE POLICY maintenance_all ON workspace_lexicon AS PERMISSIVE FOR ALL TO palace_maintenance
    USING (true) WITH CHECK (true);
GRANT SELECT ON workspace_lexicon TO palace_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON workspace_lexicon TO palace_maintenance;

-- The full-text query of a search, from the query's lexemes (first max_terms, in order):
--   exact (a workspace small enough to match everything) or fewer than two lexemes: any of them;
--   else, once the workspace has a lexicon and the query holds lexemes missing from it: any of those;
--   else: any two of them together.
-- SECURITY INVOKER: the lexicon is read under the caller's row-level security.
CREATE FUNCTION palace_text_query(ws text, lexemes text[], exact boolean)
RETURNS tsquery
LANGUAGE sql STABLE
SET search_path = pg_catalog, public
AS $$
    WITH l AS (SELECT DISTINCT x AS l FROM unnest(lexemes) x),
    rare AS (
        SELECT l.l FROM l
         WHERE EXISTS (SELECT 1 FROM public.vector_indexes v WHERE v.workspace_id = ws AND v.lexicon_at IS NOT NULL)
           AND NOT EXISTS (SELECT 1 FROM public.workspace_lexicon x WHERE x.workspace_id = ws AND x.lexeme = l.l)
    )
    SELECT CASE
        WHEN exact OR (SELECT count(*) FROM l) < 2 THEN (SELECT string_agg(format('%L', l), ' | ') FROM l)
        WHEN EXISTS (SELECT 1 FROM rare) THEN (SELECT string_agg(format('%L', l), ' | ') FROM rare)
        ELSE (SELECT string_agg(format('(%L & %L)', a.l, b.l), ' | ') FROM l a JOIN l b ON a.l < b.l)
    END::tsquery
$$;
GRANT EXECUTE ON FUNCTION palace_text_query(text, text[], boolean) TO palace_app, palace_maintenance;
