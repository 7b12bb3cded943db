//! `clicktap listen`: bind a path and print what arrives, one line per datagram or per second.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::MsgFlags;
use serde_json::json;

use super::show::{self, Reading, SeqNote};
use super::{signals, TapError};
use protocol::seq::{self, LastSeqs};
use protocol::wire::{Datagram, MAX_DATAGRAM};
use shared::socket::bind_datagram;

/// How long one `recv` blocks: bounds how late a `--stats` line or a signal is noticed when a
/// signal lands just before the call (otherwise `EINTR` wakes it at once).
const RECV_WAIT: Duration = Duration::from_millis(50);
const STATS_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Socket path to bind: a stand-in for the collector's socket, or the target of the
    /// collector's --mirror. A stale socket file nobody is bound to is replaced; anything else
    /// at the path (a live socket, a regular file) is refused.
    #[arg(long, env = "CLICKS_SOCKET")]
    socket: PathBuf,
    /// Print one JSON object per line (per datagram, or per second with --stats) instead of
    /// text. Rejected datagrams carry "reason" and "error".
    #[arg(long)]
    json: bool,
    /// Instead of a line per datagram, print one line per second: datagrams/s, clicks/s,
    /// bytes/s, rejected datagrams, and sequence gaps (missing datagrams) per sender.
    #[arg(long)]
    stats: bool,
    /// File mode of the socket, in octal; senders need write permission on it (a collector
    /// running as another user needs 666, or this tap run in the collector's group).
    #[arg(long, default_value = "660", value_parser = shared::flags::mode)]
    mode: u32,
}

pub fn run(args: &Args) -> Result<(), TapError> {
    let stop = signals::stop_flag().map_err(TapError::io("installing signal handlers"))?;
    let socket = bind_datagram(&args.socket, args.mode)?;
    let _remove = RemoveOnExit::new(&args.socket);
    // As the collector's socket: a descriptor a datagram carried is closed as it is read, and
    // a close can block (a lingering TCP socket), holding up the tap. Before Linux 6.16, closed
    // so all the same.
    shared::socket::refuse_descriptors(&socket)
        .map_err(TapError::io("refusing datagrams that carry descriptors"))?;
    socket
        .set_read_timeout(Some(RECV_WAIT))
        .map_err(TapError::io("setting the receive timeout"))?;
    tracing::info!("listening on {}", args.socket.display());
    let mut listener = Listener {
        args,
        out: signals::Stdout,
        tally: Tally::default(),
    };
    let result = listener.receive(&socket, stop);
    tracing::info!("{}", listener.tally.all.summary());
    match result {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other.map_err(TapError::io("listening")),
    }
}

/// When the per-second line after the one due at `due` and printed at `now` is due: on a fixed
/// schedule, so that lines do not drift by the receive timeout, unless the line was late by a
/// period or more (the process stopped, or its output blocked). Then a whole period from now,
/// not at once: a line over the microseconds since would show rates a thousand times too high.
fn next_line_after(due: Instant, now: Instant) -> Instant {
    let scheduled = due + STATS_EVERY;
    if scheduled > now {
        scheduled
    } else {
        now + STATS_EVERY
    }
}

struct Listener<'a> {
    args: &'a Args,
    out: signals::Stdout,
    tally: Tally,
}

