-- The redirector reads links and its change log, nothing else (migration 8). A database set
-- up with an older systemd/database.sql gave its login SELECT on every table the collector's
-- login made, by a default privilege (ALTER DEFAULT PRIVILEGES FOR ROLE "clicks-collector"
-- ... GRANT SELECT ON TABLES TO "clicks-redirector"), and so on every table until then.
-- Migration 8's hint asked an operator to revoke both; where nobody did, each day's new
-- partition of clicks was readable by the redirector still. This takes both back from every
-- role that has the privileges of clicks_link_reader (the redirectors), but is not a
-- superuser nor a member of clicks_collector, in the default privileges this migrating role
-- may change (those of roles whose privileges it has: its own, its groups') and on the
-- relations in public owned by such roles; links, link_changes and link_changes_state keep
-- their grant. A grant to any other role (reports, backups) is left as it is. 'USAGE', not
-- 'MEMBER': from PostgreSQL 16 on, a member without INHERIT may not change its group's
-- default privileges, and the migration would fail at every start.
DO $$
DECLARE
    readers oid[] := ARRAY(SELECT oid FROM pg_roles
                           WHERE NOT rolsuper
                             AND pg_has_role(oid, 'clicks_link_reader', 'USAGE')
                             AND NOT pg_has_role(oid, 'clicks_collector', 'MEMBER'));
    r record;
BEGIN
    -- A partition made meanwhile by a collector of an earlier build (which takes this lock
    -- first, in ensure_click_partition) would get the old default privilege and not be seen.
    PERFORM pg_advisory_xact_lock(hashtextextended('clicks partitions', 0));
    FOR r IN
        SELECT d.defaclrole::regrole AS owner, d.defaclnamespace AS space,
               a.grantee::regrole AS grantee
        FROM pg_default_acl d, aclexplode(d.defaclacl) a
        WHERE d.defaclobjtype = 'r'
          AND d.defaclnamespace IN (0, 'public'::regnamespace)
          AND a.privilege_type = 'SELECT'
          AND pg_has_role(current_user, d.defaclrole, 'USAGE')
          AND a.grantee = ANY (readers)
    LOOP
        EXECUTE format('ALTER DEFAULT PRIVILEGES FOR ROLE %s %s REVOKE SELECT ON TABLES FROM %s',
                       r.owner,
                       CASE WHEN r.space = 0 THEN '' ELSE 'IN SCHEMA ' || r.space::regnamespace END,
                       r.grantee);
        RAISE WARNING 'migration 23: % no longer gets SELECT on the tables % makes',
            r.grantee, r.owner;
    END LOOP;
    FOR r IN
        SELECT DISTINCT c.oid::regclass AS name, a.grantee::regrole AS grantee
        FROM pg_class c, aclexplode(c.relacl) a
        WHERE c.relnamespace = 'public'::regnamespace
          AND c.relkind IN ('r', 'p', 'v', 'm')
          AND c.relname NOT IN ('links', 'link_changes', 'link_changes_state')
          AND a.privilege_type = 'SELECT'
          AND pg_has_role(current_user, c.relowner, 'USAGE')
          AND a.grantee = ANY (readers)
    LOOP
        EXECUTE format('REVOKE SELECT ON %s FROM %s', r.name, r.grantee);
        RAISE WARNING 'migration 23: SELECT on % revoked from %', r.name, r.grantee;
    END LOOP;
END
$$;
