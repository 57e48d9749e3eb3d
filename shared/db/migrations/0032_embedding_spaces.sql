-- Embedding spaces: which model and dimension the vectors in drawers, episodes and entities come from.
-- `palace reembed` (shared/reembed.py) builds a new space beside the active one, in columns named
-- embedding_next filled in batches while the pipeline runs, then switches in one short transaction that
-- renames the columns (embedding → embedding_old, embedding_next → embedding), so every statement that
-- reads `embedding` reads the new space from that commit on. Services follow the active space
-- (shared/adapters/space_embedder.py) instead of trusting their own PALACE_EMBED_* settings.
--
-- No workspace data here (one row per space, for every workspace alike): no row-level security, and
-- the services' role may only read it; the re-embed runs as the login role that owns the tables.
CREATE TABLE embedding_spaces (
    id            text        PRIMARY KEY,
    provider      text,                   -- NULL: the first space, whatever PALACE_EMBED_* configure
    model         text,
    base_url      text,
    dim           integer     NOT NULL CHECK (dim > 0),
    state         text        NOT NULL CHECK (state IN ('building', 'active', 'retired')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    activated_at  timestamptz,
    retired_at    timestamptz
);
CREATE UNIQUE INDEX embedding_spaces_one_active ON embedding_spaces (state) WHERE state = 'active';
CREATE UNIQUE INDEX embedding_spaces_one_building ON embedding_spaces (state) WHERE state = 'building';
INSERT INTO embedding_spaces (id, dim, state, activated_at) VALUES ('initial', {embed_dim}, 'active', now());
REVOKE INSERT, UPDATE, DELETE ON embedding_spaces FROM palace_app;
GRANT SELECT ON embedding_spaces TO palace_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON embedding_spaces TO palace_maintenance;

-- The cache is keyed by model, so a re-embed can fill the new model's entries beside the old ones:
-- its vectors carry no fixed dimension any more.
ALTER TABLE embedding_cache ALTER COLUMN embedding TYPE vector;
-- Type centroids are means of drawer vectors, recomputed by classify from the active space; untyped,
-- the switch only clears them.
ALTER TABLE type_centroids ALTER COLUMN centroid TYPE vector;

-- While a space builds, a vector of the active space that changes (re-embedded after a forget, a
-- reverted decision, an entity renamed) makes the row's new-space vector stale: a trigger that
-- `palace reembed` installs clears it, so the catch-up pass embeds the row again.
CREATE FUNCTION palace_embedding_next_stale() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.embedding_next := NULL;
    RETURN NEW;
END
$$;
