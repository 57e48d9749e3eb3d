-- The statistics of 0059 are built by the next ANALYZE of drawers, which in a large settled table can be
-- days away (autovacuum waits for a tenth of it to change): until then the planner still takes a room for
-- three independent guesses. Build them now: ANALYZE reads a fixed-size sample of rows, whatever the
-- table's size, and summarises only these three columns.
ANALYZE drawers (workspace_id, wing, room);
