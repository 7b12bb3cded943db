//! `redirect`: the redirector's throughput and latency with clicks off, through the pipeline,
//! one INSERT per request (direct), the pipeline with `--dimensions`, clicks off beside a busy
//! PostgreSQL (neighbour), BASELINE's pipeline, and the pipeline and clicks off at once (paired);
//! what each process spends per redirect, and each one's peak memory.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use testkit::redirector::browsers::{Headers, COUNTRY_HEADER};
use testkit::redirector::load::{Client, Load, Report};

use crate::knobs::CODES;
use crate::machine::Probe;
use crate::procfs::{hwm_mib, Cpu, PgMemory};
use crate::services::{await_healthy, has_flag, metric, until, until_every, Proc};
use crate::table::{column, median, num, ratio, rotated, rows};
use crate::{
    addr, log, Bench, Res, Variant, COLLECTOR_ADMIN, HTTP, PAIRED_OFF_ADMIN, PAIRED_OFF_HTTP,
    REDIRECTOR_ADMIN,
};

/// Which codes the requests ask for.
pub(crate) const MIXES: [&str; 2] = ["zipf", "uniform"];

/// The load's paths for `mix`: uniform over all codes, or Zipf-like (s = 1):
/// floor((N+1)^u) - 1 for uniform u has P(k) ~ 1/(k+1.5), the continuous Zipf.
fn paths(mix: &str) -> testkit::redirector::load::Paths {
    let zipf = mix == "zipf";
    Arc::new(move |random, path| {
        let u = (random.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let code = if zipf {
            ((CODES as f64 + 1.0).powf(u).floor() as u64).saturating_sub(1)
        } else {
            (u * CODES as f64) as u64
        };
        let _ = write!(path, "/seed{}", code.min(CODES - 1));
    })
}

/// req/s, p50 and p99 in ms of a load run, as the tables print them.
pub(crate) fn stats(report: &Report, elapsed: Duration) -> (String, String, String) {
    let ms = |q| {
        report
            .latencies
            .quantile(q)
            .map_or("-".to_owned(), |d| format!("{:.3}", d.as_secs_f64() * 1e3))
    };
    let rps = report.total() as f64 / elapsed.as_secs_f64();
    (format!("{rps:.0}"), ms(0.5), ms(0.99))
}

/// The load run's summary kept in $OUT, as wrk's report was.
fn summary(report: &Report, elapsed: Duration, connections: usize) -> String {
    let (rps, p50, p99) = stats(report, elapsed);
    let mut text = format!(
        "{connections} connections, {:.2} s: {} responses {:?}, {} errors\n",
        elapsed.as_secs_f64(),
        report.total(),
        report.statuses,
        report.errors
    );
    for q in [0.5, 0.75, 0.9, 0.99, 0.999] {
        let at = report.latencies.quantile(q).unwrap_or_default();
        let _ = writeln!(text, "{:>6.2}% {:.3} ms", q * 100.0, at.as_secs_f64() * 1e3);
    }
    let _ = writeln!(
        text,
        "max {:.3} ms\nRequests/sec: {rps} (p50 {p50} ms, p99 {p99} ms)",
        report.max_latency.as_secs_f64() * 1e3
    );
    text
}

/// The redirector's last words: "redirector: N clicks sent, M dropped (R redirects served)".
fn final_counts(log: &str) -> Option<(u64, u64, u64)> {
    let line = log.lines().rev().find(|l| l.contains("redirects served"))?;
    let rest = &line[line.rfind("redirector: ")? + "redirector: ".len()..];
    let words: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| words.get(i)?.trim_start_matches('(').parse().ok();
    Some((n(5)?, n(0)?, n(3)?))
}

/// One redirector of a run: where it serves, its admin listener, its log and its
/// acknowledgement socket.
struct Instance {
    http: &'static str,
    admin: &'static str,
    log: &'static str,
    ack: &'static str,
}

/// Every mode's redirector (mode paired's with the pipeline).
const MAIN: Instance = Instance {
    http: HTTP,
    admin: REDIRECTOR_ADMIN,
    log: "redirector.log",
    ack: "redirector-ack.sock",
};

/// Mode paired's redirector with clicks off, serving at the same time as `MAIN`.
const PAIRED_OFF: Instance = Instance {
    http: PAIRED_OFF_HTTP,
    admin: PAIRED_OFF_ADMIN,
    log: "redirector-paired-off.log",
    ack: "redirector-paired-off-ack.sock",
};

/// The redirector's command line for a mode.
fn redirector(
    bench: &Bench,
    variant: Variant,
    clicks: &str,
    instance: &Instance,
) -> std::process::Command {
    let bin = bench.bin(variant, "redirector");
    let mut cmd = match bench.knobs.redirect_cpu {
        Some(cpu) => crate::cpus::on(cpu, &bin),
        None => std::process::Command::new(&bin),
    };
    cmd.args(["--clicks", clicks, "--database-url", &bench.url(variant)])
        .arg("--socket")
        .arg(bench.path("collector.sock"))
        .args(["--listen", instance.http, "--admin-listen", instance.admin])
        .args(["--flush-interval", &bench.knobs.flush_interval]);
    if has_flag(&bin, "--ack-socket") {
        cmd.arg("--ack-socket").arg(bench.path(instance.ack));
    }
    cmd
}

/// Starts a redirector with its log emptied, and waits until it is healthy.
async fn start_redirector(
    bench: &Bench,
    variant: Variant,
    clicks: &str,
    instance: &Instance,
    extra: &[&str],
) -> Res<Proc> {
    let log_path = bench.path(instance.log);
    let _ = std::fs::remove_file(&log_path);
    let mut cmd = redirector(bench, variant, clicks, instance);
    cmd.args(extra);
    let proc = Proc::spawn("redirector", cmd, &log_path)?;
    await_healthy(addr(instance.admin), "redirector", &log_path).await?;
    Ok(proc)
}

/// What a redirector used through its load, read while it still runs: a stop drains its ring
/// and waits for acknowledgements, which is not the load's work. Mode paired reads both of its
/// redirectors before stopping either, so that their windows end together.
struct Used {
    ticks: u64,
    mib: String,
}

impl Used {
    fn of(proc: &Proc) -> Used {
        Used {
            ticks: crate::procfs::ticks(proc.pid()),
            mib: hwm_mib(proc.pid()),
        }
    }
}

/// Stops a redirector: its final counts (redirects, sent, dropped).
async fn stop_redirector(bench: &Bench, proc: Proc, instance: &Instance) -> Res<(u64, u64, u64)> {
    proc.stop().await;
    let log_path = bench.path(instance.log);
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    final_counts(&text).ok_or_else(|| format!("no final counts in {}", log_path.display()).into())
}

/// A row of $OUT/redirect.tsv, in the columns `print_table` reads: mix, mode, round, req/s,
/// p50 and p99 ms, redirects, sent, dropped, compaction s, CPU us a redirect of the redirector,
/// the collector and PostgreSQL, peak MiB of each, and the collector's CPU until written.
struct Row<'a> {
    mix: &'a str,
    mode: &'a str,
    round: u32,
    load: &'a (Report, Duration),
    counts: (u64, u64, u64),
    compact: f64,
    per: [String; 3],
    mib: [String; 3],
    col_written: String,
}

