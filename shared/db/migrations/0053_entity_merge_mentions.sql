-- A merge of entities (entity dedup, migration 0029) keeps in its snapshot the drawers that mentioned the
-- merged entity, for an exact revert. A forget of those drawers finds the merges that name them by this
-- index, to take the forgotten drawers (and what was read in them) out of the snapshot, or the merged
-- entity itself when nothing else ever mentioned it.
CREATE INDEX IF NOT EXISTS entity_merges_mentions ON entity_merges USING gin ((snapshot->'mentions'));
