-- Entities' mention counts and confidence without a recount (issue 13, point 3: no cost that grows with
-- the workspace). They were recomputed from every mention of the entity after each extraction that named
-- it, and a speaker's entity is named in every session: the recount grew with the workspace (and held
-- the entity's row all that time). Now every change to entity_mentions, whoever makes it (extraction,
-- the inline linker, entity dedup, forget, the lifecycle jobs), leaves a row here from a statement
-- trigger, in its own transaction: append-only, so writers of the same entity never wait on each other.
-- ``shared.db.kg.refresh_entities`` consumes an entity's rows and adds them to its counters; maintain's
-- "mentions" job consumes what no extraction did (the linker's). confidence = confidence_sum /
-- confidence_n over the mentions that carry a confidence (the linker's carry none).
ALTER TABLE entities ADD COLUMN IF NOT EXISTS confidence_sum double precision NOT NULL DEFAULT 0;
ALTER TABLE entities ADD COLUMN IF NOT EXISTS confidence_n integer NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS entity_mention_changes (
    workspace_id    text             NOT NULL,
    entity_id       text             NOT NULL,
    id              bigint           GENERATED ALWAYS AS IDENTITY,
    mentions        integer          NOT NULL,
    confidence_sum  double precision NOT NULL,
    confidence_n    integer          NOT NULL,
    PRIMARY KEY (workspace_id, entity_id, id),
    FOREIGN KEY (workspace_id, entity_id) REFERENCES entities ON DELETE CASCADE
);

ALTER TABLE entity_mention_changes ENABLE ROW LEVEL SECURITY;
ALTER TABLE entity_mention_changes FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS workspace_isolation ON entity_mention_changes;
CREATE POLICY workspace_isolation ON entity_mention_changes AS PERMISSIVE FOR ALL TO palace_app
    USING (workspace_id = current_setting('palace.workspace_id', true))
    WITH CHECK (workspace_id = current_setting('palace.workspace_id', true));
DROP POLICY IF EXISTS maintenance_all ON entity_mention_changes;
CREATE POLICY maintenance_all ON entity_mention_changes AS PERMISSIVE FOR ALL TO palace_maintenance
    USING (true) WITH CHECK (true);

-- One row per entity per statement. A mention deleted with its entity (the foreign key's cascade) leaves
-- nothing: the entity, and so its counters, are gone.
CREATE OR REPLACE FUNCTION palace_mentions_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO entity_mention_changes (workspace_id, entity_id, mentions, confidence_sum, confidence_n)
    SELECT workspace_id, entity_id, count(*), coalesce(sum(confidence::double precision), 0), count(confidence)
      FROM new_rows GROUP BY workspace_id, entity_id;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION palace_mentions_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO entity_mention_changes (workspace_id, entity_id, mentions, confidence_sum, confidence_n)
    SELECT o.workspace_id, o.entity_id, -count(*), -coalesce(sum(o.confidence::double precision), 0),
           -count(o.confidence)
      FROM old_rows o
     WHERE EXISTS (SELECT 1 FROM entities e WHERE e.workspace_id = o.workspace_id AND e.id = o.entity_id)
     GROUP BY o.workspace_id, o.entity_id;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION palace_mentions_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO entity_mention_changes (workspace_id, entity_id, mentions, confidence_sum, confidence_n)
    SELECT workspace_id, entity_id, sum(n)::integer, sum(s), sum(k)::integer
      FROM (SELECT workspace_id, entity_id, 1 AS n, coalesce(confidence, 0)::double precision AS s,
                   (confidence IS NOT NULL)::integer AS k FROM new_rows
            UNION ALL
            SELECT workspace_id, entity_id, -1, -coalesce(confidence, 0)::double precision,
                   -(confidence IS NOT NULL)::integer FROM old_rows) x
     WHERE EXISTS (SELECT 1 FROM entities e WHERE e.workspace_id = x.workspace_id AND e.id = x.entity_id)
     GROUP BY workspace_id, entity_id
    HAVING sum(n) <> 0 OR sum(s) <> 0 OR sum(k) <> 0;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS entity_mentions_inserted ON entity_mentions;
CREATE TRIGGER entity_mentions_inserted AFTER INSERT ON entity_mentions REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION palace_mentions_inserted();
DROP TRIGGER IF EXISTS entity_mentions_deleted ON entity_mentions;
CREATE TRIGGER entity_mentions_deleted AFTER DELETE ON entity_mentions REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION palace_mentions_deleted();
DROP TRIGGER IF EXISTS entity_mentions_updated ON entity_mentions;
CREATE TRIGGER entity_mentions_updated AFTER UPDATE ON entity_mentions
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION palace_mentions_updated();

-- The counters of existing entities, once at upgrade time (one pass over the mentions, hash-joined).
UPDATE entities e SET mention_count = m.n, confidence_sum = m.s, confidence_n = m.k
  FROM (SELECT workspace_id, entity_id, count(*)::integer AS n, coalesce(sum(confidence::double precision), 0) AS s,
               count(confidence)::integer AS k
          FROM entity_mentions GROUP BY workspace_id, entity_id) m
 WHERE e.workspace_id = m.workspace_id AND e.id = m.entity_id
   AND (e.mention_count, e.confidence_sum, e.confidence_n) IS DISTINCT FROM (m.n, m.s, m.k);