impl Row<'_> {
    fn fields(self) -> Vec<String> {
        let (rps, p50, p99) = stats(&self.load.0, self.load.1);
        let (redirects, sent, dropped) = self.counts;
        let mut row = vec![self.mix.to_owned(), self.mode.to_owned()];
        row.extend([self.round.to_string(), rps, p50, p99]);
        row.extend([redirects, sent, dropped].map(|n| n.to_string()));
        row.push(format!("{:.2}", self.compact));
        row.extend(self.per);
        row.extend(self.mib);
        row.push(self.col_written);
        row
    }
}

/// The row of a round's redirector with clicks off beside a paired mode ([`partner`]): its
/// CPU from `cpu0` to `used`; no collector, no rows of its own, and PostgreSQL's CPU is in the
/// other redirector's row.
fn paired_off_row<'a>(
    mix: &'a str,
    mode: &'a str,
    round: u32,
    load: &(Report, Duration),
    redirects: u64,
    cpu0: &Cpu,
    used: Used,
) -> Vec<String> {
    let cpu1 = Cpu {
        redirector: used.ticks,
        ..*cpu0
    };
    Row {
        mix,
        mode,
        round,
        load,
        counts: (redirects, 0, 0),
        compact: 0.0,
        per: cpu1.per_click(cpu0, redirects),
        mib: [used.mib, "0".to_owned(), "0".to_owned()],
        col_written: "0.000".to_owned(),
    }
    .fields()
}

/// Writes a load run's summary to $OUT/load-MIX-MODE-ROUND.txt.
fn write_summary(
    bench: &Bench,
    mix: &str,
    mode: &str,
    round: u32,
    load: &(Report, Duration),
) -> Res<()> {
    let file = bench.path(&format!("load-{mix}-{mode}-{round}.txt"));
    std::fs::write(&file, summary(&load.0, load.1, bench.knobs.connections))?;
    Ok(())
}

