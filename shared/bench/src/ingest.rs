//! The collector's side: the databases every mode starts from, the ingest inputs, `collector`
//! (the collector's ingest rate next to `psql \copy` of the same rows) and `totals` (what
//! keeping click totals costs at a steady rate).

use std::io::{BufWriter, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::cluster::{execute, number, scalar, settle, with_room_for_wal};
use crate::knobs::CODES;
use crate::procfs::{hwm_mib, Cpu, PgMemory};
use crate::redirect::{check_recorded, rows_now, start_collector, Written};
use crate::services::{metrics, Proc};
use crate::table::{append, column, g10, median, num, order_balanced, ratio, rotated, rows};
use crate::{addr, log, Bench, Res, Variant, COLLECTOR_ADMIN};

/// A fresh database for a variant: migrated by its own collector, seeded with the links.
pub(crate) async fn fresh_db(bench: &Bench, variant: Variant) -> Res<()> {
    let admin = bench.cluster.connect("postgres").await?;
    let name = variant.db();
    execute(&admin, &format!("DROP DATABASE IF EXISTS {name}")).await?;
    execute(&admin, &format!("CREATE DATABASE {name}")).await?;
    let mut migrate = Command::new(bench.bin(variant, "collector"));
    migrate.args(["migrate", "--database-url", &bench.url(variant)]);
    Proc::spawn("collector migrate", migrate, &bench.path("collector.log"))?
        .finish()
        .await?;
    let db = bench.client(variant).await?;
    let seed = format!(
        "INSERT INTO links (code, url) SELECT 'seed' || n, 'https://example.com/' || n \
         FROM generate_series(0, {} - 1) AS n",
        CODES
    );
    execute(&db, &seed).await?;
    // Vacuumed now: autovacuum would otherwise do it for the seeding (links and the change
    // log) in the middle of whichever run comes first.
    execute(&db, "VACUUM ANALYZE").await?;
    if variant == Variant::Flat {
        // The current collector's schema with clicks one unpartitioned table, as before
        // migration 6: nothing to route, and no partition for the collector to make or find.
        execute(&db, "DROP TABLE clicks").await?;
        execute(
            &db,
            "CREATE TABLE clicks (code text NOT NULL, clicked_at timestamptz NOT NULL)",
        )
        .await?;
        execute(
            &db,
            "CREATE OR REPLACE FUNCTION ensure_click_partition(day date) RETURNS boolean \
             LANGUAGE sql AS 'SELECT false'",
        )
        .await?;
    }
    Ok(())
}

/// The code distributions of the ingest runs.
pub(crate) const DISTS: [&str; 2] = ["zipf", "uniform"];

/// For each distribution, CLICKS codes (one a line, for `clicktap send --code-file`) and the
/// same rows as CSV for `\copy`, stamped today (UTC: a day the collector keeps a partition for).
pub(crate) fn make_inputs(bench: &Bench) -> Res<()> {
    let n = bench.knobs.clicks;
    log(&format!("generating {n} rows per distribution"));
    // Zipf, s = 1: the cumulative weights, searched for a uniform draw.
    let mut cumulative = Vec::with_capacity(CODES as usize);
    let mut sum = 0.0;
    for k in 1..=CODES {
        sum += 1.0 / k as f64;
        cumulative.push(sum);
    }
    let today = crate::today();
    for dist in DISTS {
        let mut random = testkit::XorShift(0x2545_f491_4f6c_dd1d);
        let mut codes = writer(bench, &format!("codes-{dist}.txt"))?;
        let mut csv = writer(bench, &format!("rows-{dist}.csv"))?;
        for i in 0..n {
            let u = (random.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            let code = match dist {
                "zipf" => cumulative.partition_point(|&c| c < u * sum),
                _ => (u * CODES as f64) as usize,
            };
            writeln!(codes, "seed{code}")?;
            writeln!(csv, "seed{code},{today} 00:00:00.{:06}+00", i % 1_000_000)?;
        }
        codes.flush()?;
        csv.flush()?;
    }
    Ok(())
}

/// CLICKS, where clicktap is to send that many codes from a file: at most what it reads.
pub(crate) fn check_sendable(clicks: u64) -> Res<()> {
    let most = clicktap::MAX_FILE_CODES as u64;
    if clicks > most {
        return Err(format!(
            "CLICKS must be at most {most} (a line of a code file each, and `clicktap send \
             --code-file` reads at most that many), not {clicks}"
        )
        .into());
    }
    Ok(())
}

fn writer(bench: &Bench, name: &str) -> Res<BufWriter<std::fs::File>> {
    let path = bench.path(name);
    let file = std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(BufWriter::new(file))
}

/// Counts (code, day) waiting to be folded, in any shape of the schema a BASELINE may have
/// (a row each, arrays per batch since version 5, lists since).
async fn pending_counts(client: &tokio_postgres::Client) -> Res<i64> {
    let has = |table: &str| format!("SELECT (to_regclass('{table}') IS NOT NULL)::text");
    let lists = scalar(client, &has("click_count_lists")).await? == "true";
    let batches = scalar(client, &has("click_count_batches")).await? == "true";
    let sql = match (lists, batches) {
        (true, _) => {
            "SELECT (SELECT count(*) FROM click_count_deltas) \
             + (SELECT coalesce(sum(entries), 0) FROM click_count_batches) \
             + (SELECT coalesce(sum(entries), 0) FROM click_count_lists)"
        }
        (false, true) => {
            "SELECT (SELECT count(*) FROM click_count_deltas) \
             + (SELECT coalesce(sum(entries), 0) FROM click_count_batches)"
        }
        _ => "SELECT count(*) FROM click_count_deltas",
    };
    number(client, sql).await
}

pub(crate) async fn reset_tables(bench: &Bench, variant: Variant) -> Res<()> {
    let client = bench.client(variant).await?;
    execute(&client, "TRUNCATE clicks, click_count_deltas, click_counts").await?;
    let optional = "DO $$ BEGIN
        IF to_regclass('click_count_batches') IS NOT NULL THEN TRUNCATE click_count_batches; END IF;
        IF to_regclass('clicks_set_aside') IS NOT NULL THEN TRUNCATE clicks_set_aside; END IF;
        IF to_regclass('click_count_lists') IS NOT NULL THEN TRUNCATE click_count_lists; END IF;
        IF to_regclass('click_breakdown_counts') IS NOT NULL THEN TRUNCATE click_breakdown_counts; END IF;
        IF to_regclass('click_breakdown_lists') IS NOT NULL THEN TRUNCATE click_breakdown_lists; END IF;
        END $$";
    execute(&client, optional).await
}

/// `clicktap send` of `count` codes of `dist` to the collector's socket, as fast as it takes them.
async fn send(bench: &Bench, variant: Variant, dist: &str, count: u64) -> Res<()> {
    send_with(bench, send_command(bench, variant, dist, count, None)).await
}

async fn send_with(bench: &Bench, cmd: Command) -> Res<()> {
    Proc::spawn("clicktap send", cmd, &bench.path("clicktap.log"))?
        .finish()
        .await
}

/// The `clicktap send` flags that give every click `dimensions` (a DIMENSIONS list), each one
/// value, as a redirector records them.
fn dimension_args(dimensions: &str) -> Vec<&'static str> {
    let flag = |d: &str| match d {
        "referrer" => ["--referrer", "example.com"],
        "device" => ["--device", "mobile"],
        _ => ["--country", "DE"],
    };
    dimensions.split(',').flat_map(flag).collect()
}

/// The `clicktap send` command line of [`send`]: the variant's own clicktap, which speaks
/// the wire its collector takes.
pub(crate) fn send_command(
    bench: &Bench,
    variant: Variant,
    dist: &str,
    count: u64,
    rate: Option<u64>,
) -> Command {
    let mut cmd = Command::new(bench.bin(variant, "clicktap"));
    cmd.arg("send")
        .arg("--socket")
        .arg(bench.path("collector.sock"))
        .arg("--code-file")
        .arg(bench.path(&format!("codes-{dist}.txt")))
        .args(["--count", &count.to_string(), "--batch", "1250"]);
    if let Some(rate) = rate {
        cmd.args(["--rate", &rate.to_string()]);
    }
    cmd
}

/// CLICKS clicks of `dist` from clicktap into the variant's collector as fast as it takes
/// them, timed until written, then until folded. Appends its row to $OUT/collector.tsv.
async fn ingest_collector(bench: &Bench, dist: &str, variant: Variant, round: u32) -> Res<()> {
    let clicks = bench.knobs.clicks;
    let collector = start_collector(bench, variant, &[]).await?;
    let written = Written::now(variant).await?;
    let rows0 = rows_now(bench, variant).await?;
    let memory = PgMemory::start(bench.postmaster);
    let cpu0 = Cpu::now(None, Some(collector.pid()), bench.postmaster);
    let t0 = Instant::now();
    send(bench, variant, dist, clicks).await?;
    let admin = addr(COLLECTOR_ADMIN);
    let log_path = bench.path("collector.log");
    let what = format!("{clicks} clicks written");
    crate::services::until(Duration::from_secs(300), &what, &log_path, || async {
        crate::services::metric(admin, "collector_clicks_written_total")
            .await
            .is_ok_and(|w| w - written.clicks >= clicks as f64)
    })
    .await?;
    let rate = clicks as f64 / t0.elapsed().as_secs_f64();
    let deltas = pending_counts(&bench.client(variant).await?).await?;
    let c0 = Instant::now();
    let compaction = written
        .await_folded(bench, clicks as f64, Duration::from_secs(300))
        .await?;
    let per = Cpu::now(None, Some(collector.pid()), bench.postmaster).per_click(&cpu0, clicks);
    let catchup = c0.elapsed().as_secs_f64();
    let col_mib = hwm_mib(collector.pid());
    let pg_mib = memory.peak();
    // After the CPU and memory are read: the count is PostgreSQL's work, not the run's.
    let mode = format!("collector ({}, {dist})", variant.name());
    check_recorded(bench, variant, &mode, clicks, 0, rows0).await?;
    collector.stop().await;
    let [_, col_us, pg_us] = per;
    let row = [
        variant.name().to_owned(),
        dist.to_owned(),
        round.to_string(),
        format!("{rate:.0}"),
        deltas.to_string(),
        format!("{catchup:.2}"),
        format!("{compaction:.2}"),
        col_us,
        pg_us,
        col_mib,
        pg_mib,
    ];
    append(&bench.path("collector.tsv"), &row)
}

/// The same rows through `psql \copy` into `clicks`: the yardstick. Appends its row.
async fn ingest_copy(bench: &Bench, dist: &str, round: u32) -> Res<()> {
    let clicks = bench.knobs.clicks;
    let memory = PgMemory::start(bench.postmaster);
    let backends = crate::procfs::pg_children(bench.postmaster);
    let cpu0 = Cpu::now(None, None, bench.postmaster);
    let t0 = Instant::now();
    copy_csv(bench, &bench.path(&format!("rows-{dist}.csv"))).await?;
    let rate = clicks as f64 / t0.elapsed().as_secs_f64();
    crate::procfs::await_reaped(bench.postmaster, &backends);
    let [_, _, pg_us] = Cpu::now(None, None, bench.postmaster).per_click(&cpu0, clicks);
    let pg_mib = memory.peak();
    let row = [
        "copy",
        dist,
        &round.to_string(),
        &format!("{rate:.0}"),
        "-",
        "-",
        "-",
        "0",
        &pg_us,
        "0",
        &pg_mib,
    ];
    append(&bench.path("collector.tsv"), &row.map(str::to_owned))
}

/// `psql \copy` of a CSV file of (code, clicked_at) rows into the current variant's `clicks`.
pub(crate) async fn copy_csv(bench: &Bench, csv: &std::path::Path) -> Res<()> {
    let copy = format!(
        "\\copy clicks (code, clicked_at) from '{}' csv",
        csv.display()
    );
    let mut psql = Command::new("psql");
    psql.args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-At"])
        .arg(bench.url(Variant::Current))
        .args(["-c", &copy]);
    Proc::spawn("psql \\copy", psql, &bench.path("psql.log"))?
        .finish()
        .await
}

/// The variants of the collector runs.
fn ingest_variants(bench: &Bench) -> Vec<Variant> {
    let mut variants = vec![Variant::Current];
    if bench.knobs.baseline.is_some() {
        variants.push(Variant::Baseline);
    }
    if bench.knobs.flat {
        variants.push(Variant::Flat);
    }
    variants
}

pub(crate) async fn bench_collector(bench: &mut Bench) -> Res<()> {
    std::fs::write(bench.path("collector.tsv"), "")?;
    let variants = ingest_variants(bench);
    let mut m = 0;
    for round in 1..=bench.knobs.rounds {
        for dist in DISTS {
            // Rotated between the two mixes of a round too (with an even number of rounds,
            // each variant goes first equally often in each mix).
            m += 1;
            for variant in rotated(round as usize + m, &variants) {
                reset_tables(bench, variant).await?;
                log(&format!(
                    "ingest round {round}, {dist}: collector ({})",
                    variant.name()
                ));
                ingest_collector(bench, dist, variant, round).await?;
            }
            reset_tables(bench, Variant::Current).await?;
            log(&format!("ingest round {round}, {dist}: psql \\copy"));
            ingest_copy(bench, dist, round).await?;
        }
    }
    print_collector(bench, &variants);
    Ok(())
}

fn print_collector(bench: &Bench, variants: &[Variant]) {
    println!("| codes | writer | rows/s | vs \\copy | delta rows per run | folding them took s | deltas empty after s | CPU us per click: collector / PostgreSQL | peak MiB: collector / PostgreSQL |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let rows = rows(&bench.path("collector.tsv"));
    let kinds: Vec<&str> = variants.iter().map(|v| v.name()).chain(["copy"]).collect();
    for dist in DISTS {
        let copy = num(&median(&column(&rows, &["copy", dist], 4)));
        for kind in &kinds {
            let c = |f| median(&column(&rows, &[kind, dist], f));
            let name = match *kind {
                "current" => "collector",
                "baseline" => "collector (baseline)",
                "flat" => "collector, clicks unpartitioned",
                _ => "psql \\copy",
            };
            let rate = num(&c(4));
            println!(
                "| {dist} | {name} | {rate:.0} | {} | {} | {} | {} | {} / {} | {} / {} |",
                ratio(rate, copy, 2),
                c(5),
                c(7),
                c(6),
                c(8),
                c(9),
                c(10),
                c(11)
            );
        }
    }
    let k = &bench.knobs;
    println!();
    println!(
        "Every run: {}. {} rows per run over {CODES} codes; medians of {}.",
        bench.path("collector.tsv").display(),
        k.clicks,
        k.rounds
    );
    println!("'deltas empty after' counts from the end of the ingest, so it includes the wait for the next");
    println!(
        "compaction; 'folding them took' is the compactions' own time. CPU counts until folded."
    );
}

/// The commit-lag histogram's cumulative buckets: (upper bound, none for +Inf; count).
async fn lag_buckets() -> Res<Vec<(Option<f64>, f64)>> {
    let text = metrics(addr(COLLECTOR_ADMIN)).await?;
    let buckets = text
        .lines()
        .filter_map(|l| l.strip_prefix("collector_commit_lag_seconds_bucket{"))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let count = l.rsplit(' ').next()?.parse().ok()?;
            Some((le.parse().ok(), count))
        })
        .collect();
    Ok(buckets)
}

