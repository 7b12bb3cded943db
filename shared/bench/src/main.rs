//! `scripts/bench`: the load tests that produce BENCHMARKS.md. Loopback only, bounded in count
//! and time. See [`HELP`].

mod charts;
mod cluster;
mod cpus;
mod hosts;
mod ingest;
mod knobs;
mod links;
mod machine;
mod maintenance;
mod memory;
mod neighbour;
mod pgbench;
mod procfs;
mod redirect;
mod services;
mod table;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use knobs::Knobs;
use nix::sys::signal::SigHandler;
use tokio::signal::unix::{signal, SignalKind};

pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type Res<T> = Result<T, Error>;

const HELP: &str = "\
Load tests that produce BENCHMARKS.md. Loopback only, bounded in count and time.

  scripts/bench redirect    redirector throughput/latency: --clicks off | pipeline | direct,
                            every request carrying browsers' headers (User-Agent, Referer,
                            X-Country); MODES=\"pipeline dimensions\": the pipeline without
                            and with --dimensions DIMENSIONS side by side; mode neighbour:
                            clicks off beside pgbench making NEIGHBOUR_RATE single-row
                            INSERTs a second, PostgreSQL busy without the pipeline; mode
                            paired: the pipeline and a second redirector with clicks off
                            (on 127.0.0.1:18081) at the same time, each under a load of
                            its own (CONNECTIONS connections, half of REDIRECT_RATE), so
                            that both meet the machine in the same state (not with
                            REDIRECT_CPU); mode paired-aa: the same with clicks off in
                            both, what the method makes of two equal redirectors; mode
                            paired-baseline: paired with BASELINE's binaries. Before each
                            round (of all the modes), a probe of the machine (a cache line
                            between two CPUs, a random read of memory, dependent
                            arithmetic: machine.tsv)
  scripts/bench collector   collector ingest vs `psql \\copy` of the same rows, Zipf and uniform codes
  scripts/bench compaction  how far compaction keeps up under sustained full-speed ingest
  scripts/bench totals      CPU per click by process at a steady RATE of uniform clicks for
                            TOTALS_SECS, the collector folding at its default interval, each
                            run from a settled cluster (no autovacuum running, checkpointed)
                            until its fold and its own checkpoint are done (with BASELINE:
                            beside BASELINE's collector, interleaved, the ratios split by
                            which went first in each round)
  scripts/bench hosts       aggregate ingest into one database from 1, 2 and 4 collectors
                            (CLICKS per run split over them)
  scripts/bench links       the link table at 1 M and 10 M links: time to ready, RSS, and
                            req/s, p99 and CPU per request with no link changes vs 100
                            changes a second, to links or to a copy nobody follows (the
                            control), each its own transaction or all in one a second (-tx)
  scripts/bench links-follow  CPU and context switches of following CHANGE_RATE link changes
                            a second at the last of LINK_COUNTS, no HTTP load, against the
                            same changes to a table nobody follows (with BASELINE: beside
                            BASELINE's redirector, interleaved; not part of all)
  scripts/bench links-soak  the redirector's RSS through SOAK seconds of SOAK_RATE link changes
                            a second at the first of LINK_COUNTS (not part of all)
  scripts/bench partitions  bytes per click in a day's partition, and the time to drop a day
  scripts/bench memory      the collector's peak RSS under DISTINCT distinct 64-byte codes sent
                            at full speed, beside the bound on its sums; totals checked exact
                            (with BASELINE: beside BASELINE's collector; not part of all)
  scripts/bench charts      the SVG charts of BENCHMARKS.md, from the last runs' $OUT/*.tsv
  scripts/bench all         all of them but links-soak and memory (default)
  scripts/bench --quick     redirect and collector, a few seconds per mode: a smoke test that
                            fails when a run's recorded plus dropped clicks differ from the
                            redirects served (.ci/run runs it)

Modes are compared in the same run, interleaved round by round (2 cores run the load
generator, the pipeline and PostgreSQL together), and reported as medians and ratios. Every
run also records CPU time per click of the redirector, the collector and PostgreSQL (all its
processes, exited backends included), read from /proc, and each one's peak memory. The load
is the tests' generator (testkit): 2 threads, CONNECTIONS keep-alive connections.
Knobs (environment): ROUNDS (3), DURATION (10, seconds per load run), CONNECTIONS (50),
REDIRECT_RATE (requests a second of a redirect run, all connections together; unset: as fast
as they get answers), REDIRECT_CPU (unset: none; a CPU number: the redirector runs on that
CPU alone and the load, the collector and PostgreSQL on the others), CLICKS (2000000, rows per ingest run; at most what clicktap send --code-file holds,
but for partitions alone), SUSTAIN (15000000, clicks per compaction run),
BASELINE (a git revision: its binaries run as mode `baseline` beside the current ones, on a
database of their own; as mode `paired-baseline` when MODES has paired), FLAT (collector: also the current collector into an unpartitioned
`clicks`, as variant `flat`), CURRENT_REV (a git revision to build the current binaries from,
instead of the working tree), MODES (redirect modes, default \"off pipeline direct\", with
--quick \"off pipeline direct paired\", also dimensions, neighbour, paired and paired-aa, plus baseline
or paired-baseline with BASELINE), NEIGHBOUR_RATE (650, INSERTs a second
of mode neighbour), REDIRECTOR_FLUSH_INTERVAL (50ms, the redirector's --flush-interval, given to
every build alike, BASELINE's too), DIMENSIONS (\"referrer,device,country\", the
--dimensions of mode dimensions; none: without the flag), COLLECTOR_FLAGS (extra collector flags), LINK_COUNTS (\"1000000
10000000\"), CHANGE_RATE (100, link changes a second), SOAK (600, s), SOAK_RATE (1000, changes
a second), RATE (90000, clicks a second of totals), TOTALS_SECS (120), TOTALS_DIMENSIONS (none:
the dimensions every click of totals carries besides the agent, a subset of
referrer,device,country, each with one value), DISTINCT (10000000, codes of a memory run), OUT
(bench-out).";

const USAGE: &str = "usage: scripts/bench [--quick] \
    [redirect|collector|compaction|totals|hosts|partitions|memory|links|links-follow|links-soak|charts|all]";

/// Where the redirector serves and where each service's admin listener is.
pub(crate) const HTTP: &str = "127.0.0.1:18080";
pub(crate) const REDIRECTOR_ADMIN: &str = "127.0.0.1:19180";
pub(crate) const COLLECTOR_ADMIN: &str = "127.0.0.1:19181";
/// Mode paired's redirector with clicks off, serving at the same time as the pipeline's.
pub(crate) const PAIRED_OFF_HTTP: &str = "127.0.0.1:18081";
pub(crate) const PAIRED_OFF_ADMIN: &str = "127.0.0.1:19182";

pub(crate) fn addr(a: &str) -> SocketAddr {
    a.parse()
        .unwrap_or_else(|_| unreachable!("{a} is a literal address"))
}

/// One of the binaries-and-database pairs a run compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Variant {
    Current,
    /// BASELINE's binaries, on a database of their own.
    Baseline,
    /// The current collector into an unpartitioned `clicks`.
    Flat,
}

impl Variant {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Variant::Current => "current",
            Variant::Baseline => "baseline",
            Variant::Flat => "flat",
        }
    }

    pub(crate) fn db(self) -> &'static str {
        match self {
            Variant::Current => "bench",
            Variant::Baseline => "bench_base",
            Variant::Flat => "bench_flat",
        }
    }
}