/// Starts the variant's collector on $OUT/collector.sock with COLLECTOR_FLAGS (and `extra`),
/// and waits until it is healthy.
pub(crate) async fn start_collector(bench: &Bench, variant: Variant, extra: &[&str]) -> Res<Proc> {
    let bin = bench.bin(variant, "collector");
    let mut cmd = std::process::Command::new(&bin);
    cmd.args(["--database-url", &bench.url(variant)])
        .arg("--socket")
        .arg(bench.path("collector.sock"))
        .args(["--admin-listen", COLLECTOR_ADMIN]);
    if has_flag(&bin, "--instance") {
        cmd.args(["--instance", "bench"]);
    }
    cmd.args(&bench.knobs.collector_flags).args(extra);
    // The per-fold lines (`bench compaction` reads them) are debug lines of
    // `collector::upkeep::maintenance`; BASELINE's older builds wrote them under the other two.
    cmd.env(
        "RUST_LOG",
        "info,collector::upkeep=debug,collector::maintenance=debug,collector::compact=debug",
    );
    let log = bench.path("collector.log");
    let proc = Proc::spawn("collector", cmd, &log)?;
    await_healthy(addr(COLLECTOR_ADMIN), "collector", &log).await?;
    Ok(proc)
}

/// The collector's counters a run starts from: clicks written, compactions, their seconds.
pub(crate) struct Written {
    /// Whose database the collector writes to: its breakdown lists are part of the fold.
    variant: Variant,
    pub(crate) clicks: f64,
    pub(crate) compactions: f64,
    pub(crate) compaction_s: f64,
}

impl Written {
    pub(crate) async fn now(variant: Variant) -> Res<Written> {
        let admin = addr(COLLECTOR_ADMIN);
        Ok(Written {
            variant,
            clicks: metric(admin, "collector_clicks_written_total").await?,
            compactions: metric(admin, "collector_compactions_total").await?,
            compaction_s: metric(admin, "collector_compaction_seconds_sum").await?,
        })
    }

    /// Waits until the collector has written `n` clicks since.
    pub(crate) async fn await_written(&self, bench: &Bench, n: f64, limit: Duration) -> Res<()> {
        let admin = addr(COLLECTOR_ADMIN);
        let what = format!("{n} clicks written");
        until(limit, &what, &bench.path("collector.log"), || async {
            metric(admin, "collector_clicks_written_total")
                .await
                .is_ok_and(|w| w - self.clicks >= n)
        })
        .await
    }

    /// Waits until the collector has written `n` clicks since, and folded them (`await_fold`).
    pub(crate) async fn await_folded(&self, bench: &Bench, n: f64, limit: Duration) -> Res<f64> {
        self.await_written(bench, n, limit).await?;
        self.await_fold(bench).await
    }

    /// Waits until what was written is folded: a compaction has run since, with no count left
    /// pending. The compaction seconds since.
    pub(crate) async fn await_fold(&self, bench: &Bench) -> Res<f64> {
        let admin = addr(COLLECTOR_ADMIN);
        let log = bench.path("collector.log");
        // Each look is a scrape of the collector's /metrics, whose CPU the run counts: looked
        // at every 50 ms through the wait for a fold (up to --compact-interval), the scrapes
        // were most of the collector's CPU after the clicks were written (BENCHMARKS.md,
        // "The bench's own scrapes").
        until_every(
            Duration::from_secs(1),
            Duration::from_secs(300),
            "the run's counts folded",
            &log,
            || self.folded(bench),
        )
        .await?;
        Ok(metric(admin, "collector_compaction_seconds_sum").await? - self.compaction_s)
    }

    /// Whether a compaction has run since, with no count left pending, nor a breakdown list:
    /// those go a slice a fold, so a run with more of them than a slice is folded later.
    pub(crate) async fn folded(&self, bench: &Bench) -> bool {
        let admin = addr(COLLECTOR_ADMIN);
        let compacted = metric(admin, "collector_compactions_total")
            .await
            .is_ok_and(|c| c > self.compactions);
        compacted
            && metric(admin, "collector_deltas_pending")
                .await
                .is_ok_and(|p| p == 0.0)
            && self.no_breakdown_lists(bench).await.unwrap_or(false)
    }

    /// No breakdown list waits (nor is there a table of them: a BASELINE from before them).
    async fn no_breakdown_lists(&self, bench: &Bench) -> Res<bool> {
        let client = bench.client(self.variant).await?;
        let table = "SELECT to_regclass('click_breakdown_lists') IS NOT NULL";
        if crate::cluster::scalar(&client, table).await? != "t" {
            return Ok(true);
        }
        let waiting = "SELECT count(*) FROM click_breakdown_lists";
        Ok(crate::cluster::number(&client, waiting).await? == 0)
    }
}

pub(crate) async fn rows_now(bench: &Bench, variant: Variant) -> Res<i64> {
    let client = bench.client(variant).await?;
    crate::cluster::number(&client, "SELECT count(*) FROM clicks").await
}

/// The dimensions a run of `mode` records besides the agent: DIMENSIONS in mode
/// `dimensions`, none in the others.
fn dimensions<'a>(bench: &'a Bench, mode: &str) -> Option<&'a str> {
    match mode {
        "dimensions" => bench.knobs.dimensions.as_deref(),
        _ => None,
    }
}

