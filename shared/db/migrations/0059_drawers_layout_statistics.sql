-- Where a drawer is filed (workspace, wing, room) is one choice, not three: a wing and a room belong to a
-- workspace. Without statistics over the three together the planner multiplies their selectivities as if
-- independent, and in a table holding many workspaces it took a room of thousands of drawers for one of a
-- few rows: a page of the palace browser then read and sorted the whole room (a bitmap scan of
-- drawers_live_layout and a Sort) instead of reading one page of drawers_room_pages. The combinations'
-- most common values and the columns' dependencies give it the room's real size. ANALYZE (autovacuum's
-- too) keeps them.
CREATE STATISTICS IF NOT EXISTS drawers_layout (dependencies, mcv) ON workspace_id, wing, room FROM drawers;
