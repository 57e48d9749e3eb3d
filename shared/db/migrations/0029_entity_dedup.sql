-- Entity dedup on entity.upserted (shared/db/entity_dedup.py; the rules in shared/memory/entity_dedup.py).
--
-- A merge never deletes the merged entity: it gets merged_into (its mentions, aliases and facts move
-- to the survivor), so a replayed event that names it again finds it (and the next entity.upserted
-- moves what it gained), lookups by its name reach the survivor, and a revert puts back the very rows
-- the merge changed, from the snapshot kept in entity_merges.

ALTER TABLE entities ADD COLUMN merged_into text;
-- The entities merged into one (forget takes them with their survivor).
CREATE INDEX entities_merged_into ON entities (workspace_id, merged_into) WHERE merged_into IS NOT NULL;

-- The keys an entity is compared by (shared.memory.entity_dedup.dedup_keys: its canonical name, the
-- words of a longer name, the first letters of its name), so finding the candidates of one entity is
-- an index probe by a handful of keys, never a scan of the workspace's entities.
CREATE TABLE entity_keys (
    workspace_id  text NOT NULL,
    key           text NOT NULL,
    entity_id     text NOT NULL,
    PRIMARY KEY (workspace_id, key, entity_id),
    FOREIGN KEY (workspace_id, entity_id) REFERENCES entities ON DELETE CASCADE
);
CREATE INDEX entity_keys_entity ON entity_keys (workspace_id, entity_id);

-- The audit of every merge, with what it changed (snapshot: the merged entity's row, its aliases,
-- mentions and facts before the merge, and what was added to the survivor), so a revert is exact.
CREATE TABLE entity_merges (
    workspace_id  text        NOT NULL,
    id            text        NOT NULL,
    survivor_id   text        NOT NULL,
    merged_id     text        NOT NULL,
    rule          text        NOT NULL,   -- same_name | alias | short_name | operator
    reason        text        NOT NULL,
    evidence      jsonb       NOT NULL DEFAULT '{}',
    snapshot      jsonb       NOT NULL,
    actor         text        NOT NULL,
    event_id      text,
    status        text        NOT NULL DEFAULT 'merged' CHECK (status IN ('merged', 'reverted')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    reverted_at   timestamptz,
    reverted_by   text,
    PRIMARY KEY (workspace_id, id)
);
CREATE INDEX entity_merges_created ON entity_merges (workspace_id, created_at);
-- At most one standing merge of an entity; the follow-up of a replay finds it by the merged id.
CREATE UNIQUE INDEX entity_merges_standing ON entity_merges (workspace_id, merged_id) WHERE status = 'merged';

-- Pairs that look alike without the evidence a merge needs: an operator decides (palace entities).
-- 'kept_apart' (an operator's "different", or a reverted merge) is never merged automatically again.
CREATE TABLE entity_flags (
    workspace_id  text        NOT NULL,
    entity_a      text        NOT NULL,
    entity_b      text        NOT NULL,
    status        text        NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'kept_apart', 'merged')),
    rule          text        NOT NULL,
    reason        text        NOT NULL,
    score         real        NOT NULL DEFAULT 0,
    evidence      jsonb       NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    resolved_by   text,
    PRIMARY KEY (workspace_id, entity_a, entity_b),
    CHECK (entity_a < entity_b)
);
CREATE INDEX entity_flags_status ON entity_flags (workspace_id, status, created_at);

ALTER TABLE entity_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE entity_keys FORCE ROW LEVEL SECURITY;
CREATE POLICY workspace_isolation ON entity_keys AS PERMISSIVE FOR ALL TO palace_app
    USING (workspace_id = current_setting('palace.workspace_id', true))
    WITH CHECK (workspace_id = current_setting('palace.workspace_id', true));
CREATE POLICY maintenance_all ON entity_keys AS PERMISSIVE FOR ALL TO palace_maintenance
    USING (true) WITH CHECK (true);

ALTER TABLE entity_merges ENABLE ROW LEVEL SECURITY;
ALTER TABLE entity_merges FORCE ROW LEVEL SECURITY;
CREATE POLICY workspace_isolation ON entity_merges AS PERMISSIVE FOR ALL TO palace_app
    USING (workspace_id = current_setting('palace.workspace_id', true))
    WITH CHECK (workspace_id = current_setting('palace.workspace_id', true));
CREATE POLICY maintenance_all ON entity_merges AS PERMISSIVE FOR ALL TO palace_maintenance
    USING (true) WITH CHECK (true);

ALTER TABLE entity_flags ENABLE ROW LEVEL SECURITY;
ALTER TABLE entity_flags FORCE ROW LEVEL SECURITY;
CREATE POLICY workspace_isolation ON entity_flags AS PERMISSIVE FOR ALL TO palace_app
    USING (workspace_id = current_setting('palace.workspace_id', true))
    WITH CHECK (workspace_id = current_setting('palace.workspace_id', true));
CREATE POLICY maintenance_all ON entity_flags AS PERMISSIVE FOR ALL TO palace_maintenance
    USING (true) WITH CHECK (true);
