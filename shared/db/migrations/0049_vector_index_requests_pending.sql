-- maintain's poll also looks for builds marked as running whose builder died (they are asked for again
-- under the build lease), so the partial index of 0048 covers both states a poll reads.
CREATE INDEX vector_indexes_pending ON vector_indexes (requested_at) WHERE state IN ('wanted', 'building');
DROP INDEX vector_indexes_wanted;
