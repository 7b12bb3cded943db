-- The change log's trigger functions run as their owner (SECURITY DEFINER), so that a role
-- allowed to change links needs no privilege on the log. But PostgreSQL lets every role
-- (PUBLIC) execute a new function, and checks that only when a trigger is created, not when
-- it fires: any role that may connect, the link reader included, could attach them to a
-- temporary table of its own and, as their owner, write made-up codes into link_changes or
-- bump the TRUNCATE epoch, making every redirector load its whole table again and again. Now
-- nobody but the owner may attach them (the triggers already on links fire as before), and
-- each refuses to run for any table but links.
CREATE OR REPLACE FUNCTION log_link_changes() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF TG_RELID <> 'public.links'::regclass THEN
        RAISE EXCEPTION 'log_link_changes() logs changes of links only, not of %', TG_RELID::regclass;
    END IF;
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

CREATE OR REPLACE FUNCTION bump_links_epoch() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF TG_RELID <> 'public.links'::regclass THEN
        RAISE EXCEPTION 'bump_links_epoch() counts truncations of links only, not of %', TG_RELID::regclass;
    END IF;
    UPDATE link_changes_state SET epoch = epoch + 1;
    RETURN NULL;
END
$$;

REVOKE EXECUTE ON FUNCTION log_link_changes(), bump_links_epoch() FROM PUBLIC;