/// One load run against `mode` (off, pipeline, direct, dimensions: the pipeline with
/// `--dimensions`, neighbour: off beside a busy PostgreSQL, baseline: the pipeline of
/// BASELINE's binaries, paired: the pipeline and, at the same time, a second redirector with
/// clicks off, each under a load of its own, or paired-baseline: paired with BASELINE's
/// binaries), each request with a block of `headers` when given. The measured window runs from
/// the load's start until the collector has written and folded the run's clicks, so compaction
/// is included. Appends a row to $OUT/redirect.tsv (a paired mode two: its [`partner`]'s for
/// the redirector with clicks off, then its own).
async fn once(
    bench: &mut Bench,
    mix: &str,
    mode: &str,
    round: u32,
    headers: Option<Arc<Headers>>,
) -> Res<()> {
    let (variant, clicks) = match mode {
        "baseline" | "paired-baseline" => (Variant::Baseline, "pipeline"),
        "dimensions" | "paired" => (Variant::Current, "pipeline"),
        "neighbour" | "paired-aa" => (Variant::Current, "off"),
        _ => (Variant::Current, mode),
    };
    let dims = dimensions(bench, mode).map(str::to_owned);
    let rows0 = rows_now(bench, variant).await?;
    let breakdown0 = match &dims {
        Some(dims) => breakdown_now(bench, dims).await?,
        None => Vec::new(),
    };
    let collector = match clicks {
        "pipeline" => Some(start_collector(bench, variant, &[]).await?),
        _ => None,
    };
    let dims_flags = match &dims {
        Some(dims) => vec!["--dimensions", dims, "--country-header", COUNTRY_HEADER],
        None => Vec::new(),
    };
    let redirector = start_redirector(bench, variant, clicks, &MAIN, &dims_flags).await?;
    let paired_off = match partner(mode) {
        Some(_) => Some(start_redirector(bench, variant, "off", &PAIRED_OFF, &[]).await?),
        None => None,
    };
    let written = match collector {
        Some(_) => Some(Written::now(variant).await?),
        None => None,
    };
    let memory = PgMemory::start(bench.postmaster);
    let collector_pid = collector.as_ref().map(Proc::pid);
    let neighbour = match mode {
        "neighbour" => {
            let run = format!("{mix}-{round}");
            Some(crate::neighbour::start(bench, bench.knobs.duration, &run).await?)
        }
        _ => None,
    };
    let cpu0 = Cpu::now(Some(redirector.pid()), collector_pid, bench.postmaster);
    let paired_off = paired_off.map(|proc| {
        let cpu0 = Cpu {
            redirector: crate::procfs::ticks(proc.pid()),
            ..Cpu::default()
        };
        (proc, cpu0)
    });
    let (load, paired_off_load) = run_loads(bench, mix, headers, paired_off.is_some()).await;
    write_summary(bench, mix, mode, round, &load)?;
    check_answers(bench, mode, &load.0);
    let used = Used::of(&redirector);
    let paired_off = paired_off.map(|(proc, cpu0)| (Used::of(&proc), proc, cpu0));
    let (redirects, sent, dropped) = stop_redirector(bench, redirector, &MAIN).await?;
    if let (Some((used, proc, cpu0)), Some(load), Some(off_mode)) =
        (paired_off, paired_off_load, partner(mode))
    {
        let (off_redirects, ..) = stop_redirector(bench, proc, &PAIRED_OFF).await?;
        write_summary(bench, mix, off_mode, round, &load)?;
        check_answers(bench, off_mode, &load.0);
        let row = paired_off_row(mix, off_mode, round, &load, off_redirects, &cpu0, used);
        crate::table::append(&bench.path("redirect.tsv"), &row)?;
    }
    let (mut compact, mut col_mib, mut col_written) = (0.0, "0".to_owned(), "0.000".to_owned());
    if let (Some(c), Some(written)) = (&collector, &written) {
        // The collector's CPU until the clicks are written, apart: the wait for the fold below
        // charges the round a whole fold of its counts, however short the round.
        written
            .await_written(bench, sent as f64, Duration::from_secs(300))
            .await?;
        let [_, until_written, _] =
            Cpu::now(None, collector_pid, bench.postmaster).per_click(&cpu0, redirects);
        col_written = until_written;
        compact = written.await_fold(bench).await?;
        col_mib = hwm_mib(c.pid());
    }
    let mut cpu1 = Cpu::now(None, collector_pid, bench.postmaster);
    cpu1.redirector = used.ticks;
    // Read first: the neighbour runs on for the half second it started ahead of the load.
    if let Some(neighbour) = neighbour {
        neighbour.finish(bench).await?;
    }
    let pg_mib = memory.peak();
    let per = cpu1.per_click(&cpu0, redirects);
    if let Some(c) = collector {
        c.stop().await;
    }
    if clicks != "off" {
        let recorded = check_recorded(bench, variant, mode, redirects, dropped, rows0).await?;
        if let Some(dims) = &dims {
            check_breakdown(bench, mode, dims, &breakdown0, recorded).await?;
        }
    }
    let row = Row {
        mix,
        mode,
        round,
        load: &load,
        counts: (redirects, sent, dropped),
        compact,
        per,
        mib: [used.mib, col_mib, pg_mib],
        col_written,
    };
    crate::table::append(&bench.path("redirect.tsv"), &row.fields())
}

