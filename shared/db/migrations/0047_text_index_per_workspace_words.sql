-- Full-text lookups that read the workspace's posting lists, not the table's.
--
-- The index of 0036 held each drawer's lexemes as they are, plus one lexeme naming its workspace, and a
-- lookup ANDed the query with that lexeme. GIN then read the whole posting list of every query word across
-- all tenants before the AND kept this workspace's rows: in the 1M-drawer bench a common name ('nate') is in
-- 161,616 drawers of the table and 15,984 of the 100k-drawer workspace, so a question of four common
-- words spent most of its lookup in other tenants' postings (the slowest questions, several tens of ms).
--
-- Now every lexeme is indexed under its workspace: 'cadb51b5.nate' (the first 8 hex digits of
-- md5(workspace_id), a dot, the lexeme). A word's posting list holds the workspace's drawers only. Two
-- workspaces whose prefixes collide only share postings: the lookup still filters every row by its
-- workspace, so nothing of another tenant comes back. The drawer's own tsv (BM25, the speaker signal) is
-- unchanged; no column is rewritten.
CREATE FUNCTION palace_ws_lexemes(ws text, tsv tsvector) RETURNS tsvector
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN pg_catalog.array_to_tsvector(ARRAY(
    SELECT pg_catalog.left(pg_catalog.md5(ws), 8) OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) l
      FROM pg_catalog.unnest(pg_catalog.tsvector_to_array(tsv)) l));

-- The same prefix on each lexeme of a query: a tsquery's text quotes every lexeme ('it''s'), so the
-- prefix goes after each opening quote; operators, weights and prefix marks stay where they were.
CREATE FUNCTION palace_ws_tsquery(ws text, query tsquery) RETURNS tsquery
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN pg_catalog.regexp_replace(query::text, '''((?:[^'']|'''')*)''',
                                 '''' OPERATOR(pg_catalog.||) pg_catalog.left(pg_catalog.md5(ws), 8)
                                      OPERATOR(pg_catalog.||) '.\1''', 'g')::tsquery;

CREATE INDEX IF NOT EXISTS drawers_ws_lexemes ON drawers USING gin (palace_ws_lexemes(workspace_id, tsv));
DROP INDEX IF EXISTS drawers_tsv_ws;

-- The same function, contract and plan as 0046, with its match through the new index. The services of
-- the previous release call it by the same name and arguments, so a rolling upgrade needs no overload.
CREATE OR REPLACE FUNCTION palace_text_candidates(ws text, query tsquery, lexemes text[], scan_limit integer,
                                                  top_n integer)
RETURNS TABLE (id text, matched integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, public
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    SELECT m.id, length(m.tsv) - length(ts_delete(m.tsv, lexemes))
      FROM (SELECT d.id, d.tsv FROM public.drawers d
             WHERE public.palace_ws_lexemes(d.workspace_id, d.tsv) @@ public.palace_ws_tsquery(ws, query)
               AND d.workspace_id || '' = ws
               AND ws = current_setting('palace.workspace_id', true)
               AND d.deleted_at IS NULL AND d.state <> 'merged'
             LIMIT scan_limit) m
     ORDER BY 2 DESC, length(m.tsv), m.id
     LIMIT top_n;
END
$$;
