-- Names and aliases of entities, keyed the way the inline linker reads text (shared.memory.kg.match_key:
-- the name's words, case-folded, space-joined) and indexed by their anchor (anchor_word: the longest
-- of those words), so linking new drawers is one index probe by the distinct words in them, never a
-- scan of the workspace's entities. Written with the entity
-- (shared.db.kg.ensure_entities, shared.db.episodes.upsert_entities); a merge (entity dedup) adds the
-- merged name as an alias of the survivor.
CREATE TABLE entity_aliases (
    workspace_id  text        NOT NULL,
    alias_key     text        NOT NULL,
    anchor        text        NOT NULL,   -- the longest word of alias_key (the first of equals)
    entity_id     text        NOT NULL,
    alias         text        NOT NULL,   -- as written
    cased         boolean     NOT NULL,   -- written with a capital: a one-word match must be too
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, alias_key, entity_id),
    FOREIGN KEY (workspace_id, entity_id) REFERENCES entities ON DELETE CASCADE
);
CREATE INDEX entity_aliases_anchor ON entity_aliases (workspace_id, anchor);
CREATE INDEX entity_aliases_entity ON entity_aliases (workspace_id, entity_id);

ALTER TABLE entity_aliases ENABLE ROW LEVEL SECURITY;
ALTER TABLE entity_aliases FORCE ROW LEVEL SECURITY;
CREATE POLICY workspace_isolation ON entity_aliases AS PERMISSIVE FOR ALL TO palace_app
    USING (workspace_id = current_setting('palace.workspace_id', true))
    WITH CHECK (workspace_id = current_setting('palace.workspace_id', true));
CREATE POLICY maintenance_all ON entity_aliases AS PERMISSIVE FOR ALL TO palace_maintenance
    USING (true) WITH CHECK (true);

-- Existing entities whose names are plain words, for which lower-casing and collapsing spaces is
-- exactly match_key (and the anchor its longest word); any other name is keyed when its entity is
-- next written.
INSERT INTO entity_aliases (workspace_id, alias_key, anchor, entity_id, alias, cased)
SELECT e.workspace_id, k.key,
       (SELECT w FROM unnest(string_to_array(k.key, ' ')) WITH ORDINALITY AS u(w, i)
         ORDER BY length(w) DESC, i LIMIT 1),
       e.id, e.name, e.name <> lower(e.name)
  FROM entities e
 CROSS JOIN LATERAL (SELECT lower(regexp_replace(btrim(e.name), '\s+', ' ', 'g')) AS key) k
 WHERE e.name ~ '^[[:alnum:][:space:]]+$' AND btrim(e.name) <> ''
ON CONFLICT DO NOTHING;
