-- Palace initial schema. {embed_dim} is substituted (as a literal) by the migration runner.
-- Every table that holds workspace data has a primary key beginning with workspace_id.
CREATE EXTENSION IF NOT EXISTS vector;

-- Raw input, verbatim -------------------------------------------------------------------------
CREATE TABLE sessions (
    workspace_id   text        NOT NULL,
    session_id     text        NOT NULL,
    event_id       text        NOT NULL,
    agent_id       text,
    user_id        text,
    started_at     timestamptz,
    completed_at   timestamptz,
    metadata       jsonb       NOT NULL DEFAULT '{}',
    message_count  integer     NOT NULL,
    content_hash   text        NOT NULL,
    received_at    timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, session_id)
);

CREATE TABLE messages (
    workspace_id  text        NOT NULL,
    session_id    text        NOT NULL,
    seq           integer     NOT NULL,
    role          text        NOT NULL,
    name          text,
    content       text        NOT NULL,
    content_hash  text        NOT NULL,
    created_at    timestamptz,
    metadata      jsonb       NOT NULL DEFAULT '{}',
    is_noise      boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (workspace_id, session_id, seq),
    FOREIGN KEY (workspace_id, session_id) REFERENCES sessions ON DELETE CASCADE
);

-- Drawers: verbatim memory chunks filed at wing / room / hall --------------------------------
CREATE TABLE drawers (
    workspace_id      text        NOT NULL,
    id                text        NOT NULL,
    content           text        NOT NULL,
    content_hash      text        NOT NULL,
    embedding         vector({embed_dim}),
    embedding_model   text,
    -- Full text over the verbatim content (weight A) and the speaker (weight D, so naming a person
    -- finds their turns without outranking what was actually said).
    tsv               tsvector    GENERATED ALWAYS AS (
                          setweight(to_tsvector('english', content), 'A')
                          || setweight(to_tsvector('english', coalesce(speaker, '')), 'D')) STORED,
    wing              text        NOT NULL DEFAULT 'general',
    room              text        NOT NULL DEFAULT 'general',
    hall              text,
    state             text        NOT NULL DEFAULT 'raw'
                      CHECK (state IN ('raw', 'processed', 'merged', 'failed')),
    memory_type       text        CHECK (memory_type IN
                      ('decision', 'preference', 'milestone', 'problem', 'emotional', 'fact', 'task')),
    confidence        real,
    importance        real        NOT NULL DEFAULT 3.0 CHECK (importance BETWEEN 0 AND 5),
    pipeline_tier     text        CHECK (pipeline_tier IN ('heuristic', 'centroid', 'llm')),
    summary           text,
    -- provenance (first sighting; every sighting is in drawer_sources)
    session_id        text,
    seq               integer,    -- position of the first sighting in its session (neighbour lookups)
    context           text,       -- the turn before it, attributed: part of what is embedded
    agent_id          text,
    user_id           text,
    role              text,
    speaker           text,
    source            text        NOT NULL DEFAULT 'session',
    occurred_at       timestamptz,
    filed_at          timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    -- access stats (touched by every recall; keeps memories from decaying)
    last_accessed_at  timestamptz,
    access_count      integer     NOT NULL DEFAULT 0,
    -- lifecycle
    superseded_by     text,
    cluster_id        text,
    retry_count       integer     NOT NULL DEFAULT 0,
    failure_reason    text,
    entity_count      integer     NOT NULL DEFAULT 0,
    triple_count      integer     NOT NULL DEFAULT 0,
    pinned            boolean     NOT NULL DEFAULT false,
    deleted_at        timestamptz,
    metadata          jsonb       NOT NULL DEFAULT '{}',
    PRIMARY KEY (workspace_id, id)
);
CREATE INDEX drawers_embedding_hnsw ON drawers USING hnsw (embedding vector_cosine_ops)
    WITH (m = 16, ef_construction = 64);
CREATE INDEX drawers_tsv_gin ON drawers USING gin (tsv);
CREATE INDEX drawers_state ON drawers (workspace_id, state, filed_at);
CREATE INDEX drawers_importance ON drawers (workspace_id, importance DESC) WHERE deleted_at IS NULL;
CREATE INDEX drawers_wing_room ON drawers (workspace_id, wing, room);
CREATE INDEX drawers_session ON drawers (workspace_id, session_id, seq);

