//! How a received datagram is judged and shown: one text line or JSON object per datagram for
//! `listen`, the full field list for `decode`.

use std::collections::HashMap;
use std::fmt::Write;

use serde_json::{json, Map, Value};

use super::hex;
use protocol::dimensions::{Dimension, Dimensions};
use protocol::wire::{self, Click, Datagram, Resync, MAX_DATAGRAM, RESYNC_VERSION};

/// Codes listed on a `listen` line before the rest is summarised as "+N more".
const CODES_SHOWN: usize = 5;

/// A datagram accepted whole, a sender's resync (which a collector's mirror forwards too), or
/// the reason it was rejected.
pub enum Reading<'a> {
    Datagram(Datagram<'a>),
    Resync(Resync),
    Rejected { reason: &'static str, error: String },
}

/// Judges a datagram of `len` bytes of which `bytes` were kept: a receiver's buffer holds
/// [`MAX_DATAGRAM`] bytes, so anything longer is rejected as `oversize` before decoding.
pub fn judge(bytes: &[u8], len: usize) -> Reading<'_> {
    if len > MAX_DATAGRAM {
        return Reading::Rejected {
            reason: "oversize",
            error: format!("{len} bytes, over the {MAX_DATAGRAM}-byte limit"),
        };
    }
    let decoded = match bytes.first() {
        Some(&RESYNC_VERSION) => wire::decode_resync(bytes).map(Reading::Resync),
        _ => wire::decode(bytes).map(Reading::Datagram),
    };
    match decoded {
        Ok(reading) => reading,
        Err(reject) => Reading::Rejected {
            reason: reject.reason().as_str(),
            error: reject.to_string(),
        },
    }
}

/// The distinct codes of a batch with their click counts, in order of first appearance.
pub fn code_counts<'a>(batch: &Datagram<'a>) -> Vec<(&'a str, usize)> {
    tally(batch.clicks.iter().map(|click| click.code))
}

/// The distinct values with how often each came, in order of first appearance; in time linear
/// in the values, however many distinct ones a peer sends.
fn tally<'a>(values: impl Iterator<Item = &'a str>) -> Vec<(&'a str, usize)> {
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for value in values {
        let i = *index.entry(value).or_insert_with(|| {
            counts.push((value, 0));
            counts.len() - 1
        });
        counts[i].1 += 1;
    }
    counts
}

/// Each dimension the batch's clicks carry, with the clicks per value, in order of first
/// appearance: what the collector counts of them (`click_breakdown`). A version-1 datagram's
/// clicks carry none (the collector counts them under agent `unknown`).
pub fn dimension_counts<'a>(batch: &Datagram<'a>) -> Vec<(Dimension, Vec<(&'a str, usize)>)> {
    if batch.version == 1 {
        return Vec::new();
    }
    // The values of each dimension, the dimensions in order of first appearance (a few).
    let mut values: Vec<(Dimension, Vec<&str>)> = Vec::new();
    for click in &batch.clicks {
        for (dimension, value) in click.dimensions.values() {
            match values.iter_mut().find(|(d, _)| *d == dimension) {
                Some((_, of_it)) => of_it.push(value),
                None => values.push((dimension, vec![value])),
            }
        }
    }
    values
        .into_iter()
        .map(|(dimension, of_it)| (dimension, tally(of_it.into_iter())))
        .collect()
}

/// A click's dimensions as `name=value` words (`agent=bot referrer=t.co`); empty for a click
/// of a version-1 datagram, which carries none.
fn dimension_words(version: u8, d: &Dimensions<'_>) -> String {
    if version == 1 {
        return String::new();
    }
    let words: Vec<String> = d
        .values()
        .map(|(dimension, value)| format!("{}={value}", dimension.as_str()))
        .collect();
    words.join(" ")
}

/// A click's dimensions as a JSON object, only those it carries (none for version 1).
fn dimension_json(version: u8, click: &Click<'_>) -> Map<String, Value> {
    if version == 1 {
        return Map::new();
    }
    click
        .dimensions
        .values()
        .map(|(dimension, value)| (dimension.as_str().to_owned(), json!(value)))
        .collect()
}

/// `value:n` items, the first [`CODES_SHOWN`] of them, then `+N more`.
fn abbreviated(counts: &[(&str, usize)]) -> String {
    let shown: Vec<String> = counts
        .iter()
        .take(CODES_SHOWN)
        .map(|&(code, n)| {
            if n > 1 {
                format!("{code}:{n}")
            } else {
                code.to_owned()
            }
        })
        .collect();
    let mut text = shown.join(",");
    if counts.len() > CODES_SHOWN {
        let _ = write!(text, " +{} more", counts.len() - CODES_SHOWN);
    }
    text
}

/// Microseconds between the batch's oldest click and `now_us` (negative if the sender's
/// clock is ahead); `None` for a batch without clicks.
pub fn oldest_age_us(batch: &Datagram<'_>, now_us: i64) -> Option<i64> {
    batch
        .clicks_at()
        .map(|(_, at)| at)
        .min()
        .map(|oldest| now_us.saturating_sub(oldest))
}

/// What `listen` tracked about this datagram's place in its sender's sequence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeqNote {
    /// Datagrams missing between this sender's previous seq and this one.
    pub missing: u64,
    /// The seq is at or below one already seen from this sender.
    pub repeat: bool,
}

