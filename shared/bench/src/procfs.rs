//! What each process costs, read from /proc: CPU ticks from /proc/PID/stat (PostgreSQL's
//! exited backends included, through the postmaster's cumulative children's time), peak
//! resident memory (VmHWM) from /proc/PID/status, PostgreSQL's proportional set size sampled
//! from smaps_rollup.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use testkit::status_kib;

use crate::Res;

/// Clock ticks a second, the unit of /proc/PID/stat's times.
pub(crate) fn clk_tck() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100.0, |t| t as f64)
}

/// The fields of /proc/PID/stat after the command name (which may hold spaces and
/// parentheses): the state first, so utime is the 12th, stime the 13th.
fn stat_fields(pid: i32) -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(") ")? + 2..];
    // The state is a letter; it counts as 0 so that the indexes stay the file's.
    Some(
        rest.split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect(),
    )
}

/// CPU ticks (utime + stime) of a live process; 0 if it is gone.
pub(crate) fn ticks(pid: i32) -> u64 {
    stat_fields(pid).map_or(0, |f| f.get(11).unwrap_or(&0) + f.get(12).unwrap_or(&0))
}

/// The processes whose parent is `parent`, as `pgrep -P` finds them.
fn children(parent: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| stat_fields(pid).and_then(|f| f.get(1).copied()) == Some(parent as u64))
        .collect()
}

/// Waits, up to 2 s, until the postmaster has reaped every child it has now that was not in
/// `before`: a backend whose client has gone may still be exiting, and its CPU reaches the
/// postmaster's children's time only once it is reaped.
pub(crate) fn await_reaped(postmaster: i32, before: &[i32]) {
    for _ in 0..40 {
        if children(postmaster).iter().all(|pid| before.contains(pid)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The postmaster's live children.
pub(crate) fn pg_children(postmaster: i32) -> Vec<i32> {
    children(postmaster)
}

/// The postmaster's pid, the first line of postmaster.pid in the data directory.
pub(crate) fn postmaster(data: &Path) -> Res<i32> {
    let file = data.join("postmaster.pid");
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    text.lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .ok_or_else(|| format!("no pid on the first line of {}", file.display()).into())
}

/// CPU ticks of the whole PostgreSQL cluster: the postmaster, what its exited children used
/// (cutime + cstime, added when it reaps them), and every live child.
pub(crate) fn pg_ticks(postmaster: i32) -> u64 {
    let own = stat_fields(postmaster).map_or(0, |f| f.iter().skip(11).take(4).sum());
    own + children(postmaster).into_iter().map(ticks).sum::<u64>()
}

/// Resident memory now (VmRSS) or at its peak (VmHWM), in KiB; 0 if the process is gone.
pub(crate) fn memory_kib(pid: i32, key: &str) -> u64 {
    status_kib(pid, key).unwrap_or(0)
}

/// Context switches (voluntary and not) of a process, its threads summed; 0 if it is gone.
pub(crate) fn switches(pid: i32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|status| {
            let counts: Vec<u64> = status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split(':').nth(1)?.trim().parse().ok())
                .collect();
            counts
        })
        .sum()
}

/// Context switches of the postmaster and its live children.
pub(crate) fn pg_switches(postmaster: i32) -> u64 {
    std::iter::once(postmaster)
        .chain(children(postmaster))
        .map(switches)
        .sum()
}

/// Peak resident memory in MiB as the tables print it: one decimal, `0` if the process is gone.
pub(crate) fn hwm_mib(pid: i32) -> String {
    status_kib(pid, "VmHWM").map_or("0".to_owned(), |k| format!("{:.1}", k as f64 / 1024.0))
}

/// The proportional set size of the postmaster and its children, in MiB (a backend that
/// exits while it is read is only left out of this sample).
fn pg_pss_mib(postmaster: i32) -> f64 {
    let pids = std::iter::once(postmaster).chain(children(postmaster));
    let kib: u64 = pids
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok())
        .flat_map(|text| {
            text.lines()
                .filter_map(|l| {
                    l.strip_prefix("Pss:")?
                        .trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .collect::<Vec<_>>()
        })
        .sum();
    kib as f64 / 1024.0
}

/// PostgreSQL's memory sampled every half second on a thread of its own until
/// [`PgMemory::peak`]; the largest sample is the run's peak.
pub(crate) struct PgMemory {
    stop: Arc<AtomicBool>,
    sampler: std::thread::JoinHandle<f64>,
}

impl PgMemory {
    pub(crate) fn start(postmaster: i32) -> PgMemory {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let sampler = std::thread::spawn(move || {
            let mut peak: f64 = 0.0;
            loop {
                peak = peak.max(pg_pss_mib(postmaster));
                if sleep_unless(&stopped, Duration::from_millis(500)) {
                    return peak;
                }
            }
        });
        PgMemory { stop, sampler }
    }

    /// Stops sampling; the peak in MiB, one decimal.
    pub(crate) fn peak(self) -> String {
        self.stop.store(true, Ordering::Relaxed);
        format!("{:.1}", self.sampler.join().unwrap_or(0.0))
    }
}

/// Sleeps `wait` in short steps; true as soon as `stop` is set.
fn sleep_unless(stop: &AtomicBool, wait: Duration) -> bool {
    let step = Duration::from_millis(50);
    let mut slept = Duration::ZERO;
    while slept < wait {
        if stop.load(Ordering::Relaxed) {
            return true;
        }
        std::thread::sleep(step);
        slept += step;
    }
    stop.load(Ordering::Relaxed)
}

/// CPU counters of a run's processes, in ticks.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cpu {
    pub(crate) redirector: u64,
    pub(crate) collector: u64,
    pub(crate) postgres: u64,
}

impl Cpu {
    /// Now, for the redirector and collector pids given (none: 0).
    pub(crate) fn now(redirector: Option<i32>, collector: Option<i32>, postmaster: i32) -> Cpu {
        Cpu {
            redirector: redirector.map_or(0, ticks),
            collector: collector.map_or(0, ticks),
            postgres: pg_ticks(postmaster),
        }
    }

    /// CPU microseconds per click of each process since `before`, three decimals each.
    pub(crate) fn per_click(&self, before: &Cpu, clicks: u64) -> [String; 3] {
        let us = |after: u64, before: u64| {
            if clicks == 0 {
                return "0.000".to_owned();
            }
            let t = after.saturating_sub(before) as f64;
            format!("{:.3}", t * 1e6 / clk_tck() / clicks as f64)
        };
        [
            us(self.redirector, before.redirector),
            us(self.collector, before.collector),
            us(self.postgres, before.postgres),
        ]
    }
}

/// The cluster's data directory under the bench's PostgreSQL directory.
pub(crate) fn data_dir(pgdir: &Path) -> PathBuf {
    pgdir.join("data")
}