-- Every place a drawer's content was seen: keeps provenance when an exact repeat is de-duplicated.
CREATE TABLE drawer_sources (
    workspace_id  text    NOT NULL,
    drawer_id     text    NOT NULL,
    session_id    text    NOT NULL,
    seq           integer NOT NULL,
    chunk_index   integer NOT NULL DEFAULT 0,
    char_start    integer NOT NULL DEFAULT 0,
    char_end      integer NOT NULL DEFAULT 0,
    PRIMARY KEY (workspace_id, drawer_id, session_id, seq, chunk_index),
    FOREIGN KEY (workspace_id, drawer_id) REFERENCES drawers ON DELETE CASCADE
);
CREATE INDEX drawer_sources_session ON drawer_sources (workspace_id, session_id, seq);

CREATE TABLE embedding_cache (
    workspace_id  text        NOT NULL,
    model         text        NOT NULL,
    content_hash  text        NOT NULL,
    embedding     vector({embed_dim}) NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, model, content_hash)
);

-- Audit of every decision and mutation (ADD / UPDATE / DELETE / NONE / MERGE / CLASSIFY ...).
CREATE TABLE memory_history (
    workspace_id  text        NOT NULL,
    id            text        NOT NULL,
    drawer_id     text,
    action        text        NOT NULL,
    actor         text        NOT NULL,
    reason        text,
    old_value     jsonb,
    new_value     jsonb,
    event_id      text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, id)
);
CREATE INDEX memory_history_drawer ON memory_history (workspace_id, drawer_id, created_at);

-- Episodes, knowledge graph, identity, centroids ----------------------------------------------
CREATE TABLE episodes (
    workspace_id  text        NOT NULL,
    id            text        NOT NULL,
    session_id    text        NOT NULL,
    agent_id      text,
    summary       text        NOT NULL,
    abstract      text        NOT NULL,
    topics        text[]      NOT NULL DEFAULT '{}',
    embedding     vector({embed_dim}),
    started_at    timestamptz,
    completed_at  timestamptz,
    expires_at    timestamptz,
    promoted_at   timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, id),
    UNIQUE (workspace_id, session_id)
);

CREATE TABLE entities (
    workspace_id  text        NOT NULL,
    id            text        NOT NULL,
    name          text        NOT NULL,
    entity_type   text        NOT NULL DEFAULT 'unknown',
    properties    jsonb       NOT NULL DEFAULT '{}',
    mention_count integer     NOT NULL DEFAULT 0,
    embedding     vector({embed_dim}),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, id)
);
CREATE INDEX entities_name ON entities (workspace_id, lower(name));

CREATE TABLE entity_mentions (
    workspace_id  text NOT NULL,
    entity_id     text NOT NULL,
    drawer_id     text NOT NULL,
    PRIMARY KEY (workspace_id, entity_id, drawer_id),
    FOREIGN KEY (workspace_id, entity_id) REFERENCES entities ON DELETE CASCADE
);
CREATE INDEX entity_mentions_drawer ON entity_mentions (workspace_id, drawer_id);

CREATE TABLE triples (
    workspace_id  text        NOT NULL,
    id            text        NOT NULL,
    subject_id    text        NOT NULL,
    predicate     text        NOT NULL,
    object_id     text        NOT NULL,
    valid_from    timestamptz,
    valid_to      timestamptz,
    confidence    real        NOT NULL DEFAULT 1.0,
    source_drawer text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, id)
);
CREATE INDEX triples_subject ON triples (workspace_id, subject_id) WHERE valid_to IS NULL;
CREATE INDEX triples_object ON triples (workspace_id, object_id) WHERE valid_to IS NULL;

CREATE TABLE identities (
    workspace_id  text        NOT NULL,
    text          text        NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id)
);

CREATE TABLE type_centroids (
    workspace_id  text        NOT NULL,
    memory_type   text        NOT NULL,
    centroid      vector({embed_dim}) NOT NULL,
    sample_count  integer     NOT NULL,
    source_hash   text        NOT NULL,
    computed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, memory_type)
);

-- API keys, stored as SHA-256 hashes only.
CREATE TABLE api_keys (
    workspace_id  text        NOT NULL,
    key_id        text        NOT NULL,
    key_hash      text        NOT NULL,
    name          text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz,
    PRIMARY KEY (workspace_id, key_id)
);
CREATE UNIQUE INDEX api_keys_hash ON api_keys (key_hash);

-- Leases for periodic jobs, so one replica runs each sweep.
CREATE TABLE job_leases (
    workspace_id  text        NOT NULL DEFAULT '*',
    job           text        NOT NULL,
    holder        text        NOT NULL,
    expires_at    timestamptz NOT NULL,
    last_run_at   timestamptz,
    PRIMARY KEY (workspace_id, job)
);
