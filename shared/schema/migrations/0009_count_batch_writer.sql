-- Which writer (collector process) wrote a batch's counts, and the batch's number: a collector
-- keeps the sums of the batches it committed in memory and folds them by these two columns,
-- instead of having PostgreSQL unnest and add up every batch's arrays again (BENCHMARKS.md:
-- with codes spread over many links that was most of the database's work). Rows without them
-- (collectors of earlier versions, during a rolling upgrade) are folded as before.
ALTER TABLE click_count_batches ADD COLUMN writer bigint, ADD COLUMN batch bigint;
