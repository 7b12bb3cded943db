-- A day's partition is made as a table of its own and then attached, instead of with
-- CREATE TABLE ... PARTITION OF: that takes the strongest lock there is on clicks, which waits
-- for every transaction that read it (a long report, a pg_dump), and every batch's COPY
-- queued behind the wait, so the collector gave up after its lock timeout and tried again
-- each round, and a reader that outlasted the days made ahead stopped ingest. ATTACH
-- PARTITION takes SHARE UPDATE EXCLUSIVE on clicks, which readers and writers do not
-- conflict with (only another attach or detach, a VACUUM or an ANALYZE of clicks itself).
--
-- Its bounds are written into the statement as text (format's %L), which renders a time as
-- the session's DateStyle and TimeZone have it: under 'SQL' or 'Postgres' with a zone whose
-- abbreviation PostgreSQL reads as another zone's (Dublin's summer time, 'IST', read as
-- Israel's before PostgreSQL 18), every day was made an hour off, and the last hour's clicks of each were refused
-- by the partition named for their day. The function now renders them in ISO, in UTC. Days
-- made before keep their bounds, and a day made next to one of them starts where it ends and
-- ends where the next begins (within a day of its own bounds; none where they leave it no
-- room): such a
-- day holds part of another, and the collector writes it through clicks, not straight into
-- it (WHOLE_DAY, collector/src/write/store.rs). Otherwise the first day made
-- in UTC would overlap the last one shifted later (Kolkata's 'IST', also read as Israel's,
-- shifted days 3.5 hours late), which refuses the attach at every round, or leave an hour
-- that no partition holds.
--
-- CREATE OR REPLACE drops what ALTER FUNCTION set: the search path (migration 13) is set
-- again here.
CREATE OR REPLACE FUNCTION ensure_click_partition(day date) RETURNS boolean LANGUAGE plpgsql
SET search_path = public, pg_temp
SET DateStyle = 'ISO, YMD'
SET TimeZone = 'UTC'
AS $$
DECLARE
    name  text := 'clicks_p' || to_char(day, 'YYYYMMDD');
    lower timestamptz := (day::timestamp AT TIME ZONE 'UTC');
    upper timestamptz := ((day + 1)::timestamp AT TIME ZONE 'UTC');
    start timestamptz := (SELECT p.start FROM click_partitions_start AS p);
    met_from timestamptz;
    met_to timestamptz;
    space name := (SELECT t.spcname FROM pg_class AS c JOIN pg_tablespace AS t
                   ON t.oid = c.reltablespace WHERE c.oid = 'clicks'::regclass);
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('clicks partitions', 0));
    IF to_regclass(name) IS NOT NULL OR upper <= start THEN
        RETURN false;
    END IF;
    SELECT coalesce(max(b.ends) FILTER (WHERE b.ends > lower - interval '1 day'
                                          AND b.ends <= upper), lower),
           coalesce(min(b.starts) FILTER (WHERE b.starts >= lower
                                            AND b.starts < upper + interval '1 day'), upper)
      INTO met_from, met_to
      FROM (SELECT substring(e FROM $re$FROM \('([^']+)'\)$re$)::timestamptz AS starts,
                   substring(e FROM $re$ TO \('([^']+)'\)$re$)::timestamptz AS ends
              FROM (SELECT pg_get_expr(c.relpartbound, c.oid) AS e
                      FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
                     WHERE i.inhparent = 'clicks'::regclass) AS p) AS b;
    -- Its neighbours hold the whole of it already (days shifted more than half a day, one of
    -- them made while this one's name was taken): nothing left to make.
    IF met_from >= met_to THEN
        RETURN false;
    END IF;
    lower := met_from;
    upper := met_to;
    -- Its columns, defaults and checks as clicks has them (an attach wants them all; not an
    -- identity column, which PostgreSQL 17 refuses to attach and the attach gives it), in
    -- its tablespace (PARTITION OF took that from clicks), not its comment: retention marks
    -- a day by its table's comment.
    EXECUTE format('CREATE TABLE %I (LIKE clicks INCLUDING DEFAULTS INCLUDING CONSTRAINTS
                                     INCLUDING GENERATED INCLUDING STORAGE
                                     INCLUDING COMPRESSION)
                    WITH (autovacuum_enabled = false)', name)
            || CASE WHEN space IS NULL THEN '' ELSE format(' TABLESPACE %I', space) END;
    EXECUTE format('ALTER TABLE %I OWNER TO clicks_collector', name);
    EXECUTE format('ALTER TABLE clicks ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   name, greatest(lower, start), upper);
    RETURN true;
END
$$;
