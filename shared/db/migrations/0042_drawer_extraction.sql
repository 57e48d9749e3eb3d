-- Semantic extraction's second trigger (issue 14, point 2): processed drawers of importance >= 3 that no
-- extractor has read get their entities and facts too, not only the sessions that reach episodic.created.
--
-- Which drawers an extractor has read, and which wait for one, live here and not on drawers: a column of
-- drawers in an index predicate would make every later update of the row (decay's daily importance
-- step among them) a non-HOT one, and importance itself is in no index for that reason (0020, 0034).
-- due_at: classified processed with importance >= 3 (classify, in the statement that classifies it).
-- extracted_at: an extractor read it (the session's episode extraction, an LLM label with its graph, or
-- the sweep). The sweep (enrich, leased) reads the partial index, which holds only drawers still
-- waiting: one that the episode's extraction reads first never enters it, and the sweep waits
-- PALACE_KG_SWEEP_GRACE_S so the episode comes first in the ordinary case.
CREATE TABLE IF NOT EXISTS drawer_extraction (
    workspace_id  text        NOT NULL,
    drawer_id     text        NOT NULL,
    due_at        timestamptz,
    extracted_at  timestamptz,
    PRIMARY KEY (workspace_id, drawer_id),
    FOREIGN KEY (workspace_id, drawer_id) REFERENCES drawers ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS drawer_extraction_due ON drawer_extraction (due_at) WHERE extracted_at IS NULL;

ALTER TABLE drawer_extraction ENABLE ROW LEVEL SECURITY;
ALTER TABLE drawer_extraction FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS workspace_isolation ON drawer_extraction;
CREATE POLICY workspace_isolation ON drawer_extraction AS PERMISSIVE FOR ALL TO palace_app
    USING (workspace_id = current_setting('palace.workspace_id', true))
    WITH CHECK (workspace_id = current_setting('palace.workspace_id', true));
DROP POLICY IF EXISTS maintenance_all ON drawer_extraction;
CREATE POLICY maintenance_all ON drawer_extraction AS PERMISSIVE FOR ALL TO palace_maintenance
    USING (true) WITH CHECK (true);

-- Existing drawers, once at upgrade time (one pass, hash-joined): a qualifying drawer counts as read when
-- it is linked already (a mention or a fact) or its session's episode was announced (its extraction ran);
-- the rest wait for the sweep. So an upgrade does not send every session again through an LLM.
INSERT INTO drawer_extraction (workspace_id, drawer_id, due_at, extracted_at)
SELECT d.workspace_id, d.id, d.filed_at,
       CASE WHEN d.entity_count > 0 OR d.triple_count > 0 OR a.session_id IS NOT NULL THEN d.filed_at END
  FROM drawers d
  LEFT JOIN (SELECT DISTINCT workspace_id, session_id FROM episodes WHERE announced_at IS NOT NULL) a
         ON a.workspace_id = d.workspace_id AND a.session_id = d.session_id
 WHERE d.state = 'processed' AND d.importance >= 3 AND d.deleted_at IS NULL
ON CONFLICT DO NOTHING;
