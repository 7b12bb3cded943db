-- Links kept by logical replication (a subscription to the application's own database, say)
-- were never served: the apply worker runs as session_replication_role = replica, where
-- triggers enabled the ordinary way do not fire, and it fires row triggers only, never
-- statement ones (TRUNCATE's aside). So the change log heard nothing of a replicated change,
-- and no redirector served it until a full load, which nothing asked for.
--
-- `ALTER TABLE links ENABLE TRIGGER ALL` (which a data-only pg_restore --disable-triggers
-- ends with) sets every trigger back to fire in ordinary sessions only: the collector sets
-- these three back at start and with each pruning (schema::restore_link_trigger_modes).
--
-- A row trigger enabled for replica sessions alone logs those changes (and wakes the
-- redirectors): it never fires in an ordinary session, whose changes the statement triggers
-- of migration 4 go on logging at a statement's cost, not a row's. The TRUNCATE epoch and the
-- notification fire in both (a replicated TRUNCATE fires statement triggers); for an INSERT,
-- UPDATE or DELETE in a session as a replica (not the apply worker, which fires no statement
-- trigger) the notification fires twice in one transaction, which PostgreSQL delivers once.
CREATE FUNCTION log_replicated_link_change() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF TG_RELID <> 'public.links'::regclass THEN
        RAISE EXCEPTION 'log_replicated_link_change() logs changes of links only, not of %', TG_RELID::regclass;
    END IF;
    -- Fired in an ordinary session only once `ENABLE TRIGGER ALL` reset its mode (until a
    -- collector sets it back): the statement triggers log that session's changes.
    IF current_setting('session_replication_role') <> 'replica' THEN
        RETURN NULL;
    END IF;
    IF TG_OP <> 'INSERT' THEN
        INSERT INTO link_changes (code) VALUES (OLD.code);
    END IF;
    IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND NEW.code <> OLD.code) THEN
        INSERT INTO link_changes (code) VALUES (NEW.code);
    END IF;
    PERFORM pg_notify('links_changed', '');
    RETURN NULL;
END
$$;

ALTER FUNCTION log_replicated_link_change() OWNER TO clicks_collector;
REVOKE EXECUTE ON FUNCTION log_replicated_link_change() FROM PUBLIC;

CREATE TRIGGER links_log_replicated AFTER INSERT OR UPDATE OR DELETE ON links
FOR EACH ROW EXECUTE FUNCTION log_replicated_link_change();

ALTER TABLE links ENABLE REPLICA TRIGGER links_log_replicated;
ALTER TABLE links ENABLE ALWAYS TRIGGER links_truncated;
ALTER TABLE links ENABLE ALWAYS TRIGGER links_changed;
