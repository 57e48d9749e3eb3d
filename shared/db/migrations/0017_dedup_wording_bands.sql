-- Near-duplicate candidates by wording (shared/memory/dedup.py: MinHash LSH bands keyed by workspace):
-- a GIN lookup of the bands a new drawer shares, instead of an exact scan of every embedding in the
-- workspace for every drawer (a cost that grew with the workspace, quadratic over an ingest).
ALTER TABLE drawers ADD COLUMN IF NOT EXISTS dedup_bands bigint[];
-- fastupdate off: a GIN pending list is scanned linearly by every lookup (up to gin_pending_list_limit of
-- recent entries), which is exactly where a new drawer's twins are; entries go straight into the tree.
CREATE INDEX IF NOT EXISTS drawers_dedup_bands ON drawers USING gin (dedup_bands) WITH (fastupdate = off);
-- Processed drawers filed before the bands existed, for cluster's backfill.
CREATE INDEX IF NOT EXISTS drawers_dedup_bands_missing ON drawers (filed_at)
    WHERE dedup_bands IS NULL AND state = 'processed' AND deleted_at IS NULL;

-- `&&` is not leakproof, so under the workspace policy the planner may not use the GIN index for it
-- (see palace_text_candidates in 0003): the lookup runs as palace_maintenance and enforces the rule
-- itself, answering only for the workspace the calling transaction has set. The bands alone drive the
-- scan (they are keyed by workspace already). PostgreSQL has no statistics that tell how selective a
-- 64-bit hash is (it assumes ~8% of rows for 16 of them, and a capped sequential scan then looks
-- cheaper), so the function allows bitmap scans only: the GIN lookup is the one plan left.
CREATE FUNCTION palace_wording_candidates(ws text, bands bigint[], scan_limit integer)
RETURNS TABLE (id text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, public
SET enable_seqscan = off
SET enable_indexscan = off
AS $$
    WITH c AS MATERIALIZED (
        SELECT d.workspace_id, d.id FROM public.drawers d WHERE d.dedup_bands && bands LIMIT scan_limit)
    SELECT c.id FROM c WHERE c.workspace_id = ws AND ws = current_setting('palace.workspace_id', true)
$$;
ALTER FUNCTION palace_wording_candidates(text, bigint[], integer) OWNER TO palace_maintenance;
REVOKE ALL ON FUNCTION palace_wording_candidates(text, bigint[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION palace_wording_candidates(text, bigint[], integer) TO palace_app, palace_maintenance;
