-- palace_text_query (0037) in PL/pgSQL, with the same body and result. A LANGUAGE sql function that
-- cannot be inlined (it has a SET clause) plans its body again on every call, and search calls it once
-- per query: planning was most of its cost. PL/pgSQL keeps the plan for the life of the connection.
CREATE OR REPLACE FUNCTION palace_text_query(ws text, lexemes text[], exact boolean)
RETURNS tsquery
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, public
AS $$
BEGIN
    RETURN (
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
        END::tsquery);
END
$$;
