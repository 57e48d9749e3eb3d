-- Held write proposals (controlled-write mode) become actionable: an operator approves or rejects each
-- one once. The resolution is its own row keyed by the held proposal's audit id, so a proposal cannot
-- be resolved twice (two operators racing: the second insert finds the key taken); the audit trail
-- itself stays append-only.
CREATE TABLE proposal_resolutions (
    workspace_id  text        NOT NULL,
    history_id    text        NOT NULL,  -- the held proposal's memory_history id
    outcome       text        NOT NULL CHECK (outcome IN ('applied', 'dropped', 'rejected')),
    actor         text        NOT NULL,
    note          text,
    audit_id      text,                  -- the memory_history row the resolution wrote
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, history_id)
);

ALTER TABLE proposal_resolutions ENABLE ROW LEVEL SECURITY;
ALTER TABLE proposal_resolutions FORCE ROW LEVEL SECURITY;
CREATE POLICY workspace_isolation ON proposal_resolutions AS PERMISSIVE FOR ALL TO palace_app
    USING (workspace_id = current_setting('palace.workspace_id', true))
    WITH CHECK (workspace_id = current_setting('palace.workspace_id', true));
CREATE POLICY maintenance_all ON proposal_resolutions AS PERMISSIVE FOR ALL TO palace_maintenance
    USING (true) WITH CHECK (true);

-- `palace proposals`: the held proposals of a workspace, newest first, without reading its whole history.
CREATE INDEX memory_history_held ON memory_history (workspace_id, created_at)
    WHERE new_value->>'outcome' = 'held';

-- The centroids job reads a workspace's LLM-labelled drawers (the training set) on every run.
CREATE INDEX drawers_llm_labelled ON drawers (workspace_id, id)
    WHERE pipeline_tier = 'llm' AND deleted_at IS NULL;

-- maintain's per-workspace cost gauges read today's rows of every workspace each round.
CREATE INDEX llm_usage_day ON llm_usage (day);
