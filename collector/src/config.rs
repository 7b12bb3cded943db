//! Command line and environment: every flag has an environment fallback.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// The stop behaviour, for `--help`.
const STOPPING: &str = "\
Stopping: on SIGTERM or SIGINT the collector takes no new datagrams (a socket it bound is \
unlinked and shut, and what is queued on it is read; one passed by systemd is left to it, queue \
and all), then waits for the database to take the last batches, each attempt bounded by \
--write-timeout and retried while the database is away, and exits 0. A stop can \
therefore take more than one --write-timeout: give the service manager room (collector.service \
has TimeoutStopSec=90s against the 30s default).";

#[derive(Debug, Parser)]
#[command(
    name = "collector",
    version,
    about = "Receives click datagrams on a Unix socket and writes them to PostgreSQL with binary COPY",
    after_help = STOPPING
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// PostgreSQL to write to (required): a libpq key=value string
    /// (`host=/run/postgresql dbname=clicks`) or a postgres:// URL.
    // Optional to clap only so that it can be global (`collector migrate --database-url ..`);
    // `database_url()` requires it.
    #[arg(
        long,
        env = "DATABASE_URL",
        value_name = "URL",
        hide_env_values = true,
        global = true
    )]
    database_url: Option<String>,

    #[command(flatten)]
    pub run: Config,
}