/// The load of a run against `MAIN`, and with `paired` at the same time one against
/// `PAIRED_OFF`, each with the bench's CONNECTIONS and half of REDIRECT_RATE (without a rate,
/// each as fast as its connections get answers). Each load's report and length.
async fn run_loads(
    bench: &Bench,
    mix: &str,
    headers: Option<Arc<Headers>>,
    paired: bool,
) -> ((Report, Duration), Option<(Report, Duration)>) {
    let share = if paired { 2.0 } else { 1.0 };
    let load = |http| Load {
        connections: bench.knobs.connections,
        paths: Some(paths(mix)),
        headers: headers.clone(),
        client: Client::Plain,
        rate: bench.knobs.redirect_rate.map(|r| r as f64 / share),
        ..Load::get(addr(http), "/")
    };
    let duration = Duration::from_secs(bench.knobs.duration);
    if !paired {
        return (load(MAIN.http).run_for(duration).await, None);
    }
    let (main, off) = (load(MAIN.http), load(PAIRED_OFF.http));
    let (main, off) = tokio::join!(main.run_for(duration), off.run_for(duration));
    (main, Some(off))
}

/// Every request of the load was answered, with a redirect, and there were some: otherwise
/// the figures measured errors (a run of 404s or refused connections has no redirect to
/// record, and its clicks add up as 0 = 0). A mismatch is reported and fails the run at the
/// end. (So is a REDIRECT_RATE so low that a connection's requests are further apart than the
/// redirector's --idle-timeout: it closes them between requests.)
fn check_answers(bench: &Bench, mode: &str, load: &Report) {
    let redirects = load.count(302);
    if load.errors > 0 || redirects != load.total() || redirects == 0 {
        bench.mismatch(&format!(
            "mode {mode}: {redirects} redirects of {} answers {:?}, {} requests unanswered",
            load.total(),
            load.statuses,
            load.errors
        ));
    }
}

/// Every click sent (a redirect served, or one clicktap sent) is a row or a counted drop:
/// rows the run added plus its drops must be what it sent. A mismatch is reported and fails
/// the run at the end. The rows the run added.
pub(crate) async fn check_recorded(
    bench: &Bench,
    variant: Variant,
    mode: &str,
    sent: u64,
    dropped: u64,
    rows0: i64,
) -> Res<i64> {
    let recorded = rows_now(bench, variant).await? - rows0;
    if !adds_up(recorded, dropped, sent) {
        bench.mismatch(&format!(
            "mode {mode}: {sent} clicks sent (redirects served, or clicktap's), {recorded} \
             recorded, {dropped} dropped"
        ));
    }
    Ok(recorded)
}

/// The agent and each of `dims` (comma-separated): every click lands in each once.
fn breakdown_dimensions(dims: &str) -> Vec<&str> {
    std::iter::once("agent").chain(dims.split(',')).collect()
}

/// The clicks `click_breakdown` holds now in the agent and each of `dims`, in that order.
async fn breakdown_now(bench: &Bench, dims: &str) -> Res<Vec<i64>> {
    let client = bench.client(Variant::Current).await?;
    let mut clicks = Vec::new();
    for dim in breakdown_dimensions(dims) {
        let sql = format!(
            "SELECT coalesce(sum(clicks), 0) FROM click_breakdown WHERE dimension = '{dim}'"
        );
        clicks.push(crate::cluster::number(&client, &sql).await?);
    }
    Ok(clicks)
}

/// Every click the run recorded is in each dimension's breakdown once (every request carries
/// each header, and a missing Referer counts as its own value): otherwise the run measured
/// dimensions that were not all recorded. A mismatch is reported and fails the run at the end.
async fn check_breakdown(
    bench: &Bench,
    mode: &str,
    dims: &str,
    before: &[i64],
    recorded: i64,
) -> Res<()> {
    let after = breakdown_now(bench, dims).await?;
    for ((dim, b), a) in breakdown_dimensions(dims).iter().zip(before).zip(&after) {
        if a - b != recorded {
            bench.mismatch(&format!(
                "mode {mode}: {recorded} clicks recorded, {} in the {dim} breakdown",
                a - b
            ));
        }
    }
    Ok(())
}

