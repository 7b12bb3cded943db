-- clicks partitioned by UTC day of clicked_at: old days are dropped whole (--retention) instead
-- of deleted row by row, while click_counts keeps every day's total.
--
-- Partitions are named clicks_pYYYYMMDD and hold [day 00:00 UTC, next day 00:00 UTC). The
-- collector keeps them created ahead (ensure_click_partitions) and drops expired ones. There is
-- no default partition: a click whose day has none would fail its whole batch, so the
-- collector sets aside clicks outside its time window before writing (clicks_set_aside).
--
-- An existing unpartitioned clicks is kept, whole, as the partition clicks_before_partitioning
-- of everything before this migration ran (with a CHECK it is validated against by one scan,
-- while the table is locked: that scan, a second one moving rows dated after the migration,
-- and the attach are the whole pause in ingest; README, "Click history").

-- Clicks not written into clicks: too far from the collector's clock (too_old, too_new), dated
-- after this migration in the old table (migrated_future), or refused by the database.
CREATE TABLE clicks_set_aside (
    code        text NOT NULL,
    clicked_at  timestamptz NOT NULL,
    reason      text NOT NULL,
    error       text,
    set_aside_at timestamptz NOT NULL DEFAULT now()
);

-- Where the first day partition starts: the end of clicks_before_partitioning, if there is one.
CREATE TABLE click_partitions_start (
    one   boolean PRIMARY KEY DEFAULT true CHECK (one),
    start timestamptz NOT NULL
);

-- The partition of `day`, created if missing (serialized: collectors of several hosts may call
-- this at once). Returns whether it created one.
CREATE FUNCTION ensure_click_partition(day date) RETURNS boolean LANGUAGE plpgsql AS $$
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
    EXECUTE format('CREATE TABLE %I PARTITION OF clicks FOR VALUES FROM (%L) TO (%L)',
                   name, greatest(lower, start), upper);
    RETURN true;
END
$$;

DO $$
DECLARE
    boundary timestamptz := now();
    today    date := (boundary AT TIME ZONE 'UTC')::date;
    kept     boolean := EXISTS (SELECT FROM clicks);
BEGIN
    ALTER TABLE clicks RENAME TO clicks_before_partitioning;
    CREATE TABLE clicks (
        code       text NOT NULL,
        clicked_at timestamptz NOT NULL
    ) PARTITION BY RANGE (clicked_at);
    IF kept THEN
        -- The old decoder took any year: rows dated after now cannot stay in the old table's
        -- range; they are set aside (their clicks are still counted in click_counts).
        WITH moved AS (
            DELETE FROM clicks_before_partitioning WHERE clicked_at >= boundary
            RETURNING code, clicked_at)
        INSERT INTO clicks_set_aside (code, clicked_at, reason)
        SELECT code, clicked_at, 'migrated_future' FROM moved;
        EXECUTE format('ALTER TABLE clicks_before_partitioning
                            ADD CONSTRAINT before_partitioning CHECK (clicked_at < %L)', boundary);
        EXECUTE format('ALTER TABLE clicks ATTACH PARTITION clicks_before_partitioning
                            FOR VALUES FROM (MINVALUE) TO (%L)', boundary);
        INSERT INTO click_partitions_start (start) VALUES (boundary);
    ELSE
        DROP TABLE clicks_before_partitioning;
        INSERT INTO click_partitions_start (start) VALUES ('-infinity');
    END IF;
    -- Yesterday to the day after tomorrow; the collector keeps it so from here on.
    FOR d IN -1..2 LOOP
        PERFORM ensure_click_partition(today + d);
    END LOOP;
END
$$;
