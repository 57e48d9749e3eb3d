-- Dreaming (GoClaw's L1 -> L0 promotion; shared/dreaming.py): once an agent/user pair has enough
-- unpromoted episodes, they are consolidated into long-term drawers in the 'dreaming' wing and
-- marked promoted.

-- The pair an episode belongs to: the agent is already on the episode, the user is its session's.
ALTER TABLE episodes ADD COLUMN user_id text;
UPDATE episodes e SET user_id = s.user_id
  FROM sessions s
 WHERE s.workspace_id = e.workspace_id AND s.session_id = e.session_id AND s.user_id IS NOT NULL;

-- The job's question, "which pairs have enough unpromoted episodes, and which are they?", reads only
-- unpromoted, built episodes (dreaming's own output sessions, 'dreaming:<run>', are never dreamt about).
CREATE INDEX episodes_unpromoted ON episodes (workspace_id, coalesce(agent_id, ''), coalesce(user_id, ''),
                                              completed_at, id)
    WHERE promoted_at IS NULL AND status = 'ready' AND session_id NOT LIKE 'dreaming:%';

-- One row per consolidation: its id derives from the episodes it consolidates, so a threshold is
-- consolidated once however many replicas try. 'claimed' while it runs (holder, claimed_at: a holder
-- that died is taken over after the job lease TTL), the synthesised memories are stored before they
-- are published (a retry publishes the same ones), 'done' once the episodes are marked promoted.
CREATE TABLE dreaming_runs (
    workspace_id  text        NOT NULL,
    id            text        NOT NULL,
    agent_id      text        NOT NULL DEFAULT '',
    user_id       text        NOT NULL DEFAULT '',
    episode_ids   text[]      NOT NULL,
    session_id    text        NOT NULL,   -- the session.completed its drawers were published as
    status        text        NOT NULL DEFAULT 'claimed' CHECK (status IN ('claimed', 'done')),
    holder        text        NOT NULL,
    source        text,                   -- 'llm' or 'extractive'
    memories      jsonb,                  -- what was synthesised, before it was published
    warnings      text[]      NOT NULL DEFAULT '{}',
    drawer_ids    text[]      NOT NULL DEFAULT '{}',
    claimed_at    timestamptz NOT NULL DEFAULT now(),
    done_at       timestamptz,
    PRIMARY KEY (workspace_id, id)
);
-- The debounce ("dreamt about lately?") and the running-claim check, per pair.
CREATE INDEX dreaming_runs_pair ON dreaming_runs (workspace_id, agent_id, user_id, claimed_at);

ALTER TABLE dreaming_runs ENABLE ROW LEVEL SECURITY;
ALTER TABLE dreaming_runs FORCE ROW LEVEL SECURITY;
CREATE POLICY workspace_isolation ON dreaming_runs AS PERMISSIVE FOR ALL TO palace_app
    USING (workspace_id = current_setting('palace.workspace_id', true))
    WITH CHECK (workspace_id = current_setting('palace.workspace_id', true));
CREATE POLICY maintenance_all ON dreaming_runs AS PERMISSIVE FOR ALL TO palace_maintenance
    USING (true) WITH CHECK (true);