/// What every mode works with: the knobs, the binaries, the cluster, and the tally of checks
/// whose clicks did not add up.
pub(crate) struct Bench {
    pub(crate) knobs: Knobs,
    pub(crate) out: PathBuf,
    pub(crate) bin: PathBuf,
    pub(crate) base_bin: Option<PathBuf>,
    pub(crate) cluster: cluster::Cluster,
    pub(crate) postmaster: i32,
    /// Checks that failed ([`Bench::mismatch`]): the run fails at the end.
    mismatches: std::sync::atomic::AtomicU32,
}

impl Bench {
    /// A check that failed: said now (`what`, after "MISMATCH in "), and the run fails at the
    /// end, its figures printed all the same.
    pub(crate) fn mismatch(&self, what: &str) {
        log(&format!("MISMATCH in {what}"));
        (self.mismatches).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn bin(&self, variant: Variant, name: &str) -> PathBuf {
        match (variant, &self.base_bin) {
            (Variant::Baseline, Some(dir)) => dir.join(name),
            _ => self.bin.join(name),
        }
    }

    pub(crate) fn url(&self, variant: Variant) -> String {
        self.cluster.url(variant.db())
    }

    pub(crate) async fn client(&self, variant: Variant) -> Res<tokio_postgres::Client> {
        self.cluster.connect(variant.db()).await
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.out.join(name)
    }
}

/// A line on stderr, timed, as the tables go to stdout.
pub(crate) fn log(msg: &str) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (h, m, s) = (secs / 3600 % 24, secs / 60 % 60, secs % 60);
    eprintln!("{h:02}:{m:02}:{s:02} bench: {msg}");
}

