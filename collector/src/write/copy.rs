//! PostgreSQL's binary COPY format: the stream's header and trailer, and the rows the collector
//! writes, encoded straight into a byte buffer. Pure functions; `store` sends the bytes.

use std::collections::HashMap;

use bytes::{BufMut, Bytes, BytesMut};

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
    buf.put_i32(4);
    // A batch holds at most `--batch-rows` (a u32) clicks, and counts fewer distinct codes.
    buf.put_i32(counts.len() as i32);
    put_list(buf, counts, |buf, (code, _)| buf.put_slice(code.as_bytes()));
    let mut digits = itoa::Buffer::new();
    put_list(buf, counts, |buf, (_, n)| {
        buf.put_slice(digits.format(*n).as_bytes())
    });
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
    // At most `--batch-rows` (10 M) entries of at most 64 bytes and a space: within an i32.
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
    // Codes are at most 64 bytes.
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
    }
}