impl Cli {
    /// The database URL, or the usage error clap would give for a missing required flag.
    pub fn database_url(&self) -> Result<&str, clap::Error> {
        self.database_url.as_deref().ok_or_else(|| {
            <Self as clap::CommandFactory>::command().error(
                clap::error::ErrorKind::MissingRequiredArgument,
                "--database-url (or DATABASE_URL) is required",
            )
        })
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply the schema migrations the database lacks, then exit.
    Migrate,
}

#[derive(Debug, Clone, Args)]
pub struct Config {
    /// Unix datagram socket to receive clicks on. Ignored under systemd socket activation
    /// (LISTEN_FDS), which passes the socket instead.
    #[arg(
        long,
        env = "CLICKS_SOCKET",
        value_name = "PATH",
        default_value = "/run/clicks/collector.sock"
    )]
    pub(crate) socket: PathBuf,

    /// File mode of the socket when the collector binds it (octal). Senders need write access.
    #[arg(
        long,
        env = "COLLECTOR_SOCKET_MODE",
        value_name = "OCTAL",
        default_value = "0660",
        value_parser = shared::flags::mode
    )]
    pub(crate) socket_mode: u32,

    /// This collector's instance name: one collector per instance writes at a time (a restart
    /// waits for its predecessor to finish), while collectors of different instances (one per
    /// host) write to the same database at once. Shown in click_writers.instance. Default: the
    /// host name.
    #[arg(
        long,
        env = "COLLECTOR_INSTANCE",
        value_name = "NAME",
        default_value_t = default_instance(),
        value_parser = parse_instance
    )]
    pub(crate) instance: String,

    /// Take datagrams only from processes of these uids (comma-separated); any other uid's are
    /// rejected (reason unauthorized). Default: any process that may write to the socket.
    /// In a user namespace (systemd's PrivateUsers=yes, which collector.service sets) a sender
    /// the namespace does not map arrives as uid 65534, so a uid it does not map could never
    /// match: the collector then refuses to start. Under that unit the socket's group and mode
    /// decide who may send.
    #[arg(
        long,
        env = "COLLECTOR_ALLOW_UID",
        value_name = "UID[,UID...]",
        value_delimiter = ','
    )]
    pub(crate) allow_uid: Option<Vec<u32>>,

    /// Address of the admin listener: GET /metrics (Prometheus) and GET /healthz.
    #[arg(
        long,
        env = "COLLECTOR_ADMIN_LISTEN",
        value_name = "ADDR",
        default_value = "127.0.0.1:9181"
    )]
    pub(crate) admin_listen: SocketAddr,

    /// Write a batch once it holds this many clicks (1 to 5,000,000). Bigger batches cost
    /// less per click in PostgreSQL (each commit waits for a WAL flush); two batches of this
    /// size (at the default, about 3 MB of rows each and up to 8 MB of counts a day when
    /// every code is distinct) are in memory at most, kept for reuse. Below 400,000 clicks/s
    /// (at the default --flush-interval), --flush-interval comes first. The ceiling keeps a
    /// batch's largest row under PostgreSQL's 1 GB limit on a row: a day's referrer
    /// breakdown, a code of up to 64 bytes, a host of up to 64 and a count an entry (5 M
    /// entries: 720 MB).
    #[arg(
        long,
        env = "COLLECTOR_BATCH_ROWS",
        value_name = "N",
        default_value = "100000",
        value_parser = clap::value_parser!(u32).range(1..=MAX_BATCH_ROWS)
    )]
    pub(crate) batch_rows: u32,

    /// Write a batch at the latest this long after its first click arrived (e.g. `100ms`).
    /// Besides its rows, each batch costs PostgreSQL a few ms of CPU whatever its size (a
    /// transaction, a WAL flush, and in PostgreSQL 15 a COPY that creates and drops 1,000
    /// tuple slots, each pinned in a resource owner searched linearly): a longer interval
    /// costs it less per click (BENCHMARKS.md, "Totals", has `100ms` against `250ms`).
    #[arg(
        long,
        env = "COLLECTOR_FLUSH_INTERVAL",
        value_name = "DURATION",
        default_value = "250ms",
        value_parser = shared::flags::duration
    )]
    pub(crate) flush_interval: Duration,

    /// Fold the per-batch counts into click_counts once the oldest has waited this long. A
    /// fold costs the database an update or insert per distinct (code, day), so fewer folds
    /// cost less; click_totals is exact either way (it adds what is not folded yet).
    #[arg(
        long,
        env = "COLLECTOR_COMPACT_INTERVAL",
        value_name = "DURATION",
        default_value = "60s",
        value_parser = shared::flags::duration
    )]
    pub(crate) compact_interval: Duration,

    /// ... or as soon as this many per-batch counts (code, day, clicks) wait, whichever comes
    /// first: what a reader of click_totals adds up on top of click_counts stays below it.
    #[arg(
        long,
        env = "COLLECTOR_COMPACT_BACKLOG",
        value_name = "N",
        default_value = "5000000",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub(crate) compact_backlog: u32,

    /// ... or as soon as the sums this collector keeps of its unfolded counts (one per distinct
    /// code and day, however many clicks) take half of this memory. They never take more: sums
    /// that reach it before a fold takes them (the database away from the fold, another
    /// collector folding, codes coming faster than folds go) are dropped, and their batches
    /// folded from their rows, which costs the database more and is exact all the same (a fold
    /// briefly holds a second copy of the sums it takes, while it puts them in order). Bytes,
    /// or with a unit: K, M, G (powers of 1024, as systemd's MemoryMax=), e.g. `64M`. The
    /// collector's peak RSS with it is in BENCHMARKS.md ("The collector's memory").
    #[arg(
        long,
        env = "COLLECTOR_COMPACT_MEMORY",
        value_name = "BYTES",
        default_value = "64M",
        value_parser = parse_memory
    )]
    pub(crate) compact_memory: usize,

    /// Clicks older than this (by the collector's clock when it receives them) are not written
    /// into clicks but set aside (clicks_set_aside, reason too_old), as clicks dated more than
    /// --max-click-skew ahead are (too_new): a wrong clock or a forged datagram cannot write
    /// clicks into days long gone or far ahead. Partitions are kept for this many days back.
    #[arg(
        long,
        env = "COLLECTOR_MAX_CLICK_AGE",
        value_name = "DURATION",
        default_value = "1d",
        value_parser = shared::flags::duration
    )]
    pub(crate) max_click_age: Duration,

    /// How far ahead of the collector's clock a click may be dated (see --max-click-age).
    #[arg(
        long,
        env = "COLLECTOR_MAX_CLICK_SKEW",
        value_name = "DURATION",
        default_value = "5m",
        value_parser = shared::flags::duration
    )]
    pub(crate) max_click_skew: Duration,

    /// Drop the partitions of clicks older than this many days (whole days, UTC), detached
    /// without a lock that would stop writers; never a day of the --max-click-age window nor
    /// the day before it. click_counts and click_totals keep every day's total. Default: keep
    /// everything.
    #[arg(
        long,
        env = "COLLECTOR_RETENTION",
        value_name = "DAYS",
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub(crate) retention: Option<u16>,

    /// Give up on one attempt to write a batch (connect, writer lock, COPY, commit: one deadline
    /// for all of it) after this long; the connection is dropped and the same batch is retried
    /// on a new one. The same deadline bounds each round of the periodic work (a fold, pruning)
    /// and connecting at start. A stop waits for the last batches, so it can take longer than
    /// this (see Stopping below).
    #[arg(
        long,
        env = "COLLECTOR_WRITE_TIMEOUT",
        value_name = "DURATION",
        default_value = "30s",
        value_parser = shared::flags::duration
    )]
    pub(crate) write_timeout: Duration,

    /// Also forward every received datagram, unchanged and without waiting, to this socket
    /// (e.g. `clicktap listen`). Dropped and counted when nobody listens there.
    #[arg(long, env = "COLLECTOR_MIRROR", value_name = "PATH")]
    pub(crate) mirror: Option<PathBuf>,
}

