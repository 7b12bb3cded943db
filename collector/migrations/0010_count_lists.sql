-- A batch's counts as two space-separated lists in text columns instead of two arrays. With
-- codes spread over many links a batch has thousands of entries, and PostgreSQL receives an
-- array's elements one by one through the element type's receive function: `perf` put
-- array_recv and the arrays' TOAST at a fifth of the COPY backend's time. A text field is
-- received as one string, and stored out of line it takes about half the bytes. Codes are
-- [A-Za-z0-9_-], so a space never occurs in one. Rows of collectors of earlier versions (a
-- rolling upgrade) keep the arrays; click_batch_entries reads either form.
ALTER TABLE click_count_batches
    ALTER COLUMN codes DROP NOT NULL,
    ALTER COLUMN counts DROP NOT NULL,
    ADD COLUMN code_list text,
    ADD COLUMN count_list text,
    ADD CONSTRAINT click_count_batches_one_form CHECK (
        (codes IS NOT NULL AND counts IS NOT NULL AND code_list IS NULL AND count_list IS NULL)
        OR (codes IS NULL AND counts IS NULL AND code_list IS NOT NULL AND count_list IS NOT NULL));
ALTER TABLE click_count_batches
    ALTER COLUMN code_list SET STORAGE EXTERNAL,
    ALTER COLUMN count_list SET STORAGE EXTERNAL;

-- One batch row's (code, clicks) entries, whichever form it holds. A single SELECT in SQL, so
-- the planner inlines it where it is used.
CREATE FUNCTION click_batch_entries(codes text[], counts bigint[], code_list text, count_list text)
RETURNS TABLE (code text, clicks bigint) LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT * FROM unnest(coalesce(codes, string_to_array(code_list, ' ')),
                         coalesce(counts, string_to_array(count_list, ' ')::bigint[]))
$$;

CREATE OR REPLACE VIEW click_totals AS
SELECT code, day, sum(clicks)::bigint AS clicks
FROM (
    SELECT code, day, clicks FROM click_counts
    UNION ALL
    SELECT code, day, clicks FROM click_count_deltas
    UNION ALL
    SELECT u.code, b.day, u.clicks
    FROM click_count_batches AS b,
         click_batch_entries(b.codes, b.counts, b.code_list, b.count_list) AS u
) AS parts
GROUP BY code, day;
