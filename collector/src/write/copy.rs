//! PostgreSQL's binary COPY format: the stream's header and trailer, and the rows the collector
//! writes, encoded straight into a byte buffer. Pure functions; `store` sends the bytes.

use std::collections::HashMap;

use bytes::{BufMut, Bytes, BytesMut};
use protocol::dimensions::{Dimension, Dimensions};

/// Signature, flags (no OIDs) and an empty header extension.
pub(crate) const HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";
/// A field count of -1 ends the data.
pub(crate) const TRAILER: &[u8] = &(-1i16).to_be_bytes();
/// 2000-01-01, PostgreSQL's epoch for timestamps and dates, in days since the Unix epoch.
const PG_EPOCH_DAYS: i32 = 10_957;
const DAY_US: i64 = 86_400_000_000;
/// The same epoch in Unix microseconds.
const PG_EPOCH_US: i64 = PG_EPOCH_DAYS as i64 * DAY_US;

/// The UTC day of `at_us` (Unix microseconds), as PostgreSQL's binary `date`.
pub fn pg_day(at_us: i64) -> i32 {
    // Valid clicks lie in years 1..=9999, whose days all fit an i32.
    at_us.div_euclid(DAY_US) as i32 - PG_EPOCH_DAYS
}

/// The microseconds of the UTC day of `at_us`: where [`pg_day`] gives the same day. (Decoding
/// keeps clicks within years 1 to 9999; saturating only so that no `i64` overflows.)
pub(crate) fn day_span(at_us: i64) -> std::ops::Range<i64> {
    let start = at_us.saturating_sub(at_us.rem_euclid(DAY_US));
    start..start.saturating_add(DAY_US)
}

/// Appends one `clicks` row: (code text, clicked_at timestamptz).
pub(crate) fn put_click(buf: &mut BytesMut, code: &str, at_us: i64) {
    buf.reserve(2 + 4 + code.len() + 4 + 8);
    buf.put_i16(2);
    put_text(buf, code);
    buf.put_i32(8);
    buf.put_i64(at_us - PG_EPOCH_US);
}

/// Appends one `clicks_set_aside` row: (code text, clicked_at timestamptz, reason text,
/// error text, NULL without one).
pub(crate) fn put_set_aside(
    buf: &mut BytesMut,
    code: &str,
    at_us: i64,
    reason: &str,
    error: Option<&str>,
) {
    buf.put_i16(4);
    put_text(buf, code);
    buf.put_i32(8);
    buf.put_i64(at_us - PG_EPOCH_US);
    put_text(buf, reason);
    match error {
        Some(error) => put_text(buf, error),
        None => buf.put_i32(-1),
    }
}

/// One row of a `clicks` COPY buffer written by `put_click`: where it is, and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClickRow<'a> {
    pub(crate) bytes: std::ops::Range<usize>,
    pub(crate) code: &'a str,
    pub(crate) at_us: i64,
}

/// The rows of a buffer that `put_click` wrote, in order (for finding the one PostgreSQL
/// refuses). Stops at anything it did not write.
pub(crate) fn click_rows(buf: &[u8]) -> Vec<ClickRow<'_>> {
    let mut rows = Vec::new();
    let mut at = 0;
    while let Some(row) = click_row(buf, at) {
        at = row.bytes.end;
        rows.push(row);
    }
    rows
}

/// The first row of a buffer that `put_click` wrote.
pub(crate) fn first_click(buf: &[u8]) -> Option<ClickRow<'_>> {
    click_row(buf, 0)
}

fn click_row(buf: &[u8], start: usize) -> Option<ClickRow<'_>> {
    let int = |at: usize, n: usize| buf.get(at..at + n);
    let len = i32::from_be_bytes(int(start + 2, 4)?.try_into().ok()?);
    let code_at = start + 6;
    let code = std::str::from_utf8(buf.get(code_at..code_at + usize::try_from(len).ok()?)?).ok()?;
    let time_at = code_at + code.len() + 4;
    let pg_us = i64::from_be_bytes(int(time_at, 8)?.try_into().ok()?);
    Some(ClickRow {
        bytes: start..time_at + 8,
        code,
        at_us: pg_us + PG_EPOCH_US,
    })
}

/// Which batch of which writer a `click_count_lists` row belongs to: its `writer` and
/// `batch` columns, by which the writer folds the rows it wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchTag {
    pub(crate) writer: i64,
    pub(crate) batch: i64,
}

