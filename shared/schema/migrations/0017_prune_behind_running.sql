-- prune_link_changes() deletes only rows of transactions older than every one running. A
-- redirector reading a hot standby cannot list the transactions in progress there, so it
-- takes every one from the snapshot's xmin (the oldest running) on as perhaps unread, and
-- loads its whole table when the log was pruned past that (pruned_xid at or above it). A
-- transaction left open longer than the prune's age (a session idle in transaction, a
-- forgotten prepared transaction) held that xmin back while prunes went on deleting rows of
-- transactions newer than it: every poll of such a redirector loaded the whole table, until
-- that transaction ended. Kept, those rows wait for the next prune after it ends; a primary's
-- reader loses nothing by it.
CREATE OR REPLACE FUNCTION prune_link_changes(keep interval) RETURNS bigint LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
DECLARE
    cutoff  timestamptz := now() - keep;
    oldest  xid8 := pg_snapshot_xmin(pg_current_snapshot());
    kept    bigint;
    deleted bigint;
    top_id  bigint;
    top_xid xid8;
BEGIN
    SELECT id INTO kept FROM link_changes WHERE changed_at >= cutoff ORDER BY id LIMIT 1;
    EXECUTE 'WITH gone AS (DELETE FROM link_changes
                           WHERE changed_at < $1 AND ($2 IS NULL OR id < $2) AND xid < $3
                           RETURNING id, xid)
             SELECT count(*), max(id), max(xid) FROM gone'
        INTO deleted, top_id, top_xid USING cutoff, kept, oldest;
    IF deleted > 0 THEN
        UPDATE link_changes_state
           SET pruned_id = GREATEST(pruned_id, top_id),
               pruned_xid = GREATEST(pruned_xid, top_xid);
    END IF;
    RETURN deleted;
END
$$;