/// One `listen` line for an accepted datagram.
pub fn batch_line(batch: &Datagram<'_>, len: usize, now_us: i64, note: SeqNote) -> String {
    let mut line = format!(
        "sender={} seq={} version={} clicks={} bytes={len}",
        batch.sender,
        batch.seq,
        batch.version,
        batch.clicks.len()
    );
    if let Some(age) = oldest_age_us(batch, now_us) {
        let _ = write!(line, " oldest_age={}", format_age(age));
    }
    if note.missing > 0 {
        let _ = write!(line, " missing_before={}", note.missing);
    }
    if note.repeat {
        line.push_str(" repeated_seq");
    }
    let _ = write!(line, " codes={}", abbreviated(&code_counts(batch)));
    for (dimension, values) in dimension_counts(batch) {
        let _ = write!(line, " {}={}", dimension.as_str(), abbreviated(&values));
    }
    line
}

/// One `listen` line for a rejected datagram.
pub fn rejected_line(bytes: &[u8], len: usize, reason: &str, error: &str) -> String {
    format!(
        "REJECTED bytes={len} reason={reason} error={error:?} head={}",
        hex::head(bytes)
    )
}

/// The line `listen` prints for a resync: the sender goes on from seq `first`, every datagram
/// before it acknowledged, `clicks_before` clicks in all before it.
pub fn resync_line(resync: &Resync, len: usize) -> String {
    format!(
        "RESYNC sender={} first={} clicks_before={} bytes={len}",
        resync.sender, resync.first, resync.clicks_before
    )
}

/// [`resync_line`] as `listen --json` and `decode --json` print it.
pub fn resync_json(resync: &Resync, len: usize) -> Value {
    json!({
        "resync": { "sender": resync.sender, "first": resync.first,
                    "clicks_before": resync.clicks_before },
        "bytes": len,
    })
}

/// The JSON object `listen --json` prints for an accepted datagram: every code, not abbreviated.
pub fn batch_json(batch: &Datagram<'_>, len: usize, now_us: i64, note: SeqNote) -> Value {
    let codes: Map<String, Value> = code_counts(batch)
        .into_iter()
        .map(|(code, n)| (code.to_owned(), json!(n)))
        .collect();
    let dimensions: Map<String, Value> = dimension_counts(batch)
        .into_iter()
        .map(|(dimension, values)| {
            let values: Map<String, Value> = values
                .into_iter()
                .map(|(value, n)| (value.to_owned(), json!(n)))
                .collect();
            (dimension.as_str().to_owned(), Value::Object(values))
        })
        .collect();
    json!({
        "version": batch.version,
        "sender": batch.sender,
        "seq": batch.seq,
        "clicks": batch.clicks.len(),
        "bytes": len,
        "base_us": batch.base_us,
        "oldest_age_us": oldest_age_us(batch, now_us),
        "missing_before": note.missing,
        "repeated_seq": note.repeat,
        "codes": codes,
        "dimensions": dimensions,
    })
}

