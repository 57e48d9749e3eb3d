-- A drawer waiting for its LLM label is claimed by the classify event whose batch asks the model about it,
-- until that batch has written the answer (or its failure), or this time has passed (a batch that died).
-- Another event naming the same drawer meanwhile (the same words said in another session, a re-drive)
-- leaves it to the claimant instead of asking the model a second time and counting a second failure; the
-- claimant's own event, delivered again, takes its claim back.
-- Read and written by primary key only: no index.
ALTER TABLE drawers ADD COLUMN IF NOT EXISTS llm_claimed_until timestamptz;
ALTER TABLE drawers ADD COLUMN IF NOT EXISTS llm_claimed_by text;
