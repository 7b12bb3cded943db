-- A link's URL goes into a Location header as it is: no control characters (bytes 0x01-0x1f
-- and 0x7f; a text value cannot hold 0x00; tab included, which a header would allow but no
-- URL needs), at most 2,048 bytes. The redirector applies the same rule when it loads links
-- (redirector/src/table.rs, `usable`), so a row that predates this constraint is never
-- served: it is skipped and counted (redirector_links_skipped).
--
-- Added NOT VALID first, so that the new rule holds from now on whatever the table holds;
-- validated only if no existing row breaks it. Otherwise the migration still succeeds (the
-- collector must start) and warns how many rows break it and how to find them.
ALTER TABLE links ADD CONSTRAINT links_url_clean
    CHECK (url !~ '[\x01-\x1f\x7f]' AND octet_length(url) <= 2048) NOT VALID;

DO $$
DECLARE
    bad bigint;
BEGIN
    SELECT count(*) INTO bad FROM links
    WHERE NOT (url !~ '[\x01-\x1f\x7f]' AND octet_length(url) <= 2048);
    IF bad = 0 THEN
        ALTER TABLE links VALIDATE CONSTRAINT links_url_clean;
    ELSE
        RAISE WARNING '% row(s) of links break links_url_clean (a control character, or over 2048 bytes); the redirector does not serve them. Find them with: SELECT code FROM links WHERE NOT (url !~ ''[\x01-\x1f\x7f]'' AND octet_length(url) <= 2048); fix or delete them, then: ALTER TABLE links VALIDATE CONSTRAINT links_url_clean', bad;
    END IF;
END
$$;
