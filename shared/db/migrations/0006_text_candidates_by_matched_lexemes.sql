-- Full-text candidates ordered by how many of the query's lexemes a drawer holds (then the shorter
-- drawer), not by ts_rank_cd. Recall re-scores every candidate with BM25 afterwards, so this order only
-- decides which ~100 matches become candidates, and it chose as well (LoCoMo-dev through
-- bench/ranking_lab.py: turn R@10 0.800 vs 0.801, session any@5 0.924 both), while ts_rank_cd cost ~20 µs
-- a matching row: 8 of the 11 ms a search spent in PostgreSQL when a query named a speaker and so
-- matched half of the workspace. length(tsv) - length(ts_delete(tsv, lexemes)) counts the lexemes of
-- the query a drawer holds, in C, without ranking positions. Same security rule as in 0003.
DROP FUNCTION IF EXISTS palace_text_candidates(text, tsquery, integer, integer);

CREATE FUNCTION palace_text_candidates(ws text, query tsquery, lexemes text[], scan_limit integer, top_n integer)
RETURNS TABLE (id text, matched integer)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, public
AS $$
    SELECT m.id, length(m.tsv) - length(ts_delete(m.tsv, lexemes))
      FROM (SELECT d.id, d.tsv FROM public.drawers d
             WHERE d.workspace_id = ws
               AND ws = current_setting('palace.workspace_id', true)
               AND d.tsv @@ query AND d.deleted_at IS NULL AND d.state <> 'merged'
             LIMIT scan_limit) m
     ORDER BY 2 DESC, length(m.tsv), m.id
     LIMIT top_n
$$;
ALTER FUNCTION palace_text_candidates(text, tsquery, text[], integer, integer) OWNER TO palace_maintenance;
REVOKE ALL ON FUNCTION palace_text_candidates(text, tsquery, text[], integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION palace_text_candidates(text, tsquery, text[], integer, integer)
    TO palace_app, palace_maintenance;