/// Every field of an accepted datagram as one JSON object, each click with its time and the
/// dimensions it carries, for `decode --json`.
pub fn batch_details_json(batch: &Datagram<'_>, len: usize) -> Value {
    let clicks: Vec<Value> = batch
        .clicks
        .iter()
        .zip(batch.clicks_at())
        .map(|(click, (_, at_us))| {
            let mut fields = Map::new();
            fields.insert("code".into(), json!(click.code));
            fields.insert("at_us".into(), json!(at_us));
            fields.insert("at".into(), json!(format_time(at_us)));
            fields.insert("offset_us".into(), json!(click.offset_us));
            fields.extend(dimension_json(batch.version, click));
            Value::Object(fields)
        })
        .collect();
    json!({
        "bytes": len,
        "version": batch.version,
        "sender": batch.sender,
        "seq": batch.seq,
        "base_us": batch.base_us,
        "clicks": clicks,
    })
}

/// The JSON object `listen --json` prints for a rejected datagram.
pub fn rejected_json(bytes: &[u8], len: usize, reason: &str, error: &str) -> Value {
    json!({ "bytes": len, "reason": reason, "error": error, "head": hex::head(bytes) })
}

/// Every field of an accepted datagram, one per line, for `decode`.
pub fn batch_details(batch: &Datagram<'_>, len: usize) -> String {
    let mut out = format!(
        "valid datagram, {len} bytes\nversion: {}\nsender:  {}\nseq:     {}\nbase:    {} (base_us {})\nclicks:  {}\n",
        batch.version,
        batch.sender,
        batch.seq,
        format_time(batch.base_us),
        batch.base_us,
        batch.clicks.len()
    );
    for (i, (click, (_, at))) in batch.clicks.iter().zip(batch.clicks_at()).enumerate() {
        let _ = write!(
            out,
            "  {i:>4}  {:<20} {} (+{} us)",
            click.code,
            format_time(at),
            click.offset_us
        );
        let words = dimension_words(batch.version, &click.dimensions);
        if !words.is_empty() {
            let _ = write!(out, "  {words}");
        }
        out.push('\n');
    }
    out
}

/// A duration in microseconds, short: `850us`, `12.3ms`, `1.25s`; negative when the clock
/// that stamped the click is ahead of ours.
pub fn format_age(us: i64) -> String {
    let sign = if us < 0 { "-" } else { "" };
    let abs = us.unsigned_abs();
    match abs {
        0..=999 => format!("{sign}{abs}us"),
        1_000..=999_999 => format!("{sign}{:.1}ms", abs as f64 / 1e3),
        _ => format!("{sign}{:.2}s", abs as f64 / 1e6),
    }
}

