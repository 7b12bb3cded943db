-- The change log the redirectors follow: one row per changed code (an UPDATE that renames a
-- code logs the old and the new one), so a redirector applies a change at the cost of the
-- change, not of the table. A row says only "this code changed"; the reader re-reads the code's
-- current row in the same snapshot, so applying is idempotent and converges.
--
-- Ids are handed out before commit, so commit order is not id order: a reader remembers the
-- transactions in progress at its last read (pg_snapshot_xip) and reads their rows by xid next
-- time, besides every id above the highest it saw.
CREATE TABLE link_changes (
    id         bigserial PRIMARY KEY,
    code       text NOT NULL,
    xid        xid8 NOT NULL DEFAULT pg_current_xact_id(),
    changed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX link_changes_xid ON link_changes (xid);

-- One row. pruned_id and pruned_xid are the highest id and transaction id
-- prune_link_changes() deleted: a reader that has not applied everything up to them must load
-- the whole table again. epoch is bumped by every TRUNCATE of links (which fires no row
-- triggers): a reader that sees it change loads the whole table again.
CREATE TABLE link_changes_state (
    one        boolean PRIMARY KEY DEFAULT true CHECK (one),
    pruned_id  bigint NOT NULL DEFAULT 0,
    pruned_xid xid8 NOT NULL DEFAULT '0',
    epoch      bigint NOT NULL DEFAULT 0
);
INSERT INTO link_changes_state DEFAULT VALUES;

-- Statement-level triggers with transition tables: one INSERT ... SELECT per statement
-- instead of one plpgsql call per row, so a bulk load of links is not slowed by a factor.
-- SECURITY DEFINER (with a fixed search_path): a role allowed to change links needs no
-- privilege on the log itself.
CREATE FUNCTION log_link_changes() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO link_changes (code) SELECT code FROM new_links;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO link_changes (code)
        SELECT code FROM old_links UNION SELECT code FROM new_links;
    ELSE
        INSERT INTO link_changes (code) SELECT code FROM old_links;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER links_log_insert AFTER INSERT ON links
REFERENCING NEW TABLE AS new_links
FOR EACH STATEMENT EXECUTE FUNCTION log_link_changes();

CREATE TRIGGER links_log_update AFTER UPDATE ON links
REFERENCING OLD TABLE AS old_links NEW TABLE AS new_links
FOR EACH STATEMENT EXECUTE FUNCTION log_link_changes();

CREATE TRIGGER links_log_delete AFTER DELETE ON links
REFERENCING OLD TABLE AS old_links
FOR EACH STATEMENT EXECUTE FUNCTION log_link_changes();

CREATE FUNCTION bump_links_epoch() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
    UPDATE link_changes_state SET epoch = epoch + 1;
    RETURN NULL;
END
$$;

CREATE TRIGGER links_truncated AFTER TRUNCATE ON links
FOR EACH STATEMENT EXECUTE FUNCTION bump_links_epoch();

-- Deletes the change log's committed rows older than `keep` and records the highest id and
-- transaction id deleted. Returns how many rows it deleted. Called by the collector's periodic
-- maintenance.
CREATE FUNCTION prune_link_changes(keep interval) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    deleted bigint;
    top_id bigint;
    top_xid xid8;
BEGIN
    WITH gone AS (DELETE FROM link_changes WHERE changed_at < now() - keep RETURNING id, xid)
    SELECT count(*), max(id), max(xid) INTO deleted, top_id, top_xid FROM gone;
    IF deleted > 0 THEN
        UPDATE link_changes_state
           SET pruned_id = GREATEST(pruned_id, top_id),
               pruned_xid = GREATEST(pruned_xid, top_xid);
    END IF;
    RETURN deleted;
END
$$;
