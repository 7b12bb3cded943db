-- Retention deletes the breakdowns of expired days but the agent's, which are kept as
-- click_counts keeps every day's total. Through the index by day alone, its DELETE visited
-- every agent row of every expired day, each round (a minute), to keep it: work that grew
-- with the history kept. This index holds only the rows that retention deletes, so a round
-- with nothing to delete finds nothing at once. The day index had no other reader. Built in
-- the migrations' transaction, it holds off folds for the time of one scan of the table; an
-- operator may build it beforehand with CREATE INDEX CONCURRENTLY (docs/schema.md).
-- One built beforehand whose CONCURRENTLY build failed is left invalid: built again here.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_index AS i
                WHERE i.indexrelid = to_regclass('click_breakdown_counts_expiring')
                  AND NOT i.indisvalid) THEN
        DROP INDEX click_breakdown_counts_expiring;
    END IF;
END
$$;
CREATE INDEX IF NOT EXISTS click_breakdown_counts_expiring ON click_breakdown_counts (day)
    WHERE dimension <> 'agent';
DROP INDEX IF EXISTS click_breakdown_counts_day;