/// Appends one `click_count_lists` row: (day date, entries integer, code_list text,
/// count_list text, writer bigint, batch bigint): one batch's counts for one day, as two
/// space-separated lists of `counts.len()` entries (migration 10: a text field is received
/// whole, where an array's elements each pass through a receive function; codes hold no
/// space).
pub(crate) fn put_count_batch(buf: &mut BytesMut, tag: BatchTag, day: i32, counts: &[(&str, i64)]) {
    let codes_len: usize = counts.iter().map(|(code, _)| code.len() + 1).sum();
    // Counts are mostly a digit or two: a hint, the buffer grows past it.
    buf.reserve(2 + 16 + 8 + codes_len + counts.len() * 3 + 24);
    buf.put_i16(6);
    buf.put_i32(4);
    buf.put_i32(day);
    put_entries(buf, counts.len());
    put_list(buf, counts, |buf, (code, _)| buf.put_slice(code.as_bytes()));
    put_count_list(buf, counts, |&(_, n)| n);
    put_tag(buf, tag);
}

/// Appends one `click_breakdown_lists` row (migration 14): (day date, dimension text, entries
/// integer, code_list text, value_list text, count_list text, writer bigint, batch bigint):
/// one batch's counts for one day and dimension, as three space-separated lists of
/// `counts.len()` entries, written as `put_count_batch` writes its two.
pub(crate) fn put_breakdown_batch(
    buf: &mut BytesMut,
    tag: BatchTag,
    day: i32,
    dimension: Dimension,
    counts: &[(&str, &str, i64)],
) {
    let lists_len: usize = counts.iter().map(|(c, v, _)| c.len() + v.len() + 2).sum();
    buf.reserve(2 + 8 + 4 + 8 + 8 + lists_len + counts.len() * 3 + 36);
    buf.put_i16(8);
    buf.put_i32(4);
    buf.put_i32(day);
    put_text(buf, dimension.as_str());
    put_entries(buf, counts.len());
    put_list(buf, counts, |buf, (code, _, _)| {
        buf.put_slice(code.as_bytes())
    });
    put_list(buf, counts, |buf, (_, value, _)| {
        buf.put_slice(value.as_bytes())
    });
    put_count_list(buf, counts, |&(_, _, n)| n);
    put_tag(buf, tag);
}

/// Appends the `entries` integer field.
fn put_entries(buf: &mut BytesMut, entries: usize) {
    buf.put_i32(4);
    // A batch holds at most `--batch-rows` (a u32) clicks, and counts fewer distinct keys.
    buf.put_i32(entries as i32);
}

/// Appends the `count_list` text field: each item's count, in decimal.
fn put_count_list<T>(buf: &mut BytesMut, items: &[T], count: impl Fn(&T) -> i64) {
    let mut digits = itoa::Buffer::new();
    put_list(buf, items, |buf, item| {
        buf.put_slice(digits.format(count(item)).as_bytes())
    });
}

/// Appends the `writer` and `batch` bigint fields.
fn put_tag(buf: &mut BytesMut, tag: BatchTag) {
    for id in [tag.writer, tag.batch] {
        buf.put_i32(8);
        buf.put_i64(id);
    }
}

/// Appends a text field: what `put` writes of each item, separated by spaces.
fn put_list<T>(buf: &mut BytesMut, items: &[T], mut put: impl FnMut(&mut BytesMut, &T)) {
    let len_at = buf.len();
    buf.put_i32(0);
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            buf.put_u8(b' ');
        }
        put(buf, item);
    }
    // At most `--batch-rows` (5 M) entries of at most 64 bytes and a space: within an i32.
    let len = (buf.len() - len_at - 4) as i32;
    buf[len_at..len_at + 4].copy_from_slice(&len.to_be_bytes());
}

/// `click_count_lists` rows: one per day, of its (code, clicks) entries.
pub(crate) fn counts_rows<'a>(
    tag: BatchTag,
    days: impl IntoIterator<Item = (i32, Vec<(&'a str, i64)>)>,
) -> Bytes {
    let mut buf = BytesMut::new();
    for (day, entries) in days {
        put_count_batch(&mut buf, tag, day, &entries);
    }
    buf.freeze()
}

/// Whether a breakdown value is stored: every one but the agent `human`, which the view
/// `click_breakdown` derives from the totals (migration 14).
pub(crate) fn stored(dimension: Dimension, value: &str) -> bool {
    !(dimension == Dimension::Agent && value == protocol::dimensions::Agent::Human.as_str())
}

/// `click_breakdown_lists` rows: one per (day, dimension), of its (code, value, clicks)
/// entries.
pub(crate) fn breakdown_rows<'a>(
    tag: BatchTag,
    lists: impl IntoIterator<Item = (i32, Dimension, Vec<(&'a str, &'a str, i64)>)>,
) -> Bytes {
    let mut buf = BytesMut::new();
    // A day whose clicks were all human has no agent entry (humans are not stored): no row,
    // and for a batch of such days no COPY.
    for (day, dimension, entries) in lists.into_iter().filter(|l| !l.2.is_empty()) {
        put_breakdown_batch(&mut buf, tag, day, dimension, &entries);
    }
    buf.freeze()
}