/// The pipeline's invariant: every redirect served is a recorded click or a counted drop.
fn adds_up(recorded: i64, dropped: u64, redirects: u64) -> bool {
    i128::from(recorded) + i128::from(dropped) == i128::from(redirects)
}

pub(crate) async fn bench(bench: &mut Bench) -> Res<()> {
    let tsv = bench.path("redirect.tsv");
    std::fs::write(&tsv, "")?;
    std::fs::write(bench.path("machine.tsv"), "")?;
    let modes = bench.knobs.modes.clone();
    let with_dimensions = modes.iter().any(|m| m == "dimensions");
    let bin = bench.bin(Variant::Current, "redirector");
    if with_dimensions && bench.knobs.dimensions.is_some() && !has_flag(&bin, "--dimensions") {
        return Err(format!(
            "{} has no --dimensions (DIMENSIONS=none runs mode dimensions without it)",
            bin.display()
        )
        .into());
    }
    // Every mode's requests carry browsers' headers, as people's do: a request without a
    // User-Agent is a bot's, and bots' clicks are stored in the agent breakdown where humans'
    // are derived (migration 14), so a load without one measured PostgreSQL's worst case. The
    // modes then differ only in the redirector's flags.
    let headers = Some(Headers::browsers());
    for round in 1..=bench.knobs.rounds {
        let probe = Probe::take();
        let fields = [vec![round.to_string()], probe.fields().to_vec()].concat();
        crate::table::append(&bench.path("machine.tsv"), &fields)?;
        for mix in MIXES {
            for mode in rotated(round as usize, &modes) {
                log(&format!("redirect round {round}, {mix} codes: {mode}"));
                once(bench, mix, &mode, round, headers.clone()).await?;
            }
        }
    }
    print_table(bench, &modes);
    if with_dimensions && modes.iter().any(|m| m == "pipeline") {
        print_dimensions(bench);
    }
    Ok(())
}

fn print_table(bench: &Bench, modes: &[String]) {
    let k = &bench.knobs;
    let rate = k
        .redirect_rate
        .map_or("as fast as answered".to_owned(), |r| format!("{r} req/s"));
    println!(
        "load: 2 threads, {} keep-alive connections, {rate}, {}s, {CODES} links, medians of {} interleaved rounds.",
        k.connections, k.duration, k.rounds
    );
    if k.modes.iter().any(|m| m == "dimensions") {
        let flags = k
            .dimensions
            .as_deref()
            .map_or("no --dimensions (DIMENSIONS=none)".to_owned(), |d| {
                format!("`--dimensions {d} --country-header {COUNTRY_HEADER}`")
            });
        println!("`dimensions`: the pipeline with {flags}.");
    }
    if k.modes.iter().any(|m| m.starts_with("paired")) {
        println!(
            "`paired`: the pipeline, and `paired-off` a redirector with clicks off, at the same time, each under a load of its own at half the rate; its \"vs off\" columns are against `paired-off`."
        );
    }
    if k.modes.iter().any(|m| m == "paired-baseline") {
        println!(
            "`paired-baseline`: as `paired`, with BASELINE's binaries in both redirectors and the collector (`paired-baseline-off` its redirector with clicks off)."
        );
    }
    if k.modes.iter().any(|m| m == "paired-aa") {
        println!(
            "`paired-aa`: as `paired`, with clicks off in both redirectors (`paired-aa` in the pipeline's place): its \"vs off\" columns, against `paired-aa-off`, are what the method makes of two equal redirectors."
        );
    }
    if k.modes.iter().any(|m| m == "neighbour") {
        println!(
            "`neighbour`: clicks off beside pgbench making {} single-row INSERTs a second.",
            k.neighbour_rate
        );
    }
    println!(
        "`--flush-interval {}` for every redirector, BASELINE's too.",
        k.flush_interval
    );
    println!("Every request carries a browser's, a crawler's or a previewer's User-Agent, a Referer or none, and {COUNTRY_HEADER} (testkit's browsers).");
    if let Some(base) = &k.baseline {
        println!(
            "BASELINE: {base} ({}), its binaries on a database of their own.",
            crate::services::short(base)
        );
        if k.modes.iter().any(|m| m == "baseline") {
            println!("`baseline`: BASELINE's pipeline.");
        }
    }
    println!();
    println!("| codes | mode | req/s | vs off | p50 ms | p99 ms | dropped | compaction s | CPU us per redirect: redirector / collector (until written) / PostgreSQL | host cost vs off | peak MiB: redirector / collector / PostgreSQL |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let rows = rows(&bench.path("redirect.tsv"));
    let shown = modes.iter().flat_map(|m| match partner(m) {
        Some(off) => vec![off, m.as_str()],
        None => vec![m.as_str()],
    });
    for mix in MIXES {
        let col = |mode: &str, field| median(&column(&rows, &[mix, mode], field));
        for mode in shown.clone() {
            let base = num(&col(off_of(mode), 4));
            let rps = num(&col(mode, 4));
            let c = |f| col(mode, f);
            println!(
                "| {mix} | {mode} | {rps:.0} | {} | {} | {} | {} | {} | {} / {} ({}) / {} | {} | {} / {} / {} |",
                ratio(rps, base, 3),
                c(5), c(6), c(9), c(10), c(11), c(12), c(17), c(13),
                host_cost(&rows, mix, mode, bench.knobs.rounds),
                c(14), c(15), c(16)
            );
        }
    }
    println!();
    println!(
        "Every run: {} (mix, mode, round, req/s, p50 ms, p99 ms, redirects, sent, dropped,",
        bench.path("redirect.tsv").display()
    );
    println!("compaction s, CPU us per redirect of redirector, collector and PostgreSQL, peak MiB of each,");
    println!("the collector's CPU us per redirect until the clicks were written);");
    println!(
        "each load run's latency percentiles: {}/load-MIX-MODE-ROUND.txt.",
        bench.out.display()
    );
    println!("CPU counts from the load's start until the collector has written and folded the run's clicks (with no collector, until the load ends);");
    println!("the collector's in brackets until they were written: the rest is the run's fold, a whole one however short the run.");
    print_machine(bench);
}

/// The rows of the redirector with clicks off that serves at the same time as a paired mode's
/// (`paired`: the pipeline; `paired-aa`: clicks off too, so that its ratio shows what the
/// method itself makes of two equal redirectors; `paired-baseline`: BASELINE's pipeline,
/// beside BASELINE's redirector).
fn partner(mode: &str) -> Option<&'static str> {
    match mode {
        "paired" => Some("paired-off"),
        "paired-aa" => Some("paired-aa-off"),
        "paired-baseline" => Some("paired-baseline-off"),
        _ => None,
    }
}

