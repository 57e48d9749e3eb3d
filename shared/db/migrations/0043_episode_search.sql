-- Episodes returned by recall (issue 14, point 1: `include_episodes` on /v1/search, memory_search, the SDK
-- and `palace search --episodes`). shared.db.episodes.search_episodes ranks a workspace's built episodes
-- by cosine exactly, among at most its most recently completed `scan_max`: this index hands it exactly
-- those rows in that order, so the scan is bounded by the cap and never walks other workspaces'
-- episodes, pending ones, or ones without an embedding. One episode per session, expired after
-- PALACE_EPISODE_TTL_DAYS, keeps a workspace's live episodes far fewer than its drawers.
CREATE INDEX IF NOT EXISTS episodes_searchable
    ON episodes (workspace_id, completed_at DESC NULLS LAST, id)
 WHERE status = 'ready' AND embedding IS NOT NULL;
