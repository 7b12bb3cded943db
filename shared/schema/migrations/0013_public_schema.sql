-- Nobody but the schema's owners may create objects in schema public, on any PostgreSQL.
--
-- The services name tables and functions unqualified (the collector's statements, the
-- functions below, the migrations' DO blocks), resolved through the session's search path.
-- Before PostgreSQL 15 every role may create in public (PUBLIC holds CREATE on it): any role
-- that may connect could add a function or operator there that matches a call better than
-- the system catalog's does (to_char(date, text) where the catalog's takes a timestamp;
-- hashtextextended(text, integer) where the catalog's takes a bigint and the call passes 0),
-- and the collector would run it with its own privileges. PostgreSQL 15 revokes that by default; this does the same on
-- older servers, where PUBLIC's CREATE is revoked here if the migrating role may (the
-- schema's owner or a superuser); if it may not, the migration stops and says what to run.
--
-- The services' sessions search public only (shared::db::SET_SEARCH_PATH), after the system
-- catalog, which PostgreSQL searches first when a path does not name it; not the default
-- "$user" schema, which a role allowed to create schemas could make. The functions below
-- search the same whoever calls them, with the caller's temporary schema last, so that a
-- caller's temporary tables never stand in for the schema's (as PostgreSQL advises for
-- SECURITY DEFINER functions). pg_catalog is not named: the first schema a path names is
-- where new tables go (ensure_click_partition creates the partitions).
DO $$
DECLARE
    owner regrole := (SELECT nspowner::regrole FROM pg_namespace WHERE nspname = 'public');
BEGIN
    IF has_schema_privilege('public', 'public', 'CREATE') THEN
        -- Before PostgreSQL 15 a migrating role that does not own public could not grant
        -- clicks_collector CREATE (migration 8 then only warned): it created partitions
        -- through PUBLIC's privilege, which goes now.
        GRANT USAGE, CREATE ON SCHEMA public TO clicks_collector;
        REVOKE CREATE ON SCHEMA public FROM PUBLIC;
    END IF;
    IF has_schema_privilege('public', 'public', 'CREATE') THEN
        RAISE EXCEPTION 'migration 13: every role may create objects in schema public (and so '
                        'shadow functions the collector calls), and % may not revoke that: '
                        'the schema belongs to %', current_user, owner
            USING HINT = 'As a superuser, in this database, run: GRANT USAGE, CREATE ON SCHEMA '
                         'public TO clicks_collector; REVOKE CREATE ON SCHEMA public FROM '
                         'PUBLIC; then start the collector again (docs/operating.md, "Database '
                         'access").';
    END IF;
END
$$;

ALTER FUNCTION notify_links_changed() SET search_path = public, pg_temp;
ALTER FUNCTION log_link_changes() SET search_path = public, pg_temp;
ALTER FUNCTION bump_links_epoch() SET search_path = public, pg_temp;
ALTER FUNCTION prune_link_changes(interval) SET search_path = public, pg_temp;
ALTER FUNCTION ensure_click_partition(date) SET search_path = public, pg_temp;
