-- maintain now looks for requested vector indexes every few seconds (PALACE_VECTOR_INDEX_POLL_S) instead
-- of once a sweep, so that read takes the waiting requests from an index of their own: the table holds a
-- row for every workspace that ever outgrew exact search, and all but the waiting few are 'ready'.
CREATE INDEX vector_indexes_wanted ON vector_indexes (requested_at) WHERE state = 'wanted';
