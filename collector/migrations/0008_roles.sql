-- One role per process, each with only what it needs (NOLOGIN group roles: the login roles
-- the services connect as are made members, e.g. by systemd/database.sql).
--
-- clicks_collector owns the schema. That is not more than the running collector needs:
-- partition maintenance (CREATE TABLE ... PARTITION OF clicks, DETACH PARTITION, DROP,
-- CREATE INDEX on a partition) is allowed to the owner of clicks only, and PostgreSQL has no
-- privilege to grant for it instead. The collector also applies these migrations at start,
-- as the same role. What it does not get: superuser, CREATEROLE, CREATEDB, or anything
-- outside this database.
--
-- clicks_link_reader (the redirector): SELECT on links and its change log, nothing else;
-- LISTEN needs no grant. It cannot read clicks or any count.
--
-- Roles belong to the cluster, not the database: created only if missing (by a role that
-- can; systemd/database.sql creates them beforehand for a collector that cannot). Two
-- databases of one cluster migrating at once race to create them: the loser's unique
-- violation is caught.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'clicks_collector') THEN
        BEGIN
            CREATE ROLE clicks_collector NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'clicks_link_reader') THEN
        BEGIN
            CREATE ROLE clicks_link_reader NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END;
    END IF;
END
$$;

-- Creating tables (partitions, later migrations) in the schema.
GRANT USAGE, CREATE ON SCHEMA public TO clicks_collector;

-- Everything the migrations made so far (tables, partitions, views, sequences, functions)
-- passes to clicks_collector, so that any member can run the collector and later migrations.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT c.oid::regclass AS name, c.relkind
        FROM pg_class c
        WHERE c.relnamespace = 'public'::regnamespace
          AND c.relkind IN ('r', 'p', 'v', 'm')
          AND c.relowner <> 'clicks_collector'::regrole
    LOOP
        EXECUTE format('ALTER TABLE %s OWNER TO clicks_collector', r.name);
    END LOOP;
    FOR r IN
        SELECT p.oid::regprocedure AS name
        FROM pg_proc p
        WHERE p.pronamespace = 'public'::regnamespace
          AND p.proowner <> 'clicks_collector'::regrole
    LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO clicks_collector', r.name);
    END LOOP;
END
$$;

GRANT USAGE ON SCHEMA public TO clicks_link_reader;
GRANT SELECT ON links, link_changes, link_changes_state TO clicks_link_reader;
