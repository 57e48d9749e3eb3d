-- Temporal knowledge graph (shared/db/kg.py): provenance of every fact down to the message it was
-- said in, and indexes for the questions the graph answers.
--
-- valid_from is when the fact was said (the message's created_at), valid_to is set once by an
-- invalidation; a fact is never overwritten, so "as of" questions about earlier times keep working.

ALTER TABLE triples
    ADD COLUMN source_episode text,
    ADD COLUMN source_session text,
    ADD COLUMN source_seq     integer,          -- the message: (source_session, source_seq) in messages
    ADD COLUMN invalidated_at timestamptz;      -- when Palace recorded the end (valid_to is when it ended)

-- The partial indexes of 0001 only served "current" facts; as-of queries and timelines read ended
-- facts too. One index per end of the edge, ordered by start: an entity's facts as of a time are a
-- range scan (valid_from <= t), and a timeline comes out of the index already in order.
DROP INDEX triples_subject;
DROP INDEX triples_object;
CREATE INDEX triples_subject_from ON triples (workspace_id, subject_id, valid_from);
CREATE INDEX triples_object_from ON triples (workspace_id, object_id, valid_from);
-- The workspace-wide timeline.
CREATE INDEX triples_valid_from ON triples (workspace_id, valid_from);

-- At most one current (not yet ended) copy of a statement: saying it again, or two replicas adding
-- it at once, finds the existing fact instead of opening a second one.
CREATE UNIQUE INDEX triples_one_current ON triples (workspace_id, subject_id, predicate, object_id)
    WHERE valid_to IS NULL;

-- A fact cannot end before it starts.
ALTER TABLE triples ADD CONSTRAINT triples_interval CHECK (valid_to IS NULL OR valid_from IS NULL
                                                           OR valid_to >= valid_from);

-- triples and entities already have row-level security (0003); nothing new to enable here.