/// Quantile `q` of the clicks committed between two readings of the buckets, interpolated
/// within its bucket as Prometheus' histogram_quantile does; `-` if none were.
fn lag_quantile(before: &[(Option<f64>, f64)], after: &[(Option<f64>, f64)], q: f64) -> String {
    let counts: Vec<(Option<f64>, f64)> = after
        .iter()
        .map(|(le, n)| {
            (
                *le,
                n - before.iter().find(|(b, _)| b == le).map_or(0.0, |b| b.1),
            )
        })
        .collect();
    let Some(&(_, total)) = counts.last().filter(|(_, n)| *n > 0.0) else {
        return "-".to_owned();
    };
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for (le, n) in counts {
        if n >= rank {
            return match le {
                None => g10(lower),
                Some(le) => format!("{:.4}", lower + (le - lower) * (rank - below) / (n - below)),
            };
        }
        (lower, below) = (le.unwrap_or(lower), n);
    }
    "-".to_owned()
}

/// RATE clicks/s of uniform codes for TOTALS_SECS through `clicktap send --rate` (stamped and
/// paced as a redirector's drain sends them) into the variant's collector, which folds at its
/// own interval; CPU from the first click until the run's counts are folded and checkpointed,
/// on a cluster settled before it. Appends its row to $OUT/totals.tsv.
async fn totals_once(
    bench: &Bench,
    superuser: &tokio_postgres::Client,
    variant: Variant,
    round: u32,
) -> Res<()> {
    let n = bench.knobs.rate * bench.knobs.totals_secs;
    reset_tables(bench, variant).await?;
    settle(superuser, &bench.path("postgres.log")).await?;
    let collector = start_collector(bench, variant, &[]).await?;
    let written = Written::now(variant).await?;
    let rows0 = rows_now(bench, variant).await?;
    let cpu0 = Cpu::now(None, Some(collector.pid()), bench.postmaster);
    let lag0 = lag_buckets().await?;
    let mut cmd = send_command(bench, variant, "uniform", n, Some(bench.knobs.rate));
    if let Some(dimensions) = &bench.knobs.totals_dimensions {
        cmd.args(dimension_args(dimensions));
    }
    send_with(bench, cmd).await?;
    let admin = addr(COLLECTOR_ADMIN);
    written
        .await_written(bench, n as f64, Duration::from_secs(120))
        .await?;
    let lag1 = lag_buckets().await?;
    let cpu_written = Cpu::now(None, Some(collector.pid()), bench.postmaster);
    // Until every count of the run is folded: each variant then carries the whole cost of
    // its run's totals, however its folds fall in time.
    written.await_fold(bench).await?;
    let cpu_folded = Cpu::now(None, Some(collector.pid()), bench.postmaster);
    // The run's pages written out, charged to it: left to the next checkpoint, they fell to
    // whichever run came next, which moved a round's ratio with the order (BENCHMARKS.md).
    execute(superuser, "CHECKPOINT").await?;
    let cpu_done = Cpu::now(None, Some(collector.pid()), bench.postmaster);
    // After the CPU is read: the count is PostgreSQL's work, not the run's.
    let mode = format!("totals ({})", variant.name());
    check_recorded(bench, variant, &mode, n, 0, rows0).await?;
    let [_, col_us, pg_us] = cpu_done.per_click(&cpu0, n);
    // The same in two parts: until the clicks are written (the COPYs, and the folds that came
    // due meanwhile), and after (a 20-s run's fold comes after, at --compact-interval).
    let [_, col_writing, pg_writing] = cpu_written.per_click(&cpu0, n);
    let [_, col_after, pg_after] = cpu_folded.per_click(&cpu_written, n);
    let [_, _, pg_checkpoint] = cpu_done.per_click(&cpu_folded, n);
    let folds =
        crate::services::metric(admin, "collector_compactions_total").await? - written.compactions;
    let row = [
        variant.name().to_owned(),
        round.to_string(),
        col_us,
        pg_us,
        format!("{folds:.0}"),
        hwm_mib(collector.pid()),
        lag_quantile(&lag0, &lag1, 0.5),
        lag_quantile(&lag0, &lag1, 0.99),
        col_writing,
        col_after,
        pg_writing,
        pg_after,
        pg_checkpoint,
    ];
    collector.stop().await;
    // What the run left autovacuum to do, done now and not counted, rather than in a run of
    // the other variant (whose database shares the cluster).
    execute(&bench.client(variant).await?, "VACUUM").await?;
    append(&bench.path("totals.tsv"), &row)
}

