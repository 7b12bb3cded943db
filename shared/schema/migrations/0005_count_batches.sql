-- A batch's counts as one row per UTC day: its codes and their counts in two arrays, instead of
-- a row per (code, day). With codes spread over many links nearly every click of a batch is a
-- pair of its own, and a row per pair cost PostgreSQL about as much to write, and more to
-- delete when folded, as the click itself (BENCHMARKS.md). The arrays live out of line and
-- uncompressed: written once and read once, compressing them would only cost CPU.
CREATE TABLE click_count_batches (
    day        date    NOT NULL,
    -- The arrays' length, so that the backlog is summed without reading the arrays.
    entries    integer NOT NULL,
    codes      text[]  NOT NULL,
    counts     bigint[] NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE click_count_batches
    ALTER COLUMN codes SET STORAGE EXTERNAL,
    ALTER COLUMN counts SET STORAGE EXTERNAL;

-- Half-full pages: a fold updates every key it touches, and with room on the page the new
-- version stays there (a HOT update) instead of adding an index entry and a dead one.
ALTER TABLE click_counts SET (fillfactor = 50);

-- click_count_deltas stays, folded as before, for collectors of earlier versions during a
-- rolling upgrade; nothing of this version writes to it.
CREATE OR REPLACE VIEW click_totals AS
SELECT code, day, sum(clicks)::bigint AS clicks
FROM (
    SELECT code, day, clicks FROM click_counts
    UNION ALL
    SELECT code, day, clicks FROM click_count_deltas
    UNION ALL
    SELECT u.code, b.day, u.clicks
    FROM click_count_batches AS b, unnest(b.codes, b.counts) AS u(code, clicks)
) AS parts
GROUP BY code, day;
