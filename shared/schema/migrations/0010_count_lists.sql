-- A batch's counts as two space-separated lists in text columns instead of two arrays. With
-- codes spread over many links a batch has thousands of entries, and PostgreSQL receives an
-- array's elements one by one through the element type's receive function: `perf` put
-- array_recv and the arrays' TOAST at a fifth of the COPY backend's time. A text field is
-- received as one string, and stored out of line it takes about half the bytes. Codes are
-- [A-Za-z0-9_-], so a space never occurs in one.
--
-- A table of its own rather than new columns of click_count_batches: collectors of earlier
-- versions, still running during a rolling upgrade, fold click_count_batches by unnesting its
-- arrays, and would delete a row holding lists while adding nothing from it. This version
-- writes here only, and folds what earlier ones leave in click_count_batches.
CREATE TABLE click_count_lists (
    day        date    NOT NULL,
    -- The lists' length, so that the backlog is summed without reading them.
    entries    integer NOT NULL,
    code_list  text    NOT NULL,
    count_list text    NOT NULL,
    -- Which collector process wrote it, and its batch number: the fold deletes its own by these.
    writer     bigint  NOT NULL,
    batch      bigint  NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE click_count_lists
    ALTER COLUMN code_list SET STORAGE EXTERNAL,
    ALTER COLUMN count_list SET STORAGE EXTERNAL;
-- As migration 8 does for everything the migrations make.
ALTER TABLE click_count_lists OWNER TO clicks_collector;

CREATE OR REPLACE VIEW click_totals AS
SELECT code, day, sum(clicks)::bigint AS clicks
FROM (
    SELECT code, day, clicks FROM click_counts
    UNION ALL
    SELECT code, day, clicks FROM click_count_deltas
    UNION ALL
    SELECT u.code, b.day, u.clicks
    FROM click_count_batches AS b, unnest(b.codes, b.counts) AS u(code, clicks)
    UNION ALL
    SELECT u.code, l.day, u.clicks
    FROM click_count_lists AS l,
         unnest(string_to_array(l.code_list, ' '), string_to_array(l.count_list, ' ')::bigint[])
             AS u(code, clicks)
) AS parts
GROUP BY code, day;
