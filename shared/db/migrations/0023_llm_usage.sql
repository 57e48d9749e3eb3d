-- LLM cost accounting: calls, tokens and time per workspace, purpose, model and day.
CREATE TABLE llm_usage (
    workspace_id  text        NOT NULL,
    day           date        NOT NULL,
    purpose       text        NOT NULL,
    model         text        NOT NULL,
    calls_ok      bigint      NOT NULL DEFAULT 0,
    calls_failed  bigint      NOT NULL DEFAULT 0,
    tokens_in     bigint      NOT NULL DEFAULT 0,
    tokens_out    bigint      NOT NULL DEFAULT 0,
    seconds       double precision NOT NULL DEFAULT 0,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, day, purpose, model)
);

ALTER TABLE llm_usage ENABLE ROW LEVEL SECURITY;
ALTER TABLE llm_usage FORCE ROW LEVEL SECURITY;
CREATE POLICY workspace_isolation ON llm_usage AS PERMISSIVE FOR ALL TO palace_app
    USING (workspace_id = current_setting('palace.workspace_id', true))
    WITH CHECK (workspace_id = current_setting('palace.workspace_id', true));
CREATE POLICY maintenance_all ON llm_usage AS PERMISSIVE FOR ALL TO palace_maintenance
    USING (true) WITH CHECK (true);
