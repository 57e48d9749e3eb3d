-- Full-text candidates at the cost of their rows, not of planning them, nor of the query's most common
-- words.
--
-- 1. palace_text_candidates (0036) in PL/pgSQL, with the same statement and result. As a LANGUAGE sql
--    function with a SET clause it is never inlined, so its statement was planned again on every call,
--    against every index of drawers: about a quarter of its cost at 100k drawers. PL/pgSQL keeps the
--    plan for the life of the connection; the generic plan is forced so that which plan a connection
--    keeps does not depend on the first queries it happened to see (the GIN lookup serves any query:
--    its condition holds the query as a parameter). tests/integration/test_plans_int.py plans it so.
--
-- 2. palace_text_query (0045): a query of common words only (every lexeme in the workspace lexicon)
--    asked for every pair of its lexemes, up to 120 pairs for 16 lexemes, and GIN reads the whole
--    posting list of each word of each pair before any LIMIT applies: tens of ms for five common
--    words. The pairs now come from the pair_terms rarest of them by the lexicon's counts (the query's
--    order breaks ties). Why the rarest: BM25 weighs a word by its rarity, so the drawers that match
--    only the most common words are the ones it ranks lowest; and the function still ranks the rows it
--    finds by how many of all the query's lexemes they hold.
DROP FUNCTION IF EXISTS palace_text_candidates(text, tsquery, text[], integer, integer);

CREATE FUNCTION palace_text_candidates(ws text, query tsquery, lexemes text[], scan_limit integer, top_n integer)
RETURNS TABLE (id text, matched integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, public
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    SELECT m.id, length(m.tsv) - length(ts_delete(m.tsv, lexemes))
      FROM (SELECT d.id, d.tsv FROM public.drawers d
             WHERE (d.tsv || array_to_tsvector(ARRAY['w' || md5(d.workspace_id)]))
                   @@ (query && ('w' || md5(ws))::tsquery)
               AND d.workspace_id || '' = ws
               AND ws = current_setting('palace.workspace_id', true)
               AND d.deleted_at IS NULL AND d.state <> 'merged'
             LIMIT scan_limit) m
     ORDER BY 2 DESC, length(m.tsv), m.id
     LIMIT top_n;
END
$$;
ALTER FUNCTION palace_text_candidates(text, tsquery, text[], integer, integer) OWNER TO palace_maintenance;
REVOKE ALL ON FUNCTION palace_text_candidates(text, tsquery, text[], integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION palace_text_candidates(text, tsquery, text[], integer, integer)
    TO palace_app, palace_maintenance;

-- A new overload: the three-argument function of 0045 stays as it was, for the services of the
-- previous release that a rolling upgrade leaves running beside the migrated schema.
--
-- The full-text query of a search, from the query's lexemes (first max_terms, in order):
--   exact (a workspace small enough to match everything) or fewer than two lexemes: any of them;
--   else, once the workspace has a lexicon and the query holds lexemes missing from it: any of those;
--   else: any two of its pair_terms rarest lexemes together (of all of them before a lexicon exists: no
--   count to choose by, and an exact scan of the workspace, which reads every row, pays nothing for them).
-- SECURITY INVOKER: the lexicon is read under the caller's row-level security.
CREATE FUNCTION palace_text_query(ws text, lexemes text[], exact boolean, pair_terms integer)
RETURNS tsquery
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, public
AS $$
BEGIN
    RETURN (
        WITH l AS (SELECT x AS l, min(o) AS o FROM unnest(lexemes) WITH ORDINALITY u(x, o) GROUP BY x),
        counted AS (
            SELECT l.l, l.o, x.ndoc FROM l
              LEFT JOIN public.workspace_lexicon x ON x.workspace_id = ws AND x.lexeme = l.l
             WHERE EXISTS (SELECT 1 FROM public.vector_indexes v WHERE v.workspace_id = ws AND v.lexicon_at IS NOT NULL)
        ),
        rare AS (SELECT counted.l FROM counted WHERE counted.ndoc IS NULL),
        paired AS (
            SELECT l.l FROM l LEFT JOIN counted c ON c.l = l.l
             ORDER BY c.ndoc NULLS FIRST, l.o
             LIMIT CASE WHEN EXISTS (SELECT 1 FROM counted) THEN greatest(pair_terms, 2) END
        )
        SELECT CASE
            WHEN exact OR (SELECT count(*) FROM l) < 2 THEN (SELECT string_agg(format('%L', l), ' | ') FROM l)
            WHEN EXISTS (SELECT 1 FROM rare) THEN (SELECT string_agg(format('%L', l), ' | ') FROM rare)
            ELSE (SELECT string_agg(format('(%L & %L)', a.l, b.l), ' | ') FROM paired a JOIN paired b ON a.l < b.l)
        END::tsquery);
END
$$;
GRANT EXECUTE ON FUNCTION palace_text_query(text, text[], boolean, integer) TO palace_app, palace_maintenance;