/// The smallest and largest --compact-memory: below a mebibyte, a batch or two of distinct
/// codes would fill the sums and every batch would go the SQL way; above 64 GiB is no host's
/// collector (a typo's extra digits).
const MEMORY_RANGE: std::ops::RangeInclusive<u64> = (1 << 20)..=(64 << 30);
/// `--batch-rows`' ceiling.
const MAX_BATCH_ROWS: i64 = 5_000_000;
// The sums' code maps index at most MAX_ENTRIES entries, of 40 bytes or more each; the sums
// pass the bound by one batch's codes at most (--batch-rows) before they are dropped.
const _: () = assert!(
    *MEMORY_RANGE.end() / 40 + (MAX_BATCH_ROWS as u64) < crate::write::code_map::MAX_ENTRIES,
    "--compact-memory's ceiling holds more sums than a code map can index"
);

/// Bytes, or a number with K, M or G (KiB, MiB, GiB also read; powers of 1024), in
/// [`MEMORY_RANGE`].
fn parse_memory(s: &str) -> Result<usize, String> {
    let text = s.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        other => {
            return Err(format!(
                "{s:?}: unknown unit {other:?}; give bytes, or K, M or G (e.g. 64M)"
            ))
        }
    };
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a size; give bytes, or K, M or G (e.g. 64M)"))?;
    let bytes = number.checked_shl(shift).filter(|b| b >> shift == number);
    match bytes {
        Some(b) if MEMORY_RANGE.contains(&b) => Ok(b as usize),
        _ => Err(format!(
            "{s:?} is outside 1M to 64G: less would fold (or drop the sums) every batch, more \
             is beyond any host's collector"
        )),
    }
}

/// The host name, or `localhost` if it cannot be read (never expected on Linux).
fn default_instance() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .and_then(|h| parse_instance(&h).ok())
        .unwrap_or_else(|| "localhost".into())
}

