//! The collector's background work under load: `compaction` (how far folding keeps up with
//! sustained full-speed ingest) and `partitions` (bytes per click in a day's partition, and
//! the time to drop a day).

use std::time::{Duration, Instant};

use crate::cluster::{execute, number, scalar};
use crate::ingest::{copy_csv, reset_tables, DISTS};
use crate::redirect::{check_recorded, rows_now, start_collector, Written};
use crate::services::{until, Proc};
use crate::{log, Bench, Res, Variant};

/// The lines the collector's log has now: a run reads only those it adds.
fn log_lines(bench: &Bench) -> usize {
    let text = std::fs::read_to_string(bench.path("collector.log")).unwrap_or_default();
    text.lines().count()
}

/// The collector's log lines after the first `skip`.
fn log_since(bench: &Bench, skip: usize) -> Vec<String> {
    let text = std::fs::read_to_string(bench.path("collector.log")).unwrap_or_default();
    text.lines().skip(skip).map(str::to_owned).collect()
}

/// A `Debug`-printed duration (`12.3ms`, `850.1µs`, `1.2s`) in seconds.
fn seconds(text: &str) -> Option<f64> {
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = text.strip_suffix("µs").or_else(|| text.strip_suffix("us")) {
        (n, 1e-6)
    } else if let Some(n) = text.strip_suffix("ns") {
        (n, 1e-9)
    } else {
        (text.strip_suffix('s')?, 1.0)
    };
    number.parse::<f64>().ok().map(|n| n * scale)
}

/// The word after `marker` in `line`.
fn word_after<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    let rest = &line[line.find(marker)? + marker.len()..];
    rest.split(|c: char| c.is_whitespace() || c == ':')
        .find(|w| !w.is_empty())
}

/// The counts committed and not folded yet (this version's lists; the bench writes no other kind).
const WAITING_COUNTS: &str = "SELECT coalesce(sum(entries), 0)::float8 FROM click_count_lists";

