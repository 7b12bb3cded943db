-- prune_link_changes(keep) deletes every row due in one statement, and the collector ran it in
-- its fold's transaction: a day after a bulk change of millions of links, that one DELETE
-- outlived the fold's deadline, which rolled the fold back with it, at every fold, for good.
-- prune_link_changes(keep, most) deletes at most `most` rows a call, the oldest by id, and
-- reads at most `most` + 1 to find them: the collector calls it in slices, each its own
-- transaction, outside the fold's. The rows it may delete are the one-argument version's
-- (older than `keep`, below the first row it keeps, of transactions older than every one
-- running), so pruned_id and pruned_xid mean what they meant. (Two collectors pruning at
-- once can move the row a call keeps past a young one, deleting an old row after it early:
-- pruned_xid then sends a reader that might have missed it to a full load, as always.) The
-- one-argument version stays for collectors of earlier builds still running beside this one,
-- which prune in their fold's transaction until they are upgraded.
CREATE FUNCTION prune_link_changes(keep interval, most bigint) RETURNS bigint LANGUAGE plpgsql
SET search_path = public, pg_temp AS $$
DECLARE
    cutoff  timestamptz := now() - keep;
    oldest  xid8 := pg_snapshot_xmin(pg_current_snapshot());
    kept    bigint;
    deleted bigint;
    top_id  bigint;
    top_xid xid8;
BEGIN
    -- The first row kept among the oldest `most` + 1: the first too young, or else the last
    -- of them (none while fewer are left, all old). Each read stops at the row it looks for.
    EXECUTE 'SELECT id FROM (SELECT id, changed_at FROM link_changes ORDER BY id LIMIT $2 + 1)
                 AS head WHERE changed_at >= $1 ORDER BY id LIMIT 1'
        INTO kept USING cutoff, most;
    IF kept IS NULL THEN
        EXECUTE 'SELECT id FROM link_changes ORDER BY id OFFSET $1 LIMIT 1' INTO kept USING most;
    END IF;
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
ALTER FUNCTION prune_link_changes(interval, bigint) OWNER TO clicks_collector;