/// 1 to 255 printable characters: it is a log and table label, not free text.
fn parse_instance(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 255 {
        return Err(format!("{} bytes; an instance name has 1 to 255", s.len()));
    }
    if let Some(c) = s.chars().find(|c| c.is_control()) {
        return Err(format!("control character {c:?}; use printable characters"));
    }
    Ok(s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("collector").chain(args.iter().copied()))
    }

    #[test]
    fn flags_parse_with_units_and_octal() {
        let cli = parse(&[
            "--database-url",
            "host=/tmp",
            "--flush-interval",
            "40ms",
            "--socket-mode",
            "0620",
            "--batch-rows",
            "7",
        ])
        .unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.database_url().unwrap(), "host=/tmp");
        assert_eq!(cli.run.flush_interval, Duration::from_millis(40));
        assert_eq!(cli.run.socket_mode, 0o620);
        assert_eq!(cli.run.batch_rows, 7);
        assert_eq!(cli.run.compact_interval, Duration::from_secs(60));
        assert_eq!(cli.run.compact_backlog, 5_000_000);
        assert_eq!(cli.run.compact_memory, 64 << 20);
        assert_eq!(
            cli.run.compact_memory,
            crate::write::unfolded::DEFAULT_MEMORY,
            "the flag's default is the sums' own"
        );
        let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
        assert_eq!(
            cli.run.instance, host,
            "the instance defaults to the host name"
        );
    }

    #[test]
    fn rejects_bad_values_with_the_reason() {
        let url = ["--database-url", "x"];
        for (flag, value, why) in [
            ("--socket-mode", "9", "not octal"),
            ("--socket-mode", "1777", "above 0777"),
            ("--flush-interval", "0s", "more than zero"),
            ("--batch-rows", "0", "0"),
            ("--batch-rows", "5000001", "5000000"),
            ("--instance", "", "1 to 255"),
            ("--instance", "a\tb", "control character"),
            ("--allow-uid", "root", "invalid digit"),
            ("--compact-memory", "0", "outside 1M to 64G"),
            ("--compact-memory", "1023K", "outside 1M to 64G"),
            ("--compact-memory", "65G", "outside 1M to 64G"),
            ("--compact-memory", "99999999999999999999", "not a size"),
            (
                "--compact-memory",
                "18446744073709551615G",
                "outside 1M to 64G",
            ),
            ("--compact-memory", "64MB", "unknown unit"),
            ("--compact-memory", "1.5G", "unknown unit"),
        ] {
            let err = parse(&[url[0], url[1], flag, value])
                .unwrap_err()
                .to_string();
            assert!(err.contains(why), "{flag} {value}: {err}");
        }
    }

    /// systemd kills a collector still stopping after TimeoutStopSec: the last batch's write
    /// must be able to time out once and be retried within it.
    #[test]
    fn the_units_stop_timeout_outlasts_a_retried_last_write() {
        let unit = concat!(env!("CARGO_MANIFEST_DIR"), "/../systemd/collector.service");
        let unit = std::fs::read_to_string(unit).unwrap();
        let stop = unit
            .lines()
            .find_map(|l| l.strip_prefix("TimeoutStopSec="))
            .expect("TimeoutStopSec in collector.service");
        let stop = shared::flags::duration(stop.trim()).unwrap();
        let mut command = <Cli as clap::CommandFactory>::command();
        let write_timeout = command
            .get_arguments()
            .find(|a| a.get_long() == Some("write-timeout"))
            .and_then(|a| a.get_default_values().first()?.to_str())
            .map(|d| shared::flags::duration(d).unwrap())
            .expect("a default --write-timeout");
        assert!(
            stop > 2 * write_timeout,
            "TimeoutStopSec={stop:?} against --write-timeout {write_timeout:?}"
        );
        let help = command.render_help().to_string();
        assert!(
            help.contains("waits for the database to take the last batches"),
            "{help}"
        );
    }

    #[test]
    fn memory_sizes_take_bytes_or_units() {
        assert_eq!(parse_memory("1048576"), Ok(1 << 20));
        assert_eq!(parse_memory("64M"), Ok(64 << 20));
        assert_eq!(parse_memory("64MiB"), Ok(64 << 20));
        assert_eq!(parse_memory("2048K"), Ok(2 << 20));
        assert_eq!(parse_memory("1G"), Ok(1 << 30));
        assert_eq!(parse_memory("64G"), Ok(64 << 30));
    }

    #[test]
    fn every_duration_flag_refuses_zero_and_absurd_values() {
        let command = <Cli as clap::CommandFactory>::command();
        testkit::assert_duration_flags_refuse_zero_and_absurd(command, &[]);
    }

    #[test]
    fn migrate_needs_only_the_database() {
        let cli = parse(&["migrate", "--database-url", "host=/tmp"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Migrate)));
        assert_eq!(cli.database_url().unwrap(), "host=/tmp");
    }

    #[test]
    fn the_database_url_is_required() {
        // Whatever this process's environment holds: the command's DATABASE_URL fallback is
        // taken off (process env is not changed, which would race the other tests' threads).
        let command = <Cli as clap::CommandFactory>::command()
            .mut_arg("database_url", |a| a.env(None::<&str>));
        let matches = command.try_get_matches_from(["collector"]).unwrap();
        let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap();
        let err = cli.database_url().unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        assert!(err.to_string().contains("--database-url"), "{err}");
    }
}