/// Sends SUSTAIN clicks as fast as the collector takes them while sampling the count backlog
/// each second; then reads the collector's "folded N counts in T" lines of that run. The
/// table's cells: clicks/s, largest backlog, fold rate, longest fold.
async fn sustain_once(bench: &Bench, dist: &str) -> Res<[String; 4]> {
    let sustain = bench.knobs.sustain;
    let collector = start_collector(bench, Variant::Current, &[]).await?;
    let written = Written::now(Variant::Current).await?;
    let rows0 = rows_now(bench, Variant::Current).await?;
    let skip = log_lines(bench);
    let t0 = Instant::now();
    let mut sender = Proc::spawn(
        "clicktap send",
        crate::ingest::send_command(bench, Variant::Current, dist, sustain, None),
        &bench.path("clicktap.log"),
    )?;
    // Read from the table, not from the gauge collector_deltas_pending: that is set once a
    // maintenance round, which a run of a few seconds may not reach, and read 0 throughout.
    // Once more when every click is written: a run shorter than a sample is one sample.
    let db = bench.client(Variant::Current).await?;
    let mut largest = 0.0f64;
    while !sender.exited() {
        let waiting: f64 = db.query_one(WAITING_COUNTS, &[]).await?.get(0);
        largest = largest.max(waiting);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sender.finish().await?;
    let rate = sustain as f64 / t0.elapsed().as_secs_f64();
    written
        .await_written(bench, sustain as f64, Duration::from_secs(600))
        .await?;
    let waiting: f64 = db.query_one(WAITING_COUNTS, &[]).await?.get(0);
    largest = largest.max(waiting);
    written
        .await_folded(bench, sustain as f64, Duration::from_secs(600))
        .await?;
    collector.stop().await;
    // After the folds: the count would have slowed the last.
    check_recorded(bench, Variant::Current, "compaction", sustain, 0, rows0).await?;
    let folds: Vec<(f64, f64)> = log_since(bench, skip)
        .iter()
        .filter_map(|l| {
            let moved = word_after(l, "folded ")?.parse().ok()?;
            let took = seconds(word_after(l, " counts in ")?)?;
            Some((moved, took))
        })
        .collect();
    if folds.is_empty() {
        // The run waited for its folds: none in the log is a log filter that missed them,
        // which would print a fold rate of 0.
        return Err(format!(
            "no \"folded N counts in T\" line in {} for this run, though its clicks were \
             folded: the collector's RUST_LOG no longer names the module that writes it",
            bench.path("collector.log").display()
        )
        .into());
    }
    let rows: f64 = folds.iter().map(|f| f.0).sum();
    let secs: f64 = folds.iter().map(|f| f.1).sum();
    let longest = folds.iter().map(|f| f.1).fold(0.0, f64::max);
    let fold_rate = if secs > 0.0 { rows / secs } else { 0.0 };
    Ok([
        format!("{rate:.0}"),
        format!("{largest:.0}"),
        format!("{fold_rate:.0}"),
        format!("{longest:.2}"),
    ])
}

pub(crate) async fn bench_compaction(bench: &mut Bench) -> Res<()> {
    println!("| codes | ingest clicks/s | largest delta backlog (rows) | fold rate (delta rows/s) | longest compaction s |");
    println!("|---|---|---|---|---|");
    for dist in DISTS {
        reset_tables(bench, Variant::Current).await?;
        log(&format!(
            "sustained ingest, {dist}: {} clicks",
            bench.knobs.sustain
        ));
        let cells = sustain_once(bench, dist).await?;
        println!("| {dist} | {} |", cells.join(" | "));
    }
    println!();
    println!(
        "{} clicks per run, as fast as the collector takes them. Compaction keeps up while the",
        bench.knobs.sustain
    );
    println!("backlog stays bounded and returns to 0.");
    Ok(())
}

/// A day CLICKS clicks long, 20 days ago, loaded straight into its partition; its size on
/// disk per click (heap, and the code index the collector builds once a day is over); then a
/// collector with --retention 10 drops it, and its log says how long that took.
pub(crate) async fn bench_partitions(bench: &mut Bench) -> Res<()> {
    let db = bench.client(Variant::Current).await?;
    let day = scalar(&db, "SELECT to_char(current_date - 20, 'YYYYMMDD')").await?;
    let date = scalar(&db, "SELECT (current_date - 20)::text").await?;
    execute(&db, "SELECT ensure_click_partition(current_date - 20)").await?;
    let old = bench.path("rows-old.csv");
    restamp(&bench.path("rows-uniform.csv"), &old, &date)?;
    copy_csv(bench, &old).await?;
    let table = format!("clicks_p{day}");
    let rows = number(&db, &format!("SELECT count(*) FROM {table}")).await?;
    let bytes = number(&db, &format!("SELECT pg_table_size('{table}')")).await?;
    execute(
        &db,
        &format!("CREATE INDEX {table}_code ON {table} (code, clicked_at)"),
    )
    .await?;
    let indexed = number(&db, &format!("SELECT pg_total_relation_size('{table}')")).await?;
    let skip = log_lines(bench);
    let collector = start_collector(bench, Variant::Current, &["--retention", "10"]).await?;
    let marker = format!("dropped partition {table} in ");
    let dropped = || {
        log_since(bench, skip)
            .into_iter()
            .find(|l| l.contains(&marker))
    };
    until(
        Duration::from_secs(300),
        "the old day dropped",
        &bench.path("collector.log"),
        || async { dropped().is_some() },
    )
    .await?;
    let took = dropped()
        .and_then(|l| word_after(&l, &marker).map(str::to_owned))
        .unwrap_or_default();
    collector.stop().await;
    let per = |b: i64| {
        if rows > 0 {
            format!("{:.1}", b as f64 / rows as f64)
        } else {
            "-".to_owned()
        }
    };
    println!(
        "| rows in the day | heap bytes per click | with the code index | dropping the day took |"
    );
    println!("|---|---|---|---|");
    println!("| {rows} | {} | {} | {took} |", per(bytes), per(indexed));
    println!();
    println!(
        "One day of {rows} uniform clicks loaded with \\copy into its partition; the index is the"
    );
    println!("(code, clicked_at) one the collector builds on each partition once its day is over.");
    Ok(())
}

/// `from`'s CSV rows with their day replaced by `date`.
fn restamp(from: &std::path::Path, to: &std::path::Path, date: &str) -> Res<()> {
    use std::io::{BufRead, BufWriter, Write};
    let input = std::fs::File::open(from).map_err(|e| format!("{}: {e}", from.display()))?;
    let mut out = BufWriter::new(std::fs::File::create(to)?);
    for line in std::io::BufReader::new(input).lines() {
        let line = line?;
        let (code, stamp) = line
            .split_once(',')
            .ok_or_else(|| format!("{}: {line:?} is not code,time", from.display()))?;
        let time = stamp.split_once(' ').map_or(stamp, |(_, t)| t);
        writeln!(out, "{code},{date} {time}")?;
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_lines_parse() {
        let line = "2026-12-02T06:00:00Z DEBUG collector::compact: folded 1234 counts in 12.5ms";
        assert_eq!(word_after(line, "folded "), Some("1234"));
        assert_eq!(
            word_after(line, " counts in ").and_then(seconds),
            Some(0.0125)
        );
        assert_eq!(seconds("850µs"), Some(0.00085));
        assert_eq!(seconds("1.5s"), Some(1.5));
        let drop = "INFO collector::maintenance: dropped partition clicks_p20261112 in 3.1ms: older than the retention";
        assert_eq!(
            word_after(drop, "dropped partition clicks_p20261112 in "),
            Some("3.1ms")
        );
    }
}
