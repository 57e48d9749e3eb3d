-- Keep embeddings inside the heap row. A drawer row is ~2.4 kB (a 384-dim vector is 1.5 kB), over the
-- default 2 kB TOAST threshold, so PostgreSQL moved every embedding to the TOAST table and each distance
-- in the exact nearest-neighbour scan paid a TOAST fetch: 679 distances took 3.8 ms, 0.8 ms inline
-- (LoCoMo-dev, 2 cores). STORAGE MAIN moves the content and tsv out of line before the vector, and a
-- 4 kB tuple target keeps typical rows whole. Rows written before this keep their TOASTed vectors until
-- rewritten (an embedding update, or VACUUM FULL drawers in a maintenance window).
ALTER TABLE drawers ALTER COLUMN embedding SET STORAGE MAIN;
ALTER TABLE drawers SET (toast_tuple_target = 4080);