/// The mode whose redirector has clicks off that `mode` is compared with: its [`partner`], run
/// at the same time, for a paired mode (and that partner itself); mode `off`, run in turn, for
/// the others.
fn off_of(mode: &str) -> &str {
    match partner(mode) {
        Some(off) => off,
        None if mode.starts_with("paired") => mode,
        None => "off",
    }
}

/// The probes of the machine before each round (`machine`), medians and ranges.
fn print_machine(bench: &Bench) {
    let rows = rows(&bench.path("machine.tsv"));
    let of = |field, missing| {
        let values = column(&rows, &[], field);
        let numbers = values.iter().filter_map(|v| v.parse::<f64>().ok());
        let low = numbers.clone().min_by(f64::total_cmp);
        match (low, numbers.max_by(f64::total_cmp)) {
            (Some(low), Some(high)) => format!("{} ns ({low}-{high})", median(&values)),
            _ => missing,
        }
    };
    println!(
        "The machine before each round ({}: round, then these): a cache line from one CPU to the other and back {}, a random read of 256 MiB {}, a step of dependent arithmetic {}; medians (ranges).",
        bench.path("machine.tsv").display(),
        of(2, "not measured (fewer than two CPUs, or a thread not started or not pinned)".to_owned()),
        of(3, "-".to_owned()),
        of(4, "-".to_owned())
    );
}

/// The host's cost of a redirect in `mode` against its clicks off ([`off_of`]): the
/// redirector's and the collector's CPU per redirect (PostgreSQL's left out: it usually runs on
/// another machine) over the redirector's with clicks off, in the same round; the median of
/// the rounds.
fn host_cost(rows: &[Vec<String>], mix: &str, mode: &str, rounds: u32) -> String {
    let cpu =
        |mode: &str, round: &str, field| num(&median(&column(rows, &[mix, mode, round], field)));
    let per_round: Vec<String> = (1..=rounds)
        .map(|round| {
            let round = round.to_string();
            let host = cpu(mode, &round, 11) + cpu(mode, &round, 12);
            ratio(host, cpu(off_of(mode), &round, 11), 3)
        })
        .collect();
    median(&per_round)
}

