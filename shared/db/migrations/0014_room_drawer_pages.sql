-- The palace browser lists a room's live drawers newest first, a page at a time (keyset on
-- filed_at, id). Without an index whose order is the page's order, every page would read and sort
-- the whole room; with it, a page is an index range of at most the page size.
CREATE INDEX IF NOT EXISTS drawers_room_pages ON drawers (workspace_id, wing, room, filed_at DESC, id DESC)
    WHERE deleted_at IS NULL AND state <> 'merged';
