-- Full-text candidates scoped to the workspace by the index itself. The GIN index of 0001 knew nothing of
-- workspaces: a query's lexemes matched every tenant's drawers, the bitmap of all of them was built, and
-- only then were the other tenants' rows thrown away, so a small workspace in a big table paid for the
-- whole table (bench/search.py --scale: the 1k-drawer workspace's search cost more than the 100k one's).
-- Each drawer's index entry now also holds one lexeme naming its workspace ('w' || md5(workspace_id): hex
-- only, so it cannot collide with a word or need quoting), and every full-text lookup ANDs the query with
-- it: GIN intersects the posting lists, so the work follows the workspace's matches, not the table's.
-- No column is rewritten (an expression index), and the drawer's own tsv (BM25, the speaker signal) is
-- unchanged.
CREATE INDEX IF NOT EXISTS drawers_tsv_ws
    ON drawers USING gin ((tsv || array_to_tsvector(ARRAY['w' || md5(workspace_id)])));
DROP INDEX IF EXISTS drawers_tsv_gin;

-- Same contract and security rule as 0006; only the match goes through the scoped index. The workspace
-- comparison is written so that it cannot use a btree index (`|| ''`): the GIN lookup already keeps to
-- the workspace, and ANDing its bitmap with a scan of every row of a big workspace only cost time. It
-- still filters every row, so nothing of another workspace can come back.
DROP FUNCTION IF EXISTS palace_text_candidates(text, tsquery, text[], integer, integer);

CREATE FUNCTION palace_text_candidates(ws text, query tsquery, lexemes text[], scan_limit integer, top_n integer)
RETURNS TABLE (id text, matched integer)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, public
AS $$
    SELECT m.id, length(m.tsv) - length(ts_delete(m.tsv, lexemes))
      FROM (SELECT d.id, d.tsv FROM public.drawers d
             WHERE (d.tsv || array_to_tsvector(ARRAY['w' || md5(d.workspace_id)]))
                   @@ (query && ('w' || md5(ws))::tsquery)
               AND d.workspace_id || '' = ws
               AND ws = current_setting('palace.workspace_id', true)
               AND d.deleted_at IS NULL AND d.state <> 'merged'
             LIMIT scan_limit) m
     ORDER BY 2 DESC, length(m.tsv), m.id
     LIMIT top_n
$$;
ALTER FUNCTION palace_text_candidates(text, tsquery, text[], integer, integer) OWNER TO palace_maintenance;
REVOKE ALL ON FUNCTION palace_text_candidates(text, tsquery, text[], integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION palace_text_candidates(text, tsquery, text[], integer, integer)
    TO palace_app, palace_maintenance;
