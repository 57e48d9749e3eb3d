-- A sighting (drawer_sources) whose message has been edited since (shared/memory/revisions.py) stays, for
-- provenance and so a forget of the drawer still finds the message and every revision of it, but records the
-- revision it was cut from: NULL while the message at (session, seq) still says the drawer, N once revision N
-- was replaced. A drawer edited away is retired when it has no current sighting left, wherever it was said:
-- that needs no comparison of words (a drawer's id is its normalised text, and a curation UPDATE rewrites its
-- content), and a sighting that went stale in one session never keeps it alive. Read through the primary key
-- (workspace_id, drawer_id, ...) and drawer_sources_session: no index of its own.
ALTER TABLE drawer_sources ADD COLUMN IF NOT EXISTS revision integer;