/// RFC 3339 UTC with microseconds, for any time the wire format allows (years 1 to 9999).
pub fn format_time(us: i64) -> String {
    let secs = us.div_euclid(1_000_000);
    let micros = us.rem_euclid(1_000_000);
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
    let of_day = secs.rem_euclid(86_400);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::wire::{END_CLICKED_AT_US, MIN_CLICKED_AT_US};

    #[test]
    fn times_cover_the_whole_wire_range() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(format_time(-5), "1969-12-31T23:59:59.999995Z");
        assert_eq!(
            format_time(951_782_400_000_001),
            "2000-02-29T00:00:00.000001Z"
        );
        assert_eq!(
            format_time(MIN_CLICKED_AT_US),
            "0001-01-01T00:00:00.000000Z"
        );
        assert_eq!(
            format_time(END_CLICKED_AT_US - 1),
            "9999-12-31T23:59:59.999999Z"
        );
    }

    #[test]
    fn ages_are_short() {
        assert_eq!(format_age(850), "850us");
        assert_eq!(format_age(12_340), "12.3ms");
        assert_eq!(format_age(1_250_000), "1.25s");
        assert_eq!(format_age(-2_000), "-2.0ms");
    }

    #[test]
    fn long_code_lists_are_abbreviated() {
        let mut enc = wire::Encoder::new(1, wire::DEFAULT_DATAGRAM).unwrap();
        for code in ["a", "b", "a", "c", "d", "e", "f", "g"] {
            enc.push(code, 1_000_000).unwrap();
        }
        let bytes = enc.datagram().to_vec();
        let batch = wire::decode(&bytes).unwrap();
        let line = batch_line(&batch, bytes.len(), 1_000_000, SeqNote::default());
        assert!(
            line.ends_with("codes=a:2,b,c,d,e +2 more agent=human:8"),
            "{line}"
        );
        assert!(line.contains("oldest_age=0us"), "{line}");
    }

    #[test]
    fn each_dimensions_values_are_counted_in_order_of_first_appearance() {
        let mut enc = wire::Encoder::new(1, wire::DEFAULT_DATAGRAM).unwrap();
        let hosts: Vec<String> = (0..300).map(|i| format!("r{i}.example")).collect();
        for host in hosts.iter().chain([&hosts[7], &hosts[7], &hosts[0]]) {
            let d = Dimensions {
                referrer: Some(host),
                ..Dimensions::default()
            };
            enc.push_with("a", 1_000_000, &d).unwrap();
        }
        let bytes = enc.datagram().to_vec();
        let batch = wire::decode(&bytes).unwrap();
        let counts = dimension_counts(&batch);
        let (_, referrers) = counts
            .iter()
            .find(|(d, _)| *d == Dimension::Referrer)
            .expect("a referrer count");
        assert_eq!(referrers.len(), 300);
        assert_eq!(referrers[0], ("r0.example", 2));
        assert_eq!(referrers[7], ("r7.example", 3));
        assert_eq!(referrers[299], ("r299.example", 1));
        assert_eq!(counts[0].0, Dimension::Agent, "{:?}", counts[0].1);
    }

    #[test]
    fn dimensions_are_shown_for_version_2_and_not_for_version_1() {
        let d = Dimensions {
            agent: protocol::dimensions::Agent::Bot,
            referrer: Some(""),
            device: None,
            country: protocol::dimensions::Country::parse(b"DE"),
        };
        for version in [1, 2] {
            let mut enc = wire::Encoder::of_version(version, 1, wire::DEFAULT_DATAGRAM).unwrap();
            enc.push_with("a", 1_000_000, &d).unwrap();
            enc.push("b", 1_000_000).unwrap();
            let bytes = enc.datagram().to_vec();
            let batch = wire::decode(&bytes).unwrap();
            let line = batch_line(&batch, bytes.len(), 1_000_000, SeqNote::default());
            let details = batch_details(&batch, bytes.len());
            let json = batch_details_json(&batch, bytes.len());
            if version == 2 {
                assert!(
                    line.contains(" version=2 ")
                        && line.ends_with(" agent=bot,human referrer=(none) country=DE"),
                    "{line}"
                );
                assert!(
                    details.contains("(+1000000 us)  agent=bot referrer=(none) country=DE\n"),
                    "{details}"
                );
                assert_eq!(json["clicks"][0]["referrer"], "(none)");
                assert_eq!(json["clicks"][1]["agent"], "human");
                assert!(json["clicks"][1].get("device").is_none());
            } else {
                assert!(
                    line.contains(" version=1 ") && line.ends_with("codes=a,b"),
                    "{line}"
                );
                assert!(!details.contains("agent="), "{details}");
                assert!(json["clicks"][0].get("agent").is_none(), "{json}");
            }
            assert_eq!(json["version"], version);
        }
    }

    #[test]
    fn a_resync_is_shown_as_one_and_a_damaged_one_is_rejected() {
        let bytes = Resync::new(7, 42, 1_000).encode();
        let Reading::Resync(resync) = judge(&bytes, bytes.len()) else {
            panic!("a resync not read as one");
        };
        let line = resync_line(&resync, bytes.len());
        assert!(
            line.starts_with("RESYNC sender=7 first=42 clicks_before=1000 "),
            "{line}"
        );
        assert_eq!(resync_json(&resync, bytes.len())["resync"]["first"], 42);
        let cut = &bytes[..bytes.len() - 1];
        assert!(matches!(judge(cut, cut.len()), Reading::Rejected { .. }));
    }

    #[test]
    fn oversize_is_rejected_before_decoding() {
        let Reading::Rejected { reason, .. } = judge(&[1], MAX_DATAGRAM + 1) else {
            panic!("an oversize datagram was accepted");
        };
        assert_eq!(reason, "oversize");
    }
}