impl Listener<'_> {
    fn receive(&mut self, socket: &UnixDatagram, stop: &AtomicBool) -> io::Result<()> {
        let mut buf = vec![0u8; MAX_DATAGRAM];
        let mut second_start = Instant::now();
        let mut next_line = second_start + STATS_EVERY;
        while !signals::stopping(stop) {
            match receive_one(socket, &mut buf) {
                Ok(len) => self.show(&buf[..len.min(buf.len())], len)?,
                Err(Errno::EAGAIN | Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
            let now = Instant::now();
            // Each second's counts start again, printed or not.
            if now >= next_line {
                let totals = std::mem::take(&mut self.tally.second);
                if self.args.stats {
                    self.print(&stats_line(&totals, now - second_start, self.args.json))?;
                }
                second_start = now;
                next_line = next_line_after(next_line, now);
            }
        }
        Ok(())
    }

    /// Counts a datagram and, unless only per-second totals are asked for, prints it.
    fn show(&mut self, bytes: &[u8], len: usize) -> io::Result<()> {
        let (now, json, quiet) = (protocol::now_us(), self.args.json, self.args.stats);
        match show::judge(bytes, len) {
            Reading::Datagram(batch) => {
                let note = self.tally.batch(&batch, len);
                if quiet {
                    return Ok(());
                }
                let line = if json {
                    show::batch_json(&batch, len, now, note).to_string()
                } else {
                    show::batch_line(&batch, len, now, note)
                };
                self.print(&line)
            }
            Reading::Resync(resync) => {
                self.tally.resync(len);
                if quiet {
                    return Ok(());
                }
                let line = if json {
                    show::resync_json(&resync, len).to_string()
                } else {
                    show::resync_line(&resync, len)
                };
                self.print(&line)
            }
            Reading::Rejected { reason, error } => {
                self.tally.reject(len);
                if quiet {
                    return Ok(());
                }
                let line = if json {
                    show::rejected_json(bytes, len, reason, &error).to_string()
                } else {
                    show::rejected_line(bytes, len, reason, &error)
                };
                self.print(&line)
            }
        }
    }

    /// One line, written at once so that a pipe reader sees it now.
    fn print(&mut self, line: &str) -> io::Result<()> {
        self.out.line(line)
    }
}

/// Receives one datagram; returns its real length even when it was longer than `buf`.
fn receive_one(socket: &UnixDatagram, buf: &mut [u8]) -> nix::Result<usize> {
    nix::sys::socket::recv(socket.as_raw_fd(), buf, MsgFlags::MSG_TRUNC)
}

/// Counts of one stats second, or of the whole run.
#[derive(Debug, Default)]
struct Totals {
    datagrams: u64,
    clicks: u64,
    bytes: u64,
    rejects: u64,
    /// Missing datagrams, held at `u64::MAX`: a sender may jump to any seq (a hostile one to
    /// the last).
    missing: u64,
    /// Missing datagrams by sender: a second's only, so that a run's memory does not grow
    /// with every sender that ever missed one.
    gaps: BTreeMap<u64, u64>,
}

impl Totals {
    fn add(&mut self, len: usize, clicks: usize) {
        self.datagrams += 1;
        self.clicks += clicks as u64;
        self.bytes += len as u64;
    }

    fn summary(&self) -> String {
        format!(
            "received {} datagrams ({} clicks, {} bytes), {} rejected, {} missing by sequence",
            self.datagrams, self.clicks, self.bytes, self.rejects, self.missing
        )
    }
}

/// Each sender's last seq, and the counts of the current second and of the whole run.
#[derive(Debug)]
struct Tally {
    seqs: LastSeqs,
    second: Totals,
    all: Totals,
}

impl Default for Tally {
    fn default() -> Tally {
        Tally {
            // A tap starts listening at any moment: a sender's first datagram is its start.
            // As many as a collector keeps: a tap on its --mirror sees every datagram.
            seqs: LastSeqs::mid_stream(protocol::senders::MAX_SENDERS),
            second: Totals::default(),
            all: Totals::default(),
        }
    }
}

impl Tally {
    fn batch(&mut self, batch: &Datagram<'_>, len: usize) -> SeqNote {
        let note = match self.seqs.accept(batch.sender, batch.seq) {
            seq::Seen::New { lost } => SeqNote {
                missing: lost,
                repeat: false,
            },
            seq::Seen::Again => SeqNote {
                missing: 0,
                repeat: true,
            },
        };
        for totals in [&mut self.second, &mut self.all] {
            totals.add(len, batch.clicks.len());
            totals.missing = totals.missing.saturating_add(note.missing);
        }
        if note.missing > 0 {
            let gap = self.second.gaps.entry(batch.sender).or_default();
            *gap = gap.saturating_add(note.missing);
        }
        note
    }

    /// A resync: a datagram of no clicks (the collector's verdict on it is its own).
    fn resync(&mut self, len: usize) {
        for totals in [&mut self.second, &mut self.all] {
            totals.add(len, 0);
        }
    }

    fn reject(&mut self, len: usize) {
        for totals in [&mut self.second, &mut self.all] {
            totals.add(len, 0);
            totals.rejects += 1;
        }
    }
}

/// The `--stats` line for one second's `totals`, as rates over `elapsed`.
fn stats_line(totals: &Totals, elapsed: Duration, json: bool) -> String {
    let secs = elapsed.as_secs_f64();
    let rate = |n: u64| (n as f64 / secs).round() as u64;
    let now = show::format_time(protocol::now_us());
    if json {
        let gaps: serde_json::Map<String, serde_json::Value> = totals
            .gaps
            .iter()
            .map(|(sender, n)| (sender.to_string(), json!(n)))
            .collect();
        return json!({
            "time": now,
            "seconds": secs,
            "datagrams": totals.datagrams,
            "clicks": totals.clicks,
            "bytes": totals.bytes,
            "rejects": totals.rejects,
            "datagrams_per_s": rate(totals.datagrams),
            "clicks_per_s": rate(totals.clicks),
            "bytes_per_s": rate(totals.bytes),
            "gaps": gaps,
        })
        .to_string();
    }
    let mut line = format!(
        "{} datagrams/s={} clicks/s={} bytes/s={} rejects={} gaps={}",
        &now[11..19],
        rate(totals.datagrams),
        rate(totals.clicks),
        rate(totals.bytes),
        totals.rejects,
        totals.missing
    );
    if !totals.gaps.is_empty() {
        let per_sender: Vec<String> = totals
            .gaps
            .iter()
            .map(|(sender, n)| format!("sender {sender}: {n}"))
            .collect();
        line.push_str(&format!(" ({})", per_sender.join(", ")));
    }
    line
}

/// Removes the socket file on the way out, unless something else has replaced it since.
struct RemoveOnExit {
    path: PathBuf,
    identity: Option<(u64, u64)>,
}

impl RemoveOnExit {
    fn new(path: &Path) -> Self {
        RemoveOnExit {
            path: path.to_owned(),
            identity: file_identity(path),
        }
    }
}

impl Drop for RemoveOnExit {
    fn drop(&mut self) {
        if self.identity.is_some() && file_identity(&self.path) == self.identity {
            if let Err(e) = std::fs::remove_file(&self.path) {
                tracing::warn!("removing {}: {e}", self.path.display());
            }
        }
    }
}

fn file_identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(sender: u64, seq: u64) -> Datagram<'static> {
        Datagram {
            version: 1,
            sender,
            seq,
            base_us: 0,
            clicks: Vec::new(),
        }
    }

    #[test]
    fn a_line_late_by_a_period_or_more_puts_the_next_a_whole_period_after_it() {
        let due = Instant::now();
        let on_time = due + Duration::from_millis(30);
        assert_eq!(next_line_after(due, on_time), due + STATS_EVERY);
        let stopped = due + STATS_EVERY * 5 + Duration::from_millis(30);
        assert_eq!(next_line_after(due, stopped), stopped + STATS_EVERY);
    }

    #[test]
    fn gaps_and_repeats_are_counted_per_sender() {
        let mut tally = Tally::default();
        assert_eq!(tally.batch(&batch(1, 5), 10), SeqNote::default());
        assert_eq!(tally.batch(&batch(2, 0), 10), SeqNote::default());
        assert_eq!(tally.batch(&batch(1, 8), 10).missing, 2);
        assert!(tally.batch(&batch(1, 8), 10).repeat);
        assert_eq!(tally.batch(&batch(2, 1), 10), SeqNote::default());
        assert_eq!(tally.second.gaps, BTreeMap::from([(1, 2)]));
        assert_eq!(tally.all.missing, 2);
        assert!(tally.all.gaps.is_empty(), "the run keeps no sender's");
        let line = stats_line(&tally.second, Duration::from_secs(1), false);
        assert!(line.ends_with("rejects=0 gaps=2 (sender 1: 2)"), "{line}");
    }

    #[test]
    fn gaps_as_large_as_a_seq_can_jump_are_held_at_the_most() {
        let mut tally = Tally::default();
        tally.batch(&batch(1, 0), 10);
        tally.batch(&batch(1, u64::MAX), 10);
        tally.batch(&batch(2, 0), 10);
        tally.batch(&batch(2, 5), 10);
        assert_eq!(tally.all.missing, u64::MAX);
        assert!(tally
            .all
            .summary()
            .contains(&format!("{} missing", u64::MAX)));
    }
}
