-- A day's partition is vacuumed once, when its day is over, instead of by autovacuum while it
-- fills. Today's partition takes every click and has no index (it gets one when its day is
-- over), so autovacuum's passes over it buy nothing: an insert-triggered VACUUM at every 20 %
-- of growth and an ANALYZE at every 10 % (each reading up to 30,000 pages), at most once a
-- minute (BENCHMARKS.md, "Totals", for what they cost).
-- Once the day is over the collector runs VACUUM and ANALYZE on it once and hands it back to
-- autovacuum (RESET). A table with autovacuum_enabled = false is still vacuumed against
-- wraparound.
--
-- The marker of a day not yet settled is the option itself: partitions of days before today
-- whose reloptions hold autovacuum_enabled=false (collector/src/upkeep/partitions.rs, UNSETTLED).
CREATE OR REPLACE FUNCTION ensure_click_partition(day date) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    name  text := 'clicks_p' || to_char(day, 'YYYYMMDD');
    lower timestamptz := (day::timestamp AT TIME ZONE 'UTC');
    upper timestamptz := ((day + 1)::timestamp AT TIME ZONE 'UTC');
    start timestamptz := (SELECT p.start FROM click_partitions_start AS p);
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('clicks partitions', 0));
    IF to_regclass(name) IS NOT NULL OR upper <= start THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I PARTITION OF clicks FOR VALUES FROM (%L) TO (%L)
                    WITH (autovacuum_enabled = false)',
                   name, greatest(lower, start), upper);
    EXECUTE format('ALTER TABLE %I OWNER TO clicks_collector', name);
    RETURN true;
END
$$;

-- The partitions made ahead before this migration: today's and later ones.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT c.relname FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'clicks'::regclass AND c.relname ~ '^clicks_p[0-9]{8}$'
          AND to_date(substr(c.relname, 9), 'YYYYMMDD') >= (now() AT TIME ZONE 'UTC')::date
    LOOP
        EXECUTE format('ALTER TABLE %I SET (autovacuum_enabled = false)', r.relname);
    END LOOP;
END
$$;