pub(crate) async fn bench_totals(bench: &mut Bench) -> Res<()> {
    std::fs::write(bench.path("totals.tsv"), "")?;
    let mut variants = vec![Variant::Current];
    if bench.knobs.baseline.is_some() {
        variants.push(Variant::Baseline);
    }
    let k = bench.knobs.clone();
    let admin = bench.cluster.connect("postgres").await?;
    let runs = async {
        for round in 1..=k.rounds {
            // The variants take turns going first, should a run still pay for the one before it.
            for variant in rotated(round as usize - 1, &variants) {
                log(&format!(
                    "totals round {round}: {}, {} clicks/s for {} s",
                    variant.name(),
                    k.rate,
                    k.totals_secs
                ));
                totals_once(bench, &admin, variant, round).await?;
            }
        }
        Ok(())
    };
    with_room_for_wal(&admin, runs).await?;
    println!("| collector | CPU us per click: collector | PostgreSQL | the same until written + after: collector; PostgreSQL, + its checkpoint | folds per run | collector peak MiB | commit lag p50 / p99 s |");
    println!("|---|---|---|---|---|---|---|");
    let all = rows(&bench.path("totals.tsv"));
    for variant in &variants {
        // The run with the median PostgreSQL figure, whole.
        let mut runs: Vec<&Vec<String>> = all
            .iter()
            .filter(|r| r.len() >= 8 && r[0] == variant.name())
            .collect();
        runs.sort_by(|a, b| num(&a[3]).total_cmp(&num(&b[3])));
        if let Some(r) = runs.get(runs.len().saturating_sub(1) / 2) {
            let part = |i: usize| r.get(i).map_or(f64::NAN, |v| num(v));
            println!(
                "| {} | {:.3} | {:.3} | {:.3} + {:.3}; {:.3} + {:.3} + {:.3} | {} | {} | {} / {} |",
                r[0],
                num(&r[2]),
                num(&r[3]),
                part(8),
                part(9),
                part(10),
                part(11),
                part(12),
                r[4],
                r[5],
                r[6],
                r[7]
            );
        }
    }
    println!();
    println!(
        "{} uniform clicks/s over {CODES} codes for {} s per run, medians of {} rounds; \
         dimensions besides the agent: {}",
        k.rate,
        k.totals_secs,
        k.rounds,
        k.totals_dimensions.as_deref().unwrap_or("none")
    );
    println!(
        "(the run with the median PostgreSQL figure); every run in {}.",
        bench.path("totals.tsv").display()
    );
    if let [this, base] = variants.as_slice() {
        for (what, field) in [("collector", 3), ("PostgreSQL", 4)] {
            let split = order_balanced(&all, this.name(), base.name(), field);
            println!("{what}, current / baseline per round: {split}.");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_quantiles_interpolate_within_the_bucket() {
        let before = [(Some(0.1), 0.0), (Some(1.0), 0.0), (None, 0.0)];
        let after = [(Some(0.1), 50.0), (Some(1.0), 100.0), (None, 100.0)];
        assert_eq!(lag_quantile(&before, &after, 0.5), "0.1000");
        assert_eq!(lag_quantile(&before, &after, 0.99), "0.9820");
        assert_eq!(lag_quantile(&after, &after, 0.5), "-");
    }
}
