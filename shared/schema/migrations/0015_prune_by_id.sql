-- prune_link_changes() read the whole change log at every call (a filter on changed_at, which
-- has no index), and the collector calls it with every fold and at least once a
-- --compact-interval: with a day of changes kept at 100 a second, millions of rows read each
-- minute for the few thousand it deletes (BENCHMARKS.md, "Pruning the change log").
-- The rows it deletes are the log's oldest, and ids are handed out in time order give or take
-- a transaction's length, so it now finds the oldest row it keeps through the primary key
-- and deletes by id below it: it reads the rows it deletes, one more, and (until autovacuum
-- passes) the index entries of rows earlier calls deleted. A row older than `keep` but
-- with an id above a row it keeps (a transaction that ran long) waits for a later call; it is
-- never deleted early, so pruned_id and pruned_xid mean what they meant.
-- The DELETE is planned with its bound at each call (EXECUTE), never from a cached generic
-- plan, which would have to guess `id < $2` at a third of the table.
CREATE OR REPLACE FUNCTION prune_link_changes(keep interval) RETURNS bigint LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
DECLARE
    cutoff  timestamptz := now() - keep;
    kept    bigint;
    deleted bigint;
    top_id  bigint;
    top_xid xid8;
BEGIN
    SELECT id INTO kept FROM link_changes WHERE changed_at >= cutoff ORDER BY id LIMIT 1;
    EXECUTE 'WITH gone AS (DELETE FROM link_changes
                           WHERE changed_at < $1 AND ($2 IS NULL OR id < $2)
                           RETURNING id, xid)
             SELECT count(*), max(id), max(xid) FROM gone'
        INTO deleted, top_id, top_xid USING cutoff, kept;
    IF deleted > 0 THEN
        UPDATE link_changes_state
           SET pruned_id = GREATEST(pruned_id, top_id),
               pruned_xid = GREATEST(pruned_xid, top_xid);
    END IF;
    RETURN deleted;
END
$$;