/// The breakdowns of `clicks` (code, Unix microseconds, dimensions) per UTC day, dimension,
/// code and value, as `click_breakdown_lists` rows (the batch's own when PostgreSQL refused
/// some of its clicks: rare, so plainly).
pub(crate) fn breakdowns_of<'a>(
    tag: BatchTag,
    clicks: impl IntoIterator<Item = (&'a str, i64, Dimensions<'a>)>,
) -> Bytes {
    type Values<'a> = HashMap<(&'a str, &'a str), i64>;
    let mut lists: HashMap<(i32, Dimension), Values<'_>> = HashMap::new();
    for (code, at_us, dimensions) in clicks {
        for (dimension, value) in dimensions.values().filter(|&(d, v)| stored(d, v)) {
            *lists
                .entry((pg_day(at_us), dimension))
                .or_default()
                .entry((code, value))
                .or_default() += 1;
        }
    }
    breakdown_rows(
        tag,
        lists.into_iter().map(|((day, dimension), values)| {
            let entries = values.into_iter().map(|((c, v), n)| (c, v, n)).collect();
            (day, dimension, entries)
        }),
    )
}

/// The counts of `clicks` (code, Unix microseconds) per UTC day and code, as
/// `click_count_lists` rows.
pub(crate) fn count_rows<'a>(
    tag: BatchTag,
    clicks: impl IntoIterator<Item = (&'a str, i64)>,
) -> Bytes {
    let mut days: HashMap<i32, HashMap<&str, i64>> = HashMap::new();
    for (code, at_us) in clicks {
        *days
            .entry(pg_day(at_us))
            .or_default()
            .entry(code)
            .or_default() += 1;
    }
    counts_rows(
        tag,
        days.into_iter()
            .map(|(day, codes)| (day, codes.into_iter().collect())),
    )
}

fn put_text(buf: &mut BytesMut, s: &str) {
    // Codes, values and errors are short.
    buf.put_i32(s.len() as i32);
    buf.put_slice(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_and_timestamps_count_from_2000_utc() {
        assert_eq!(pg_day(PG_EPOCH_US), 0);
        assert_eq!(pg_day(PG_EPOCH_US - 1), -1);
        assert_eq!(pg_day(PG_EPOCH_US + DAY_US - 1), 0);
        for at in [
            PG_EPOCH_US - 1,
            PG_EPOCH_US,
            PG_EPOCH_US + DAY_US - 1,
            -5 * DAY_US / 2,
        ] {
            let span = day_span(at);
            assert!(span.contains(&at), "{at}");
            let (first, last) = (pg_day(span.start), pg_day(span.end - 1));
            assert_eq!(
                (first, last, pg_day(span.end)),
                (pg_day(at), pg_day(at), pg_day(at) + 1)
            );
        }
        assert_eq!(pg_day(0), -PG_EPOCH_DAYS);
        let mut buf = BytesMut::new();
        put_click(&mut buf, "ab", PG_EPOCH_US + 5);
        assert_eq!(&buf[..], b"\0\x02\0\0\0\x02ab\0\0\0\x08\0\0\0\0\0\0\0\x05");
        put_click(&mut buf, "xyz", 7);
        let rows = click_rows(&buf);
        let read: Vec<_> = rows
            .iter()
            .map(|r| (r.bytes.clone(), r.code, r.at_us))
            .collect();
        assert_eq!(read, [(0..20, "ab", PG_EPOCH_US + 5), (20..41, "xyz", 7)]);
        buf.clear();
        let tag = BatchTag {
            writer: 2,
            batch: 3,
        };
        put_count_batch(&mut buf, tag, 1, &[("c", 7), ("d-9", 12)]);
        let want = [
            &b"\0\x06\0\0\0\x04\0\0\0\x01\0\0\0\x04\0\0\0\x02"[..],
            b"\0\0\0\x05c d-9",
            b"\0\0\0\x047 12",
            b"\0\0\0\x08\0\0\0\0\0\0\0\x02\0\0\0\x08\0\0\0\0\0\0\0\x03",
        ]
        .concat();
        assert_eq!(&buf[..], &want[..]);

        buf.clear();
        let entries = [("c", "(none)", 7), ("d-9", "x.org", 12)];
        put_breakdown_batch(&mut buf, tag, 1, Dimension::Referrer, &entries);
        let want = [
            &b"\0\x08\0\0\0\x04\0\0\0\x01\0\0\0\x08referrer\0\0\0\x04\0\0\0\x02"[..],
            b"\0\0\0\x05c d-9",
            b"\0\0\0\x0c(none) x.org",
            b"\0\0\0\x047 12",
            b"\0\0\0\x08\0\0\0\0\0\0\0\x02\0\0\0\x08\0\0\0\0\0\0\0\x03",
        ]
        .concat();
        assert_eq!(&buf[..], &want[..]);
    }
}