/// Dimensions off (mode pipeline) and on (mode dimensions) side by side: req/s, each round's
/// ratio on/off and their median, and CPU per redirect (per click: every redirect is one).
fn print_dimensions(bench: &Bench) {
    let rows = rows(&bench.path("redirect.tsv"));
    println!();
    println!("Dimensions off (`pipeline`) and on (`dimensions`), the same requests:");
    println!();
    println!("| codes | dimensions | req/s (median) | per-round ratio on/off | median ratio | CPU us per redirect: redirector / collector / PostgreSQL | dropped |");
    println!("|---|---|---|---|---|---|---|");
    for mix in MIXES {
        let round_rps = |mode: &str, round: u32| {
            num(&median(&column(&rows, &[mix, mode, &round.to_string()], 4)))
        };
        let ratios: Vec<String> = (1..=bench.knobs.rounds)
            .map(|r| ratio(round_rps("dimensions", r), round_rps("pipeline", r), 6))
            .collect();
        for (label, mode) in [("off", "pipeline"), ("on", "dimensions")] {
            let c = |f| median(&column(&rows, &[mix, mode], f));
            let (per_round, med) = match mode {
                "dimensions" => (
                    ratios.iter().map(|r| two(r)).collect::<Vec<_>>().join(", "),
                    format!("**{}**", two(&median(&ratios))),
                ),
                _ => (String::new(), String::new()),
            };
            println!(
                "| {mix} | {label} | {:.0} | {per_round} | {med} | {} / {} / {} | {} |",
                num(&c(4)),
                c(11),
                c(12),
                c(13),
                c(9)
            );
        }
    }
}

/// A ratio with two decimals, as the tables print them (`-` as it is).
fn two(ratio: &str) -> String {
    ratio
        .parse::<f64>()
        .map_or(ratio.to_owned(), |r| format!("{r:.2}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_counts_from_the_log_line() {
        let line = "2026-12-01T10:00:00Z  INFO redirector: redirector: 10 clicks sent, 2 dropped (12 redirects served); 10 acknowledged, 0 not acknowledged";
        assert_eq!(final_counts(line), Some((12, 10, 2)));
    }

    #[test]
    fn clicks_add_up_only_exactly() {
        assert!(adds_up(10, 2, 12));
        assert!(!adds_up(9, 2, 12));
        assert!(!adds_up(11, 2, 12));
    }

    /// A row of `mode` whose redirector and collector took `red` and `col` us a redirect.
    fn row_of(mode: &str, red: &str, col: &str) -> Vec<String> {
        Row {
            mix: "zipf",
            mode,
            round: 1,
            load: &(Report::default(), Duration::from_secs(1)),
            counts: (1_000_000, 0, 0),
            compact: 0.0,
            per: [red.to_owned(), col.to_owned(), "0".to_owned()],
            mib: Default::default(),
            col_written: "0".to_owned(),
        }
        .fields()
    }

    #[test]
    fn each_paired_mode_is_compared_with_its_partner_and_the_others_with_off() {
        // 800 ticks over a million redirects, in us a redirect.
        let off_us = 800.0 * 1e6 / crate::procfs::clk_tck() / 1e6;
        let load = (Report::default(), Duration::from_secs(1));
        let paired_off = |mode, ticks| {
            let used = Used {
                ticks,
                mib: "0".to_owned(),
            };
            paired_off_row("zipf", mode, 1, &load, 1_000_000, &Cpu::default(), used)
        };
        assert_eq!(
            paired_off("paired-off", 800)[10],
            format!("{off_us:.3}"),
            "field 11: the redirector's us"
        );
        let paired = (off_us * 1.05).to_string();
        let rows = [
            row_of("off", "10", "0"),
            row_of("pipeline", "10.5", "0.5"),
            paired_off("paired-off", 800),
            row_of("paired", &paired, &(off_us * 0.05).to_string()),
            // paired-aa's partner at twice paired-off's CPU: against paired-off, or mode off,
            // paired-aa's ratio would not be 1.1.
            paired_off("paired-aa-off", 1600),
            row_of("paired-aa", &(off_us * 2.2).to_string(), "0"),
            // BASELINE's, against its own partner at three times paired-off's CPU.
            paired_off("paired-baseline-off", 2400),
            row_of("paired-baseline", &(off_us * 3.6).to_string(), "0"),
        ];
        // Each as the median of its rounds' ratios prints it.
        assert_eq!(host_cost(&rows, "zipf", "pipeline", 1), "1.1");
        assert_eq!(host_cost(&rows, "zipf", "paired", 1), "1.1");
        assert_eq!(host_cost(&rows, "zipf", "paired-off", 1), "1");
        assert_eq!(host_cost(&rows, "zipf", "paired-aa", 1), "1.1");
        assert_eq!(host_cost(&rows, "zipf", "paired-aa-off", 1), "1");
        assert_eq!(host_cost(&rows, "zipf", "paired-baseline", 1), "1.2");
    }

    #[test]
    fn zipf_paths_favour_the_first_codes() {
        let draw = paths("zipf");
        let mut random = testkit::XorShift(7);
        let mut path = String::new();
        let mut first = 0;
        for _ in 0..10_000 {
            path.clear();
            draw(&mut random, &mut path);
            first += u32::from(path == "/seed0");
        }
        // P(0) = log(2)/log(N+1) ~ 5.6 % for the continuous Zipf.
        assert!((400..700).contains(&first), "{first}");
    }
}