/// Today (UTC) as YYYY-MM-DD, from the days since 1970 (the civil-from-days algorithm).
pub(crate) fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let z = secs.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

const MODES: [&str; 12] = [
    "redirect",
    "collector",
    "compaction",
    "totals",
    "hosts",
    "partitions",
    "memory",
    "links",
    "links-follow",
    "links-soak",
    "charts",
    "all",
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.first().is_some_and(|a| a == "--quick");
    let what = match (quick, args.first().map(String::as_str)) {
        (true, _) => "quick".to_owned(),
        (false, Some("-h" | "--help")) => {
            println!("{HELP}");
            return;
        }
        (false, Some(mode)) if MODES.contains(&mode) => mode.to_owned(),
        (false, None) => "all".to_owned(),
        (false, Some(_)) => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };
    let code = match run(&what, quick) {
        Ok(code) => code,
        Err(e) => {
            log(&format!("error: {e}"));
            1
        }
    };
    std::process::exit(code);
}

fn run(what: &str, quick: bool) -> Res<i32> {
    if !Path::new("scripts/lib/pg.sh").is_file() {
        return Err("run from the repository's root, as scripts/bench does".into());
    }
    let knobs = Knobs::from_env(quick)?;
    if what == "charts" {
        charts::draw(&knobs)?;
        return Ok(0);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mismatches = runtime.block_on(async {
        // A stop asked by SIGTERM too, not only ^C: killed outright, the bench would leave its
        // services on their fixed ports and the next run's DROP DATABASE refused.
        let mut terminate = signal(SignalKind::terminate())?;
        tokio::select! {
            r = run_ported(what, knobs.clone()) => r,
            _ = tokio::signal::ctrl_c() => Err("interrupted".into()),
            _ = terminate.recv() => Err("terminated (SIGTERM)".into()),
        }
    });
    // tokio's handler stays installed: a second SIGTERM while the cluster stops would be lost.
    // SAFETY: the default disposition; no handler of this process's runs.
    let _ = unsafe { nix::sys::signal::signal(nix::sys::signal::SIGTERM, SigHandler::SigDfl) };
    // The run's processes were killed as its future was dropped; the cluster stops here.
    stop_cluster(&knobs);
    let mismatches = mismatches?;
    if what == "all" {
        // The figures are in $OUT and printed whether or not they can be drawn.
        if let Err(e) = charts::draw(&knobs) {
            log(&format!("the charts were not drawn: {e}"));
        }
    }
    if mismatches > 0 {
        log(&format!(
            "{mismatches} checks failed: a run's recorded plus dropped clicks differ from what it \
             sent, a dimension's breakdown from its clicks recorded, or a load's answers were \
             not all redirects (the MISMATCH lines above)"
        ));
        return Ok(1);
    }
    Ok(0)
}

fn stop_cluster(knobs: &Knobs) {
    let out = std::fs::canonicalize(&knobs.out).unwrap_or_else(|_| knobs.out.clone());
    if let Err(e) = cluster::stop_at(&out) {
        log(&format!("stopping PostgreSQL: {e}"));
    }
}

/// Every mode but charts; the number of runs whose clicks did not add up.
async fn run_ported(what: &str, knobs: Knobs) -> Res<u32> {
    let all = what == "all";
    let inputs = [
        "collector",
        "compaction",
        "totals",
        "hosts",
        "partitions",
        "quick",
    ];
    // Every mode with inputs but partitions (which copies the rows) has clicktap send the
    // codes: refused now, not after the runs before.
    if (all || inputs.contains(&what)) && what != "partitions" {
        ingest::check_sendable(knobs.clicks)?;
    }
    // Before `setup`, which may take a CPU away from this process (REDIRECT_CPU).
    let cores = cpus::count();
    let pinned = match knobs.redirect_cpu {
        Some(cpu) => format!(" (the redirector alone on CPU {cpu}, REDIRECT_CPU)"),
        None => String::new(),
    };
    let overrides = services::profile_overrides();
    let built = if overrides.is_empty() {
        String::new()
    } else {
        format!(
            ", built with {}: not the release profile as shipped",
            overrides.join(" ")
        )
    };
    let mut bench = setup(knobs).await?;
    println!(
        "# scripts/bench {what}, {}, {cores} cores{pinned}{built}",
        today()
    );
    println!();
    if all || what == "redirect" || what == "quick" {
        redirect::bench(&mut bench).await?;
    }
    if all || inputs.contains(&what) {
        ingest::make_inputs(&bench)?;
    }
    if all || what == "collector" || what == "quick" {
        ingest::bench_collector(&mut bench).await?;
    }
    if all || what == "compaction" {
        maintenance::bench_compaction(&mut bench).await?;
    }
    if all || what == "totals" {
        ingest::bench_totals(&mut bench).await?;
    }
    if all || what == "hosts" {
        hosts::bench_hosts(&mut bench).await?;
    }
    if all || what == "partitions" {
        maintenance::bench_partitions(&mut bench).await?;
    }
    if what == "memory" {
        memory::bench_memory(&mut bench).await?;
    }
    if all || what == "links" {
        links::bench_links(&mut bench).await?;
    }
    if what == "links-follow" {
        links::bench_links_follow(&mut bench).await?;
    }
    if what == "links-soak" {
        links::bench_links_soak(&mut bench).await?;
    }
    Ok(bench.mismatches.into_inner())
}

/// The binaries, the cluster, and a fresh database for each variant.
async fn setup(knobs: Knobs) -> Res<Bench> {
    std::fs::create_dir_all(&knobs.out).map_err(|e| format!("OUT {}: {e}", knobs.out.display()))?;
    let out = std::fs::canonicalize(&knobs.out)?;
    let bin = match &knobs.current_rev {
        Some(rev) => services::build_rev(rev, &out)?,
        None => std::env::current_exe()?
            .parent()
            .ok_or("the bench binary has no directory")?
            .to_owned(),
    };
    let base_bin = knobs
        .baseline
        .as_deref()
        .map(|rev| services::build_rev(rev, &out))
        .transpose()?;
    let repo = std::env::current_dir()?;
    let cluster = cluster::Cluster::start(&repo, &out).await?;
    let postmaster = cluster.postmaster()?;
    if let Some(cpu) = knobs.redirect_cpu {
        cpus::keep_off(cpu, cpus::count(), postmaster)?;
    }
    let bench = Bench {
        knobs,
        out,
        bin,
        base_bin,
        cluster,
        postmaster,
        mismatches: Default::default(),
    };
    ingest::fresh_db(&bench, Variant::Current).await?;
    if bench.knobs.baseline.is_some() {
        ingest::fresh_db(&bench, Variant::Baseline).await?;
    }
    if bench.knobs.flat {
        ingest::fresh_db(&bench, Variant::Flat).await?;
    }
    Ok(bench)
}
