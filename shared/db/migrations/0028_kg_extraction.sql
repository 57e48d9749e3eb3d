-- Semantic extraction (enrich, on episodic.created): how sure the extractor was, per sighting.
--
-- A confidence is a running average over the sightings of an entity or a fact, and a sighting is a
-- row keyed by what was read (the drawer), so replaying an episode adds no sighting and moves no
-- average; the average is recomputed from the rows, never incremented.

-- Entities: the average over their extracted mentions. NULL: never extracted (created by the API,
-- or known only through the inline linker, whose mentions carry no confidence).
ALTER TABLE entities ADD COLUMN confidence real;
ALTER TABLE entity_mentions ADD COLUMN confidence real;

-- Every drawer that stated a fact, with when it was said and where: the fact's provenance beyond its
-- first source (triples.source_*), and the sightings its confidence averages over. Goes with its
-- drawer (forget deletes the drawer) and with its fact.
CREATE TABLE triple_evidence (
    workspace_id  text        NOT NULL,
    triple_id     text        NOT NULL,
    drawer_id     text        NOT NULL,
    confidence    real        NOT NULL,
    said_at       timestamptz,
    episode_id    text,
    session_id    text,
    seq           integer,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, triple_id, drawer_id),
    FOREIGN KEY (workspace_id, triple_id) REFERENCES triples ON DELETE CASCADE,
    FOREIGN KEY (workspace_id, drawer_id) REFERENCES drawers ON DELETE CASCADE
);
CREATE INDEX triple_evidence_drawer ON triple_evidence (workspace_id, drawer_id);

ALTER TABLE triple_evidence ENABLE ROW LEVEL SECURITY;
ALTER TABLE triple_evidence FORCE ROW LEVEL SECURITY;
CREATE POLICY workspace_isolation ON triple_evidence AS PERMISSIVE FOR ALL TO palace_app
    USING (workspace_id = current_setting('palace.workspace_id', true))
    WITH CHECK (workspace_id = current_setting('palace.workspace_id', true));
CREATE POLICY maintenance_all ON triple_evidence AS PERMISSIVE FOR ALL TO palace_maintenance
    USING (true) WITH CHECK (true);

