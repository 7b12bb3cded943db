-- Both prune_link_changes took max() of the change log's xid8 column, an aggregate PostgreSQL
-- has only from 15 on: on 13 and 14, which the schema otherwise runs on, every prune failed
-- ("function max(xid8) does not exist", plpgsql bodies being checked only when run), and the
-- change log grew for good. The newest deleted xid is now found by ordering (xid8's btree
-- operators are there from 13 on), and the one-argument version is the two-argument one
-- without a bound. Nothing else changes.
CREATE OR REPLACE FUNCTION prune_link_changes(keep interval, most bigint) RETURNS bigint LANGUAGE plpgsql
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
             SELECT count(*), max(id), (SELECT xid FROM gone ORDER BY xid DESC LIMIT 1) FROM gone'
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
-- The one-argument version, for collectors of earlier builds: every row due at once, which is
-- the two-argument version's with no bound (the first row too young, if any, is kept; the row
-- it would otherwise keep, at an offset no log reaches, is none).
CREATE OR REPLACE FUNCTION prune_link_changes(keep interval) RETURNS bigint LANGUAGE sql
SET search_path = public, pg_temp
AS $$ SELECT prune_link_changes(keep, 4611686018427387903) $$;
